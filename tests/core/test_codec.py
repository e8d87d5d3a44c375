"""StateCodec: round trips, every way a token can be wrong, time edges, replay, deny-on-error."""

from __future__ import annotations

import base64
import inspect
import logging
import math
import pickle
from typing import Any

import pytest
from clocks import ManualClock
from hypothesis import given
from hypothesis import strategies as st
from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_decrypt
from nacl.exceptions import CryptoError

import statecodec as sc
from statecodec import _format
from statecodec.replay.memory import MemoryReplayStore

T0 = 1_750_000_000
MODES = [sc.Mode.SIGN, sc.Mode.ENCRYPT]
RING = sc.KeyRing([sc.Key("old", bytes(range(1, 33)), 0), sc.Key("k1", bytes(range(32)), 0)], primary="k1")
FULL = sc.Binding(
    principal="alice",
    audience="deploy-svc",
    method="tools/call",
    target="deploy_production",
    arguments={"version": "v2.1.0"},
    extra={"tenant": "acme"},
)
# Every reason a token itself can earn: the flow reasons need a chained state, replayed and
# store_unavailable a store; internal_error no token earns.
FLOW_REASONS = {"round_limit", "flow_expired", "too_early"}
TOKEN_REASONS = set(sc.REASONS) - FLOW_REASONS - {"replayed", "store_unavailable", "internal_error"}


def _codec(mode: sc.Mode | str = sc.Mode.SIGN, **kw: Any) -> sc.StateCodec:
    kw.setdefault("clock", ManualClock(T0))
    return sc.StateCodec(kw.pop("keys", RING), mode=mode, **kw)


def _at(codec: sc.StateCodec, now: float) -> sc.StateCodec:
    """``codec`` with its hand-moved clock set to ``now``: time enters only through the clock."""
    assert isinstance(codec.clock, ManualClock)
    codec.clock.now = now
    return codec


def _reason(codec: sc.StateCodec, token: Any, binding: sc.Binding | None = FULL, now: float = T0) -> str:
    with pytest.raises(sc.InvalidState) as info:
        _at(codec, now).unseal(token, binding)
    return info.value.reason


def _detail(codec: sc.StateCodec, token: str, now: float) -> str:
    with pytest.raises(sc.InvalidState) as info:
        _at(codec, now).unseal(token, FULL)
    return info.value.detail


CODECS = {m: _codec(m) for m in MODES}

bindings = st.builds(
    sc.Binding,
    principal=st.none() | st.text(max_size=20),
    audience=st.none() | st.text(max_size=20),
    method=st.none() | st.sampled_from(["tools/call", "resources/read", "prompts/get"]),
    target=st.none() | st.text(max_size=20),
    arguments=st.none() | st.dictionaries(st.text(max_size=5), st.integers(-1000, 1000), max_size=3),
    extra=st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("mode", MODES)
@given(payload=st.binary(max_size=2048), binding=st.none() | bindings)
def test_round_trip(mode: sc.Mode, payload: bytes, binding: sc.Binding | None) -> None:
    codec = CODECS[mode]
    token = _at(codec, T0).seal(payload, binding)
    opened = _at(codec, T0 + 1).unseal(token, binding)
    assert type(opened) is sc.OpenedState and len(opened) == len(sc.OpenedState._fields)
    assert opened.payload == payload
    assert (opened.kid, opened.issued_at, opened.expires_at, opened.mode) == ("k1", T0, T0 + 600, mode)
    assert len(bytes.fromhex(opened.token_id)) == 16
    assert token.isascii()
    assert token.startswith("sc1s." if mode is sc.Mode.SIGN else "sc1e.")


@pytest.mark.parametrize("mode", MODES)
def test_empty_payload(mode: sc.Mode) -> None:
    codec = _codec(mode)
    assert codec.unseal(codec.seal(b"")).payload == b""


@pytest.mark.parametrize("mode", MODES)
def test_bytes_like_payloads(mode: sc.Mode) -> None:
    codec = _codec(mode)
    # bytes-like objects are accepted at run time although the annotation says bytes
    assert codec.unseal(codec.seal(bytearray(b"ab"))).payload == b"ab"  # type: ignore[arg-type]
    assert codec.unseal(codec.seal(memoryview(b"cd"))).payload == b"cd"  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="payload must be bytes"):
        codec.seal("text")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cap", [128, 1000, 8192])
def test_payload_up_to_the_size_cap(mode: sc.Mode, cap: int) -> None:
    codec = _codec(mode, max_token_bytes=cap)
    overhead = 1 + len("k1") + 8 + 16 + 16 + (32 if mode is sc.Mode.SIGN else 8 + 16)
    largest = max(p for p in range(cap) if 5 + math.ceil(4 * (overhead + p) / 3) <= cap)
    token = codec.seal(b"\xff" * largest)
    assert len(token) <= cap
    assert codec.unseal(token).payload == b"\xff" * largest
    with pytest.raises(ValueError, match=f"over max_token_bytes={cap}"):
        codec.seal(b"\xff" * (largest + 1))


def test_encrypt_hides_the_payload_and_sign_does_not() -> None:
    secret = b"the launch code is 0000"
    signed, sealed = (_codec(m).seal(secret) for m in MODES)
    assert secret in _format.b64decode(signed[5:])
    assert secret not in _format.b64decode(sealed[5:])


@pytest.mark.parametrize("mode", MODES)
def test_fresh_token_id_and_nonce_every_time(mode: sc.Mode) -> None:
    codec = _codec(mode)
    tokens = [_at(codec, T0).seal(b"same", FULL) for _ in range(20)]
    assert len(set(tokens)) == 20
    ids = {_at(codec, T0).unseal(t, FULL).token_id for t in tokens}
    assert len(ids) == 20
    if mode is sc.Mode.ENCRYPT:
        hl = 1 + 2 + 8 + 32
        suffixes = {_format.b64decode(t[5:])[hl : hl + 8] for t in tokens}
        assert len(suffixes) == 20


def test_encrypt_nonce_is_the_token_id_then_the_suffix() -> None:
    # Opened with PyNaCl's public API, not the codec: the 24-byte nonce is tid || the 8
    # bytes after the header, and the associated data is the prefix and the header.
    token = _codec(sc.Mode.ENCRYPT).seal(b"secret state", FULL)
    raw = _format.b64decode(token[5:])
    hl = 1 + 2 + 8 + 32
    tid, suffix, sealed = raw[hl - 32 : hl - 16], raw[hl : hl + 8], raw[hl + 8 :]
    aead_key = RING.require("k1").aead_key
    aad = b"sc1e." + raw[:hl]
    assert crypto_aead_xchacha20poly1305_ietf_decrypt(sealed, aad, tid + suffix, aead_key) == b"secret state"
    for nonce in (bytes(16) + suffix, tid + bytes(8)):
        with pytest.raises(CryptoError):
            crypto_aead_xchacha20poly1305_ietf_decrypt(sealed, aad, nonce, aead_key)


def test_seal_uses_the_clock_and_ttl() -> None:
    clock = ManualClock(T0 + 5)
    codec = _codec(ttl=30, clock=clock)
    opened = codec.unseal(codec.seal(b"x"))
    assert (opened.issued_at, opened.expires_at) == (T0 + 5, T0 + 35)
    opened = codec.unseal(codec.seal(b"x", ttl=5))
    assert opened.expires_at == T0 + 10
    clock.now = T0 + 5.9  # times are whole seconds, truncated
    assert codec.unseal(codec.seal(b"x")).issued_at == T0 + 5


def test_seal_refuses_bad_ttl_and_times() -> None:
    codec = _codec()
    for ttl in (0, -1, 2**31):
        with pytest.raises(ValueError, match="ttl"):
            codec.seal(b"x", ttl=ttl)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        _at(codec, 2**32 - 10).seal(b"x", None)  # would expire after 2106
    with pytest.raises(ValueError):
        _at(codec, -5).seal(b"x", None)


def test_seal_says_a_ttl_past_the_last_time_a_token_can_carry() -> None:
    # The one check of it: statecodec mint reports this error as a usage error of --ttl.
    codec = _codec(max_flow_age=None)  # else a first round's ttl is cut to the flow budget
    with pytest.raises(_format.TimeRangeError, match="would expire after 2106-02-07T06:28:15Z, the last"):
        _at(codec, 4_000_000_000).seal(b"x", ttl=1_000_000_000)
    last = _at(codec, 2**32 - 1 - 600).seal(b"x", ttl=600)  # expiring at the last second is fine
    assert codec.unseal(last, None, consume=False).expires_at == 2**32 - 1


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"ttl": 0}, ValueError),
        ({"ttl": 2**31}, ValueError),
        ({"max_skew": -1}, ValueError),
        ({"max_skew": 1.5}, ValueError),
        ({"max_skew": 2**31}, ValueError),
        ({"expiry_grace": -1}, ValueError),
        ({"expiry_grace": 0.5}, ValueError),
        ({"expiry_grace": float("nan")}, ValueError),
        ({"max_token_bytes": 127}, ValueError),
        ({"mode": "compress"}, ValueError),
        ({"keys": b"secret"}, TypeError),
        ({"replay": object()}, TypeError),
    ],
)
def test_constructor_validation(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        _codec(**kwargs)


def test_mode_accepts_strings() -> None:
    assert _codec("encrypt").mode is sc.Mode.ENCRYPT
    assert str(sc.Mode.SIGN) == "sign"


# ------------------------------------------------------------------ every change is rejected
_REPLACEMENTS = "AQgw_-9z=+/. \n\u00e9"


@pytest.mark.parametrize("mode", MODES)
def test_every_single_character_change_is_rejected(mode: sc.Mode) -> None:
    codec = _codec(mode)
    token = _at(codec, T0).seal(b"state", FULL)
    tried = 0
    for i, original in enumerate(token):
        for c in _REPLACEMENTS:
            if c == original:
                continue
            mutated = token[:i] + c + token[i + 1 :]
            assert _reason(codec, mutated) in TOKEN_REASONS
            tried += 1
    assert tried > 10 * len(token)


@pytest.mark.parametrize("mode", MODES)
def test_every_bit_flip_of_the_decoded_bytes_is_rejected(mode: sc.Mode) -> None:
    codec = _codec(mode)
    token = _at(codec, T0).seal(b"state", FULL)
    raw = _format.b64decode(token[5:])
    reasons: set[str] = set()
    for i in range(len(raw)):
        for bit in range(8):
            flipped = bytearray(raw)
            flipped[i] ^= 1 << bit
            reason = _reason(codec, token[:5] + _format.b64encode(bytes(flipped)))
            assert reason in {"malformed", "unknown_key", "tampered"}
            reasons.add(reason)
    # kid_len and kid bytes fail structurally or by lookup; everything else fails authentication
    assert reasons == {"malformed", "unknown_key", "tampered"}


@pytest.mark.parametrize("mode", MODES)
def test_every_truncation_is_rejected(mode: sc.Mode) -> None:
    codec = _codec(mode)
    token = _at(codec, T0).seal(b"state", FULL)
    for n in range(len(token)):
        assert _reason(codec, token[:n]) in {"malformed", "tampered"}
    raw = _format.b64decode(token[5:])
    for n in range(len(raw)):
        assert _reason(codec, token[:5] + _format.b64encode(raw[:n])) in {"malformed", "tampered"}


@pytest.mark.parametrize("mode", MODES)
def test_extensions_are_rejected(mode: sc.Mode) -> None:
    codec = _codec(mode)
    token = _at(codec, T0).seal(b"state", FULL)
    raw = _format.b64decode(token[5:])
    for extra in (b"\x00", b"\x00" * 3, b"\xff" * 40):
        assert _reason(codec, token[:5] + _format.b64encode(raw + extra)) == "tampered"
    for suffix in ("=", "==", "\n", " ", "A", "AAAA", ".sig"):
        assert _reason(codec, token + suffix) in {"malformed", "tampered"}


@pytest.mark.parametrize("mode", MODES)
@given(junk=st.text(max_size=200) | st.binary(max_size=200).map(_format.b64encode))
def test_arbitrary_input_only_ever_raises_invalid_state(mode: sc.Mode, junk: str) -> None:
    codec = CODECS[mode]
    for token in (junk, "sc1s." + junk, "sc1e." + junk):
        assert _reason(codec, token) in TOKEN_REASONS


# ------------------------------------------------------------------ cross-checks
@pytest.mark.parametrize("mode", MODES)
def test_cross_key_same_kid_is_tampered(mode: sc.Mode) -> None:
    impostor = sc.KeyRing([sc.Key("k1", bytes(range(5, 37)))], primary="k1")
    token = _codec(mode, keys=impostor).seal(b"x", FULL)
    assert _reason(_codec(mode), token) == "tampered"


@pytest.mark.parametrize("mode", MODES)
def test_cross_key_other_kid_is_unknown(mode: sc.Mode) -> None:
    token = _codec(mode, keys=sc.KeyRing.generate("stranger")).seal(b"x", FULL)
    assert _reason(_codec(mode), token) == "unknown_key"


def test_cross_mode_same_key() -> None:
    signed = _codec(sc.Mode.SIGN).seal(b"x", FULL)
    sealed = _codec(sc.Mode.ENCRYPT).seal(b"x", FULL)
    assert _reason(_codec(sc.Mode.ENCRYPT), signed) == "wrong_mode"
    assert _reason(_codec(sc.Mode.SIGN), sealed) == "wrong_mode"
    # Relabelling the prefix does not help: the prefix is inside the MAC / associated data,
    # and the two modes use independent subkeys.
    # (Payloads long enough for either mode's trailer, so the relabelled body parses.)
    long_signed = _codec(sc.Mode.SIGN).seal(b"x" * 20, FULL)
    long_sealed = _codec(sc.Mode.ENCRYPT).seal(b"x" * 20, FULL)
    assert _reason(_codec(sc.Mode.ENCRYPT), "sc1e." + long_signed[5:]) == "tampered"
    assert _reason(_codec(sc.Mode.SIGN), "sc1s." + long_sealed[5:]) == "tampered"


def test_non_primary_keys_verify_and_only_the_kid_key_is_tried() -> None:
    old_only = sc.KeyRing([RING.require("old")], primary="old")
    token = _codec(keys=old_only).seal(b"x", FULL)
    assert _codec().unseal(token, FULL).kid == "old"
    # A k1 token relabelled as "old" is checked under "old" only, and fails there.
    raw = _format.b64decode(_codec().seal(b"x", FULL)[5:])
    assert raw[:3] == b"\x02k1"
    assert _reason(_codec(), "sc1s." + _format.b64encode(b"\x03old" + raw[3:])) == "tampered"


def test_retired_key() -> None:
    ring = RING.retire("old", T0 + 100)
    token = _codec(keys=RING.with_primary("old")).seal(b"x", FULL)
    codec = _codec(keys=ring)
    assert _at(codec, T0 + 99).unseal(token, FULL).kid == "old"
    assert _reason(codec, token, now=T0 + 100) == "unknown_key"


_FIELDS: list[tuple[str, Any]] = [
    ("principal", "mallory"),
    ("audience", "billing-svc"),
    ("method", "resources/read"),
    ("target", "deploy_staging"),
    ("arguments", {"version": "v2.1.1"}),
    ("extra", {"tenant": "evil"}),
    ("extra", {"tenant": "acme", "region": "eu"}),
    ("extra", {}),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("field", "value"), _FIELDS)
def test_cross_binding_each_field(mode: sc.Mode, field: str, value: Any) -> None:
    codec = _codec(mode)
    token = _at(codec, T0).seal(b"x", FULL)
    assert _reason(codec, token, FULL.replace(**{field: value})) == "binding_mismatch"
    assert _at(codec, T0).unseal(token, FULL).payload == b"x"


@pytest.mark.parametrize("field", ["principal", "audience", "method", "target", "argument_digest"])
def test_present_versus_absent(field: str) -> None:
    codec = _codec()
    without = FULL.replace(**{field: None})
    assert _reason(codec, _at(codec, T0).seal(b"x", FULL), without) == "binding_mismatch"
    assert _reason(codec, _at(codec, T0).seal(b"x", without), FULL) == "binding_mismatch"
    if field != "argument_digest":
        empty = FULL.replace(**{field: ""})
        assert _reason(codec, _at(codec, T0).seal(b"x", without), empty) == "binding_mismatch"


def test_bound_versus_unbound() -> None:
    codec = _codec()
    assert _reason(codec, _at(codec, T0).seal(b"x", FULL), None) == "binding_mismatch"
    assert _reason(codec, _at(codec, T0).seal(b"x", None), FULL) == "binding_mismatch"
    assert _at(codec, T0).unseal(_at(codec, T0).seal(b"x", None), sc.UNBOUND).payload == b"x"


def test_cross_audience_with_a_shared_key() -> None:
    """Two services share a key ring; a token minted for one is refused by the other."""
    deploy, billing = _codec(), _codec()
    token = _at(deploy, T0).seal(b"x", FULL)
    assert _reason(billing, token, FULL.replace(audience="billing-svc")) == "binding_mismatch"
    assert _at(deploy, T0).unseal(token, FULL).payload == b"x"


def test_binding_tag_is_not_readable() -> None:
    """The header holds a keyed tag, never the values or an unkeyed hash of them."""
    token = _codec().seal(b"", FULL)
    raw = _format.b64decode(token[5:])
    assert b"alice" not in raw
    assert FULL.encoded[-16:] not in raw
    assert sc.argument_digest({"version": "v2.1.0"})[:16] not in raw


# ------------------------------------------------------------------ time edges
@pytest.mark.parametrize("mode", MODES)
def test_expiry_is_strict_by_default(mode: sc.Mode) -> None:
    # A TTL means at most its TTL: accepted while now < exp, as JWT's exp and both MCP SDKs
    # have it (they reject at now >= exp). The exact edges: exp - epsilon, exp, exp + epsilon.
    codec = _codec(mode, ttl=600)
    assert (codec.max_skew, codec.expiry_grace) == (60, 0)
    token = _at(codec, T0).seal(b"x", FULL)
    exp = T0 + 600
    for now in (T0, exp - 1, exp - 0.5, exp - 0.001):
        assert _at(codec, now).unseal(token, FULL, consume=False).payload == b"x", now
    for now in (exp, exp + 0.001, exp + 0.5, exp + 0.999, exp + 1, exp + 59, exp + 10**6):
        assert _reason(codec, token, now=now) == "expired", now


def test_an_empty_key_ring_is_refused_at_construction() -> None:
    # As the SDK refuses a codec without keys: at construction, not at the first seal.
    with pytest.raises(ValueError, match="the key ring has no keys"):
        sc.StateCodec(sc.KeyRing([]))
    with pytest.raises(ValueError, match="the key ring has no keys"):
        sc.StateCodec(sc.KeyRing([]), mode="encrypt")
    # A ring that only verifies (no primary) still builds: `statecodec verify` uses one.
    verify_only = sc.KeyRing([sc.Key("k1", bytes(32))])
    assert sc.StateCodec(verify_only).keys is verify_only


@pytest.mark.parametrize("mode", MODES)
def test_a_ttl_is_at_most_its_ttl_as_the_sdks_state_it(mode: sc.Mode) -> None:
    # The two cases of issue 29, from the official SDKs' requestState tests: with ttl=600 a
    # token minted at T0 is refused at T0 + 600.5; with ttl=1 one minted at T0 + 2.0 is
    # refused at T0 + 3.1. Both through the injected clock, as the SDKs' tests do.
    clock = ManualClock(T0)
    codec = _codec(mode, clock=clock, ttl=600)
    token = codec.seal(b"x", FULL)
    clock.now = T0 + 600.5
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(token, FULL)
    assert info.value.reason == "expired"
    short = _codec(mode, clock=clock, ttl=1)
    clock.now = T0 + 2.0
    token = short.seal(b"y", FULL)
    clock.now = T0 + 2.999
    assert short.unseal(token, FULL, consume=False).payload == b"y"
    clock.now = T0 + 3.1
    with pytest.raises(sc.InvalidState) as info:
        short.unseal(token, FULL)
    assert info.value.reason == "expired"
    # Minted late in a second, a token lives less than its TTL, never more: iat is floor(now).
    clock.now = T0 + 2.9
    late = short.seal(b"z", FULL)
    assert _reason(short, late, now=T0 + 3.0) == "expired"


@pytest.mark.parametrize("mode", MODES)
def test_expiry_grace_extends_expiry_and_nothing_else(mode: sc.Mode) -> None:
    codec = _codec(mode, ttl=10, max_skew=0, expiry_grace=30)
    token = _at(codec, T0).seal(b"x", FULL)
    assert _at(codec, T0 + 39.999).unseal(token, FULL).payload == b"x"  # just before exp + grace
    assert _reason(codec, token, now=T0 + 40) == "expired"  # exp + grace
    assert _reason(codec, token, now=T0 + 40.001) == "expired"
    assert _reason(codec, token, now=T0 - 1) == "not_yet_valid"  # no skew allowance from the grace
    detail = _detail(codec, token, now=T0 + 100)
    assert detail == "expired 1m30s ago (expiry grace 30s)"


@pytest.mark.parametrize("mode", MODES)
def test_issued_in_the_future(mode: sc.Mode) -> None:
    codec = _codec(mode, max_skew=60)
    token = _at(codec, T0).seal(b"x", FULL)
    assert _at(codec, T0 - 60).unseal(token, FULL).payload == b"x"  # iat = now + max_skew
    assert _at(codec, T0 - 59.5).unseal(token, FULL).payload == b"x"
    assert _reason(codec, token, now=T0 - 61) == "not_yet_valid"  # iat = now + max_skew + 1
    assert _reason(codec, token, now=T0 - 60.001) == "not_yet_valid"  # exact: iat - now > max_skew
    assert "beyond the 60s skew allowance" in _detail(codec, token, now=T0 - 90)
    strict = _codec(mode, max_skew=0)
    assert _at(strict, T0).unseal(token, FULL).payload == b"x"
    assert _reason(strict, token, now=T0 - 0.5) == "not_yet_valid"
    # The skew allowance never extends expiry: that is the grace's job.
    assert _reason(_codec(mode, max_skew=3600), token, now=T0 + 600) == "expired"


def test_the_order_of_checks() -> None:
    codec = _codec()
    token = _at(codec, T0).seal(b"x", FULL)
    late = T0 + 10**6
    tampered = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    assert _reason(codec, "x" * 9000, now=late) == "too_large"
    assert _reason(_codec(sc.Mode.ENCRYPT), token, now=late) == "wrong_mode"
    assert _reason(codec, tampered, now=late) == "tampered"
    assert _reason(codec, token, FULL.replace(principal="x"), now=late) == "expired"
    assert _reason(codec, token, FULL.replace(principal="x"), now=T0) == "binding_mismatch"


def test_rejections_name_the_token() -> None:
    codec = _codec()
    token = _at(codec, T0).seal(b"x", FULL)
    opened = _at(codec, T0).unseal(token, FULL)
    with pytest.raises(sc.InvalidState) as info:
        _at(codec, T0 + 3600).unseal(token, FULL)
    assert (info.value.kid, info.value.token_id) == ("k1", opened.token_id)
    assert "expired 50m ago" in info.value.detail


def test_verify_unbound_skips_only_the_binding() -> None:
    codec = _codec(replay=MemoryReplayStore())
    token = _at(codec, T0).seal(b"x", FULL)
    assert _at(codec, T0).verify_unbound(token).payload == b"x"
    assert _at(codec, T0).verify_unbound(token).payload == b"x"  # never consumes
    with pytest.raises(sc.InvalidState, match="expired"):
        _at(codec, T0 + 10**6).verify_unbound(token)
    assert _at(codec, T0).unseal(token, FULL).payload == b"x"


# ------------------------------------------------------------------ deny on error
class _BrokenProvider:
    """A key manager whose backend blows up (a stand-in: a real KMS outage cannot be staged here)."""

    def __init__(self, ring: sc.KeyRing) -> None:
        self.ring = ring
        self.broken = False

    def keyring(self) -> sc.KeyRing:
        if self.broken:
            raise RuntimeError("vault connection reset with secret=hunter2")
        return self.ring

    def signing_key(self) -> sc.Key:
        return self.ring.primary


def test_unexpected_exception_fails_closed(caplog: pytest.LogCaptureFixture) -> None:
    provider = _BrokenProvider(RING)
    codec = _codec(keys=provider)
    token = _at(codec, T0).seal(b"x", FULL)
    assert _at(codec, T0).unseal(token, FULL).payload == b"x"
    provider.broken = True
    with caplog.at_level(logging.ERROR, logger="statecodec"), pytest.raises(sc.InvalidState) as info:
        _at(codec, T0).unseal(token, FULL)
    assert info.value.reason == "internal_error"
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "RuntimeError" in info.value.detail
    assert "hunter2" not in str(info.value)  # exception text stays in the server log
    assert any(r.exc_info for r in caplog.records)


def test_wrong_binding_type_fails_closed() -> None:
    codec = _codec()
    token = _at(codec, T0).seal(b"x", FULL)
    assert _reason(codec, token, "alice") == "internal_error"  # type: ignore[arg-type]


# ------------------------------------------------------------------ replay (memory store)
class _FlakyStore(MemoryReplayStore):
    """A real memory store with a switch that makes it fail, as a network store would."""

    def __init__(self) -> None:
        super().__init__(clock=ManualClock(T0))  # the store shares the tests' frozen time
        self.down = False
        self.calls: list[tuple[str, float]] = []

    def consume(self, key: str, retention: float) -> bool:
        if self.down:
            raise ConnectionError("store unreachable")
        self.calls.append((key, retention))
        return super().consume(key, retention)


@pytest.mark.parametrize("mode", MODES)
def test_second_unseal_is_replayed(mode: sc.Mode) -> None:
    store = _FlakyStore()
    codec = _codec(mode, replay=store, namespace="deploy", max_skew=60, expiry_grace=5)
    token = _at(codec, T0).seal(b"x", FULL)
    opened = _at(codec, T0 + 0.25).unseal(token, FULL)
    # This codec accepts it while now < exp + grace; an instance whose clock lags by up to
    # max_skew, until max_skew later. The store gets that as a retention from now, to
    # measure on its own clock.
    assert store.calls == [(f"deploy:{opened.token_id}", 600 + 5 + 60 - 0.25)]
    with pytest.raises(sc.InvalidState) as info:
        _at(codec, T0 + 1).unseal(token, FULL)
    assert info.value.reason == "replayed"
    assert info.value.token_id == opened.token_id


def test_failed_checks_never_consume() -> None:
    store = _FlakyStore()
    codec = _codec(replay=store)
    token = _at(codec, T0).seal(b"x", FULL)
    assert _reason(codec, token, FULL.replace(principal="mallory")) == "binding_mismatch"
    assert _reason(codec, token, now=T0 - 3600) == "not_yet_valid"
    raw = bytearray(_format.b64decode(token[5:]))
    raw[-1] ^= 1
    assert _reason(codec, "sc1s." + _format.b64encode(bytes(raw))) == "tampered"
    assert store.calls == []
    assert len(store) == 0
    assert _at(codec, T0).unseal(token, FULL).payload == b"x"


def test_consume_false_leaves_the_token_usable() -> None:
    codec = _codec(replay=MemoryReplayStore(clock=ManualClock(T0)))
    token = _at(codec, T0).seal(b"x", FULL)
    _at(codec, T0).unseal(token, FULL, consume=False)
    _at(codec, T0).unseal(token, FULL)
    assert _reason(codec, token) == "replayed"


def test_store_failure_is_store_unavailable_and_leaves_the_token(caplog: pytest.LogCaptureFixture) -> None:
    store = _FlakyStore()
    codec = _codec(replay=store)
    token = _at(codec, T0).seal(b"x", FULL)
    store.down = True
    with caplog.at_level(logging.WARNING, logger="statecodec"), pytest.raises(sc.InvalidState) as info:
        _at(codec, T0).unseal(token, FULL)
    assert info.value.reason == "store_unavailable"
    assert "not consumed" in info.value.detail
    assert "replay store unavailable" in caplog.text
    store.down = False
    assert _at(codec, T0).unseal(token, FULL).payload == b"x"
    assert _reason(codec, token) == "replayed"


def test_full_memory_store_fails_closed() -> None:
    codec = _codec(replay=MemoryReplayStore(max_entries=1, clock=ManualClock(T0)))
    first, second = (_at(codec, T0).seal(b"x", FULL) for _ in range(2))
    _at(codec, T0).unseal(first, FULL)
    assert _reason(codec, second) == "store_unavailable"


async def test_aunseal_with_the_memory_store() -> None:
    store = _FlakyStore()
    codec = _codec(sc.Mode.ENCRYPT, replay=store, clock=ManualClock(T0))
    token = codec.seal(b"async", FULL)
    assert (await codec.aunseal(token, FULL)).payload == b"async"
    with pytest.raises(sc.InvalidState) as info:
        await codec.aunseal(token, FULL)
    assert info.value.reason == "replayed"
    other = codec.seal(b"again", FULL)
    with pytest.raises(sc.InvalidState) as info:
        await codec.aunseal(other, FULL.replace(target="t"))
    assert info.value.reason == "binding_mismatch"
    store.down = True
    with pytest.raises(sc.InvalidState) as info:
        await codec.aunseal(other, FULL)
    assert info.value.reason == "store_unavailable"
    store.down = False
    assert (await codec.aunseal(other, FULL, consume=False)).payload == b"again"
    assert (await codec.aunseal(other, FULL)).payload == b"again"


async def test_aunseal_without_a_store_and_its_clock() -> None:
    clock = ManualClock(T0)
    codec = _codec(clock=clock)
    token = codec.seal(b"x", FULL)
    assert (await codec.aunseal(token, FULL)).payload == b"x"
    assert (await codec.aunseal(token, FULL)).payload == b"x"  # no store: no single use
    clock.now = T0 + 10**6
    with pytest.raises(sc.InvalidState, match="expired"):
        await codec.aunseal(token, FULL)


async def test_time_enters_only_through_the_clock() -> None:
    # One way for every entry point: seal, unseal, aunseal and verify_unbound all read the
    # codec's clock, and none takes an instant of its own (no *_at_time twins, no now=).
    clock = ManualClock(T0 + 0.9)
    codec = _codec(clock=clock, ttl=600)
    token = codec.seal(b"x", FULL)
    assert codec.verify_unbound(token).issued_at == T0  # truncated to the whole second
    clock.now = T0 + 599.9  # the last accepted instants, for every entry point
    assert codec.unseal(token, FULL, consume=False).payload == b"x"
    assert (await codec.aunseal(token, FULL, consume=False)).payload == b"x"
    assert codec.verify_unbound(token).payload == b"x"
    clock.now = T0 + 600  # exp: expired
    for attempt in (lambda: codec.unseal(token, FULL), lambda: codec.verify_unbound(token)):
        with pytest.raises(sc.InvalidState, match="expired"):
            attempt()
    with pytest.raises(sc.InvalidState, match="expired"):
        await codec.aunseal(token, FULL)
    public = {name for name in dir(sc.StateCodec) if not name.startswith("_")}
    assert not {name for name in public if name.endswith("_at_time")}
    for method in (
        sc.StateCodec.seal,
        sc.StateCodec.unseal,
        sc.StateCodec.aunseal,
        sc.StateCodec.verify_unbound,
    ):
        assert "now" not in inspect.signature(method).parameters


def test_repr_of_codec_is_safe_and_useful() -> None:
    text = repr(_codec(sc.Mode.ENCRYPT, replay=MemoryReplayStore()))
    assert "encrypt" in text and "k1" in text
    for key in RING.keys:
        for material in (key.secret, key.mac_key, key.aead_key, key.bind_key):
            assert material.hex() not in text
            assert base64.urlsafe_b64encode(material).decode().rstrip("=") not in text
            assert repr(material) not in text


def test_invalid_state_pickles() -> None:
    exc = sc.InvalidState("expired", "expired 3s ago", kid="k1", token_id="ab")
    again = pickle.loads(pickle.dumps(exc))
    assert (again.reason, again.detail, again.kid, again.token_id) == (
        "expired",
        "expired 3s ago",
        "k1",
        "ab",
    )
