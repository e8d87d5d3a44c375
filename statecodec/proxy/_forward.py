"""An ASGI application that forwards every HTTP request to one upstream, streaming both ways.

It knows nothing about MCP or tokens: :class:`~statecodec.adapters.asgi.RequestStateMiddleware`
wraps it. What it does is what any careful reverse proxy does: drop hop-by-hop headers
(RFC 9110 section 7.6.1, including those named by ``Connection``), pass every other
header on (``Authorization``, ``Mcp-Session-Id``, ``MCP-Protocol-Version``, ``Last-Event-ID``),
add ``X-Forwarded-*``, stream the response chunk by chunk, stop reading the upstream
when the client goes away, and turn an unreachable or slow upstream into a 502 or 504
with a JSON-RPC error body.

The upstream client is this package's own pool of keep-alive connections
(:mod:`._upstream`), its answers parsed by llhttp through httptools: on the proxy's
benchmark aiohttp's client alone cost more than the proxy's goal per request
(docs/performance.md). Choices that serve the middleware and the clients behind one
proxy:

- the upstream is always asked for ``identity`` encoding, as the middleware asks its
  application (:data:`~statecodec.adapters.asgi.ACCEPT_IDENTITY`: a compressed response
  could not be inspected, and on loopback compression buys nothing), and nothing is
  decompressed on the way: the bytes are relayed as the upstream sent them;
- no cookie jar: a ``Set-Cookie`` answered to one client is never sent upstream with
  another client's request;
- proxy environment variables play no part, so no ``HTTPS_PROXY`` setting can silently
  route tokens elsewhere, and redirects are relayed, not followed;
- the client's ``Host`` is forwarded as sent (the proxy's :class:`~._hosts.HostGuard` has
  checked it), so the upstream's own DNS-rebinding protection judges the same value;
- no header the client did not send is added but ``Accept-Encoding``, ``Content-Length``
  (or ``Transfer-Encoding: chunked``) and ``X-Forwarded-*`` (and ``Host`` when the client
  sent none);
- long-lived streams never take the connections request/response traffic needs: a
  ``GET`` (in MCP, the server's SSE stream) or a ``subscriptions/listen`` request (its
  method read from the body, whatever its headers say: :func:`_opens_stream`) goes
  through a pool of its own, ``max_streams`` connections, and one client address holds
  at most ``max_streams_per_client`` of them (:class:`_Streams`). A stream over either
  bound is refused at once (503, or 429 for a client over its share), logged and counted,
  and never waits: a POST never queues behind a stream, nor a stream behind a POST;
- every error it answers itself is a JSON-RPC error carrying the id of the request it
  read (``null`` only when there is none to read), and every upstream failure is logged
  with the upstream's URL.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import anyio

from .. import _telemetry
from ..adapters import _json
from ..adapters.asgi import (
    ACCEPT_IDENTITY,
    BODY_METHOD,
    FORWARDER_HEADERS,
    Message,
    Receive,
    Scope,
    Send,
    body_length,
    request_path,
)
from ..boundary import INTERNAL_ERROR_CODE, WireError
from ._upstream import Pool, Response, UpstreamError, check_fields
from ._wire import respond_error

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
_REPLACED_REQUEST: Final = FORWARDER_HEADERS | {
    b"host",
    b"expect",
    b"x-forwarded-host",
    b"x-forwarded-proto",
    b"x-forwarded-for",
}
_DROPPED_REQUEST: Final = HOP_BY_HOP | _REPLACED_REQUEST
# SEP-2575's listen request opens a long-lived stream, as MCP's GET does.
_LISTEN: Final = "subscriptions/listen"
_UNREAD: Final = object()  # no method read from the body by the middleware
# Methods that define no meaning for a body: no ``Content-Length: 0`` when there is none.
_BODILESS: Final = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"DELETE", b"CONNECT"})
# Below Node's default keep-alive timeout (5 s): an idle connection is dropped here before
# the upstream closes it, so a request is never written into a connection being closed.
_KEEPALIVE_SECONDS: Final = 4.0


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds toward the upstream.

    ``connect`` bounds opening a connection and ``pool`` waiting for a free one (when
    ``max_connections`` are in use). ``write`` bounds sending a streamed request body. ``read``
    bounds the silence before the answer and between two of its chunks, so an SSE stream
    stays open as long as the upstream sends something (events or keep-alives).
    """

    connect: float = 10.0
    read: float = 300.0
    write: float = 30.0
    pool: float = 10.0


class _ClientGone(Exception):  # noqa: N818 - control flow
    pass


class _Streams:
    """Slots for long-lived streams: ``total`` at once, ``per_client`` for one client address.

    The client is the peer address: behind a load balancer that hides it, every client is
    one, so give such a deployment ``per_client == total``.
    """

    __slots__ = ("by_client", "open", "per_client", "total")

    def __init__(self, total: int, per_client: int) -> None:
        if total < 1 or per_client < 1:
            raise ValueError("max_streams and max_streams_per_client must be at least 1")
        self.total = total
        self.per_client = min(per_client, total)
        self.open = 0
        self.by_client: dict[str, int] = {}

    def take(self, client: str) -> str | None:
        """A slot for ``client``, or the reason there is none (a shed reason)."""
        if self.open >= self.total:
            return "stream_limit"
        held = self.by_client.get(client, 0)
        if held >= self.per_client:
            return "stream_client_limit"
        self.open += 1
        self.by_client[client] = held + 1
        return None

    def give(self, client: str) -> None:
        self.open -= 1
        held = self.by_client.pop(client) - 1
        if held:
            self.by_client[client] = held


# What reading an answer's body raises when the upstream breaks off: the connection's
# errors and a silent read timeout.
_BROKEN: Final = (UpstreamError, OSError, TimeoutError)


class _RequestHeaders:
    """The client's headers as sent upstream, with what this proxy sets itself taken out.

    One pass: hop-by-hop headers (and those ``Connection`` names) and the ones this proxy
    replaces are dropped, the rest kept in order, as bytes.
    """

    __slots__ = ("chain", "host", "kept", "length")

    def __init__(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        kept: list[tuple[bytes, bytes]] = []
        keep = kept.append  # looked up once: this loop runs for every header of every request
        host: bytes | None = None
        self.length: bytes | None = None
        chain: list[bytes] = []
        named: set[bytes] | None = None
        for header in headers:
            lower = header[0].lower()
            if lower not in _DROPPED_REQUEST:
                keep(header)
            elif lower == b"host":
                host = host or header[1]
            elif lower == b"x-forwarded-for":
                chain.append(header[1])
            elif lower == b"content-length":
                self.length = header[1]
            elif lower == b"connection":
                named = _named(header[1], named)
        if named:
            kept = [(name, value) for name, value in kept if name.lower() not in named]
        self.kept = kept
        self.host = host
        self.chain = b", ".join(chain)


def _named(value: bytes, named: set[bytes] | None) -> set[bytes] | None:
    """``named`` with the header names a ``Connection`` value adds to the hop-by-hop ones.

    ``keep-alive`` (the usual value) and ``close`` name nothing that is not dropped already,
    so the headers are filtered a second time only for a value naming something else.
    """
    if value.lower() == b"keep-alive":
        return named
    tokens = {token.strip().lower() for token in value.split(b",")} - HOP_BY_HOP
    if not tokens:
        return named
    return tokens if named is None else named | tokens


def _response_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    kept: list[tuple[bytes, bytes]] = []
    named: set[bytes] | None = None
    for name, value in headers:
        lower = name.lower()
        if lower not in HOP_BY_HOP:
            kept.append((name, value))
        elif lower == b"connection":
            named = _named(value, named)
    if named:
        return [(name, value) for name, value in kept if name.lower() not in named]
    return kept


def _opens_stream(scope: Scope, body: bytes | AsyncIterator[bytes]) -> bool:
    """Whether a request opens a long-lived stream: a ``GET``, or a ``subscriptions/listen`` POST.

    The method is the body's: a header may say anything (the middleware refuses an
    ``Mcp-Method`` that disagrees with the body, and no header is needed at all). Behind
    the middleware, the method it read from the body (:data:`BODY_METHOD`, set by the
    server's scope, never by a client) decides without a second read. Otherwise only a
    body that may name the method is parsed: one holding ``subscriptions/listen`` as written,
    or a ``\\/`` or ``\\u`` escape (``subscriptions\\/listen`` and ``\\u006c`` spell it too).
    A body that comes in pieces is not read ahead: behind the middleware a body always comes
    whole.
    """
    method = scope["method"]
    if method == "GET":
        return True
    if method != "POST" or not isinstance(body, bytes):
        return False
    extensions = scope.get("extensions")
    read: object = extensions.get(BODY_METHOD, _UNREAD) if extensions else _UNREAD
    if read is not _UNREAD:
        return read == _LISTEN
    # find, not `in` (which tries an int first). Only \u and \/ can spell the method's
    # letters or its slash (\" and \\ are common, in states that hold JSON): the backslash
    # first, a one-byte search at memchr's speed, and the method's bytes as written last, a
    # long needle quickly skipped.
    escaped = body.find(b"\\") != -1 and (body.find(b"\\u") != -1 or body.find(b"\\/") != -1)
    if not escaped and body.find(b"subscriptions/listen") == -1:
        return False
    message = _message(body)
    items = message if isinstance(message, list) else [message]
    return any(isinstance(item, dict) and item.get("method") == _LISTEN for item in items)


def _message(body: bytes) -> Any:
    """The JSON in a request body as the most lenient server reads it, or None."""
    try:
        return _json.read_answer(_json.decode_answer(body))
    except ValueError:
        return None  # no server reads a method in it either


def _request_id(body: bytes | AsyncIterator[bytes] | None) -> object:
    """The JSON-RPC id of the request in ``body``, for the errors this proxy answers; None if none."""
    if not isinstance(body, bytes) or not body:
        return None
    message = _message(body)
    request_id = message.get("id") if isinstance(message, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | float):
        return None  # not an id JSON-RPC allows: answered as a request without one
    return request_id


async def _error(send: Send, status: int, message: str, body: bytes | AsyncIterator[bytes] | None) -> None:
    error = WireError(INTERNAL_ERROR_CODE, message, status=status)
    await respond_error(send, _request_id(body), error)


class UpstreamApp:
    """Forward to ``upstream`` (its scheme, host and port; each request keeps its own path).

    :param upstream: for example ``http://127.0.0.1:9000/mcp``.
    :param max_connections: the most connections open to the upstream at once for
        request/response traffic.
    :param max_streams: the most long-lived streams (GET, ``subscriptions/listen``) at
        once, on connections of their own; :param max_streams_per_client: of which one
        client address may hold this many.
    :param tls: the TLS context for an ``https://`` upstream (by default the system's
        trust store, hostname checked).
    """

    def __init__(
        self,
        upstream: str,
        *,
        timeouts: Timeouts = Timeouts(),
        max_connections: int = 100,
        max_streams: int = 100,
        max_streams_per_client: int = 10,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        try:
            url = urlsplit(upstream)
            host, port = url.hostname, url.port
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"the upstream {upstream!r} is not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not host:
            raise ValueError(f"the upstream must be an http:// or https:// URL with a host, not {upstream!r}")
        if url.username is not None or url.password is not None:
            raise ValueError("the upstream URL must not carry credentials")
        self.upstream = upstream
        self.timeouts = timeouts
        self.max_connections = max_connections
        self.streams = _Streams(max_streams, max_streams_per_client)
        self._host = host
        self._port = port or (443 if url.scheme == "https" else 80)
        self._tls = (tls or ssl.create_default_context()) if url.scheme == "https" else None
        authority = f"[{host}]" if ":" in host else host
        self._host_header = (authority if port is None else f"{authority}:{port}").encode("idna")
        self._pool: Pool | None = None
        self._stream_pool: Pool | None = None

    def __repr__(self) -> str:
        return f"UpstreamApp({self.upstream!r})"

    @property
    def pool(self) -> Pool:
        """The connection pool; created on first use, inside the running event loop."""
        if self._pool is None:
            self._pool = self._new_pool(self.max_connections)
        return self._pool

    @property
    def stream_pool(self) -> Pool:
        """The connections of long-lived streams, apart from :attr:`pool`."""
        if self._stream_pool is None:
            self._stream_pool = self._new_pool(self.streams.total)
        return self._stream_pool

    def _new_pool(self, limit: int) -> Pool:
        return Pool(
            self._host,
            self._port,
            tls=self._tls,
            limit=limit,
            keepalive=_KEEPALIVE_SECONDS,
            read_timeout=self.timeouts.read,
            name=self.upstream,
        )

    async def aclose(self) -> None:
        pools = (self._pool, self._stream_pool)
        self._pool = self._stream_pool = None
        for pool in pools:
            if pool is not None:
                pool.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = _RequestHeaders(scope.get("headers", ()))
            body = await _Body.read(receive)
            if body is None:
                return  # the client went away while sending
            if _opens_stream(scope, body.data):
                await self._stream(scope, headers, body, receive, send)
            else:
                await self._forward(scope, headers, body, receive, send, pool=self.pool)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1003})  # MCP does not use WebSockets

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _ = self.pool
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _head(self, scope: Scope, headers: _RequestHeaders, body: bytes | AsyncIterator[bytes]) -> bytes:
        """The request line and headers; raises ``ValueError`` for what would not frame."""
        method = str(scope["method"]).encode("ascii")
        query = scope.get("query_string", b"")
        target = request_path(scope) + (b"?" + query if query else b"")  # the path the middleware decided on
        fields = headers.kept
        fields.append(ACCEPT_IDENTITY)
        if headers.host is not None:
            fields.append((b"X-Forwarded-Host", headers.host))
        fields.append((b"X-Forwarded-Proto", str(scope.get("scheme", "http")).encode("latin-1")))
        client = scope.get("client")
        if client:
            address = str(client[0]).encode("latin-1")
            fields.append((b"X-Forwarded-For", headers.chain + b", " + address if headers.chain else address))
        if isinstance(body, bytes):
            if body or method not in _BODILESS:
                fields.append((b"Content-Length", body_length(body)))
        elif headers.length is not None:
            fields.append((b"Content-Length", headers.length))  # a streamed body keeps its length
        else:
            fields.append((b"Transfer-Encoding", b"chunked"))
        check_fields(method, target, fields)
        # The client's Host, as sent: an upstream's own DNS-rebinding check must judge what
        # the client sent, not a name this proxy made up (docs/proxy.md, "how the two layers
        # fit"). The upstream's authority only when the client sent none (HTTP/1.0).
        # Each field's line joined in C (map over bytes.join), not by a Python loop; the two
        # empty items end the last line and the head, however many fields there are.
        start = b"%b %b HTTP/1.1\r\nHost: %b" % (method, target, headers.host or self._host_header)
        return b"\r\n".join([start, *map(b": ".join, fields), b"", b""])

    async def _stream(
        self, scope: Scope, headers: _RequestHeaders, body: _Body, receive: Receive, send: Send
    ) -> None:
        """A long-lived stream: forwarded on :attr:`stream_pool` if it gets a slot, else refused."""
        client = scope.get("client")
        address = str(client[0]) if client else "-"
        refused = self.streams.take(address)
        if refused is not None:
            status = 503 if refused == "stream_limit" else 429
            _telemetry.record_shed(refused)
            logger.warning(
                "refused a stream with HTTP %d (%s): %d open, at most %d, %d per client",
                status,
                refused,
                self.streams.open,
                self.streams.total,
                self.streams.per_client,
                extra={
                    **_telemetry.fields("stream_refused", reason=refused, status=status),
                    "client": address,
                },
            )
            await _error(send, status, "Too many streams", body.data)
            return
        try:
            await self._forward(scope, headers, body, receive, send, pool=self.stream_pool)
        finally:
            self.streams.give(address)

    async def _forward(
        self, scope: Scope, headers: _RequestHeaders, body: _Body, receive: Receive, send: Send, *, pool: Pool
    ) -> None:
        try:
            head = self._head(scope, headers, body.data)
        except (ValueError, UnicodeError):
            logger.warning(
                "a request that would not frame as HTTP/1.1 was refused",
                extra=_telemetry.fields("request_refused", status=400, detail="unframable"),
            )
            await _error(send, 400, "Bad request", body.data)
            return
        timeouts = self.timeouts
        try:
            response = await pool.request(
                str(scope["method"]).encode("ascii"),
                head,
                body.data,
                chunked=not isinstance(body.data, bytes) and headers.length is None,
                pool_timeout=timeouts.pool,
                connect_timeout=timeouts.connect,
                write_timeout=timeouts.write,
            )
        except _ClientGone:
            return
        except TimeoutError as exc:
            _telemetry.record_upstream_error("timeout")
            logger.warning(
                "upstream %s timed out (%s)",
                self.upstream,
                type(exc).__name__,
                extra={
                    **_telemetry.fields("upstream_error", kind="timeout", status=504),
                    "upstream": self.upstream,
                },
            )
            await _error(send, 504, "Upstream timed out", body.data)
            return
        except (UpstreamError, OSError) as exc:
            _telemetry.record_upstream_error("unreachable")
            logger.warning(
                "upstream %s unavailable (%s: %s)",
                self.upstream,
                type(exc).__name__,
                exc,
                extra={
                    **_telemetry.fields(
                        "upstream_error", kind="unreachable", status=502, detail=type(exc).__name__
                    ),
                    "upstream": self.upstream,
                },
            )
            await _error(send, 502, "Upstream unavailable", body.data)
            return
        complete = False
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": _response_headers(response.headers),
                }
            )
            complete = await _relay(response, receive, send, self.upstream)
        finally:
            if complete:
                response.release()  # the connection goes back to the pool
            else:
                response.close()


class _Body:
    """The request body: bytes when it came in one message (the middleware's case), else a
    stream that raises :class:`_ClientGone` if the client leaves while sending it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | AsyncIterator[bytes]) -> None:
        self.data = data

    @classmethod
    async def read(cls, receive: Receive) -> _Body | None:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        first: bytes = message.get("body", b"")
        if message.get("more_body", False):
            return cls(_stream(first, receive))
        return cls(first)


async def _stream(first: bytes, receive: Receive) -> AsyncIterator[bytes]:
    if first:
        yield first
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def _relay(response: Response, receive: Receive, send: Send, upstream: str) -> bool:
    """Relay the body; True when it was relayed whole.

    An answer that is complete in its first read (a JSON answer) is sent as it is; one
    that goes on (an SSE stream) is relayed chunk by chunk while the client is watched,
    so the upstream is not read for nobody once the client has gone.
    """
    try:
        chunk = await response.read()
    except _BROKEN as exc:
        _broke_off(exc, upstream)
        return False
    if response.at_eof:
        await send({"type": "http.response.body", "body": chunk, "more_body": False})
        return True
    complete = False
    async with anyio.create_task_group() as group:

        async def relay() -> None:
            nonlocal complete
            more = chunk
            while more:
                # The last bytes go out as the last message when they are known to be
                # last: a JSON answer then ends with its last message, not after it.
                last = response.at_eof
                await send({"type": "http.response.body", "body": more, "more_body": not last})
                if last:
                    complete = True
                    break
                try:
                    more = await response.read()  # b"" at the end of the body
                except _BROKEN as exc:
                    _broke_off(exc, upstream)
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


def _broke_off(exc: BaseException, upstream: str) -> None:
    # The response is left unfinished: the server then drops the connection, and the
    # client sees a truncated response instead of a complete-looking one.
    _telemetry.record_upstream_error("broken")
    logger.warning(
        "upstream %s broke off its answer (%s)",
        upstream,
        type(exc).__name__,
        extra={
            **_telemetry.fields("upstream_error", kind="broken", detail=type(exc).__name__),
            "upstream": upstream,
        },
    )
