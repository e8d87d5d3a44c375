"""The deploy server on FastMCP (the ``fastmcp`` extra), imported only for that flavour."""

from __future__ import annotations

from typing import Any

import fastmcp
import mcp_types as types
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
from fastmcp.tools import ToolResult

from .._codec import StateCodec
from ..adapters import fastmcp as fastmcp_adapter
from ._scenario import CLIENT_ID, ISSUER, TOOL, TOOL_DESCRIPTION, USERS, DeployServer, handle


def build(codec: StateCodec, instance: str, *, auth: bool, name: str) -> DeployServer:
    verifier = StaticTokenVerifier(
        tokens={
            token: {"client_id": CLIENT_ID, "sub": user, "iss": ISSUER, "scopes": []}
            for token, user in USERS.items()
        }
    )
    server: fastmcp.FastMCP[Any] = fastmcp.FastMCP(name, auth=verifier if auth else None)

    @server.tool(name=TOOL, description=TOOL_DESCRIPTION)
    async def deploy_production(version: str, ctx: fastmcp.Context) -> Any:
        result = handle(version, ctx.request_state, ctx.input_responses, instance)
        if isinstance(result, types.InputRequiredResult):
            return result
        return ToolResult(content=result.content, structured_content=result.structured_content)

    fastmcp_adapter.protect(server, codec)
    return DeployServer(lambda: server.http_app(path="/mcp"), server.run_stdio_async)
