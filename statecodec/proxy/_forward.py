"""An ASGI application that forwards every HTTP request to one upstream, streaming both ways.

It knows nothing about MCP or tokens: :class:`~statecodec.adapters.asgi.RequestStateMiddleware`
wraps it. What it does is what any careful reverse proxy does: drop hop-by-hop headers
(RFC 9110 section 7.6.1, including those named by ``Connection``), pass every other
header on (``Authorization``, ``Mcp-Session-Id``, ``MCP-Protocol-Version``, ``Last-Event-ID``),
add ``X-Forwarded-*``, stream the response chunk by chunk, stop reading the upstream
when the client goes away, and turn an unreachable or slow upstream into a 502 or 504
with a JSON-RPC error body.

Two choices serve the middleware: the upstream is always asked for ``identity``
encoding (a compressed response could not be inspected, and on loopback compression buys
nothing), and the httpx client ignores proxy environment variables (``trust_env=False``),
so no ``HTTPS_PROXY`` setting can silently route tokens elsewhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx

from .. import _telemetry
from ..adapters.asgi import Message, Receive, Scope, Send, dumps, request_path

logger = logging.getLogger("statecodec.proxy")

#: RFC 9110 section 7.6.1, plus the non-standard Proxy-Connection still sent by some clients.
HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Set by this proxy, never copied from the client. ``Expect: 100-continue`` was the
# client's question to this server, which has answered it by reading the body.
_REPLACED_REQUEST: Final = frozenset(
    {b"host", b"accept-encoding", b"expect", b"x-forwarded-host", b"x-forwarded-proto"}
)


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds toward the upstream. ``read`` bounds the silence between two chunks, so an
    SSE stream stays open as long as the upstream sends something (events or keep-alives)."""

    connect: float = 10.0
    read: float = 300.0
    write: float = 30.0
    pool: float = 10.0

    def httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect, read=self.read, write=self.write, pool=self.pool)


class _ClientGone(Exception):  # noqa: N818 - control flow
    pass


def _hop_by_hop(headers: list[tuple[bytes, bytes]]) -> frozenset[bytes]:
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    return HOP_BY_HOP | named


def _forwardable(
    headers: list[tuple[bytes, bytes]], also: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    dropped = _hop_by_hop(headers) | also
    return [(name, value) for name, value in headers if name.lower() not in dropped]


async def _error(send: Send, status: int, message: str) -> None:
    body = dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": message}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class UpstreamApp:
    """Forward to ``upstream`` (its scheme, host and port; each request keeps its own path).

    :param upstream: for example ``http://127.0.0.1:9000/mcp``.
    :param transport: an httpx transport, for tests or unusual networking.
    """

    def __init__(
        self,
        upstream: str,
        *,
        timeouts: Timeouts = Timeouts(),
        max_connections: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        url = httpx.URL(upstream)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"the upstream must be an http:// or https:// URL with a host, not {upstream!r}")
        if url.userinfo:
            raise ValueError("the upstream URL must not carry credentials")
        self.upstream = url
        self.timeouts = timeouts
        self.max_connections = max_connections
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"UpstreamApp({str(self.upstream)!r})"

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.timeouts.httpx(),
                limits=httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=20),
                follow_redirects=False,
                trust_env=False,
                transport=self._transport,
            )
        return self._client

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._forward(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1003})  # MCP does not use WebSockets

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _ = self.client
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _request(self, scope: Scope, receive: Receive) -> httpx.Request:
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))
        host = next((value for name, value in headers if name.lower() == b"host"), None)
        out = _forwardable(headers, _REPLACED_REQUEST)
        out.append((b"accept-encoding", b"identity"))
        if host is not None:
            out.append((b"x-forwarded-host", host))
        out.append((b"x-forwarded-proto", str(scope.get("scheme", "http")).encode("latin-1")))
        client = scope.get("client")
        if client:
            out = _append_forwarded_for(out, str(client[0]))
        raw_path = request_path(scope)  # the path the middleware decided on
        query = scope.get("query_string", b"")
        target = raw_path + (b"?" + query if query else b"")
        url = self.upstream.copy_with(raw_path=target)
        chunked = any(name.lower() == b"transfer-encoding" for name, _ in headers)
        length = next((value for name, value in headers if name.lower() == b"content-length"), None)
        has_body = chunked or (length is not None and length.strip() not in (b"", b"0"))
        content = _body(receive) if has_body else None
        return self.client.build_request(scope["method"], url, headers=out, content=content)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await self.client.send(self._request(scope, receive), stream=True)
        except _ClientGone:
            return
        except httpx.TimeoutException as exc:
            _telemetry.record_upstream_error("timeout")
            logger.warning(
                "upstream timed out (%s)",
                type(exc).__name__,
                extra=_telemetry.fields("upstream_error", kind="timeout", status=504),
            )
            await _error(send, 504, "Upstream timed out")
            return
        except httpx.HTTPError as exc:
            _telemetry.record_upstream_error("unreachable")
            logger.warning(
                "upstream unavailable (%s)",
                type(exc).__name__,
                extra=_telemetry.fields(
                    "upstream_error", kind="unreachable", status=502, detail=type(exc).__name__
                ),
            )
            await _error(send, 502, "Upstream unavailable")
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": _forwardable(list(response.headers.raw)),
                }
            )
            await _stream(response, receive, send)
        finally:
            await response.aclose()


def _append_forwarded_for(headers: list[tuple[bytes, bytes]], client: str) -> list[tuple[bytes, bytes]]:
    previous = [value for name, value in headers if name.lower() == b"x-forwarded-for"]
    kept = [(name, value) for name, value in headers if name.lower() != b"x-forwarded-for"]
    chain = b", ".join([*previous, client.encode("latin-1")])
    return [*kept, (b"x-forwarded-for", chain)]


async def _body(receive: Receive) -> Any:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return


async def _stream(response: httpx.Response, receive: Receive, send: Send) -> None:
    """Relay the body chunk by chunk until it ends or the client disconnects."""
    async with anyio.create_task_group() as group:

        async def relay() -> None:
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError as exc:
                # Leave the response unfinished: the server then drops the connection, and
                # the client sees a truncated response instead of a complete-looking one.
                _telemetry.record_upstream_error("broken")
                logger.warning(
                    "upstream stream broke off (%s)",
                    type(exc).__name__,
                    extra=_telemetry.fields("upstream_error", kind="broken", detail=type(exc).__name__),
                )
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            group.cancel_scope.cancel()

        async def watch() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    group.cancel_scope.cancel()  # stop reading the upstream for nobody
                    return

        group.start_soon(relay)
        group.start_soon(watch)
