"""FastMCP servers the adapter tests build in process (the real SDK, nothing mocked).

Apart from fixtures_mcp.py so that only the tests that use FastMCP import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types
from fastmcp import Context, FastMCP


def deploy_server(plan: Callable[[str], str] | None = None) -> tuple[FastMCP[Any], list[str | None]]:
    """A FastMCP server "deploy" with one tool, ``deploy(version)``, and the states that tool saw, in order.

    Without a state the tool asks for input with the state ``plan(version)`` (with no ``plan``, it never
    asks); with one it answers ``EXECUTED <state>``.
    """
    server: FastMCP[Any] = FastMCP("deploy")
    seen: list[str | None] = []

    @server.tool
    async def deploy(version: str, ctx: Context) -> Any:
        seen.append(ctx.request_state)
        if ctx.request_state is None and plan is not None:
            return types.InputRequiredResult(request_state=plan(version))
        return f"EXECUTED {ctx.request_state}"

    return server, seen
