"""The h11 candidate of docs/performance.md: the upstream pool's connection, parsed by h11.

    .venv/bin/python benchmarks/proxy_instructions.py --client h11

:func:`install` puts :class:`H11Connection` in the place of the httptools connection of
``statecodec.proxy._upstream`` (the pool creates its connections through that name), so
the same pool, forwarder and proxy run with h11's state machine. It is the pool's own
connection with only the HTTP/1.1 part swapped: h11 frames the request from the
forwarder's fields and parses the answer, and the connection's waiting, buffering, read
deadline and failures stay the shipped ones, so a count compares the two parsers and
nothing else. Trailers are dropped and bytes past ``EndOfMessage`` close the connection,
as the httptools connection does. It is measured, never shipped (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import h11

from statecodec.proxy import _upstream
from statecodec.proxy._upstream import _MAX_HEAD, UpstreamError


def install() -> None:
    """Make the upstream pool open :class:`H11Connection` connections from now on."""
    _upstream._Connection = H11Connection  # type: ignore[misc]


class H11Connection(_upstream._Connection):
    """The pool's connection with h11 in the place of llhttp, for one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float, upstream: str) -> None:
        super().__init__(loop, read_timeout, upstream)
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=_MAX_HEAD)

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
                self.on_body(event.data)  # type: ignore[union-attr]
            elif kind is h11.Response:
                self._answered(event)  # type: ignore[arg-type]
            elif kind is h11.EndOfMessage:
                self.on_message_complete()  # its trailer fields (event.headers) are dropped
            elif kind is h11.InformationalResponse and event.status_code == 101:  # type: ignore[union-attr]
                self._malformed("switched_protocols", "the upstream switched protocols")
                return
            elif kind is h11.ConnectionClosed:
                if not self._complete:
                    self._fail(UpstreamError("the upstream closed the connection"))
                return

    def _answered(self, response: h11.Response) -> None:
        """The final answer's head: what the parent's ``on_headers_complete`` does for llhttp."""
        self._status = response.status_code
        self._headers = list(response.headers.raw_items())
        self._keep_alive = True  # the parent asks llhttp; finished() asks h11 as well
        head = self._head_ready
        if head is not None and not head.done():
            head.set_result(None)

    def _ended(self, exc: Exception | None) -> None:
        if exc is None and not self._complete and self._head_ready is not None:
            with contextlib.suppress(RuntimeError):  # h11 refuses a second end of data
                self._h11.receive_data(b"")  # an answer framed by the end of the connection ends here
            self._pump()
        super()._ended(exc)

    async def send(
        self, head: bytes, body: bytes | AsyncIterator[bytes], chunked: bool, method: bytes
    ) -> None:
        conn = self._h11
        if conn.our_state is h11.DONE:
            conn.start_next_cycle()
        # The forwarder's framed head, as the fields a switch to h11 would pass instead.
        lines = head[:-4].split(b"\r\n")
        target = lines[0].split(b" ", 2)[1]
        fields = [(name, value) for name, _, value in (line.partition(b": ") for line in lines[1:])]
        framed = conn.send(h11.Request(method=method, target=target, headers=fields))
        if isinstance(body, bytes):  # the parent writes what h11 framed, as it is
            data = conn.send(h11.Data(data=body)) if body else b""
            await super().send(framed + data + conn.send(h11.EndOfMessage()), b"", False, method)
        else:
            await super().send(framed, self._framed(body), False, method)

    async def _framed(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in body:
            if chunk:
                yield self._h11.send(h11.Data(data=chunk))
        yield self._h11.send(h11.EndOfMessage())

    def finished(self) -> bool:
        conn = self._h11
        return (
            super().finished()
            and conn.our_state is h11.DONE
            and conn.their_state is h11.DONE
            and not conn.trailing_data[0]
        )
