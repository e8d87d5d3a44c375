"""An ASGI application that forwards every HTTP request to one upstream, streaming both ways.

It knows nothing about MCP or tokens: :class:`~statecodec.adapters.asgi.RequestStateMiddleware`
wraps it. What it does is what any careful reverse proxy does: drop hop-by-hop headers
(RFC 9110 section 7.6.1, including those named by ``Connection``), pass every other
header on (``Authorization``, ``Mcp-Session-Id``, ``MCP-Protocol-Version``, ``Last-Event-ID``),
add ``X-Forwarded-*``, stream the response chunk by chunk, stop reading the upstream
when the client goes away, and turn an unreachable or slow upstream into a 502 or 504
with a JSON-RPC error body.

The upstream client is aiohttp's: its response parser is compiled (llhttp), and on the
proxy's benchmark it costs a fifth of the instructions of httpx per request
(docs/performance.md). Choices that serve the middleware and the clients behind one
proxy:

- the upstream is always asked for ``identity`` encoding (a compressed response could
  not be inspected, and on loopback compression buys nothing), and nothing is
  decompressed on the way: the bytes are relayed as the upstream sent them;
- no cookie jar: a ``Set-Cookie`` answered to one client is never sent upstream with
  another client's request (a shared client with a jar would do exactly that);
- proxy environment variables are ignored (``trust_env=False``), so no ``HTTPS_PROXY``
  setting can silently route tokens elsewhere, and redirects are relayed, not followed;
- no header the client did not send is added but ``Host``, ``Accept-Encoding``,
  ``Content-Length`` and ``X-Forwarded-*`` (no client ``User-Agent``, ``Accept`` or
  ``Content-Type`` of its own).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import anyio
import yarl

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
    {b"host", b"accept-encoding", b"expect", b"x-forwarded-host", b"x-forwarded-proto", b"x-forwarded-for"}
)
_DROPPED_REQUEST: Final = HOP_BY_HOP | _REPLACED_REQUEST
# aiohttp would add these when the client did not send them; a proxy adds nothing.
_NOT_ADDED: Final = ("User-Agent", "Accept", "Content-Type")
# Below Node's default keep-alive timeout (5 s): an idle connection is dropped here before
# the upstream closes it, so a request is never written into a connection being closed.
_KEEPALIVE_SECONDS: Final = 4.0


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds toward the upstream.

    ``connect`` bounds opening a connection and ``pool`` waiting for a free one (aiohttp
    counts them together). ``write`` bounds sending the request: the request must be
    sent and its answer started within ``write`` + ``read`` seconds. ``read`` bounds the
    silence before the answer and between two of its chunks, so an SSE stream stays open
    as long as the upstream sends something (events or keep-alives).
    """

    connect: float = 10.0
    read: float = 300.0
    write: float = 30.0
    pool: float = 10.0

    def aiohttp(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=None, connect=self.pool + self.connect, sock_connect=self.connect, sock_read=self.read
        )


class _ClientGone(Exception):  # noqa: N818 - control flow
    pass


# What reading an answer's body raises when the upstream breaks off: aiohttp's errors, a
# silent read timeout, and the RuntimeError its stream raises once the connection is gone.
_BROKEN: Final = (aiohttp.ClientError, TimeoutError, RuntimeError)


def _request_headers(headers: list[tuple[bytes, bytes]]) -> tuple[list[tuple[str, str]], bytes | None, bytes]:
    """The headers to send upstream, the client's ``Host``, and its ``X-Forwarded-For`` chain.

    One pass over the client's headers: hop-by-hop ones (and those ``Connection`` names)
    and the ones this proxy sets itself are dropped, the rest kept in order.
    """
    dropped = _DROPPED_REQUEST
    for name, value in headers:
        if name.lower() == b"connection":  # rare: it names more hop-by-hop headers
            dropped = dropped | {token.strip().lower() for token in value.split(b",")}
    kept: list[tuple[str, str]] = []
    host: bytes | None = None
    chain: list[bytes] = []
    for name, value in headers:
        lower = name.lower()
        if lower not in dropped:
            kept.append((name.decode("latin-1"), value.decode("latin-1")))
        elif lower == b"host":
            host = host or value
        elif lower == b"x-forwarded-for":
            chain.append(value)
    return kept, host, b", ".join(chain)


def _response_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    named = [value for name, value in headers if name.lower() == b"connection"]
    dropped = HOP_BY_HOP
    if named:
        dropped = dropped | {token.strip().lower() for value in named for token in value.split(b",")}
    return [(name, value) for name, value in headers if name.lower() not in dropped]


async def _error(send: Send, status: int, message: str) -> None:
    body = dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": message}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class UpstreamApp:
    """Forward to ``upstream`` (its scheme, host and port; each request keeps its own path).

    :param upstream: for example ``http://127.0.0.1:9000/mcp``.
    :param connector: an aiohttp connector, for tests or unusual networking (a Unix
        socket); by default a TCP pool of ``max_connections``.
    """

    def __init__(
        self,
        upstream: str,
        *,
        timeouts: Timeouts = Timeouts(),
        max_connections: int = 100,
        connector: aiohttp.BaseConnector | None = None,
    ) -> None:
        try:
            url = yarl.URL(upstream)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the upstream {upstream!r} is not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"the upstream must be an http:// or https:// URL with a host, not {upstream!r}")
        if url.user is not None or url.password is not None:
            raise ValueError("the upstream URL must not carry credentials")
        self.upstream = url
        self.timeouts = timeouts
        self.max_connections = max_connections
        self._origin = str(url.origin())
        self._connector = connector
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"UpstreamApp({str(self.upstream)!r})"

    @property
    def session(self) -> aiohttp.ClientSession:
        """The connection pool; created on first use, inside the running event loop."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=self._connector
                or aiohttp.TCPConnector(
                    limit=self.max_connections, limit_per_host=0, keepalive_timeout=_KEEPALIVE_SECONDS
                ),
                timeout=self.timeouts.aiohttp(),
                auto_decompress=False,
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=_NOT_ADDED,
                requote_redirect_url=False,
            )
        return self._session

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._forward(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1003})  # MCP does not use WebSockets

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _ = self.session
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _url(self, scope: Scope) -> yarl.URL:
        query = scope.get("query_string", b"")
        target = request_path(scope) + (b"?" + query if query else b"")  # the path the middleware decided on
        return yarl.URL(self._origin + target.decode("latin-1"), encoded=True)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers, host, chain = _request_headers(list(scope.get("headers", ())))
        headers.append(("Accept-Encoding", "identity"))
        if host is not None:
            headers.append(("X-Forwarded-Host", host.decode("latin-1")))
        headers.append(("X-Forwarded-Proto", str(scope.get("scheme", "http"))))
        client = scope.get("client")
        if client:
            address = str(client[0]).encode("latin-1")
            headers.append(
                ("X-Forwarded-For", (chain + b", " + address if chain else address).decode("latin-1"))
            )
        body = await _Body.read(receive)
        if body is None:
            return  # the client went away while sending
        if isinstance(body.data, bytes):  # aiohttp sets the length of what is really sent
            headers = [(name, value) for name, value in headers if name.lower() != "content-length"]
        try:
            async with asyncio.timeout(self.timeouts.write + self.timeouts.read):
                response = await self.session.request(
                    scope["method"], self._url(scope), headers=headers, data=body.data, allow_redirects=False
                )
        except TimeoutError as exc:
            if body.gone:
                return
            logger.warning("statecodec proxy: upstream timed out (%s)", type(exc).__name__)
            await _error(send, 504, "Upstream timed out")
            return
        except aiohttp.ClientError as exc:
            if body.gone:
                return
            logger.warning("statecodec proxy: upstream unavailable (%s)", type(exc).__name__)
            await _error(send, 502, "Upstream unavailable")
            return
        complete = False
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": _response_headers(response.raw_headers),
                }
            )
            complete = await _relay(response, receive, send)
        finally:
            if complete:
                response.release()  # the connection goes back to the pool
            else:
                response.close()


class _Body:
    """The request body for aiohttp: bytes when it came in one message (the middleware's
    case), else a stream; ``gone`` tells whether the client left while sending it."""

    __slots__ = ("data", "gone")

    def __init__(self) -> None:
        self.data: bytes | AsyncIterator[bytes] | None = None
        self.gone = False

    @classmethod
    async def read(cls, receive: Receive) -> _Body | None:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body = cls()
        first: bytes = message.get("body", b"")
        if message.get("more_body", False):
            body.data = body._stream(first, receive)
        else:
            body.data = first or None
        return body

    async def _stream(self, first: bytes, receive: Receive) -> AsyncIterator[bytes]:
        if first:
            yield first
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                raise _ClientGone
            chunk = message.get("body", b"")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                return


async def _relay(response: aiohttp.ClientResponse, receive: Receive, send: Send) -> bool:
    """Relay the body; True when it was relayed whole.

    An answer that is complete in its first read (a JSON answer) is sent as it is; one
    that goes on (an SSE stream) is relayed chunk by chunk while the client is watched,
    so the upstream is not read for nobody once the client has gone.
    """
    content = response.content
    try:
        chunk = await content.readany()
    except _BROKEN as exc:
        _broke_off(exc)
        return False
    if content.at_eof():
        await send({"type": "http.response.body", "body": chunk, "more_body": False})
        return True
    complete = False
    async with anyio.create_task_group() as group:

        async def relay() -> None:
            nonlocal complete
            more = chunk
            while more:
                await send({"type": "http.response.body", "body": more, "more_body": True})
                try:
                    more = await content.readany()  # b"" at the end of the body
                except _BROKEN as exc:
                    _broke_off(exc)
                    break
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                complete = True
            group.cancel_scope.cancel()

        async def watch() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    group.cancel_scope.cancel()  # stop reading the upstream for nobody
                    return

        group.start_soon(relay)
        group.start_soon(watch)
    return complete


def _broke_off(exc: BaseException) -> None:
    # The response is left unfinished: the server then drops the connection, and the
    # client sees a truncated response instead of a complete-looking one.
    logger.warning("statecodec proxy: upstream stream broke off (%s)", type(exc).__name__)
