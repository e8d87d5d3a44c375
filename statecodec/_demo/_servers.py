"""The deploy server in the three ways to write an MCP server in Python, protected in one line.

Each builder takes a :class:`~statecodec.StateCodec`, an instance label (shown in logs and
results) and the service name (the default audience), and returns how to serve it. The
tool is the same everywhere (:func:`._scenario.handle`); only the framework differs.
FastMCP is an optional extra, imported only by :func:`build_fastmcp`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from .._codec import StateCodec
from ..adapters import mcp as mcp_adapter
from ._scenario import (
    SERVER_NAME,
    STAGING_TOOL,
    TOOL,
    TOOL_DESCRIPTION,
    TOOL_SCHEMA,
    DeployServer,
    StaticVerifier,
    auth_settings,
    handle,
)

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def lowlevel_server(
    instance: str, *, name: str = SERVER_NAME, on_issued: Callable[[str | None], None] | None = None
) -> Server[Any]:
    """The deploy tool on an ``mcp.server.lowlevel.Server``, handlers by hand, unprotected.

    ``on_issued(state)`` sees every ``requestState`` the tool issues (examples/unprotected_server.py
    records them).
    """

    async def list_tools(ctx: ServerRequestContext[Any], params: Any) -> types.ListToolsResult:
        tool = types.Tool(name=TOOL, description=TOOL_DESCRIPTION, input_schema=TOOL_SCHEMA)
        return types.ListToolsResult(tools=[tool])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        if params.name != TOOL:
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {params.name}")
        version = str((params.arguments or {}).get("version"))
        outcome = handle(version, params.request_state, params.input_responses, instance)
        if on_issued is not None and isinstance(outcome, types.InputRequiredResult):
            on_issued(outcome.request_state)
        return outcome

    return Server(name, on_list_tools=list_tools, on_call_tool=call_tool)


def build_lowlevel(
    codec: StateCodec, instance: str, *, auth: bool, name: str = SERVER_NAME, log_level: LogLevel = "INFO"
) -> DeployServer:
    """:func:`lowlevel_server` protected; it configures no logging (``log_level`` unused)."""
    server = lowlevel_server(instance, name=name)
    mcp_adapter.protect(server, codec)

    def http_app() -> Any:
        if not auth:
            return server.streamable_http_app()
        return server.streamable_http_app(auth=auth_settings(), token_verifier=StaticVerifier())

    async def stdio() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    return DeployServer(http_app, stdio)


def build_mcpserver(
    codec: StateCodec,
    instance: str,
    *,
    auth: bool,
    name: str = SERVER_NAME,
    log_level: LogLevel = "INFO",
    boundary: Literal["statecodec", "sdk"] = "statecodec",
    staging_tool: bool = False,
) -> DeployServer:
    """``mcp.server.mcpserver.MCPServer``: a decorated tool. It configures root logging at ``log_level``.

    For comparisons (``statecodec probe``): ``boundary="sdk"`` leaves the SDK's own requestState
    boundary (AES-GCM under a key made per process, no single use) in place of statecodec, and
    ``staging_tool`` adds ``deploy_staging``, the same flow under another name, so a state can
    be sent to another tool.
    """
    if auth:
        server: MCPServer[Any] = MCPServer(
            name, token_verifier=StaticVerifier(), auth=auth_settings(), log_level=log_level
        )
    else:
        server = MCPServer(name, log_level=log_level)

    @server.tool(name=TOOL, description=TOOL_DESCRIPTION)
    async def deploy_production(
        version: str, ctx: Context
    ) -> types.CallToolResult | types.InputRequiredResult:
        return handle(version, ctx.request_state, ctx.input_responses, instance)

    if staging_tool:

        @server.tool(name=STAGING_TOOL, description="Deploy a release to staging")
        async def deploy_staging(
            version: str, ctx: Context
        ) -> types.CallToolResult | types.InputRequiredResult:
            return handle(version, ctx.request_state, ctx.input_responses, instance)

    if boundary == "statecodec":
        mcp_adapter.protect(server, codec)  # replaces the boundary MCPServer installed with a per-process key
    return DeployServer(server.streamable_http_app, server.run_stdio_async)


def build_fastmcp(
    codec: StateCodec, instance: str, *, auth: bool, name: str = SERVER_NAME, log_level: LogLevel = "INFO"
) -> DeployServer:
    """FastMCP 4.2+ (the ``fastmcp`` extra); ``log_level`` unused."""
    # A module of its own: FastMCP resolves the tool's annotations (``fastmcp.Context``)
    # in the module's globals, so fastmcp must be imported at the top of one.
    from ._fastmcp import build  # noqa: PLC0415 - an optional extra, needed by this flavour only

    return build(codec, instance, auth=auth, name=name)


Builder = Callable[..., DeployServer]
FLAVORS: dict[str, Builder] = {
    "lowlevel": build_lowlevel,
    "mcpserver": build_mcpserver,
    "fastmcp": build_fastmcp,
}
