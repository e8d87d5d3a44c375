"""Server-sent events, split incrementally so a stream can be rewritten event by event.

The ASGI middleware must seal the ``requestState`` of an ``input_required`` result that
travels inside an SSE stream, without ever holding the whole stream: MCP streams stay
open while a tool runs, and a proxy that buffered them would break progress
notifications and hold memory without bound. So the parser hands back each event as soon
as its terminating blank line arrives, with the exact bytes it was made of, and the
middleware either forwards those bytes untouched or swaps the ``data`` lines.

Line endings follow the WHATWG rules (CRLF, LF or a lone CR); a CR at the very end of a
chunk is held back until the next byte shows whether an LF follows. One event may not
grow beyond ``max_event_bytes``: an event that cannot be inspected must not be passed on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

_CR: Final = 0x0D
_LF: Final = 0x0A
_BOM: Final = b"\xef\xbb\xbf"


class EventTooLargeError(ValueError):
    """An event grew past ``max_event_bytes`` before its end arrived."""


@dataclass(frozen=True, slots=True)
class Event:
    """One complete event: its bytes as received, its lines, and its joined ``data``."""

    raw: bytes
    lines: tuple[bytes, ...]  # without line terminators; the blank end line excluded
    data: bytes | None  # the data field values joined by LF; None when there is no data field

    def with_data(self, data: bytes) -> bytes:
        """The event re-encoded with ``data`` (one line, no CR or LF) in place of its data lines.

        Every other line (``id``, ``event``, ``retry``, comments) keeps its place and bytes.
        """
        if b"\n" in data or b"\r" in data:
            raise ValueError("SSE data written on one line must not contain CR or LF")
        out = bytearray()
        written = False
        for line in self.lines:
            if _field(line) == b"data":
                if not written:
                    out += b"data: " + data + b"\n"
                    written = True
                continue
            out += line + b"\n"
        if not written:
            out += b"data: " + data + b"\n"
        out += b"\n"
        return bytes(out)


def encode(data: bytes) -> bytes:
    """A new event carrying ``data`` (one line)."""
    return b"data: " + data + b"\n\n"


def _field(line: bytes) -> bytes:
    if line.startswith(b":"):
        return b""  # a comment
    name, _, _ = line.partition(b":")
    return name


def _value(line: bytes) -> bytes:
    _, colon, value = line.partition(b":")
    if not colon:
        return b""
    return value[1:] if value.startswith(b" ") else value


class Parser:
    """Feed bytes, get complete :class:`Event` objects back; nothing is held past its event."""

    def __init__(self, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._buf = bytearray()
        self._lines: list[bytes] = []
        self._raw = bytearray()  # the current event's bytes so far
        self._start = True  # a BOM may open the stream

    def feed(self, chunk: bytes) -> list[Event]:
        """The events completed by ``chunk``; raises :class:`EventTooLargeError`."""
        self._buf += chunk
        if self._start:
            if len(self._buf) < len(_BOM) and _BOM.startswith(bytes(self._buf)):
                return []  # not yet known whether this is a BOM
            self._start = False
            if self._buf.startswith(_BOM):
                self._raw += _BOM  # kept on the wire, ignored by the parser (as EventSource does)
                del self._buf[: len(_BOM)]
        events = self._split(final=False)
        if len(self._raw) + len(self._buf) > self.max_event_bytes:
            raise EventTooLargeError(f"an SSE event exceeds {self.max_event_bytes} bytes")
        return events

    @property
    def pending(self) -> int:
        """The bytes held for the event not ended yet."""
        return len(self._buf) + len(self._raw)

    def close(self) -> tuple[list[Event], bytes]:
        """At the end of the stream: the last complete events and the unfinished remainder.

        Clients discard an event the stream ended in the middle of (WHATWG), so the caller
        may drop the remainder rather than pass on bytes it could not inspect.
        """
        events = self._split(final=True)
        rest = bytes(self._raw + self._buf)
        self._raw.clear()
        self._buf.clear()
        self._lines.clear()
        return events, rest

    def _split(self, *, final: bool) -> list[Event]:
        buf = self._buf
        size = len(buf)
        events: list[Event] = []
        pos = 0
        next_cr = buf.find(b"\r")
        next_lf = buf.find(b"\n")
        while True:
            if 0 <= next_cr < pos:
                next_cr = buf.find(b"\r", pos)
            if 0 <= next_lf < pos:
                next_lf = buf.find(b"\n", pos)
            if next_cr < 0 and next_lf < 0:
                break
            end_of_line = next_lf if next_cr < 0 or 0 <= next_lf < next_cr else next_cr
            if buf[end_of_line] == _CR:
                if end_of_line + 1 == size and not final:
                    break  # CR at the chunk's end: the LF of a CRLF may follow
                after = (
                    end_of_line + 2
                    if end_of_line + 1 < size and buf[end_of_line + 1] == _LF
                    else end_of_line + 1
                )
            else:
                after = end_of_line + 1
            line = bytes(buf[pos:end_of_line])
            self._raw += buf[pos:after]
            pos = after
            if line:
                self._lines.append(line)
                continue
            events.append(self._dispatch())
        del buf[:pos]
        return events

    def _dispatch(self) -> Event:
        lines = tuple(self._lines)
        data = [_value(line) for line in lines if _field(line) == b"data"]
        event = Event(bytes(self._raw), lines, b"\n".join(data) if data else None)
        self._lines.clear()
        self._raw.clear()
        return event
