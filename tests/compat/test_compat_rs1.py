"""statecodec.compat.rs1: rmcp's ``rs1.`` format, from vectors derived from its layout.

No Rust toolchain or rmcp build is available here, so nothing runs the real Rust code. The
vectors are built independently of statecodec (``rs1_seal`` in tests/compat_writers.py, and
the known answer below spelled out) from the layout in rmcp's
``crates/rmcp/src/model/request_state.rs`` (read, not executed), and the cases below mirror
that file's own unit tests (roundtrip, tampering, other key, appended bytes, wrong version,
missing sections, bad base64, associated data, TTL at 1 000 ms + 60 s).
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from compat_writers import rs1_seal, rs1_token

from statecodec import InvalidState
from statecodec.compat import detect, rs1

KEY = b"ttl-signing-key-ttl-signing-key!!"  # rmcp's own test key (33 bytes)
# Sealed at 1 000 ms with a 60 s TTL (rmcp's ttl tests): expiry 61 000 ms = 000000000000ee48,
# body 000000000000ee48 || "state", associated data "user:alice".
KNOWN_ANSWER = "rs1.AAAAAAAA7khzdGF0ZQ.2OJ_Fzei8fZmzoVgr3nvDhnGUmzICTLwzioD9N9qn4A"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def reason(token: str, ad: bytes = b"", at: float = 10.0, key: bytes = KEY) -> str | None:
    try:
        rs1.unseal(token, key, ad, clock=lambda: at)
    except InvalidState as exc:
        return exc.reason
    return None


def test_known_answer_vector() -> None:
    assert rs1_token(KEY, b"state", b"user:alice", clock=lambda: 1.0, ttl=60) == KNOWN_ANSWER
    assert rs1_seal(KEY, b"state", b"user:alice", 61_000) == KNOWN_ANSWER
    opened = rs1.unseal(KNOWN_ANSWER, KEY, b"user:alice", clock=lambda: 1.0)
    assert opened.payload == b"state" and opened.expires_at == 61.0


@pytest.mark.parametrize("payload", [b"hello world", b"", b'{"tool":"weather","round":3}', bytes(range(256))])
@pytest.mark.parametrize("ad", [b"", b"user:alice|tools/call:weather"])
def test_reference_tokens_open(payload: bytes, ad: bytes) -> None:
    token = rs1_seal(KEY, payload, ad, 61_000)
    opened = rs1.unseal(token, KEY, ad, clock=lambda: 31.0)
    assert opened.payload == payload and opened.expires_at == 61.0


def test_ttl_boundaries_follow_rmcp() -> None:
    token = rs1_seal(KEY, b"state", b"", 61_000)
    assert reason(token, at=31.0) is None  # 30 s later: valid
    assert reason(token, at=61.0) is None  # now_ms == expiry: still valid (now_ms > expiry expires)
    assert reason(token, at=61.001) == "expired"
    assert reason(token, at=62.0) == "expired"  # rmcp's past_ttl_is_expired


def test_no_ttl_tokens_are_refused_but_read() -> None:
    # rmcp accepts a token sealed without a TTL for ever; a replayable-for-ever token is refused.
    token = rs1_seal(KEY, b"state", b"", 0)
    assert rs1_token(KEY, b"state", clock=lambda: 1.0, ttl=None) == token
    assert reason(token, at=2**40) == "expired"
    info = detect(token)  # inspect still shows what it is
    assert info.payload == b"state" and info.expires_at is None and info.fields["never_expires"] is True


def test_negative_expiry_is_expired() -> None:
    assert reason(rs1_seal(KEY, b"s", b"", -5), at=0.0) == "expired"


def test_associated_data_must_match() -> None:
    token = rs1_token(KEY, b"state", b"user:alice", clock=lambda: 1.0)
    assert reason(token, b"user:alice") is None
    assert reason(token, b"user:bob") == "tampered"
    assert reason(token, b"") == "tampered"  # forgetting the context fails closed
    # The length prefix keeps AD and body apart: moving a byte across the boundary fails.
    assert reason(rs1_seal(KEY, b"xstate", b"user:alic", 61_000), b"user:alice") == "tampered"


def test_tampering_is_rejected() -> None:
    token = rs1_token(KEY, b"amount=100", clock=lambda: 1.0)
    _, body, tag = token.split(".")
    forged_body = b64(base64.urlsafe_b64decode(body + "==")[:8] + b"amount=999")
    assert reason(f"rs1.{forged_body}.{tag}") == "tampered"
    assert reason(token, key=b"a-totally-different-forged-key!!!") == "tampered"
    # A tag of the wrong length is an integrity failure in rmcp (verify_slice), not malformed.
    assert reason(token + "x") == "tampered"  # 44 characters decode to a 33-byte tag
    assert reason(f"rs1.{body}.{tag[:-3]}") == "tampered"
    assert reason(f"rs1.{body}.") == "tampered"
    assert reason(token + "xy") == "malformed"  # 45 characters are not base64


def test_structure_errors_are_malformed() -> None:
    token = rs1_token(KEY, b"state", clock=lambda: 1.0)
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
        assert reason(bad) == "malformed", bad


def test_authentic_but_short_body_is_malformed() -> None:
    # rmcp checks the body length only after the tag verifies; so do we.
    short = b"\x00\x01"
    mac_input = b"rmcp/mrtr/request-state/v1" + bytes(8) + short
    token = "rs1." + b64(short) + "." + b64(hmac.new(KEY, mac_input, hashlib.sha256).digest())
    assert reason(token) == "malformed"
    assert rs1.parse(token).expiry_ms is None


def test_keys_shorter_than_32_bytes_are_refused() -> None:
    with pytest.raises(ValueError):
        rs1.unseal(KNOWN_ANSWER, b"key", b"user:alice", clock=lambda: 1.0)
