"""statecodec.compat.rs1: rmcp's ``rs1.`` format, from vectors derived from its layout.

No Rust toolchain or rmcp build is available here, so nothing runs the real Rust code. The
vectors are built independently in this file from the layout in rmcp's
``crates/rmcp/src/model/request_state.rs`` (read, not executed), and the cases below mirror
that file's own unit tests (roundtrip, tampering, other key, appended bytes, wrong version,
missing sections, bad base64, associated data, TTL at 1 000 ms + 60 s).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct

import pytest

from statecodec import InvalidState
from statecodec.compat import Rs1Codec
from statecodec.compat.rs1 import parse

KEY = b"ttl-signing-key-ttl-signing-key!!"  # rmcp's own test key (33 bytes)


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def reference_token(key: bytes, payload: bytes, ad: bytes, expiry_ms: int) -> str:
    """The layout written out by hand, independently of statecodec.compat.rs1."""
    body = struct.pack(">q", expiry_ms) + payload
    mac_input = b"rmcp/mrtr/request-state/v1" + struct.pack(">Q", len(ad)) + ad + body
    return "rs1." + b64(body) + "." + b64(hmac.new(key, mac_input, hashlib.sha256).digest())


def codec(**kw: object) -> Rs1Codec:
    return Rs1Codec(KEY, **kw)  # type: ignore[arg-type]


def reason(c: Rs1Codec, token: str, ad: bytes = b"", now: float = 10.0) -> str | None:
    c.clock = lambda: now  # judged at this instant
    try:
        c.unseal(token, ad)
    except InvalidState as exc:
        return exc.reason
    return None


def test_known_answer_vector() -> None:
    # Sealed at 1 000 ms with a 60 s TTL (rmcp's ttl tests): expiry 61 000 ms.
    token = codec(ttl_seconds=60, clock=lambda: 1.0).seal(b"state", b"user:alice")
    assert token == reference_token(KEY, b"state", b"user:alice", 61_000)
    assert token == (
        "rs1.AAAAAAAA7khzdGF0ZQ."  # 000000000000ee48 || "state"
        + b64(
            hmac.new(
                KEY,
                b"rmcp/mrtr/request-state/v1"
                + bytes(7)
                + b"\x0auser:alice"
                + bytes.fromhex("000000000000ee48")
                + b"state",
                hashlib.sha256,
            ).digest()
        )
    )


@pytest.mark.parametrize("payload", [b"hello world", b"", b'{"tool":"weather","round":3}', bytes(range(256))])
@pytest.mark.parametrize("ad", [b"", b"user:alice|tools/call:weather"])
def test_reference_tokens_open_and_ours_match_them(payload: bytes, ad: bytes) -> None:
    token = reference_token(KEY, payload, ad, 61_000)
    opened = codec(clock=lambda: 31.0).unseal(token, ad)
    assert opened.payload == payload and opened.expires_at == 61.0
    assert codec(ttl_seconds=60, clock=lambda: 1.0).seal(payload, ad) == token


def test_ttl_boundaries_follow_rmcp() -> None:
    token = reference_token(KEY, b"state", b"", 61_000)
    assert reason(codec(), token, now=31.0) is None  # 30 s later: valid
    assert reason(codec(), token, now=61.0) is None  # now_ms == expiry: still valid (now_ms > expiry expires)
    assert reason(codec(), token, now=61.001) == "expired"
    assert reason(codec(), token, now=62.0) == "expired"  # rmcp's past_ttl_is_expired


def test_no_ttl_tokens_need_an_explicit_opt_in() -> None:
    token = reference_token(KEY, b"state", b"", 0)
    assert reason(codec(), token, now=2**40) == "expired"  # require_expiry is on by default
    opened = codec(require_expiry=False, clock=lambda: 2**40).unseal(token, b"")
    assert opened.payload == b"state" and opened.expires_at is None
    assert codec(ttl_seconds=None, clock=lambda: 1.0).seal(b"state", b"") == token


def test_negative_expiry_is_expired() -> None:
    assert reason(codec(), reference_token(KEY, b"s", b"", -5), now=0.0) == "expired"


def test_associated_data_must_match() -> None:
    token = codec(clock=lambda: 1.0).seal(b"state", b"user:alice")
    assert reason(codec(), token, b"user:alice") is None
    assert reason(codec(), token, b"user:bob") == "tampered"
    assert reason(codec(), token, b"") == "tampered"  # forgetting the context fails closed
    # The length prefix keeps AD and body apart: moving a byte across the boundary fails.
    assert reason(codec(), reference_token(KEY, b"xstate", b"user:alic", 61_000), b"user:alice") == "tampered"


def test_tampering_is_rejected() -> None:
    token = codec(clock=lambda: 1.0).seal(b"amount=100", b"")
    _, body, tag = token.split(".")
    forged_body = b64(base64.urlsafe_b64decode(body + "==")[:8] + b"amount=999")
    assert reason(codec(), f"rs1.{forged_body}.{tag}") == "tampered"
    assert reason(Rs1Codec(b"a-totally-different-forged-key!!!"), token) == "tampered"
    # A tag of the wrong length is an integrity failure in rmcp (verify_slice), not malformed.
    assert reason(codec(), token + "x") == "tampered"  # 44 characters decode to a 33-byte tag
    assert reason(codec(), f"rs1.{body}.{tag[:-3]}") == "tampered"
    assert reason(codec(), f"rs1.{body}.") == "tampered"
    assert reason(codec(), token + "xy") == "malformed"  # 45 characters are not base64


def test_structure_errors_are_malformed() -> None:
    token = codec(clock=lambda: 1.0).seal(b"state", b"")
    for bad in (
        "rs1",
        "rs1.onlybody",
        "rs1.a.b.c",
        "rs1.!!!!.!!!!",
        token.replace("rs1.", "rs2.", 1),
        "RS1." + token[4:],
        "rs1.AAAAA.AAAA",
        token[:-1] + "B",
    ):
        assert reason(codec(), bad) == "malformed", bad


def test_authentic_but_short_body_is_malformed() -> None:
    # rmcp checks the body length only after the tag verifies; so do we.
    short = b"\x00\x01"
    mac_input = b"rmcp/mrtr/request-state/v1" + bytes(8) + short
    token = "rs1." + b64(short) + "." + b64(hmac.new(KEY, mac_input, hashlib.sha256).digest())
    assert reason(codec(), token) == "malformed"
    assert parse(token).expiry_ms is None


def test_keys_shorter_than_32_bytes_are_refused() -> None:
    with pytest.raises(ValueError):
        Rs1Codec(b"key")
