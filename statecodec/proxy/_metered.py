"""Counting the proxy's answers: ``statecodec_proxy_requests_total{code}`` and their duration.

A thin ASGI wrapper around the whole proxy, so neither the middleware nor the forwarder
knows about it. Per request it costs one closure, two clock reads, a counter increment
and a histogram observation (:func:`statecodec._telemetry.record_proxy_request`).

``code`` is the HTTP status sent; ``0`` when no answer was started (the client went away
first). The duration runs from the request's arrival to the end of the answer (for an
event stream, until it closes).
"""

from __future__ import annotations

import time

from .. import _telemetry
from ..adapters.asgi import ASGIApp, Message, Receive, Scope, Send


class MeteredApp:
    """``app``, with every HTTP exchange counted by status code and timed."""

    __slots__ = ("app",)

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __repr__(self) -> str:
        return f"MeteredApp({self.app!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:
            if not status:
                status = 500  # what the server answers for an application that raised
            raise
        finally:
            _telemetry.record_proxy_request(status, time.perf_counter() - started)
