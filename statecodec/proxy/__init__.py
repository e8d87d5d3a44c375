"""A reverse proxy that protects any MCP server's ``requestState``, in any language.

``statecodec proxy --upstream http://127.0.0.1:9000/mcp ...`` puts
:class:`~statecodec.adapters.asgi.RequestStateMiddleware` in front of a server that has
no requestState protection of its own (the Go, C#, Java and Kotlin SDKs ship none), so
it gets sealed, bound, expiring, single-use state by deployment alone. docs/proxy.md
describes deployment, options, and what the proxy can and cannot bind.

Needs ``statecodec[proxy]`` (uvicorn, httptools, httpx, PyJWT; uvloop on POSIX).
"""

from .._net import bind_socket
from ._forward import HOP_BY_HOP, Timeouts, UpstreamApp
from ._hosts import HostPolicy
from ._principal import (
    DEFAULT_ALGORITHMS,
    BearerPrincipal,
    JWKSVerifier,
    TokenVerifier,
    Unauthenticated,
    bearer_token,
    header_principal,
    load_hook,
    principal_of,
)
from ._server import ProxyOptions, build_proxy, event_loop_factory, serve
from ._workers import Supervisor

__all__ = [
    "DEFAULT_ALGORITHMS",
    "HOP_BY_HOP",
    "BearerPrincipal",
    "HostPolicy",
    "JWKSVerifier",
    "ProxyOptions",
    "Supervisor",
    "Timeouts",
    "TokenVerifier",
    "Unauthenticated",
    "UpstreamApp",
    "bearer_token",
    "bind_socket",
    "build_proxy",
    "event_loop_factory",
    "header_principal",
    "load_hook",
    "principal_of",
    "serve",
]
