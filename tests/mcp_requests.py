"""A request as the MCP SDK's runner hands it to server code, for calling a middleware directly.

The adapter tests and benchmarks/bench_protect.py call ``StateCodecMiddleware`` (and the
reference middleware) without a server around it; both build the context the same way.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import ServerRequestContext


def request_context(params: dict[str, Any]) -> ServerRequestContext[Any, Any]:
    """A ``tools/call`` context as the SDK's runner builds it (no session: the middlewares use none)."""
    return ServerRequestContext(
        session=None,  # type: ignore[arg-type]
        lifespan_context={},
        protocol_version="2026-07-28",
        method="tools/call",
        params=params,
        request_id=1,
    )
