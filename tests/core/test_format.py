"""The token format alone: strict base64url, header layout, and parse() without keys.

docs/format.md is the normative text these tests hold the code to.
"""

from __future__ import annotations

import base64
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statecodec import InvalidState, KeyRing, StateCodec
from statecodec import _format as fmt

TID = bytes(range(16))
BTAG = bytes(range(100, 116))


def _raw(
    kid: str = "k1", iat: int = 1000, exp: int = 1600, body: bytes = b"payload", mode: str = "s"
) -> bytes:
    header = fmt.pack_header(fmt.kid_field(kid), iat, exp, TID, BTAG)
    trailer = b"\xaa" * 32 if mode == "s" else b""
    return header + (body if mode == "s" else b"\x01" * fmt.NONCE_SUFFIX_LEN + body + b"\x02" * 16) + trailer


def _reason(token: object, cap: int = 8192) -> str:
    with pytest.raises(InvalidState) as info:
        fmt.parse(token, cap)  # type: ignore[arg-type]
    return info.value.reason


# ------------------------------------------------------------------ base64url
@given(st.binary(max_size=200))
def test_b64_round_trip_is_canonical(raw: bytes) -> None:
    text = fmt.b64encode(raw)
    assert "=" not in text
    assert text == base64.urlsafe_b64encode(raw).decode().rstrip("=")
    assert fmt.b64decode(text) == raw


@given(st.binary(min_size=1, max_size=60), st.sampled_from(range(1, 4)))
def test_b64_non_canonical_trailing_bits_rejected(raw: bytes, bits: int) -> None:
    text = fmt.b64encode(raw)
    if len(text) % 4 == 0:
        return  # a complete last group has no unused bits
    unused = 0x0F if len(text) % 4 == 2 else 0x03
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    value = alphabet.index(text[-1]) | (bits & unused)
    if value == alphabet.index(text[-1]):
        value |= 1
    spoof = text[:-1] + alphabet[value]
    # The standard library would accept this second spelling of the same bytes...
    assert base64.urlsafe_b64decode(spoof + "=" * (-len(spoof) % 4)) == raw
    # ...the format does not: one byte string, one token.
    with pytest.raises(ValueError, match="trailing bits"):
        fmt.b64decode(spoof)


@pytest.mark.parametrize(
    "text",
    [
        "QUJD=",  # padding
        "QUI=",
        "QQ==",
        "QUJD\n",  # whitespace anywhere
        " QUJD",
        "QU JD",
        "QUJD\t",
        "QU+D",  # standard alphabet
        "QU/D",
        "QUJ.",
        "Q",  # impossible length (1 mod 4)
        "QUJDR",
        "QUJ\u0661",  # a Unicode digit is not base64
        "\uff21\uff21",  # fullwidth letters
    ],
)
def test_b64_rejects_non_canonical_text(text: str) -> None:
    with pytest.raises(ValueError):
        fmt.b64decode(text)


_URLSAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _canonical_by_definition(text: str) -> bool:
    """The spec's rule, written independently of the decoder: alphabet, length, zero trailing bits."""
    if any(c not in _URLSAFE for c in text) or len(text) % 4 == 1:
        return False
    unused = {0: 0, 2: 0x0F, 3: 0x03}[len(text) % 4]
    return not text or _URLSAFE.index(text[-1]) & unused == 0


@given(st.text(alphabet=_URLSAFE + "+/= \n.\u0661\xe9", max_size=40))
def test_b64_accepts_exactly_the_canonical_spellings(text: str) -> None:
    try:
        raw = fmt.b64decode(text)
    except ValueError:
        assert not _canonical_by_definition(text)
    else:
        assert _canonical_by_definition(text)
        assert fmt.b64encode(raw) == text


def test_b64_empty_is_empty() -> None:
    assert fmt.b64decode("") == b""


# ------------------------------------------------------------------ header layout
def test_header_layout_matches_the_spec_table() -> None:
    header = fmt.pack_header(fmt.kid_field("kid-7"), 0x01020304, 0xA0B0C0D0, TID, BTAG)
    assert header == (b"\x05" + b"kid-7" + bytes.fromhex("01020304") + bytes.fromhex("a0b0c0d0") + TID + BTAG)
    assert len(header) == 1 + 5 + 4 + 4 + 16 + 16


@pytest.mark.parametrize(
    ("kid", "iat", "exp", "tid", "btag", "match"),
    [
        ("", 1, 2, TID, BTAG, "kid"),
        ("x" * 33, 1, 2, TID, BTAG, "kid"),
        ("k/1", 1, 2, TID, BTAG, "kid"),
        ("k1", -1, 2, TID, BTAG, "times"),
        ("k1", 3, 2, TID, BTAG, "times"),
        ("k1", 1, 2**32, TID, BTAG, "times"),
        ("k1", 1, 2, TID[:15], BTAG, "16 bytes"),
        ("k1", 1, 2, TID, BTAG + b"x", "16 bytes"),
    ],
)
def test_pack_header_refuses_what_cannot_be_encoded(
    kid: str, iat: int, exp: int, tid: bytes, btag: bytes, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        fmt.pack_header(fmt.kid_field(kid), iat, exp, tid, btag)


def test_max_time_is_u32() -> None:
    header = fmt.pack_header(fmt.kid_field("k"), 2**32 - 2, 2**32 - 1, TID, BTAG)
    assert header[2:10] == struct.pack(">II", 2**32 - 2, 2**32 - 1)


# ------------------------------------------------------------------ parse
@pytest.mark.parametrize("mode", ["s", "e"])
def test_parse_splits_every_field(mode: str) -> None:
    raw = _raw("my.kid:1", 1000, 1600, b"hello", mode)
    parsed = fmt.parse(fmt.encode(fmt.PREFIXES[mode], raw), 8192)
    assert parsed.prefix == fmt.PREFIXES[mode]
    assert parsed.mode == mode
    assert (parsed.kid, parsed.issued_at, parsed.expires_at) == ("my.kid:1", 1000, 1600)
    assert (parsed.token_id, parsed.bind_tag) == (TID, BTAG)
    assert parsed.header == raw[: 1 + 8 + 8 + 32]
    if mode == "s":
        assert (parsed.body, parsed.mac) == (b"hello", b"\xaa" * 32)
    else:
        assert parsed.body == b"\x01" * 8 + b"hello" + b"\x02" * 16
        assert parsed.mac == b""


@pytest.mark.parametrize("mode", ["s", "e"])
def test_parse_accepts_minimal_bodies(mode: str) -> None:
    # An empty payload is legal: SIGN = header || mac, ENCRYPT = header || nonce_suffix || tag.
    raw = _raw(body=b"", mode=mode)
    parsed = fmt.parse(fmt.encode(fmt.PREFIXES[mode], raw), 8192)
    assert parsed.body == (b"" if mode == "s" else b"\x01" * 8 + b"\x02" * 16)
    with pytest.raises(InvalidState, match="truncated"):
        fmt.parse(fmt.encode(fmt.PREFIXES[mode], raw[:-1]), 8192)


def test_size_cap_comes_before_everything() -> None:
    assert _reason("!" * 129, 128) == "too_large"
    assert _reason("sc1s." + "A" * 123, 128) == "malformed"  # exactly at the cap: judged on its merits
    assert _reason("sc9s." + "A" * 200, 128) == "too_large"


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("", "malformed"),
        ("sc1s", "malformed"),
        ("sc1.", "malformed"),
        ("SC1S.AAAA", "malformed"),
        ("sc1S.AAAA", "malformed"),
        ("xsc1s.AAAA", "malformed"),
        ("sc\u0661s.AAAA", "malformed"),  # ARABIC-INDIC DIGIT ONE is not a version
        ("sc1s.", "malformed"),  # empty body
        ("sc2s.AAAA", "unsupported_version"),
        ("sc0e.AAAA", "unsupported_version"),
        ("sc01s.AAAA", "unsupported_version"),
        ("sc100s.AAAA", "unsupported_version"),
        ("sc1x.AAAA", "unsupported_version"),
        ("sc1a.AAAA", "unsupported_version"),
    ],
)
def test_prefix_grammar(token: str, reason: str) -> None:
    assert _reason(token) == reason


@pytest.mark.parametrize("token", [None, b"sc1s.AAAA", 42, ["sc1s."]])
def test_non_str_tokens_are_malformed(token: object) -> None:
    assert _reason(token) == "malformed"


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda raw: b"\x00" + raw[1:], "kid length 0"),
        (lambda raw: b"\x21" + raw[1:], "kid length 33"),
        (lambda raw: raw[:1] + b"/" + raw[2:], "kid has characters"),
        (lambda raw: raw[:1] + b"\xff" + raw[2:], "kid has characters"),
        (lambda raw: raw[:20], "truncated"),
        (lambda raw: raw[:-1], "truncated"),  # one byte short of the MAC
    ],
)
def test_structural_errors_are_malformed(mutate: object, match: str) -> None:
    raw = _raw(body=b"")
    token = fmt.encode(fmt.PREFIX_SIGN, mutate(raw))  # type: ignore[operator]
    with pytest.raises(InvalidState, match=match) as info:
        fmt.parse(token, 8192)
    assert info.value.reason == "malformed"


def test_parse_never_checks_authenticity() -> None:
    # parse() has no key: a garbage MAC parses fine, the codec rejects it later.
    parsed = fmt.parse(fmt.encode(fmt.PREFIX_SIGN, _raw()), 8192)
    assert parsed.mac == b"\xaa" * 32


@given(st.text(max_size=300))
def test_parse_raises_only_invalid_state(text: str) -> None:
    for candidate in (text, "sc1s." + text, "sc1e." + text):
        try:
            fmt.parse(candidate, 8192)
        except InvalidState as exc:
            assert exc.reason in {"malformed", "unsupported_version", "too_large"}


def test_a_truncated_token_is_said_to_look_cut_short() -> None:
    # A token cut anywhere when copied: the reader is told it looks cut short, not about
    # base64url lengths (4n+1 characters) or header sizes.
    codec = StateCodec(KeyRing.generate("k1"))
    token = codec.seal(b"state", None)
    for cut in range(6, len(token)):
        text = token[:cut]
        with pytest.raises(InvalidState) as info:
            codec.unseal(text, None)
        if (cut - 5) % 4 == 1:
            assert info.value.detail.startswith("the token looks cut short"), (cut, info.value.detail)
            assert "was it truncated?" in info.value.detail
        assert "impossible" not in info.value.detail
    # Decodable but shorter than header and tag: the same words.
    assert _detail_of(codec, "sc1s." + fmt.b64encode(fmt.b64decode(token[5:])[:40])).startswith(
        "the token looks cut short"
    )


def _detail_of(codec: StateCodec, token: str) -> str:
    with pytest.raises(InvalidState) as info:
        codec.unseal(token, None)
    return info.value.detail
