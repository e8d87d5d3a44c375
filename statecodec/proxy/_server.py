"""Assemble the proxy (middleware around the forwarder) and run it under uvicorn.

Served by uvicorn on uvloop with httptools' parser when they are installed (the ``proxy``
extra installs both): on the proxy benchmark they serve a request for much less than
pure-Python asyncio does (docs/performance.md). :func:`event_loop_factory` is what
the CLI runs its loop with; without uvloop it is asyncio's own.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Final

import uvicorn

from .._serving import quiet_config, serve_announcing
from ..adapters.asgi import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_JUDGED_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    ASGIApp,
    RequestStateMiddleware,
)
from ..boundary import BoundaryOptions
from ._forward import Timeouts, UpstreamApp
from ._guard import ClientLimits, Guard, default_max_connections, guarded_protocol
from ._hosts import HostGuard, HostPolicy
from ._metered import MeteredApp

logger = logging.getLogger("statecodec.proxy")
_DEFAULT_CLIENTS: Final = ClientLimits()


@dataclass(frozen=True)
class ProxyOptions:
    """Everything about the proxy: the boundary's options, and the forwarding's.

    ``boundary`` is the one :class:`~statecodec.boundary.BoundaryOptions` every adapter
    takes (codec, audience, ``principal(scope, headers)``, pacing, holds), validated once
    when it was built and handed to the middleware as it is; the proxy adds only what
    forwarding needs. A proxy needs an audience (the protected service's name): a
    ``ValueError`` here without one, before anything serves.
    """

    upstream: str
    boundary: BoundaryOptions
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    max_judged_bytes: int = DEFAULT_MAX_JUDGED_BYTES
    timeouts: Timeouts = field(default_factory=Timeouts)
    max_connections: int = 100
    max_streams: int = 100
    max_streams_per_client: int = 10
    passthrough_paths: Collection[str] = ()
    #: The Host and Origin values answered (DNS-rebinding protection); by default loopback's.
    hosts: HostPolicy = field(default_factory=HostPolicy.loopback)

    def __post_init__(self) -> None:
        if not self.boundary.audience:
            raise ValueError("the proxy needs an audience (the protected service's name)")


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop factory when uvloop is installed, else None (asyncio's default)."""
    if importlib.util.find_spec("uvloop") is None:
        return None
    import uvloop  # noqa: PLC0415 - optional, and only for the process that serves

    return uvloop.new_event_loop


def build_proxy(options: ProxyOptions) -> ASGIApp:
    """The proxy as one ASGI application: ``RequestStateMiddleware(UpstreamApp(upstream))``.

    Serve it with any ASGI server; its lifespan opens and closes the upstream connection
    pool. Every answer is counted (:class:`~statecodec.proxy._metered.MeteredApp`). The
    ``Host`` and ``Origin`` check (:class:`~statecodec.proxy._hosts.HostGuard`) runs first,
    so a refused request is never judged and never consumes a token.
    """
    upstream = UpstreamApp(
        options.upstream,
        timeouts=options.timeouts,
        max_connections=options.max_connections,
        max_streams=options.max_streams,
        max_streams_per_client=options.max_streams_per_client,
    )
    middleware = RequestStateMiddleware.from_options(
        upstream,
        options.boundary,
        max_body_bytes=options.max_body_bytes,
        max_response_bytes=options.max_response_bytes,
        max_judged_bytes=options.max_judged_bytes,
        passthrough_paths=options.passthrough_paths,
    )
    return MeteredApp(HostGuard(middleware, options.hosts))


async def serve(
    app: ASGIApp,
    sock: socket.socket,
    *,
    graceful_timeout: int = 30,
    limit_concurrency: int | None = None,
    clients: ClientLimits = _DEFAULT_CLIENTS,
    upstream_connections: int = 100,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Run ``app`` on ``sock`` until SIGINT/SIGTERM, then drain for ``graceful_timeout`` seconds.

    uvicorn runs as every statecodec server does (:func:`~statecodec._serving.quiet_config`):
    no access log, no logging of its own, no ``Server`` or ``Date`` header of its own.

    Client connections are kept within ``clients`` (:mod:`._guard`): head and body
    deadlines, idle keep-alive connections closed after ``clients.idle_timeout`` (uvicorn's
    ``timeout_keep_alive``), and at most ``clients.max_connections`` connections, by default
    what the open-file limit leaves once ``upstream_connections`` are counted. Raises
    ``ValueError`` when that limit is too low to serve.
    """
    guard = Guard(clients, clients.max_connections or default_max_connections(upstream_connections))
    config = quiet_config(
        app,
        lifespan="on",
        timeout_graceful_shutdown=graceful_timeout,
        limit_concurrency=limit_concurrency,
        http=guarded_protocol(guard),
        timeout_keep_alive=clients.idle_timeout,  # a float works
    )
    sweeper = asyncio.create_task(guard.run(min(0.5, clients.head_timeout / 4, clients.body_timeout / 4)))
    try:
        await serve_announcing(uvicorn.Server(config), sock, on_ready)
    finally:
        sweeper.cancel()
