"""A production deploy behind a confirmation: the canonical statecodec scenario.

The tool ``deploy_production(version)`` computes a deployment plan, then asks the user
two independent questions in ONE round (MCP 2026-07-28 multi-round-trip requests): a
boolean ``confirm_deploy`` and a string ``change_ticket``. The plan travels in
``requestState``. On the retry, which may reach another instance, the tool deploys
exactly the plan it recovers from the state: so that state must be tamper-proof, bound
to the user and the request, expiring and single use. statecodec makes it so in one
line, ``protect(server, codec)``, for each of the three ways to write an MCP server in
Python (``--flavor lowlevel | mcpserver | fastmcp``).

Run two instances that share keys and a replay store::

    statecodec keys generate -o keys.json
    python examples/deploy_server.py --keys keys.json --replay sqlite:/tmp/replay.db --port 8001 --instance A
    python examples/deploy_server.py --keys keys.json --replay sqlite:/tmp/replay.db --port 8002 --instance B

Over HTTP two users exist, with the bearer tokens ``alice-token`` and ``bob-token``
(a static verifier for the demo; use your OAuth verifier in production). With
``--port 0`` the server picks a free port; it prints ``READY <url>`` once listening.
``--transport stdio`` serves one client over stdin/stdout (no users there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

import fastmcp
import mcp_types as types
import uvicorn
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
from fastmcp.tools import ToolResult
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel

from statecodec import KeyRing, StateCodec
from statecodec.adapters import fastmcp as fastmcp_adapter
from statecodec.adapters import mcp as mcp_adapter
from statecodec.replay import store_from_url

ISSUER = "https://idp.example"
CLIENT_ID = "deploy-cli"
USERS = {"alice-token": "alice", "bob-token": "bob"}
SERVER_NAME = "deploy"
TOOL = "deploy_production"
TOOL_SCHEMA = {
    "type": "object",
    "properties": {"version": {"type": "string", "description": "the release to deploy"}},
    "required": ["version"],
}

log = logging.getLogger("deploy")


# --------------------------------------------------------------- the tool itself
def plan_for(version: str, instance: str) -> dict[str, Any]:
    """The expensive, authoritative part: what exactly will be rolled out."""
    return {
        "version": version,
        "plan_id": secrets.token_hex(4),
        "planned_on": instance,
        "steps": [f"canary {version} in eu-west-1", f"roll {version} to all regions", "verify health checks"],
    }


def _form(message: str, field: str, schema: dict[str, Any]) -> types.ElicitRequest:
    requested = {"type": "object", "properties": {field: schema}, "required": [field]}
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=message, requested_schema=requested)
    )


def ask(version: str, instance: str, plan: dict[str, Any] | None = None) -> types.InputRequiredResult:
    """Round 1: two independent questions, and the plan in requestState (plaintext here)."""
    plan = plan or plan_for(version, instance)
    log.info("round=1 instance=%s version=%s plan=%s", instance, version, plan["plan_id"])
    return types.InputRequiredResult(
        input_requests={
            "confirm_deploy": _form(
                f"Deploy {version} to production?", "confirm", {"type": "boolean", "title": "Confirm"}
            ),
            "change_ticket": _form(
                "Change ticket for the deployment", "ticket", {"type": "string", "title": "Ticket"}
            ),
        },
        request_state=json.dumps(plan),
    )


def _answer(responses: Any, key: str) -> tuple[str | None, dict[str, Any]]:
    response = (responses or {}).get(key)
    if isinstance(response, BaseModel):
        response = response.model_dump()
    if not isinstance(response, dict):
        return None, {}
    return response.get("action"), response.get("content") or {}


def finish(state: str, responses: Any, instance: str) -> dict[str, Any] | types.InputRequiredResult:
    """Round 2: deploy the plan recovered from the (verified) state."""
    plan = json.loads(state)
    confirm_action, confirm = _answer(responses, "confirm_deploy")
    ticket_action, ticket = _answer(responses, "change_ticket")
    if confirm_action is None or ticket_action is None:
        return ask(plan["version"], instance, plan)  # a state-only retry: ask again, same plan
    if confirm_action != "accept" or confirm.get("confirm") is not True or ticket_action != "accept":
        log.info("round=2 instance=%s plan=%s cancelled", instance, plan["plan_id"])
        return {
            "deployed": None,
            "plan_id": plan["plan_id"],
            "planned_on": plan["planned_on"],
            "deployed_on": instance,
        }
    log.info("round=2 instance=%s plan=%s deployed version=%s", instance, plan["plan_id"], plan["version"])
    return {
        "deployed": plan["version"],
        "plan_id": plan["plan_id"],
        "steps": plan["steps"],
        "ticket": str(ticket.get("ticket")),
        "planned_on": plan["planned_on"],
        "deployed_on": instance,
    }


def call_tool_result(outcome: dict[str, Any]) -> types.CallToolResult:
    text = (
        f"deployed {outcome['deployed']} (plan {outcome['plan_id']})" if outcome["deployed"] else "cancelled"
    )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=outcome
    )


# ------------------------------------------------------------- three flavours
class StaticVerifier:
    """Two fixed users for the demo (the SDK's TokenVerifier protocol)."""

    async def verify_token(self, token: str) -> AccessToken | None:
        user = USERS.get(token)
        if user is None:
            return None
        return AccessToken(token=token, client_id=CLIENT_ID, scopes=[], subject=user, claims={"iss": ISSUER})


def auth_settings() -> AuthSettings:
    return AuthSettings(issuer_url=ISSUER, resource_server_url=None)


def build_lowlevel(codec: StateCodec, instance: str, *, auth: bool) -> Any:
    async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name=TOOL, description="Deploy a release to production", input_schema=TOOL_SCHEMA)
            ]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        if params.name != TOOL:
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {params.name}")
        version = str((params.arguments or {}).get("version"))
        if params.request_state is None:
            return ask(version, instance)
        outcome = finish(params.request_state, params.input_responses, instance)
        return outcome if isinstance(outcome, types.InputRequiredResult) else call_tool_result(outcome)

    server = Server(SERVER_NAME, on_list_tools=list_tools, on_call_tool=call_tool)
    mcp_adapter.protect(server, codec)

    def http_app() -> Any:
        if not auth:
            return server.streamable_http_app()
        return server.streamable_http_app(auth=auth_settings(), token_verifier=StaticVerifier())

    async def stdio() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    return http_app, stdio


def build_mcpserver(codec: StateCodec, instance: str, *, auth: bool) -> Any:
    if auth:
        server: MCPServer[Any] = MCPServer(SERVER_NAME, token_verifier=StaticVerifier(), auth=auth_settings())
    else:
        server = MCPServer(SERVER_NAME)

    @server.tool(name=TOOL, description="Deploy a release to production")
    async def deploy_production(
        version: str, ctx: Context
    ) -> types.CallToolResult | types.InputRequiredResult:
        if ctx.request_state is None:
            return ask(version, instance)
        outcome = finish(ctx.request_state, ctx.input_responses, instance)
        return outcome if isinstance(outcome, types.InputRequiredResult) else call_tool_result(outcome)

    mcp_adapter.protect(server, codec)  # replaces the boundary MCPServer installed with a per-process key
    return server.streamable_http_app, server.run_stdio_async


def build_fastmcp(codec: StateCodec, instance: str, *, auth: bool) -> Any:
    verifier = StaticTokenVerifier(
        tokens={
            token: {"client_id": CLIENT_ID, "sub": user, "iss": ISSUER, "scopes": []}
            for token, user in USERS.items()
        }
    )
    server: fastmcp.FastMCP[Any] = fastmcp.FastMCP(SERVER_NAME, auth=verifier if auth else None)

    @server.tool(name=TOOL, description="Deploy a release to production")
    async def deploy_production(version: str, ctx: fastmcp.Context) -> Any:
        if ctx.request_state is None:
            return ask(version, instance)
        outcome = finish(ctx.request_state, ctx.input_responses, instance)
        if isinstance(outcome, types.InputRequiredResult):
            return outcome
        result = call_tool_result(outcome)
        return ToolResult(content=result.content, structured_content=outcome)

    fastmcp_adapter.protect(server, codec)
    return (lambda: server.http_app(path="/mcp")), server.run_stdio_async


FLAVORS = {"lowlevel": build_lowlevel, "mcpserver": build_mcpserver, "fastmcp": build_fastmcp}


# --------------------------------------------------------------------- running
def make_codec(args: argparse.Namespace) -> StateCodec:
    ring = KeyRing.from_json(Path(args.keys).read_text(encoding="utf-8")) if args.keys else KeyRing.generate()
    return StateCodec(
        ring, mode=args.mode, ttl=args.ttl, replay=store_from_url(args.replay), namespace=SERVER_NAME
    )


async def serve_http(app: Any, host: str, port: int) -> None:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        bound = sock.getsockname()[1]
        print(f"READY http://{host}:{bound}/mcp", flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", choices=sorted(FLAVORS), default="mcpserver")
    parser.add_argument("--transport", choices=["http", "stdio"], default="http")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--keys", help="key ring JSON file shared by all instances (default: a fresh key)")
    parser.add_argument("--replay", default="memory:", help="replay store URL, e.g. sqlite:/path/replay.db")
    parser.add_argument("--mode", choices=["sign", "encrypt"], default="encrypt")
    parser.add_argument("--ttl", type=int, default=600, help="token lifetime in seconds")
    parser.add_argument(
        "--instance", default="A", help="a label for this instance, shown in logs and results"
    )
    parser.add_argument("--no-auth", action="store_true", help="HTTP without bearer tokens")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    codec = make_codec(args)
    http_app, stdio = FLAVORS[args.flavor](
        codec, args.instance, auth=args.transport == "http" and not args.no_auth
    )
    # After the servers are built: MCPServer and FastMCP configure logging themselves.
    # Logs go to stderr (stdout is the protocol under stdio).
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        force=True,
        format=f"[{args.instance}] %(levelname)s %(name)s: %(message)s",
    )
    if args.transport == "stdio":
        asyncio.run(stdio())
    else:
        asyncio.run(serve_http(http_app(), args.host, args.port))


if __name__ == "__main__":
    main()
