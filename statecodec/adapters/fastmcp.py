"""Protect a FastMCP (4.2+) server in one line: ``protect(server, codec)``.

FastMCP builds on the ``mcp`` SDK: its low-level server (``server._mcp_server``, a
subclass of the SDK's ``Server``) carries the SDK middleware chain, where FastMCP
installs the SDK's ``RequestStateBoundary`` after its own bridge middleware. FastMCP's
own middleware (``server.add_middleware``) runs later, at the handler layer, and can
observe or refuse a call but cannot change what a tool reads from
``ctx.request_state``: so the statecodec middleware goes into the SDK chain, in the
boundary's place, exactly as for ``mcp`` servers.
"""

from __future__ import annotations

from typing import Any, Unpack

from .._extras import missing_extra

try:
    from fastmcp import FastMCP
    from fastmcp.server.dependencies import get_access_token
    from mcp.server.lowlevel import Server
except ModuleNotFoundError as _exc:
    raise (missing_extra(_exc, "fastmcp", __name__) or _exc) from None

from .. import boundary
from .._codec import StateCodec
from .mcp import (
    AudienceFn,
    Context,
    Settings,
    StateCodecMiddleware,
    _sdk_chain,
    _version,
    install,
    service_audience,
)
from .sdk_window import SDKStateWindow

__all__ = ["authenticated_principal", "protect"]


def authenticated_principal(ctx: Context) -> str | None:
    """The default principal: FastMCP's authenticated access token, or ``None``.

    FastMCP reads the token from the current HTTP request before the SDK's context
    variable (fresher after a token refresh); the principal string is the same
    ``[client_id, issuer, subject]`` as :func:`statecodec.adapters.mcp.authenticated_principal`.
    """
    token = get_access_token()
    if token is None:
        return None
    issuer = (token.claims or {}).get("iss")
    return boundary.principal_string(token.client_id, None if issuer is None else str(issuer), token.subject)


def protect(
    server: FastMCP[Any],
    codec: StateCodec,
    *,
    audience: str | AudienceFn | None = None,
    sdk_window: SDKStateWindow | None = None,
    **settings: Unpack[Settings],
) -> StateCodecMiddleware:
    """Seal and verify every ``requestState`` of a FastMCP ``server`` with ``codec``.

    Same behaviour and parameters as :func:`statecodec.adapters.mcp.protect` (flows chain
    automatically; ``retry_after`` paces requestState-only rounds, ``max_hold`` bounds the
    wait of an early retry, ``max_holds`` and ``max_holds_per_token`` how many are held;
    ``sdk_window`` accepts the tokens of FastMCP's own ``request_state_security`` for a
    bounded migration window); the default ``principal`` is FastMCP's
    :func:`authenticated_principal`. Name the
    server (``FastMCP("deploy")``) or pass ``audience``: an unnamed FastMCP gets a random
    name per process, so its tokens would never verify on another instance; it is
    refused with ``ValueError``, as an unnamed ``MCPServer`` is.
    """
    if not isinstance(server, FastMCP):
        raise TypeError(f"protect() takes a FastMCP server, not {type(server).__name__}")
    lowlevel = _lowlevel(server)
    settings.setdefault("principal", authenticated_principal)
    middleware = StateCodecMiddleware(
        codec,
        audience=service_audience(lowlevel.name, not _named(server), audience),
        sdk_window=None if sdk_window is None else sdk_window.for_server(lowlevel.name, codec),
        **settings,
    )
    install(_sdk_chain(lowlevel), middleware)
    return middleware


def _lowlevel(server: FastMCP[Any]) -> Server[Any]:
    """FastMCP's low-level SDK server, or a clear error now if this FastMCP hides it elsewhere.

    FastMCP exposes no public handle to the SDK middleware chain, only the private
    ``_mcp_server``: a release that moves it makes :func:`protect` fail here, when the
    server is assembled, not on a request. tests/core/test_seams.py forces that case.
    """
    lowlevel = getattr(server, "_mcp_server", None)
    if not isinstance(lowlevel, Server):
        raise RuntimeError(
            f"this FastMCP ({_version('fastmcp')}) keeps no mcp lowlevel Server in server._mcp_server: "
            "statecodec.adapters.fastmcp cannot reach its SDK middleware chain. Install the fastmcp "
            "versions statecodec supports, or put statecodec.adapters.asgi.RequestStateMiddleware "
            "in front of server.http_app() instead."
        )
    return lowlevel


def _named(server: FastMCP[Any]) -> bool:
    # FastMCP names an unnamed server "FastMCP-<random>" (generate_name); a user name
    # could in theory look alike (and is then asked for audience=, which costs nothing).
    return not server.name.startswith(f"{type(server).__name__}-")
