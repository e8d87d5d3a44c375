"""statecodec.adapters._json: strict requests, lenient answers at any depth, the state prefilter."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statecodec.adapters import _json
from statecodec.boundary import state_aliases

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
)


# The strict parse as it was before its orjson path (issue 30), to compare with.
_STRICT_REFERENCE = json.JSONDecoder(
    object_pairs_hook=_json._unique, parse_constant=_json._no_constant, parse_float=_json._finite
)


def nested(depth: int) -> str:
    return '{"a":' * depth + '[1.5, NaN, "\\ud800"]' + "}" * depth


@given(documents, st.sampled_from([None, 1]))
def test_the_deep_parser_reads_what_json_reads(document: Any, indent: int | None) -> None:
    text = json.dumps(document, indent=indent)
    assert _json.loads_deep(text) == json.loads(text)
    assert json.loads(_json.dumps(document)) == document


@given(documents | st.lists(st.floats() | st.text(), max_size=4))
def test_dumps_writes_what_json_dumps_writes(document: Any) -> None:
    """orjson's fast path and json's slow one agree byte for byte, NaN and lone surrogates included."""
    expected = json.dumps(document, ensure_ascii=False, separators=(",", ":"), allow_nan=True)
    try:
        reference = expected.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: escaped, as JSON allows
        reference = json.dumps(document, separators=(",", ":"), allow_nan=True).encode("ascii")
    assert _json.dumps(document, allow_nan=True) == reference


@pytest.mark.parametrize("number", [1.192092896e-07, 1e-05, 1.5e-05, 1e16, 1.2345678901234568e17, 0.1, -0.0])
def test_dumps_writes_floats_as_json_dumps_does(number: float) -> None:
    """orjson writes 1e-05 as 0.00001 and 1e+16 as 1e16: floats take json's path."""
    for document in ([number, {"n": number}], [0, number], {"a": "1.2.3", "b": [True, number]}, number):
        assert _json.dumps(document) == json.dumps(document, separators=(",", ":")).encode()


@pytest.mark.parametrize("document", [[None, math.nan], {"v": "1.2.3", "n": math.inf}, [-math.inf], math.nan])
def test_dumps_writes_nan_beside_strings_that_look_like_numbers_as_json_does(document: Any) -> None:
    """NaN and Infinity are null to orjson: wherever they are, json's path writes them."""
    assert _json.dumps(document, allow_nan=True) == json.dumps(document, separators=(",", ":")).encode()


def test_dumps_refuses_what_json_refuses() -> None:
    with pytest.raises(ValueError):
        _json.dumps([math.nan])
    with pytest.raises(TypeError):
        _json.dumps({"when": datetime.date(2026, 1, 1)})  # orjson alone would write it


@pytest.mark.parametrize(
    "text", ["[1,]", '{"a" 1}', "[1 2]", "{,}", "tru", "[", '{"a":1}x', "", "01", '"\x01"']
)
def test_the_deep_parser_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        _json.loads_deep(text)


def test_answers_of_any_depth_are_read_and_written_back() -> None:
    for depth in (10, 5_000, 50_000):
        text = nested(depth)
        document = _json.read_answer(text)
        written = _json.dumps(document, allow_nan=True)
        assert written.count(b'{"a":') == depth and written.endswith(b'[1.5,NaN,"\\ud800"]' + b"}" * depth)
    assert not _json.has_duplicate_keys(nested(5_000))
    assert _json.has_duplicate_keys(nested(5_000).replace('{"a":', '{"a":0,"a":', 1))


def test_strict_requests() -> None:
    assert _json.loads_strict(b'{"a":[1,2.5,"\\ud800"]}') == {"a": [1, 2.5, "\ud800"]}
    for bad in (
        b'{"a":1e400}',
        b'{"a":-1E+999}',
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b'\xef\xbb\xbf{"a":1}',
        b'{"a":1,"a":2}',
        b'{"a":"\xff"}',
        b"[" * 100_000 + b"]" * 100_000,
    ):
        with pytest.raises(ValueError):
            _json.loads_strict(bad)


@given(documents)
def test_strict_requests_read_compact_json_as_json_does(document: Any) -> None:
    """Compact bytes (what orjson may read alone) give json's values, or json's refusal."""
    data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    try:
        expected = _STRICT_REFERENCE.decode(data.decode("utf-8"))
    except ValueError:
        with pytest.raises(ValueError):
            _json.loads_strict(data)
        return
    assert _json.loads_strict(data) == expected
    assert type(_json.loads_strict(data)) is type(expected)


@pytest.mark.parametrize(
    "bad",
    [
        b'{"a":{"b":1,"b":2}}',
        b'[{"x":[]},{"k":1,"j":2,"k":1}]',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{},"params":{"requestState":"t"}}',
        b'{"a":1,"a":1}',
        b'{"a":"\\u0000","a":"\\u0000"}',
    ],
)
def test_strict_requests_refuse_a_compact_duplicate(bad: bytes) -> None:
    with pytest.raises(ValueError, match="duplicate key"):
        _json.loads_strict(bad)


def test_strict_requests_keep_what_orjson_would_change() -> None:
    """Integers beyond 64 bits stay exact, floats stay floats: such bytes take json's path."""
    assert _json.loads_strict(b'{"a":18446744073709551616}') == {"a": 18446744073709551616}
    assert _json.loads_strict(b'{"a":-9223372036854775809}') == {"a": -9223372036854775809}
    assert _json.loads_strict(b"[1E5,1e2,1.0]") == [1e5, 100.0, 1.0]
    assert _json.loads_strict(b'["\\ud83d\\ude00","\\u00e9"]') == ["\U0001f600", "\u00e9"]
    deep = b'{"a":' * 300 + b"1" + b"}" * 300  # beyond what orjson writes back: json reads it
    assert str(_json.loads_strict(deep)).count("{") == 300


def test_answers_are_decoded_as_the_most_lenient_client_does() -> None:
    document = {"a": "é"}
    for data in (
        json.dumps(document).encode(),
        b"\xef\xbb\xbf\xef\xbb\xbf" + json.dumps(document).encode(),
        json.dumps(document, ensure_ascii=False).encode("utf-16"),
        json.dumps(document, ensure_ascii=False).encode("utf-16-be"),
        json.dumps(document, ensure_ascii=False).encode("utf-32"),
    ):
        assert _json.read_answer(_json.decode_answer(data)) == document
    assert _json.read_answer(_json.decode_answer(b'{"a":"\xff"}')) == {"a": "\ufffd"}
    assert math.isnan(_json.read_answer("[NaN]")[0])


@given(documents | st.lists(st.floats() | st.text(), max_size=4), st.sampled_from([(",", ":"), None]))
def test_answers_read_what_json_reads(document: Any, separators: tuple[str, str] | None) -> None:
    """orjson's path for compact answers (issue 30) gives json's values, types and key order."""
    text = json.dumps(document, ensure_ascii=False, separators=separators, allow_nan=True)
    assert repr(_json.read_answer(text)) == repr(json.loads(text))  # repr: NaN, 1 against 1.0


@pytest.mark.parametrize(
    "text",
    ['{"a":1,"a":2}', '{"a":{"b":[1],"b":{"c":null}}}', '{"a":1e400}', '{"a":18446744073709551616}', "[1E5]"],
)
def test_answers_orjson_would_read_otherwise_are_json_s(text: str) -> None:
    """A repeated key keeps the last value, big numbers stay as json reads them."""
    assert repr(_json.read_answer(text)) == repr(json.loads(text))


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b'{"a":1}', "json"),
        (b"\n\t [1]", "json"),
        (b"\xef\xbb\xbf{}", "json"),
        ("{}".encode("utf-16-le"), "json"),
        (b" " * 10_000 + b"{}", "json"),
        (b"data: {}\n\n", "sse"),
        (b"\r\n\r\nevent: message\n", "sse"),
        (b": keep-alive\n", "sse"),
        (b"retry\n", "sse"),
        (b"<html>", "other"),
        (b'"a string"', "other"),
        (b"\x89PNG\r\n", "other"),
        (b"  \n", "other"),
        (b"", "other"),
    ],
)
def test_classify(data: bytes, kind: str) -> None:
    assert _json.classify(data, final=True) == kind
    if len(data) >= 6 and kind != "other":
        assert _json.classify(data, final=False) == kind


def test_classify_waits_for_enough_bytes() -> None:
    assert _json.classify(b"{", final=False) is None  # the encoding is not known yet
    assert _json.classify(b"ret", final=False) is None  # "retry:" needs six characters
    assert _json.classify(b"    ", final=False) is None


def spellings() -> st.SearchStrategy[str]:
    """Keys that normalise to requestState as state_aliases does: case, ``_``, ``-``, folds."""
    letters = st.tuples(*(st.sampled_from(sorted({c, c.upper()})) for c in "requeststate"))
    separators = st.lists(st.sampled_from(["", "", "_", "-", "__"]), min_size=12, max_size=12)
    # U+017F (long s) folds to "s", U+FB06 (the "st" ligature) to "st".
    folded = st.sampled_from(["reque\u017ftState", "REQUE\u017fTSTATE", "reque\ufb06\ufb06ate"])
    return (
        st.tuples(letters, separators).map(lambda p: "".join(a + b for a, b in zip(*p, strict=True))) | folded
    )


@given(spellings(), st.booleans())
def test_no_spelling_of_requeststate_escapes_the_prefilter(key: str, ascii_only: bool) -> None:
    assert key == "requestState" or state_aliases({key: 1}) == [key]
    text = json.dumps({"result": {"content": [], key: "plain"}}, ensure_ascii=ascii_only)
    assert _json.may_hold_state(text)
    escaped = text.replace(key, "".join(f"\\u{ord(c):04x}" for c in key))
    assert _json.may_hold_state(escaped)


def test_the_prefilter_lets_ordinary_answers_through_unparsed() -> None:
    answer = {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"content": [{"type": "text", "text": "state of requests"}]},
    }
    assert not _json.may_hold_state(json.dumps(answer))
