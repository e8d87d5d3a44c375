"""statecodec.compat: detect() for ``inspect``, the verify registry, and garbage of every kind.

Garbage must end in ``InvalidState`` with a precise reason (never another exception, never
acceptance) from every reader, and in a ``FormatInfo`` (never an exception) from detect().
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable

import pytest
from compat_writers import mcp_py_v1_cipher_seal, mcp_py_v1_seal, rs1_token
from hypothesis import given
from hypothesis import strategies as st

from statecodec import Binding, InvalidState, KeyRing, StateCodec
from statecodec._format import b64encode
from statecodec.compat import (
    FORMATS,
    VerifyOptions,
    detect,
    format_for,
    mcp_py_v1,
    mode_of,
    php_v1,
    rs1,
    rs2,
    ruby_v1,
    ts_v1,
    verify,
    verify_detected,
)
from statecodec.compat._common import fail_closed
from statecodec.replay.memory import MemoryReplayStore

SECRET = b"compat-formats-secret-0123456789abcdef"
RUBY_KEY = b"r" * 32  # the Ruby SDK takes exactly 32 bytes
RING = KeyRing.from_secret(SECRET, kid="k1")
NOW = 1_780_000_000.0
MB = "v1." + "A" * (1 << 20)


PY_BOUND = {"method": "tools/call", "target": "t", "arguments": {"x": 1}, "principal": "alice"}
PY_EXPECT = mcp_py_v1.Expected("tools/call", "t", mcp_py_v1.arguments_digest({"x": 1}), "svc", "alice")


def ts_token(payload: object = None, *, bind: str | None = None) -> str:
    return ts_v1.seal(SECRET, payload, clock=lambda: NOW, bind=bind)


def py_token(state: str = "state") -> str:
    return mcp_py_v1_seal([SECRET], state, clock=lambda: NOW, audience="svc", **PY_BOUND)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ detect
def test_detect_sc1_reads_the_header() -> None:
    codec = StateCodec(RING, clock=lambda: NOW)
    token = codec.seal(b'{"step":1}', Binding(principal="alice"))
    info = detect(token)
    assert (info.name, info.format, info.mode, info.kid) == ("statecodec sc1", "sc1", "sign", "k1")
    assert info.issued_at == NOW and info.expires_at == NOW + 600
    assert info.payload == b'{"step":1}' and info.token_id is not None and len(info.token_id) == 32
    enc = detect(StateCodec(RING, mode="encrypt").seal(b"secret"))
    assert (enc.mode, enc.payload, enc.problem) == ("encrypt", None, None)


def test_detect_ts_v1_reads_payload_and_exp() -> None:
    info = detect(ts_token({"a": [1, "é"]}, bind="ctx"))
    assert (info.name, info.format, info.mode) == ("TypeScript SDK v1", "ts-v1", "sign")
    assert info.expires_at == int(NOW) + 600
    assert json.loads(info.payload or b"") == {"a": [1, "é"]}
    assert info.fields == {"bound": True} and info.kid is None


def test_detect_python_v1_names_both_candidates_and_reads_kid_and_size() -> None:
    # A Ruby SDK token has the same shape: without the key, both are candidates.
    token = py_token()
    info = detect(token)
    assert (info.name, info.format, info.mode) == ("Python SDK v1 or Ruby SDK v1", None, "encrypt")
    assert info.candidates == ("mcp-py-v1", "ruby-v1") and info.recognised and info.ambiguity
    kid = info.fields["mcp-py-v1 kid"]
    assert kid == mcp_py_v1.key_id(mcp_py_v1.derive_key(SECRET)).hex() and info.kid is None
    assert info.size == len(token) and info.payload is None and info.expires_at is None
    assert info.fields["mcp-py-v1 ciphertext_bytes"] > 0
    assert info.fields["ruby-v1 ciphertext_bytes"] == info.fields["mcp-py-v1 ciphertext_bytes"] + 4


def test_detect_rs1_reads_expiry_and_payload() -> None:
    info = detect(rs1_token(SECRET, b"step=2", clock=lambda: NOW))
    assert (info.name, info.format, info.mode) == ("rmcp rs1", "rs1", "sign")
    assert info.expires_at == NOW + 600 and info.payload == b"step=2"
    never = detect(rs1_token(SECRET, b"x", clock=lambda: NOW, ttl=None))
    assert never.expires_at is None and never.fields["never_expires"] is True


@pytest.mark.parametrize(
    ("token", "name", "problem_has"),
    [
        ("", "unknown", "not a statecodec"),
        ("hello", "unknown", "not a statecodec"),
        ("rs2.a2lk.Ym9keQ.dGFn", "rmcp rs2 (proposed, rmcp PR #1128)", "malformed"),  # body < 8 bytes
        ("v1.a.b.c", "unknown", "neither"),
        ("sc9s.AAAA", "unknown", "unsupported_version"),
        ("sc1s.!!!", "statecodec sc1", "malformed"),
        ("v1.e30.AAAA", "TypeScript SDK v1", "malformed"),  # MAC too short
        ("v1.AAAA", "Python SDK v1 or Ruby SDK v1", "malformed"),  # shorter than iv + tag
        ("rs1.AAAA.AAAA", "rmcp rs1", "malformed"),  # body shorter than the expiry
        (MB, "Python SDK v1 or Ruby SDK v1", "too_large"),
        ("\x00\xff\ud800 binary", "unknown", "not a statecodec"),
    ],
)
def test_detect_names_garbage_and_says_why(token: str, name: str, problem_has: str) -> None:
    info = detect(token)
    assert info.name == name
    assert info.problem is not None and problem_has in info.problem
    assert info.recognised is (name != "unknown")


def test_absurd_times_are_not_passed_on_as_datetimes() -> None:
    # Anyone can write these without a key; inspect must show them, not crash on them.
    forged_ts = "v1." + b64encode(b'{"p":1,"exp":1e999}') + "." + b64encode(bytes(32))
    info = detect(forged_ts)
    assert info.problem is None and info.expires_at is None
    assert info.fields["exp_out_of_range"] == "inf"
    huge = "v1." + b64encode(b'{"p":1,"exp":' + b"9" * 400 + b"}") + "." + b64encode(bytes(32))
    assert detect(huge).expires_at is None and detect(huge).fields["exp_out_of_range"].startswith("999")
    far = rs1_token(SECRET, b"x", clock=lambda: 2.0**62 / 1000)
    assert detect(far).expires_at is None and detect(far).fields["expiry_ms"] > 2**61
    # And a key holder's token valid "forever" verifies without an unrepresentable time.
    key_holder = "v1." + b64encode(b'{"p":1,"exp":1e999}')
    key_holder += "." + b64encode(hmac.digest(SECRET, key_holder.encode(), hashlib.sha256))
    ok = verify("ts-v1", key_holder, [SECRET], clock=lambda: NOW)
    assert ok.expires_at is None and ok.claims["exp_out_of_range"] == "inf"
    sealed = mcp_py_v1_cipher_seal([SECRET], b'{"v":1,"iat":0,"exp":1e999,"s":"x"}')
    ok = verify("mcp-py-v1", sealed, [SECRET], clock=lambda: NOW)
    assert ok.expires_at is None and ok.claims["exp"] == "inf" and ok.issued_at == 0.0
    json.dumps(dict(ok.claims), allow_nan=False)


def test_an_expiry_of_minus_infinity_is_expired_not_an_internal_error() -> None:
    # A key holder can write exp = -1e999; "expired ... ago" must not overflow on it.
    signed = "v1." + b64encode(b'{"p":1,"exp":-1e999}')
    ts_token_ = signed + "." + b64encode(hmac.digest(SECRET, signed.encode(), hashlib.sha256))
    py_token_ = mcp_py_v1_cipher_seal([SECRET], b'{"v":1,"iat":0,"exp":-1e999,"s":"x"}')
    for fmt, token in (("ts-v1", ts_token_), ("mcp-py-v1", py_token_)):
        with pytest.raises(InvalidState) as err:
            verify(fmt, token, [SECRET], clock=lambda: NOW)
        assert err.value.reason == "expired", (fmt, err.value)


def test_detect_never_raises_on_non_text() -> None:
    for thing in (None, b"v1.abc", 42, ["v1."]):
        info = detect(thing)
        assert info.format is None and info.problem and "text" in info.problem


@given(st.text(max_size=300))
def test_detect_never_raises_on_any_text(text: str) -> None:
    for candidate in (text, "v1." + text, "rs1." + text, "sc1s." + text, "v1." + text + "." + text):
        info = detect(candidate)
        assert info.size == len(candidate)


# -------------------------------------------------------------------------- registry
def test_an_unreadable_token_of_a_known_format_carries_its_stable_reason() -> None:
    assert detect("sc1s.!!!").reason == "malformed" and detect(MB).reason == "too_large"
    assert detect("hello").reason is None and detect(ts_token()).reason is None


def test_format_for_names_what_verify_auto_verifies_as_and_mode_of_what_it_hides() -> None:
    sc1 = StateCodec(RING, mode="encrypt").seal(b"x")
    assert format_for(sc1) == "sc1" and mode_of("sc1", sc1) == "encrypt"
    assert format_for(ts_token()) == "ts-v1" and mode_of("ts-v1", ts_token()) == "sign"
    assert format_for(py_token()) is None  # Python or Ruby SDK v1: the keys decide
    assert format_for("hello") == "sc1" and mode_of("sc1", "hello") == "sign"  # sc1's reader says why
    assert {mode_of(f, "") for f in FORMATS if f != "sc1"} == {"sign", "encrypt"}


def test_registry_lists_every_format() -> None:
    assert set(FORMATS) == {"sc1", "ts-v1", "mcp-py-v1", "ruby-v1", "php-v1", "rs1", "rs2"}
    with pytest.raises(KeyError):
        verify("jwt", "x", RING)


def test_verify_sc1_with_and_without_binding() -> None:
    token = StateCodec(RING, clock=lambda: NOW).seal(b"p", Binding(principal="alice", method="tools/call"))
    unbound = verify("sc1", token, RING, clock=lambda: NOW)
    assert unbound.payload == b"p" and unbound.kid == "k1" and unbound.checked == ()
    assert "principal" in unbound.unchecked
    bound = verify(
        "sc1", token, RING, VerifyOptions(principal="alice", method="tools/call"), clock=lambda: NOW
    )
    assert bound.checked and not bound.unchecked
    with pytest.raises(InvalidState) as err:
        verify("sc1", token, RING, VerifyOptions(principal="bob", method="tools/call"), clock=lambda: NOW)
    assert err.value.reason == "binding_mismatch"
    with pytest.raises(TypeError):
        verify("sc1", token, [SECRET], clock=lambda: NOW)


def test_verify_ts_v1_with_a_ring_and_raw_secrets() -> None:
    other = b"some-other-secret-in-the-ring-0123456789"
    token = ts_token({"n": 1}, bind="alice")
    ring = KeyRing.from_secret(other, kid="k0").with_key(RING.require("k1"))
    unbound = verify("ts-v1", token, ring, clock=lambda: NOW)  # tries k0, then k1
    assert json.loads(unbound.payload or b"") == {"n": 1} and unbound.unchecked == ("bind",)
    assert verify("ts-v1", token, [SECRET], VerifyOptions(bind="alice"), clock=lambda: NOW).checked == (
        "bind",
    )
    with pytest.raises(InvalidState) as err:
        verify("ts-v1", token, [SECRET], VerifyOptions(bind="bob"), clock=lambda: NOW)
    assert err.value.reason == "binding_mismatch"
    with pytest.raises(InvalidState) as err:
        verify("ts-v1", token, [other], clock=lambda: NOW)
    assert err.value.reason == "tampered" and "1 key" in err.value.detail
    with pytest.raises(InvalidState) as err:
        verify("ts-v1", token, [SECRET], clock=lambda: NOW + 601)
    assert err.value.reason == "expired"


def test_verify_mcp_py_v1_checks_only_what_is_given() -> None:
    token = py_token()
    partial = verify(
        "mcp-py-v1", token, [SECRET], VerifyOptions(method="tools/call", target="t"), clock=lambda: NOW
    )
    assert partial.payload == b"state" and partial.checked == ("method", "target")
    assert partial.unchecked == ("arguments", "audience", "principal")
    assert partial.claims["m"] == "tools/call" and "s" not in partial.claims
    full = VerifyOptions(
        principal="alice", audience="svc", method="tools/call", target="t", arguments={"x": 1}
    )
    assert verify("mcp-py-v1", token, RING, full, clock=lambda: NOW).unchecked == ()
    for wrong in (
        VerifyOptions(arguments={"x": 2}),
        VerifyOptions(principal="bob"),
        VerifyOptions(audience="x"),
    ):
        with pytest.raises(InvalidState) as err:
            verify("mcp-py-v1", token, [SECRET], wrong, clock=lambda: NOW)
        assert err.value.reason == "binding_mismatch"
    with pytest.raises(InvalidState) as err:
        verify("mcp-py-v1", token, [b"z" * 32], clock=lambda: NOW)
    assert err.value.reason == "unknown_key"


def test_verify_rs1_needs_the_associated_data() -> None:
    token = rs1_token(SECRET, b"x", b"ctx", clock=lambda: NOW)
    assert (
        verify("rs1", token, [SECRET], VerifyOptions(associated_data=b"ctx"), clock=lambda: NOW).payload
        == b"x"
    )
    with pytest.raises(InvalidState) as err:
        verify("rs1", token, [SECRET], clock=lambda: NOW)
    assert err.value.reason == "tampered" and "associated data" in err.value.detail


def test_verify_never_consumes() -> None:
    store = MemoryReplayStore()
    codec = StateCodec(RING, replay=store)
    token = codec.seal(b"once")
    for _ in range(3):
        verify("sc1", token, RING)
    assert codec.unseal(token).payload == b"once"  # still unconsumed


def test_retired_keys_do_not_verify_foreign_formats() -> None:
    # k1 retired a second ago; k0 (another secret) is primary. Only k0 may be tried.
    ring = KeyRing.from_secret(b"the-new-primary-secret-0123456789abcdef", kid="k0")
    ring = ring.with_key(RING.require("k1")).retire("k1", at=int(NOW) - 1)
    token = ts_token({"n": 1})
    assert verify("ts-v1", token, ring, clock=lambda: NOW - 2).payload == b'{"n": 1}'
    with pytest.raises(InvalidState) as err:
        verify("ts-v1", token, ring, clock=lambda: NOW)
    assert err.value.reason == "tampered"
    alone = KeyRing.from_secret(b"the-new-primary-secret-0123456789abcdef", kid="k0")
    with pytest.raises(InvalidState) as err:
        verify(
            "rs1",
            rs1_token(SECRET, b"x", clock=lambda: NOW),
            alone.with_key(RING.require("k1")).retire("k1", at=0),
            clock=lambda: NOW,
        )
    assert err.value.reason == "tampered"


# --------------------------------------------------------------------------- garbage
GARBAGE = [
    pytest.param("", id="empty"),
    pytest.param(os.urandom(64).decode("latin-1"), id="binary"),
    pytest.param("\x00" * 10, id="nul"),
    pytest.param("A" * (1 << 20), id="1MB-no-prefix"),
    pytest.param("v1." + "A" * (1 << 20), id="1MB-v1"),
    pytest.param("rs1." + "A" * (1 << 20) + ".AAAA", id="1MB-rs1"),
    pytest.param("rs2.a2lk." + "A" * (1 << 20) + ".AAAA", id="1MB-rs2"),
    pytest.param("eyJleHAiOj" + "A" * (1 << 20) + ".AAAA", id="1MB-php"),
    pytest.param("rs2.", id="prefix-only-rs2"),
    pytest.param("rs2." + "QQ" * 200 + ".AAAAAAAAAAA.AAAA", id="rs2-kid-too-long"),
    pytest.param("x1.AAAA.AAAA", id="wrong-prefix"),
    pytest.param("v1.", id="prefix-only-v1"),
    pytest.param("rs1.", id="prefix-only-rs1"),
    pytest.param("v1.e30.", id="empty-mac"),
    pytest.param("v1.\u00e9\u00e9.AAAA", id="non-ascii"),
    pytest.param("v1.AAAA\n", id="newline"),
    pytest.param(" v1.AAAA", id="leading-space"),
]


def _readers() -> list[tuple[str, Callable[[str], object]]]:
    return [
        ("ts-v1", lambda t: ts_v1.unseal(t, SECRET, clock=lambda: NOW, bind=None)),
        ("ts-v1-unbound", lambda t: ts_v1.unseal(t, SECRET, clock=lambda: NOW)),
        ("mcp-py-v1", lambda t: mcp_py_v1.unseal(t, [SECRET], clock=lambda: NOW, expect=PY_EXPECT)),
        ("mcp-py-v1-cipher", lambda t: mcp_py_v1.decrypt(t, [SECRET])),
        ("rs1", lambda t: rs1.unseal(t, SECRET, b"", clock=lambda: NOW)),
        ("ruby-v1", lambda t: ruby_v1.unseal(t, RUBY_KEY, expect=ruby_v1.Expected(), clock=lambda: NOW)),
        ("php-v1", lambda t: php_v1.unseal(t, SECRET, clock=lambda: NOW)),
        ("rs2", lambda t: rs2.unseal(t, {"k1": SECRET}, b"", clock=lambda: NOW)),
        *(
            (f"verify {f}", lambda t, f=f: verify(f, t, [SECRET], clock=lambda: NOW))
            for f in ("ts-v1", "mcp-py-v1", "php-v1", "rs1")
        ),
        ("verify ruby-v1", lambda t: verify("ruby-v1", t, [RUBY_KEY], clock=lambda: NOW)),
        ("verify rs2", lambda t: verify("rs2", t, {"k1": SECRET}, clock=lambda: NOW)),
    ]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_every_reader_rejects_garbage_with_a_reason(garbage: str) -> None:
    for name, open_ in _readers():
        with pytest.raises(InvalidState) as err:
            open_(garbage)
        assert err.value.reason in {"malformed", "too_large"}, (name, err.value)
        if len(garbage) > 65536:
            assert err.value.reason == "too_large", name


@pytest.mark.parametrize("thing", [None, b"v1.AAAA", 7])
def test_every_reader_rejects_non_text(thing: object) -> None:
    for _, open_ in _readers():
        with pytest.raises(InvalidState) as err:
            open_(thing)  # type: ignore[arg-type]
        assert err.value.reason == "malformed"


@given(st.text(max_size=200), st.sampled_from(["", "v1.", "rs1.", "rs2.a2lk.", "v1.e30.", "eyJleHAiOj"]))
def test_random_text_never_crashes_or_passes(text: str, prefix: str) -> None:
    for _, open_ in _readers():
        with pytest.raises(InvalidState) as err:
            open_(prefix + text)
        assert err.value.reason in {"malformed", "too_large", "tampered", "unknown_key"}


@given(st.binary(min_size=1, max_size=120))
def test_authentic_but_odd_ts_envelopes_fail_closed(body: bytes) -> None:
    """Whatever JSON a key holder signs, unseal returns or raises InvalidState, nothing else."""
    text = b64encode(body)
    mac = hmac.digest(SECRET, b"v1." + text.encode(), hashlib.sha256)
    try:
        ts_v1.unseal(f"v1.{text}.{b64encode(mac)}", SECRET, clock=lambda: NOW, bind=None)
    except InvalidState as exc:
        assert exc.reason in {"malformed", "expired", "binding_mismatch"}


def test_an_unexpected_error_fails_closed_with_its_traceback_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @fail_closed("test")
    def broken(token: str) -> None:
        raise RuntimeError("database down")

    with caplog.at_level(logging.ERROR, logger="statecodec.compat"), pytest.raises(InvalidState) as err:
        broken("v1.x")
    assert err.value.reason == "internal_error" and "RuntimeError" in (err.value.detail or "")
    assert "database down" not in str(err.value) and caplog.records[0].exc_info is not None


def test_unusable_keys_are_refused_before_any_token_is_read() -> None:
    tokens = {
        "ts-v1": ts_token(1),
        "mcp-py-v1": py_token(),
        "rs1": rs1_token(SECRET, b"x", clock=lambda: NOW),
    }
    for bad in (b"short", 12345, bytes(8)):
        with pytest.raises((TypeError, ValueError)):
            ts_v1.seal(bad, 1, clock=lambda: NOW)  # type: ignore[arg-type]
        for fmt, token in tokens.items():
            with pytest.raises((TypeError, ValueError)):
                verify(fmt, token, [bad], clock=lambda: NOW)  # type: ignore[list-item]
    with pytest.raises(ValueError):
        ts_v1.seal(SECRET, 1, clock=lambda: NOW, ttl_seconds=float("nan"))
    with pytest.raises(TypeError):
        rs1.unseal(tokens["rs1"], SECRET, "ctx", clock=lambda: NOW)  # type: ignore[arg-type]
    for bad_ring in ({"k1": b"short"}, {"": SECRET}, {}):
        with pytest.raises(ValueError):
            rs2.unseal("rs2.a2sx.AAAAAAAAAAA.AAAA", bad_ring, b"")
    with pytest.raises(ValueError):
        ruby_v1.unseal("v1." + "A" * 40, SECRET, expect=ruby_v1.Expected())  # not 32 bytes


def test_verify_detected_names_sc1_and_the_formats_it_cannot_tell_apart() -> None:
    token = StateCodec(RING, clock=lambda: NOW).seal(b"p")
    assert verify_detected(token, RING, clock=lambda: NOW).format == "sc1"
    with pytest.raises(InvalidState) as err:
        verify_detected("hello", RING, clock=lambda: NOW)
    assert err.value.reason == "malformed"
    # A Python SDK token: the Ruby candidate fails its tag, the Python one opens it.
    ok = verify_detected(py_token(), [SECRET, RUBY_KEY], clock=lambda: NOW)
    assert ok.format == "mcp-py-v1" and ok.payload == b"state"


def test_errors_never_show_keys() -> None:
    other = b"compat-formats-other-secret-0123456789"
    tokens = {
        "ts-v1": ts_token(1),
        "mcp-py-v1": py_token(),
        "rs1": rs1_token(SECRET, b"x", clock=lambda: NOW),
    }
    for fmt, token in tokens.items():
        with pytest.raises(InvalidState) as err:
            verify(fmt, token, [other], clock=lambda: NOW)
        for shown in (str(err.value), repr(err.value), err.value.detail or ""):
            assert other.decode() not in shown and SECRET.decode() not in shown, fmt


def test_real_clock_defaults_work() -> None:
    # Without clock=lambda: , verify reads the real clock: a fresh token verifies, as the SDKs would.
    fresh = ts_v1.seal(SECRET, 1)
    assert abs((verify("ts-v1", fresh, [SECRET]).expires_at or 0) - time.time() - 600) < 5


_GIVEN = {
    "principal": "alice",
    "audience": "srv",
    "method": "tools/call",
    "target": "t",
    "arguments": {"a": 1},
    "bind": "alice",
    "associated_data": b"ctx",
    "arguments_digest": "0" * 64,
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_field_the_format_does_not_bind_is_refused_not_left_unchecked(fmt: str) -> None:
    binds = FORMATS[fmt].binds
    assert set(binds) <= set(_GIVEN) and bool(binds) == (fmt != "php-v1")  # the PHP SDK binds nothing
    for name, value in _GIVEN.items():
        options = VerifyOptions(**{name: value})
        assert FORMATS[fmt].refused(options) == (() if name in binds else (name,))
        if name not in binds:  # refused before the token is read, whatever it is
            with pytest.raises(ValueError, match=f"a {fmt} token binds .*; drop {name}$"):
                verify(fmt, "not a token", RING, options, clock=lambda: NOW)


def test_detect_says_why_a_token_cannot_be_read_as_the_error_to_raise() -> None:
    unknown = detect("just-some-text").refusal()
    assert unknown is not None and unknown.reason == "malformed"
    assert unknown.detail.startswith("not a recognised requestState token: ")
    cut = detect("sc1s.AAAA").refusal()
    assert cut is not None and cut.reason == detect("sc1s.AAAA").reason
    assert cut.detail.startswith("unreadable statecodec sc1 token: ")
    assert detect(StateCodec(RING, clock=lambda: NOW).seal(b"x")).refusal() is None
