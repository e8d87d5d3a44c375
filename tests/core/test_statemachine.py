"""Stateful property tests: seal / unseal / rotate / replay under a fake clock.

Hypothesis drives random sequences of: minting tokens under different bindings and
TTLs (also on an instance whose clock runs ahead), advancing the clock, publishing /
promoting / retiring / removing keys, redeeming tokens (right binding, wrong binding,
tampered, on a second instance whose clock is off either way, all redeeming instances'
clocks within ``max_skew`` of one another), against a real :class:`MemoryReplayStore`
that keeps the true time.

This machine found the replay that made replay entries outlive the token's expiry by the
skew (an instance whose clock lags accepts that long); tests/core/test_clock_skew.py pins it.

A small, independent model says what must happen to every redemption, and the machine
checks the codec agrees exactly (accept, or reject with the model's reason). So no
sequence accepts a token that is expired, replayed, mis-bound or signed by a retired or
removed key, and none rejects a valid one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule

from statecodec import UNBOUND, Binding, InvalidState, Key, KeyRing, Mode, StateCodec
from statecodec.replay.memory import MemoryReplayStore

MAX_SKEW = 30
EXPIRY_GRACE = 10  # not the default 0, so that the model tells the two allowances apart
# Redeeming instances' clock offsets: a window of width MAX_SKEW around the true time, the
# fleet's promise (minting instances may be further ahead: seal_on_instance_ahead).
SKEWED = st.integers(-20, MAX_SKEW - 20)
START = 1_700_000_000
BINDINGS = (
    UNBOUND,
    Binding(principal="alice", audience="https://a.example", method="tools/call", target="t", arguments={}),
    Binding(principal="bob", audience="https://a.example", method="tools/call", target="t", arguments={}),
    Binding(
        principal="alice", audience="https://a.example", method="tools/call", target="t", arguments={"n": 1}
    ),
    Binding(principal="alice", audience="https://a.example", method="prompts/get", target="t"),
)


class RingHolder:
    """A minimal KeyProvider whose ring the machine swaps, like a key manager does."""

    def __init__(self, ring: KeyRing) -> None:
        self.ring = ring

    def keyring(self) -> KeyRing:
        return self.ring

    def signing_key(self) -> Key:
        return self.ring.signing_key()


@dataclass
class Issued:
    token: str
    kid: str
    iat: int
    exp: int
    binding: int
    payload: bytes


class CodecMachine(RuleBasedStateMachine):
    mode = Mode.SIGN
    tokens = Bundle("tokens")

    @initialize(first_ttl=st.sampled_from([1, 60, 300]))
    def start(self, first_ttl: int) -> None:
        self.now = START
        self.counter = 0
        self.holder = RingHolder(KeyRing([self._new_key()], "k1"))
        self.store = MemoryReplayStore(clock=lambda: self.now)
        self.codec = self._codec(0)
        self.consumed: set[str] = set()
        self.accepted = 0
        self.ttl_default = first_ttl

    def _new_key(self) -> Key:
        self.counter += 1
        return Key(f"k{self.counter}", bytes([self.counter]) * 32, created_at=self.now)

    def _codec(self, skew: int) -> StateCodec:
        return StateCodec(
            self.holder,
            mode=self.mode,
            ttl=600,
            max_skew=MAX_SKEW,
            expiry_grace=EXPIRY_GRACE,
            replay=self.store,
            clock=lambda: self.now + skew,
        )

    # --------------------------------------------------------------- the model
    def _expected(self, issued: Issued, binding: int, t: int) -> str | None:
        """Why the token must be rejected at local time ``t``, or None if it must be accepted."""
        key = self.holder.ring.get(issued.kid)
        if key is None or not key.verifies_at(t):
            return "unknown_key"
        if t >= issued.exp + EXPIRY_GRACE:  # a TTL is at most its TTL (issue 29)
            return "expired"
        if issued.iat > t + MAX_SKEW:
            return "not_yet_valid"
        if BINDINGS[binding] != BINDINGS[issued.binding]:
            return "binding_mismatch"
        if issued.token in self.consumed:
            return "replayed"
        return None

    def _redeem(self, codec: StateCodec, issued: Issued, binding: int, t: int) -> None:
        expected = self._expected(issued, binding, t)
        try:
            opened = codec.unseal(issued.token, BINDINGS[binding])
        except InvalidState as exc:
            assert exc.reason == expected, f"rejected as {exc.reason} ({exc.detail}), model says {expected}"
            return
        assert expected is None, f"accepted, but the model says {expected}"
        assert opened.payload == issued.payload and opened.kid == issued.kid
        self.consumed.add(issued.token)
        self.accepted += 1

    # ------------------------------------------------------------------ rules
    @rule(
        target=tokens,
        binding=st.integers(0, len(BINDINGS) - 1),
        ttl=st.sampled_from([None, 1, 45, 300]),
        payload=st.binary(max_size=64),
    )
    def seal(self, binding: int, ttl: int | None, payload: bytes) -> Issued:
        ttl = ttl or self.ttl_default
        token = self.codec.seal(payload, BINDINGS[binding], ttl=ttl)
        kid = self.holder.ring.primary.kid
        return Issued(token, kid, self.now, self.now + ttl, binding, payload)

    @rule(target=tokens, binding=st.integers(0, len(BINDINGS) - 1), skew=st.integers(1, 2 * MAX_SKEW))
    def seal_on_instance_ahead(self, binding: int, skew: int) -> Issued:
        # A minting instance whose clock runs ahead, within max_skew or beyond it.
        token = self._codec(skew).seal(b"ahead", BINDINGS[binding], ttl=60)
        kid = self.holder.ring.primary.kid
        return Issued(token, kid, self.now + skew, self.now + skew + 60, binding, b"ahead")

    @rule(seconds=st.sampled_from([0, 1, 5, 29, 30, 31, 59, 60, 61, 299, 300, 301, 900]))
    def advance_clock(self, seconds: int) -> None:
        self.now += seconds

    @rule(issued=tokens, offset=st.integers(-MAX_SKEW - 2, MAX_SKEW + 2))
    def advance_to_near_expiry(self, issued: Issued, offset: int) -> None:
        # The interesting seconds are around exp + expiry_grace, where instances with
        # different clocks disagree about expiry; jump there (time only moves forward).
        self.now = max(self.now, issued.exp + EXPIRY_GRACE + offset)

    @rule(issued=tokens)
    def redeem(self, issued: Issued) -> None:
        self._redeem(self.codec, issued, issued.binding, self.now)

    @rule(issued=tokens, binding=st.integers(0, len(BINDINGS) - 1))
    def redeem_with_any_binding(self, issued: Issued, binding: int) -> None:
        self._redeem(self.codec, issued, binding, self.now)

    @rule(issued=tokens, skew=SKEWED)
    def redeem_on_skewed_instance(self, issued: Issued, skew: int) -> None:
        # A second instance sharing keys and store, its clock off either way; the store
        # keeps the true time. An instance behind accepts for up to max_skew seconds longer
        # than one ahead, so the store must remember consumed ids that long.
        self._redeem(self._codec(skew), issued, issued.binding, self.now + skew)

    @rule(issued=tokens, position=st.integers(0, 10_000), char=st.sampled_from("AQgw-_"))
    def redeem_tampered(self, issued: Issued, position: int, char: str) -> None:
        body_start = len("sc1s.")
        i = body_start + position % (len(issued.token) - body_start)
        forged = issued.token[:i] + char + issued.token[i + 1 :]
        if forged == issued.token:
            return
        try:
            self.codec.unseal(forged, BINDINGS[issued.binding])
        except InvalidState as exc:
            # Any field may have been hit; what matters is that nothing got through and
            # nothing was consumed (checked by the invariant and later redemptions).
            assert exc.reason in {"tampered", "malformed", "unknown_key"}, exc.reason
        else:
            raise AssertionError(f"a tampered token was accepted: {forged}")

    @rule()
    def publish_key(self) -> None:
        self.holder.ring = self.holder.ring.with_key(self._new_key())

    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        # Only keys not scheduled for retirement: KeyRing.with_primary does not refuse a
        # retiring key (a key manager's promotion policy must), and minting with one would
        # issue tokens that die with it. The primary itself is always a candidate.
        live = [k.kid for k in self.holder.ring.keys if k.retires_at is None]
        self.holder.ring = self.holder.ring.with_primary(data.draw(st.sampled_from(live)))

    @precondition(lambda self: len(self.holder.ring) > 1)
    @rule(data=st.data(), delay=st.sampled_from([0, 1, 30, 300]))
    def retire(self, data: st.DataObject, delay: int) -> None:
        ring = self.holder.ring
        kid = data.draw(st.sampled_from([k for k in ring.kids if k != ring.primary_kid]))
        self.holder.ring = ring.retire(kid, self.now + delay)

    @precondition(lambda self: len(self.holder.ring) > 1)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        ring = self.holder.ring
        self.holder.ring = ring.without(
            data.draw(st.sampled_from([k for k in ring.kids if k != ring.primary_kid]))
        )

    # ------------------------------------------------------------- invariants
    @invariant()
    def store_never_holds_more_than_was_accepted(self) -> None:
        # Only accepted tokens may occupy the store: a rejected one never burns an entry.
        assert len(self.store) <= self.accepted


class EncryptCodecMachine(CodecMachine):
    mode = Mode.ENCRYPT


TestSignCodec = CodecMachine.TestCase
TestEncryptCodec = EncryptCodecMachine.TestCase
