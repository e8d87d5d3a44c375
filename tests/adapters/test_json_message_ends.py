"""MessageEnds finds where each JSON message of a stream ends, however the bytes are cut."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from statecodec.adapters._json import MessageEnds

_TEXT = st.text(alphabet=st.sampled_from(['"', "\\", "{", "}", "[", "]", "a", "é", "\n", " "]), max_size=8)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4),
    max_leaves=12,
)
_DOCUMENTS = st.lists(_VALUES.map(lambda v: {"v": v}) | st.lists(_VALUES, max_size=3), min_size=1, max_size=5)


def _ends(stream: bytes, cuts: list[int]) -> list[int]:
    scanner, buffer, found, dropped = MessageEnds(), bytearray(), [], 0
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        buffer += stream[start:end]
        ends = scanner.scan(buffer)
        found += [dropped + offset for offset in ends]
        if ends:  # the caller drops what it has sent
            del buffer[: ends[-1]]
            scanner.consumed(ends[-1])
            dropped += ends[-1]
    return found


@given(
    _DOCUMENTS, st.lists(st.integers(min_value=0), max_size=6), st.sampled_from(["\n", "\r\n", "", " \n "])
)
def test_each_message_ends_after_its_last_bracket_and_the_whitespace_after_it(
    documents: list[Any], cuts: list[int], separator: str
) -> None:
    lines = [json.dumps(document, ensure_ascii=False).encode() + separator.encode() for document in documents]
    stream = b"".join(lines)
    cuts = sorted({cut % (len(stream) + 1) for cut in cuts})
    expected, total = [], 0
    for piece in lines:
        total += len(piece)
        expected.append(total)
    found = _ends(stream, cuts)
    # Trailing whitespace arriving in a later piece goes with the next message (or the end):
    # each end is at or after the last bracket of its message and never past its separator.
    assert len(found) == len(expected)
    for end, full, piece in zip(found, expected, lines, strict=True):
        assert full - len(piece) + len(piece.rstrip()) <= end <= full


def test_a_quote_after_an_even_run_of_backslashes_closes_the_string() -> None:
    stream = b'{"a":"x\\\\"}{"b":"\\"}"}'
    assert _ends(stream, [9]) == [11, len(stream)]
