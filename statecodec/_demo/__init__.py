"""The canonical statecodec scenario, shipped so that ``statecodec demo`` runs from a wheel.

``deploy_production(version)`` plans a deployment, asks two questions in one MRTR round
and carries the plan in ``requestState``; the retry deploys that plan, possibly on another
instance. :mod:`._servers` builds it on the lowlevel ``Server``, ``MCPServer`` or FastMCP,
each protected by one ``protect(server, codec)``; ``examples/deploy_server.py`` serves it
from the command line and :mod:`._run` drives it for ``statecodec demo``.

Private: needs the ``mcp`` extra (``fastmcp`` for that flavour) and may change any time.
"""

from ._scenario import (
    CLIENT_ID,
    ISSUER,
    SERVER_NAME,
    TOOL,
    USERS,
    DeployServer,
    StaticVerifier,
    ask,
    call_tool_result,
    finish,
    handle,
    plan_for,
    user_answers,
)
from ._servers import FLAVORS, build_fastmcp, build_lowlevel, build_mcpserver

__all__ = [
    "CLIENT_ID",
    "FLAVORS",
    "ISSUER",
    "SERVER_NAME",
    "TOOL",
    "USERS",
    "DeployServer",
    "StaticVerifier",
    "ask",
    "build_fastmcp",
    "build_lowlevel",
    "build_mcpserver",
    "call_tool_result",
    "finish",
    "handle",
    "plan_for",
    "user_answers",
]
