"""Binding: canonical JSON (RFC 8785), argument digest, the binding encoding and its keyed tag."""

from __future__ import annotations

import copy
import datetime
import decimal
import enum
import hashlib
import hmac
import json
import pickle
import struct
from typing import Any

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st

import statecodec as sc
from statecodec import _binding
from statecodec._binding import MAX_ARGUMENT_DEPTH, MAX_ARGUMENT_NODES

SAFE = 2**53 - 1

# Text the fast path handles: every code point below U+D800 (surrogates and above go to JCS).
fast_text = st.text(alphabet=st.characters(max_codepoint=0xD7FF), max_size=12)
fast_json = st.recursive(
    st.none() | st.booleans() | st.integers(-SAFE, SAFE) | fast_text,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(fast_text, inner, max_size=5),
    max_leaves=30,
)
# Anything JSON: floats, astral and private-use characters (no lone surrogates: not JSON text).
any_text = st.text(max_size=12)
any_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-SAFE, SAFE)
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(any_text, inner, max_size=5),
    max_leaves=30,
)


def _uses_fast_path(value: Any) -> bool:
    walk = _binding._Walk()
    walk.visit(value, 0)
    return not walk.needs_jcs


# ------------------------------------------------------------------ canonical JSON
@given(fast_json)
def test_fast_path_equals_rfc8785(value: Any) -> None:
    assert _uses_fast_path(value)
    assert sc.canonical_json(value) == rfc8785.dumps(value)


@given(any_json)
def test_canonical_json_equals_rfc8785_for_everything_it_accepts(value: Any) -> None:
    assert sc.canonical_json(value) == rfc8785.dumps(value)


@given(fast_json)
def test_argument_digest_is_sha256_of_jcs(value: Any) -> None:
    assert sc.argument_digest(value) == hashlib.sha256(rfc8785.dumps(value)).digest()


@pytest.mark.parametrize(
    ("value", "expected", "json_module_differs"),
    [
        # JCS orders keys by UTF-16 code units: U+1F600 (D83D DE00) before U+E000; Python's sort
        # by code point would put U+E000 first.
        ({"\ue000": 1, "\U0001f600": 2}, '{"\U0001f600":2,"\ue000":1}'.encode(), True),
        ({"n": 100.0}, b'{"n":100}', True),  # ECMAScript number formatting, not repr()
        ({"n": 1e-7}, b'{"n":1e-7}', True),
        ({"n": -0.0}, b'{"n":0}', True),
        ({"n": 1e21}, b'{"n":1e+21}', False),
        ({"b": [1, 2.5]}, b'{"b":[1,2.5]}', False),
        ({"\U0001f600": "\U0001f600"}, '{"\U0001f600":"\U0001f600"}'.encode(), False),
    ],
)
def test_floats_and_astral_keys_take_the_jcs_path(
    value: Any, expected: bytes, json_module_differs: bool
) -> None:
    assert not _uses_fast_path(value)
    assert sc.canonical_json(value) == expected == rfc8785.dumps(value)
    # where the C encoder alone would have been wrong:
    plain = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
    assert (plain != expected) is json_module_differs


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"b": 1, "a": [True, None, "x"]}, b'{"a":[true,null,"x"],"b":1}'),
        ({"s": "caf\u00e9 \u2603"}, '{"s":"caf\u00e9 \u2603"}'.encode()),  # UTF-8, not \\u escapes
        ({"c": '\x00\x1f\b\t\n\f\r"\\/\x7f'}, b'{"c":"\\u0000\\u001f\\b\\t\\n\\f\\r\\"\\\\/\x7f"}'),
        ([SAFE, -SAFE, 0], b"[9007199254740991,-9007199254740991,0]"),
        ((1, 2), b"[1,2]"),  # tuples are arrays
        ({}, b"{}"),
        (None, b"null"),
    ],
)
def test_fast_path_golden_values(value: Any, expected: bytes) -> None:
    assert _uses_fast_path(value)
    assert sc.canonical_json(value) == expected == rfc8785.dumps(value)


class _Color(enum.IntEnum):
    RED = 1


class _Str(str):
    pass


# ------------------------------------------------------------------ the flat-object fast path
# Most tools/call arguments are one flat object of plain scalars; _plain_flat admits those
# without the recursive walk. Anything else in the object sends it down the general path.
plain_scalar = st.none() | st.booleans() | st.integers(-SAFE, SAFE) | fast_text
flat_objects = st.dictionaries(fast_text, plain_scalar, max_size=8)
odd_scalar = (
    plain_scalar
    | st.integers()  # beyond +-(2**53-1) too
    | st.floats(allow_nan=False, allow_infinity=False)
    | any_text
    | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)
    | st.lists(plain_scalar, max_size=2)
    | st.sampled_from([_Color.RED, _Str("s"), b"bytes", 1.5])
)
odd_keys = any_text | st.integers() | st.sampled_from([_Str("k"), "\ud800", "\U0001f600"])
odd_objects = st.dictionaries(odd_keys, odd_scalar, max_size=6)


def _general_path(value: Any) -> bytes:
    # canonical_json of a one-element list never takes the flat path: strip the brackets.
    return sc.canonical_json([value])[1:-1]


@given(flat_objects)
def test_flat_fast_path_equals_rfc8785(value: dict[str, Any]) -> None:
    assert _binding._plain_flat(value), "plain flat objects take the fast path"
    assert sc.canonical_json(value) == rfc8785.dumps(value) == _general_path(value)


@given(odd_objects)
def test_flat_objects_with_anything_decide_like_the_general_path(value: dict[Any, Any]) -> None:
    # Same bytes or the same kind of error, whatever is in the object.
    try:
        expected: bytes | type[Exception] = _general_path(value)
    except (TypeError, ValueError) as exc:
        expected = type(exc)
    try:
        got: bytes | type[Exception] = sc.canonical_json(value)
    except (TypeError, ValueError) as exc:
        got = type(exc)
    assert got == expected
    if _binding._plain_flat(value):
        assert got == rfc8785.dumps(value)


@pytest.mark.parametrize(
    "value",
    [
        {"\U0001f600": 1},  # astral key: JCS orders keys by UTF-16 code units
        {"a": "\U0001f600"},
        {"\ue000": 1},
        {"a": 2**53},
        {"a": -(2**53)},
        {"a": 1.5},
        {"a": [1]},
        {"a": {}},
        {"a": _Color.RED},
        {"a": _Str("x")},
        {_Str("k"): 1},
        {1: "int key"},
        {"a": 1, 2: "mixed key types"},
        {"a": "\ud800"},
    ],
)
def test_flat_fast_path_declines_what_it_does_not_cover(value: dict[Any, Any]) -> None:
    assert not _binding._plain_flat(value)


def test_flat_fast_path_covers_plain_text_below_the_surrogates() -> None:
    value = {"caf\u00e9": "\u2603", "b": True, "a": None, "c": -SAFE, "\x7f": '\x00"\\'}
    assert _binding._plain_flat(value)
    assert sc.canonical_json(value) == rfc8785.dumps(value)


def test_flat_node_limit() -> None:
    ok = {str(i): 0 for i in range(MAX_ARGUMENT_NODES - 1)}  # plus the object itself
    assert sc.canonical_json(ok) == rfc8785.dumps(ok)
    with pytest.raises(ValueError, match="more than"):
        sc.canonical_json({**ok, "one more": 0})


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        b"bytes",
        bytearray(b"x"),
        object(),
        decimal.Decimal("1.5"),
        1 + 2j,
        {1: "int key"},
        {("t",): 1},
        {"nested": [{"deep": {"x": frozenset()}}]},
        2**53,
        -(2**53),
        float("nan"),
        float("inf"),
        {"x": -float("inf")},
        "\ud800",  # a lone surrogate is not Unicode text
        {"\udfff": 1},
        _Color.RED,  # subclasses are refused: their JSON form is not obvious
        _Str("x"),
    ],
)
def test_non_json_values_raise_type_error(value: Any) -> None:
    with pytest.raises(TypeError):
        sc.canonical_json(value)
    with pytest.raises(TypeError):
        sc.Binding(arguments=value)


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def test_depth_limit() -> None:
    assert sc.canonical_json(_nested(MAX_ARGUMENT_DEPTH)) == b"[" * 64 + b"1" + b"]" * 64
    with pytest.raises(ValueError, match="nested deeper"):
        sc.canonical_json(_nested(MAX_ARGUMENT_DEPTH + 1))
    with pytest.raises(ValueError, match="nested deeper"):
        sc.Binding(arguments={"a": _nested(MAX_ARGUMENT_DEPTH)})


def test_node_limit() -> None:
    assert sc.canonical_json([0] * (MAX_ARGUMENT_NODES - 1))  # the list itself is one node
    with pytest.raises(ValueError, match="more than"):
        sc.canonical_json([0] * MAX_ARGUMENT_NODES)
    with pytest.raises(ValueError, match="more than"):
        sc.canonical_json({"k": [[0] * 1000 for _ in range(101)]})


# ------------------------------------------------------------------ the binding encoding
def _field(value: bytes | None) -> bytes:
    return b"\x00" if value is None else b"\x01" + struct.pack(">I", len(value)) + value


def test_encoding_matches_the_spec_byte_for_byte() -> None:
    digest = bytes(range(32))
    b = sc.Binding("alice", None, "tools/call", "", argument_digest=digest, extra={"b": "2", "a": "\u00e9"})
    assert b.encoded == (
        b"statecodec/v1/binding\x00"
        + _field(b"alice")
        + _field(None)
        + _field(b"tools/call")
        + _field(b"")
        + _field(digest)
        + struct.pack(">I", 2)
        + _field(b"a")
        + _field("\u00e9".encode())
        + _field(b"b")
        + _field(b"2")
    )
    key = sc.Key("k1", bytes(range(100, 132)))
    assert b.tag(key) == hmac.digest(key.bind_key, b.encoded, "sha256")[:16]


class _AlwaysEqual(str):
    """A str subclass that claims to equal any text with the same hash as "alice"."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("alice")


def _expected_texts(*texts: str | None) -> bytes:
    return b"statecodec/v1/binding\x00" + b"".join(
        _field(None if t is None else t.encode("utf-8", "surrogatepass")) for t in texts
    )


def test_text_field_cache_never_changes_the_encoding() -> None:
    # Text fields are encoded through a cache (a speed-up, _binding._FIELD_CACHE): a miss,
    # a hit, a lone surrogate, text too long to cache and a str subclass all encode as the
    # spec says.
    long_text = "t" * (_binding._FIELD_CACHE_TEXT_MAX + 1)
    for _ in range(2):  # the second pass reads what the first one cached
        b = sc.Binding("alice", "\ud800", "tools/call", long_text)
        assert b.encoded.startswith(_expected_texts("alice", "\ud800", "tools/call", long_text))
    assert long_text not in _binding._FIELD_CACHE
    # A subclass may lie about equality: it must never be served another text's bytes.
    assert "alice" in _binding._FIELD_CACHE
    sneaky = sc.Binding(_AlwaysEqual("mallory"))
    assert sneaky.encoded.startswith(_expected_texts("mallory"))
    assert sneaky != sc.Binding("alice")


def test_text_field_cache_is_bounded() -> None:
    for i in range(_binding._FIELD_CACHE_MAX + 10):
        b = sc.Binding(f"user-{i}")
        assert b.encoded.startswith(_expected_texts(f"user-{i}"))
        assert len(_binding._FIELD_CACHE) <= _binding._FIELD_CACHE_MAX


def test_unbound_encoding() -> None:
    assert sc.UNBOUND.encoded == b"statecodec/v1/binding\x00" + b"\x00" * 5 + b"\x00\x00\x00\x00"
    assert sc.Binding() == sc.UNBOUND


def test_arguments_are_digested_at_construction() -> None:
    args = {"version": "v2.1.0", "replicas": 3}
    b = sc.Binding(arguments=args)
    assert b.argument_digest == hashlib.sha256(b'{"replicas":3,"version":"v2.1.0"}').digest()
    assert b == sc.Binding(argument_digest=b.argument_digest)
    assert "v2.1.0" not in repr(b)  # only the digest is kept
    args["version"] = "changed"
    assert b == sc.Binding(arguments={"version": "v2.1.0", "replicas": 3})


def test_argument_key_order_does_not_matter() -> None:
    assert sc.Binding(arguments={"a": 1, "b": [1, {"y": 2, "x": 1}]}) == sc.Binding(
        arguments={"b": [1, {"x": 1, "y": 2}], "a": 1}
    )
    assert sc.Binding(arguments=[1, 2]) != sc.Binding(arguments=[2, 1])


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # absent differs from empty, for every field
        ({}, {"principal": ""}),
        ({}, {"audience": ""}),
        ({}, {"method": ""}),
        ({}, {"target": ""}),
        ({}, {"arguments": {}}),
        ({}, {"extra": {"": ""}}),
        # length prefixes: no two field splits give the same bytes
        ({"principal": "ab", "audience": "c"}, {"principal": "a", "audience": "bc"}),
        ({"principal": "alice"}, {"audience": "alice"}),
        ({"method": "x"}, {"extra": {"method": "x"}}),
        ({"extra": {"a": "b"}}, {"extra": {"b": "a"}}),
        ({"extra": {"ab": "c"}}, {"extra": {"a": "bc"}}),
        ({"extra": {"a": "1", "b": "2"}}, {"extra": {"a": "1"}}),
        ({"arguments": None}, {}),  # digest of JSON null is not "no digest"... via argument_digest
    ],
)
def test_distinct_bindings_encode_distinctly(a: dict[str, Any], b: dict[str, Any]) -> None:
    def make(fields: dict[str, Any]) -> sc.Binding:
        if "arguments" in fields and fields["arguments"] is None:
            return sc.Binding(argument_digest=sc.argument_digest(None))
        return sc.Binding(**fields)

    x, y = make(a), make(b)
    assert x.encoded != y.encoded
    assert x != y
    key = sc.Key("k1", bytes(32))
    assert x.tag(key) != y.tag(key)


def test_extra_order_of_insertion_does_not_matter() -> None:
    assert sc.Binding(extra={"a": "1", "b": "2"}) == sc.Binding(extra={"b": "2", "a": "1"})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"principal": 5}, TypeError, "principal must be str"),
        ({"audience": b"x"}, TypeError, "audience must be str"),
        ({"extra": {"a": 1}}, TypeError, "extra must map str to str"),
        ({"extra": {1: "a"}}, TypeError, "extra must map str to str"),
        ({"argument_digest": b"short"}, ValueError, "32 bytes"),
        ({"arguments": {}, "argument_digest": bytes(32)}, ValueError, "not both"),
    ],
)
def test_binding_validation(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        sc.Binding(**kwargs)


def test_tag_is_keyed_and_cached_per_key() -> None:
    b = sc.Binding(principal="alice")
    keys = [sc.Key(f"k{i}", bytes([i]) * 32) for i in range(20)]
    tags = {b.tag(key) for key in keys}  # beyond the 8-entry cache
    assert len(tags) == 20
    for key in keys:
        assert b.tag(key) == hmac.digest(key.bind_key, b.encoded, "sha256")[:16]
    assert len(b._tags) == 8


@given(
    st.one_of(st.none(), any_text),
    st.one_of(st.none(), any_text),
    st.dictionaries(any_text, any_text, max_size=3),
    st.binary(min_size=32, max_size=64),
)
def test_tag_is_the_spec_hmac(
    principal: str | None, target: str | None, extra: dict[str, str], secret: bytes
) -> None:
    key = sc.Key("k1", secret)
    b = sc.Binding(principal, "svc", "tools/call", target, arguments={"n": 1}, extra=extra)
    expected = hmac.digest(key.bind_key, b.encoded, "sha256")[:16]
    assert b.tag(key) == expected
    assert b.tag(key) == expected  # cached


@pytest.mark.parametrize("name", ["principal", "audience", "method", "target", "argument_digest", "extra"])
def test_every_field_is_read_only(name: str) -> None:
    b = sc.Binding("alice", "svc", "tools/call", "t", arguments={"x": 1}, extra={"k": "v"})
    before = b.encoded
    with pytest.raises(AttributeError, match=f"immutable; use binding.replace\\({name}="):
        setattr(b, name, None)
    with pytest.raises(AttributeError, match="immutable"):
        delattr(b, name)
    with pytest.raises(AttributeError):
        b.new_field = 1  # type: ignore[attr-defined]
    assert b.encoded == before and getattr(b, name) is not None


def test_copies_are_the_same_value_and_pickles_carry_no_tag_cache() -> None:
    b = sc.Binding("alice", "svc", "tools/call", "t", arguments={"x": 1}, extra={"k": "v"})
    assert copy.copy(b) is b and copy.deepcopy(b) is b
    key = sc.Key("k1", bytes(range(32)))
    tag = b.tag(key)
    data = pickle.dumps(b)
    assert key.bind_key not in data and tag not in data  # the cache is keyed by a secret subkey
    again = pickle.loads(data)
    assert again == b and again.describe() == b.describe() and again.tag(key) == tag


def test_replace_and_describe() -> None:
    b = sc.Binding("alice", "svc", "tools/call", "t", arguments={"x": 1}, extra={"k": "v"})
    assert b.replace(principal="bob").principal == "bob"
    assert b.replace(principal="bob").argument_digest == b.argument_digest
    assert b.replace(arguments={"x": 2}).argument_digest == sc.argument_digest({"x": 2})
    assert b.describe() == {
        "principal": "alice",
        "audience": "svc",
        "method": "tools/call",
        "target": "t",
        "argument_digest": sc.argument_digest({"x": 1}).hex(),
        "extra": {"k": "v"},
    }
    assert hash(b) == hash(b.replace())
    assert "alice" in repr(b)


def test_seal_with_non_json_arguments_is_a_clear_type_error() -> None:
    codec = sc.StateCodec(sc.KeyRing.generate())
    with pytest.raises(TypeError, match="datetime"):
        codec.seal(b"x", sc.Binding(arguments={"when": datetime.datetime(2025, 1, 1)}))
