"""HTTP/1.1 toward the one upstream: a keep-alive pool of asyncio connections, answers parsed by httptools.

The proxy talks to exactly one origin, with requests it has already framed and headers
it has already filtered, and relays every answer as bytes. A general client does much
more per request (URL objects, case-insensitive header maps, cookie and redirect logic,
tracing hooks), and on the proxy benchmark a general client (aiohttp's, or h11) cost
several times what this one does (docs/performance.md, "The forwarder"). The HTTP
parsing is llhttp's, through httptools (the parser uvicorn uses), in its strict mode;
what is written here is the framing of a request and the bookkeeping of a connection.

An answer ends exactly where its framing says (RFC 9112 section 6.3), and what the
upstream writes past that end is never read as anything: a connection that was out of
step with its upstream would hand the next, unrelated client an answer meant for no
one (or written by whoever could inject bytes into one answer). So:

- bytes past the end of an answer (in the same read or a later one, a CRLF included),
  a body after an answer that has none (``HEAD``, ``204``, ``304``) and data while the
  connection is idle close that connection: the answer, complete by its framing, is
  relayed; the bytes never reach a client and the connection is never reused;
- an answer llhttp refuses (repeated or conflicting ``Content-Length``, one with
  ``Transfer-Encoding``, an invalid chunk size, obs-fold, bare LF line ends), a
  transfer coding other than a single ``chunked``, a version other than HTTP/1.0 or
  1.1, or a head (interim answers and trailers included) of more than 64 KiB is
  malformed: a clean 502 when it is seen before the answer's head was handed over, a
  stream cut short after; its connection is closed;
- interim ``1xx`` answers (``103 Early Hints``) are skipped, their fields dropped with
  them; ``101`` is refused, as no upgrade is ever asked for;
- chunked trailer fields are dropped: they never become response headers (a
  ``Set-Cookie`` trailer would otherwise reach the client as a header it was not meant
  to be), and the proxy re-frames every answer to its client, so no upstream framing
  reaches a client either;
- a connection is reused only after an answer that was read to its end and that
  llhttp says may be kept alive; one idle for ``keepalive`` seconds is dropped rather
  than written to while the upstream may be closing it (Node closes after 5 s); an
  answer delimited by the end of the connection is never followed on it;
- nothing but what the caller passes is sent, and a header or target that could split
  the request (CR, LF, NUL) is refused before a byte is written.

Each of these is logged (``upstream_framing`` with a ``reason``); the 502 or the cut
stream is the forwarder's to log.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Final

import httptools

from .. import _telemetry

__all__ = ["Pool", "Response", "UpstreamError"]

logger = logging.getLogger("statecodec.proxy")

# Beyond this many unread bytes of an answer, the upstream is not read until the client
# has taken them: a fast upstream cannot fill the proxy's memory behind a slow client.
_HIGH_WATER: Final = 256 * 1024
# RFC 9110 token characters: what a field name (and a method) may be made of. Checked
# with ``bytes.translate`` (what is left once they are deleted must be nothing), which
# costs far less than a regular expression's character class (docs/performance.md).
_TOKEN: Final = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# The most bytes read without a byte of body: a head (with its interim answers) or the
# trailers. httptools gathers a field before handing it over, so this is what bounds the
# memory one answer's head can take.
_MAX_HEAD: Final = 64 * 1024
# The byte values of CR and LF: llhttp skips them silently between two messages.
_CR_LF: Final = (13, 10)


class UpstreamError(Exception):
    """The upstream could not be reached, or broke the exchange (closed, sent no valid HTTP)."""


class _Malformed(Exception):  # noqa: N818 - control flow, never raised past this module
    """Raised in a parser callback to stop llhttp: the answer breaks a framing rule (``reason``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class _PastTheEnd(Exception):  # noqa: N818 - control flow, never raised past this module
    """Raised in a parser callback to stop llhttp: a byte past the end of the answer."""


class _Connection(asyncio.Protocol):
    """One connection, answering one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float, upstream: str) -> None:
        self._loop = loop
        self._upstream = upstream  # named in its log records
        self._read_timeout = read_timeout
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.reusable = False  # True between a complete answer and the next request
        self.idle_since = 0.0
        self._head_only = False
        self._status = 0  # the final answer's, once its head is read; 0 before (and in 1xx)
        self._headers: list[tuple[bytes, bytes]] = []
        self._until_eof = False  # the answer's body ends with the connection
        self._keep_alive = False
        self._head_ready: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._unframed = 0  # bytes read since the last byte of body (or the request)
        self._progress = False  # a read brought body bytes, or the end of a head
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        # The read deadline (see _wait): what is awaited, since when, and the one timer.
        self._awaited: asyncio.Future[None] | None = None
        self._awaited_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._drain: asyncio.Future[None] | None = None

    # ------------------------------------------------------------ transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._head_ready is None or self._complete:
            # Past the end of the answer (or while idle): the connection is out of step.
            self._past_the_end()
            return
        self._progress = False
        try:
            if data[-1] in _CR_LF and len(data) > 1:
                # llhttp skips CR and LF between messages without a callback: fed apart,
                # the last byte shows whether the answer ended before it.
                view = memoryview(data)
                self._parser.feed_data(view[:-1])
                if self._complete:
                    self._past_the_end()
                    return
                self._parser.feed_data(view[-1:])
            else:
                self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._refused(exc)
            return
        except httptools.HttpParserUpgrade:  # llhttp's own upgrade path (101 is refused first)
            self._malformed("switched_protocols", "the upstream switched protocols")
            return
        if self._progress:
            self._unframed = 0
        else:
            self._unframed += len(data)
            if self._unframed > _MAX_HEAD:
                self._malformed("head_too_large", f"more than {_MAX_HEAD} bytes of head or trailers")

    def eof_received(self) -> bool | None:
        self._ended(None)
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._timer is not None:  # a closed connection is not kept alive by its timer
            self._timer.cancel()
            self._timer = None
        self._ended(exc)
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(UpstreamError("the upstream closed the connection"))

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # ------------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        if self._complete:
            raise _PastTheEnd  # the start of another answer, after the whole of this one
        self._headers = []  # an interim answer's fields go with it

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._status:
            return  # a chunked trailer field: never a response header (dropped)
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if parser.get_http_version() not in ("1.1", "1.0"):
            raise _Malformed("http_version", f"the upstream answered HTTP/{parser.get_http_version()}")
        if 100 <= status < 200:
            if status == 101:
                raise _Malformed("switched_protocols", "the upstream switched protocols")
            return  # an interim answer: the real one follows
        self._status = status
        self._progress = True
        self._keep_alive = parser.should_keep_alive()  # llhttp forgets it once the body ends
        self._until_eof = self._framing() and not (self._head_only or status in (204, 304))
        head = self._head_ready
        if head is not None and not head.done():
            head.set_result(None)
        if self._head_only:
            self._complete = True  # a HEAD answer has no body, whatever it declares

    def _framing(self) -> bool:
        """Check the answer's transfer coding; True when its body is delimited by the connection.

        llhttp refuses a repeated ``Content-Length`` and one beside ``Transfer-Encoding``;
        it reads any coding but a final ``chunked`` to the end of the connection, which a
        proxy that relays bytes cannot decode: only one ``chunked`` is accepted here.
        """
        delimited = False
        for name, value in self._headers:
            lowered = name.lower()
            if lowered == b"content-length":
                delimited = True
            elif lowered == b"transfer-encoding":
                if delimited or value.strip().lower() != b"chunked":
                    raise _Malformed("transfer_coding", f"Transfer-Encoding {value[:40]!r}")
                delimited = True
        return not delimited

    def on_body(self, body: bytes) -> None:
        if self._complete:
            raise _PastTheEnd  # a body after an answer that has none (HEAD)
        self._chunks.append(body)
        self._buffered += len(body)
        self._progress = True
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_chunk_header(self) -> None:
        if self._complete:
            raise _PastTheEnd  # a chunked body after an answer that has none (HEAD)

    def on_message_complete(self) -> None:
        if self._status == 0:
            return  # the end of an interim answer
        self._complete = True  # (again, for a HEAD answer whose length llhttp read as 0)
        self._progress = True
        self._wake()

    # ------------------------------------------------------------ the exchange
    def _refused(self, exc: httptools.HttpParserError) -> None:
        """llhttp stopped: at a byte past the end of the answer, or at a framing error."""
        cause = exc.__context__
        if self._complete or isinstance(cause, _PastTheEnd):
            self._past_the_end()
        elif isinstance(cause, _Malformed):
            self._malformed(cause.reason, str(cause))
        else:
            self._malformed("invalid_http", str(exc))

    def _past_the_end(self) -> None:
        """Bytes past the end of the answer: the answer stands, the connection is closed."""
        logger.warning(
            "the upstream %s wrote past the end of its answer; its connection is closed",
            self._upstream,
            extra={
                **_telemetry.fields(
                    "upstream_framing", reason="bytes_after_answer", status=self._status or None
                ),
                "upstream": self._upstream,
            },
        )
        if self._head_ready is None:  # idle: no answer to stand
            self._fail(UpstreamError("the upstream sent data nobody asked for"))
        else:
            self.close()

    def _malformed(self, reason: str, detail: str) -> None:
        logger.warning(
            "the answer of the upstream %s breaks HTTP/1.1 framing (%s); its connection is closed",
            self._upstream,
            detail,
            extra={
                **_telemetry.fields("upstream_framing", reason=reason, detail=detail),
                "upstream": self._upstream,
            },
        )
        self._fail(UpstreamError(f"the upstream's answer is not valid HTTP/1.1: {detail}"))

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        head = self._head_ready
        if head is not None and not head.done():
            head.set_exception(exc)
        self._wake()
        self.close()

    def _ended(self, exc: Exception | None) -> None:
        if self._status and self._until_eof and exc is None and not self._complete:
            self._complete = True  # the body ran to the end of the connection, as announced
            self._wake()
        elif not self._complete:
            why = f": {exc}" if exc is not None else ""
            self._fail(UpstreamError(f"the upstream closed the connection{why}"))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def idle(self) -> None:
        """Between two requests: from here on, data from the upstream is an error."""
        self.reusable = True
        self.idle_since = self._loop.time()
        self._head_ready = None

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()

    async def send(
        self, head: bytes, body: bytes | AsyncIterator[bytes], chunked: bool, method: bytes
    ) -> None:
        """Write a request; its answer is then awaited with :meth:`answer`."""
        transport = self.transport
        if transport is None:
            raise UpstreamError("the upstream closed the connection")
        self.reusable = False
        self._head_only = method == b"HEAD"
        self._status = 0
        self._until_eof = False
        self._keep_alive = False
        self._complete = False
        self._unframed = 0
        self._error = None
        self._chunks.clear()
        self._buffered = 0
        self._head_ready = self._loop.create_future()
        if isinstance(body, bytes):
            transport.write(head + body)
            return
        transport.write(head)
        async for chunk in body:
            if not chunk:
                continue
            transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
            if self._drain is not None and not self._drain.done():
                await self._drain
            if self.transport is None:
                raise UpstreamError("the upstream closed the connection")
        if chunked:
            transport.write(b"0\r\n\r\n")

    async def answer(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The status and headers of the answer (interim ones skipped).

        Raises what broke the answer if that is already known: an answer found malformed
        in the read that brought its head is a 502, not a stream cut short.
        """
        head = self._head_ready
        if head is None:
            raise UpstreamError("no request was sent on this connection")
        if not head.done():
            await self._wait(head)  # the silence before the answer
        head.result()  # raises what failed the exchange
        if self._error is not None and not self._complete:
            raise self._error
        return self._status, self._headers

    async def read(self) -> bytes:
        """What has arrived of the body since the last read (waiting for some); ``b""`` at its end."""
        while not self._chunks:
            if self._complete:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            try:
                await self._wait(self._waiter)  # the silence between two chunks
            finally:
                self._waiter = None
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def _wait(self, future: asyncio.Future[None]) -> None:
        """Await ``future``; ``TimeoutError`` after ``read_timeout`` seconds without it.

        One timer per connection rather than one per wait (this runs once or twice per
        request, and a timer handle made and cancelled each time, or ``asyncio.timeout()``,
        showed in the forwarder's profile: docs/performance.md): a wait notes what it
        awaits and since when, and the timer, when it fires, fails the wait that has gone
        on for ``read_timeout`` or sets itself again for the end of the current one.
        """
        self._awaited = future
        self._awaited_since = now = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_at(now + self._read_timeout, self._silence)
        try:
            await future
        finally:
            self._awaited = None

    def _silence(self) -> None:
        """The connection's read timer: expire the current wait if it has lasted ``read_timeout``."""
        self._timer = None
        future = self._awaited
        if future is None or future.done():
            return  # nothing waits: the next wait sets the timer again
        deadline = self._awaited_since + self._read_timeout
        if self._loop.time() >= deadline:
            future.set_exception(TimeoutError())
        else:  # this wait began after the one the timer was set for
            self._timer = self._loop.call_at(deadline, self._silence)

    @property
    def at_eof(self) -> bool:
        """True once the whole body has been read."""
        return self._complete and not self._chunks

    def finished(self) -> bool:
        """Whether the connection can carry another request (the answer read whole, kept alive)."""
        return (
            self._complete
            and not self._chunks
            and self._error is None
            and not self._head_only
            and not self._until_eof
            and self.transport is not None
            and not self.transport.is_closing()
            and self._keep_alive
        )


class Response:
    """An answer being read: ``status``, raw ``headers``, the body by :meth:`read`.

    End with :meth:`release` once the body was read whole (the connection goes back to
    the pool), or :meth:`close` (it is closed).
    """

    __slots__ = ("_conn", "_pool", "headers", "status")

    def __init__(
        self, pool: Pool, conn: _Connection, status: int, headers: list[tuple[bytes, bytes]]
    ) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self.status = status
        self.headers = headers

    async def read(self) -> bytes:
        """The body's next bytes; ``b""`` at its end. Raises :class:`UpstreamError` if it broke off."""
        if self._conn is None:
            return b""
        return await self._conn.read()

    @property
    def at_eof(self) -> bool:
        return self._conn is None or self._conn.at_eof

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.put(conn)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            self._pool.put(conn)


class Pool:
    """At most ``limit`` connections to ``host:port`` (TLS when ``tls`` is set).

    ``read_timeout`` bounds the silence between two chunks of an answer's body;
    ``keepalive`` how long an idle connection is kept; ``name`` (the upstream's URL) is
    what log records call it.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        limit: int,
        keepalive: float,
        read_timeout: float,
        name: str = "",
    ) -> None:
        self.host = host
        self.port = port
        self.name = name or f"{host}:{port}"
        self.tls = tls
        self.keepalive = keepalive
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(limit)
        self._closed = False

    async def request(
        self,
        method: bytes,
        head: bytes,
        body: bytes | AsyncIterator[bytes],
        *,
        chunked: bool,
        pool_timeout: float,
        connect_timeout: float,
        write_timeout: float,
    ) -> Response:
        """Send a framed request (``head``: request line and headers) and await its answer's head.

        Raises :class:`UpstreamError` (or ``OSError``) when the upstream cannot be reached or
        breaks off, ``TimeoutError`` past a timeout.
        """
        if self._slots.locked():
            async with asyncio.timeout(pool_timeout):
                await self._slots.acquire()
        else:
            await self._slots.acquire()  # a free slot: taken at once (no timer to set)
        try:
            conn = self._take()
            if conn is None:
                async with asyncio.timeout(connect_timeout):
                    conn = await self._connect()
        except BaseException:
            self._slots.release()
            raise
        try:
            if isinstance(body, bytes):
                await conn.send(head, body, chunked, method)  # written at once, never waits
            else:
                async with asyncio.timeout(write_timeout):
                    await conn.send(head, body, chunked, method)
            status, headers = await conn.answer()
        except BaseException:
            conn.close()
            self.put(conn)
            raise
        return Response(self, conn, status, headers)

    def _take(self) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and now - conn.idle_since < self.keepalive and conn.transport is not None:
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise UpstreamError("the upstream pool is closed")
        _, conn = await loop.create_connection(
            lambda: _Connection(loop, self.read_timeout, self.name),
            self.host,
            self.port,
            ssl=self.tls,
            server_hostname=self.host if self.tls is not None else None,
        )
        return conn

    def put(self, conn: _Connection) -> None:
        """A connection back from a request: kept for the next one if it can carry it, else closed."""
        self._slots.release()
        if conn.finished() and not self._closed:
            conn.idle()
            self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def check_fields(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    """Refuse what would split the request: CR, LF or NUL anywhere, a name that is not a token."""
    # zip(*headers) splits the pairs in C: every request passes here, header by header.
    all_names, all_values = zip(*headers, strict=True) if headers else ((), ())
    names = b"".join(all_names) + method
    # A byte that would end a header line or the request line early.
    text = b"".join(all_values) + target + method
    # find, not `in`: CPython's bytes.__contains__ first tries its operand as an integer and
    # raises and clears a TypeError before it searches.
    if (
        names.translate(None, _TOKEN)
        or text.find(b"\r") != -1
        or text.find(b"\n") != -1
        or text.find(b"\x00") != -1
        or target.find(b" ") != -1
        or not target
        or not method
    ):
        raise ValueError("a header, the method or the target would not frame as HTTP/1.1")
