"""The incremental SSE splitter: the same events whatever the chunking, bytes kept exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statecodec.adapters._sse import Event, EventTooLargeError, Parser, encode

STREAM = (
    b"\xef\xbb\xbf: comment\r\n"
    b"event: message\r\nid: 1\r\ndata: one\r\n\r\n"
    b"data: two\rdata:three\r\r"
    b"data\n\n"
    b"id: 9\nretry: 100\n\n"
    b'data: {"a": 1}\n\n'
)
EXPECTED_DATA = [b"one", b"two\nthree", b"", None, b'{"a": 1}']


def feed_all(chunks: list[bytes], max_event_bytes: int = 10_000) -> tuple[list[Event], bytes]:
    parser = Parser(max_event_bytes)
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    tail, rest = parser.close()
    return events + tail, rest


def test_fields_line_endings_and_bom() -> None:
    events, rest = feed_all([STREAM])
    assert [e.data for e in events] == EXPECTED_DATA
    assert rest == b""
    assert b"".join(e.raw for e in events) == STREAM  # every byte accounted for, in order
    assert events[0].lines == (b": comment", b"event: message", b"id: 1", b"data: one")


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    events, rest = feed_all(chunks)
    assert [e.data for e in events] == EXPECTED_DATA
    assert b"".join(e.raw for e in events) == STREAM and rest == b""


def test_a_cr_at_a_chunk_end_waits_for_a_possible_lf() -> None:
    parser = Parser(1000)
    assert parser.feed(b"data: x\r\n\r") == []
    events = parser.feed(b"\ndata: y\n\n")
    assert [e.raw for e in events] == [b"data: x\r\n\r\n", b"data: y\n\n"]


def test_unfinished_event_is_returned_as_the_remainder() -> None:
    events, rest = feed_all([b"data: done\n\ndata: half"])
    assert [e.data for e in events] == [b"done"] and rest == b"data: half"


def test_with_data_replaces_only_the_data_lines() -> None:
    (event,), _ = feed_all([b": c\nid: 3\ndata: a\ndata: b\nevent: e\n\n"])
    assert event.with_data(b"NEW") == b": c\nid: 3\ndata: NEW\nevent: e\n\n"
    (no_data,), _ = feed_all([b"id: 4\n\n"])
    assert no_data.with_data(b"X") == b"id: 4\ndata: X\n\n"
    with pytest.raises(ValueError, match="CR or LF"):
        event.with_data(b"two\nlines")
    assert encode(b"{}") == b"data: {}\n\n"


def test_event_size_is_bounded() -> None:
    parser = Parser(64)
    parser.feed(b"data: " + b"x" * 40)
    with pytest.raises(EventTooLargeError):
        parser.feed(b"x" * 40)
    # Many small events are fine: the bound is per event.
    small = Parser(64)
    assert len(small.feed(b"data: 1\n\n" * 100)) == 100
