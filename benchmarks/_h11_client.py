"""The h11 candidate of docs/performance.md (issue 25): the upstream pool's connection, driven by h11.

    .venv/bin/python benchmarks/proxy_instructions.py --client h11

:func:`install` puts :class:`H11Connection` in the place of the httptools connection of
``statecodec.proxy._upstream`` (the pool creates its connections through that name), so
the same pool, forwarder and proxy run with h11's state machine: h11 frames the request
from the forwarder's fields and parses the answer; trailers are dropped and bytes past
``EndOfMessage`` close the connection, as the httptools connection does. It is measured,
never shipped: h11 cost 2.8 times the forwarder's instructions (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

import h11

from statecodec import _telemetry
from statecodec.proxy import _upstream
from statecodec.proxy._upstream import _HIGH_WATER, _MAX_HEAD, UpstreamError, _expire, logger


def install() -> None:
    """Make the upstream pool open :class:`H11Connection` connections from now on."""
    _upstream._Connection = H11Connection  # type: ignore[misc,assignment]


class H11Connection(asyncio.Protocol):
    """One connection, answering one request at a time: h11 frames the request and parses the answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self._loop = loop
        self._read_timeout = read_timeout
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self.idle_since = 0.0
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_ready: asyncio.Future[None] | None = None
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._head_ready is None or self._complete:
            self._past_the_end()
            return
        self._h11.receive_data(data)
        self._pump()

    def _pump(self) -> None:
        conn = self._h11
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._malformed("invalid_http", str(exc))
                return
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:
                if self._complete and conn.trailing_data[0]:
                    self._past_the_end()
                return
            kind = type(event)
            if kind is h11.Data:
                self._chunks.append(event.data)  # type: ignore[union-attr]
                self._buffered += len(event.data)  # type: ignore[union-attr]
                if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
                    self._paused = True
                    self.transport.pause_reading()
                self._wake()
            elif kind is h11.Response:
                self._status = event.status_code  # type: ignore[union-attr]
                self._headers = list(event.headers.raw_items())  # type: ignore[union-attr]
                head = self._head_ready
                if head is not None and not head.done():
                    head.set_result(None)
            elif kind is h11.EndOfMessage:
                self._complete = True  # its trailer fields (event.headers) are dropped
                self._wake()
            elif kind is h11.InformationalResponse:
                if event.status_code == 101:  # type: ignore[union-attr]
                    self._malformed("switched_protocols", "the upstream switched protocols")
                    return
            elif kind is h11.ConnectionClosed:
                if not self._complete:
                    self._fail(UpstreamError("the upstream closed the connection"))
                return

    def eof_received(self) -> bool | None:
        self._ended(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._ended(exc)
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(UpstreamError("the upstream closed the connection"))

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def _past_the_end(self) -> None:
        logger.warning(
            "the upstream wrote past the end of its answer; its connection is closed",
            extra=_telemetry.fields(
                "upstream_framing", reason="bytes_after_answer", status=self._status or None
            ),
        )
        if self._head_ready is None:
            self._fail(UpstreamError("the upstream sent data nobody asked for"))
        else:
            self.close()

    def _malformed(self, reason: str, detail: str) -> None:
        logger.warning(
            "the upstream's answer breaks HTTP/1.1 framing (%s); its connection is closed",
            detail,
            extra=_telemetry.fields("upstream_framing", reason=reason, detail=detail),
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
        if self._complete or self._head_ready is None:
            return
        if exc is None:
            with contextlib.suppress(RuntimeError):  # h11 refuses a second end of data
                self._h11.receive_data(b"")
            self._pump()
        if not self._complete:
            why = f": {exc}" if exc is not None else ""
            self._fail(UpstreamError(f"the upstream closed the connection{why}"))

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def idle(self) -> None:
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
        transport = self.transport
        if transport is None:
            raise UpstreamError("the upstream closed the connection")
        conn = self._h11
        if conn.our_state is h11.DONE:
            conn.start_next_cycle()
        self.reusable = False
        self._status = 0
        self._complete = False
        self._error = None
        self._chunks.clear()
        self._buffered = 0
        self._head_ready = self._loop.create_future()
        # The forwarder's framed head, as the fields a switch to h11 would pass instead.
        lines = head[:-4].split(b"\r\n")
        target = lines[0].split(b" ", 2)[1]
        fields = [(name, value) for name, _, value in (line.partition(b": ") for line in lines[1:])]
        out = conn.send(h11.Request(method=method, target=target, headers=fields))
        if isinstance(body, bytes):
            if body:
                out += conn.send(h11.Data(data=body))
            transport.write(out + conn.send(h11.EndOfMessage()))
            return
        transport.write(out)
        async for chunk in body:
            if not chunk:
                continue
            transport.write(conn.send(h11.Data(data=chunk)))
            if self._drain is not None and not self._drain.done():
                await self._drain
            if self.transport is None:
                raise UpstreamError("the upstream closed the connection")
        transport.write(conn.send(h11.EndOfMessage()))

    async def answer(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        head = self._head_ready
        if head is None:
            raise UpstreamError("no request was sent on this connection")
        if not head.done():
            await self._wait(head)
        head.result()
        if self._error is not None and not self._complete:
            raise self._error
        return self._status, self._headers

    async def read(self) -> bytes:
        while not self._chunks:
            if self._complete:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            try:
                await self._wait(self._waiter)
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
        timer = self._loop.call_later(self._read_timeout, _expire, future)
        try:
            await future
        finally:
            timer.cancel()

    @property
    def at_eof(self) -> bool:
        return self._complete and not self._chunks

    def finished(self) -> bool:
        conn = self._h11
        return (
            self._complete
            and not self._chunks
            and self._error is None
            and conn.our_state is h11.DONE
            and conn.their_state is h11.DONE
            and not conn.trailing_data[0]
            and self.transport is not None
            and not self.transport.is_closing()
        )
