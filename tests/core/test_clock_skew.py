"""Clock skew between two instances that share keys and a replay store.

Instance A mints (and sometimes redeems); instance B, whose clock is off by ``skew``,
redeems. Real clocks of two processes cannot be set apart without root tricks, so each
codec gets an injected clock around one "true" time, and both share one store whose
own clock is the true time (as a Redis server's or the minting host's would be).

The rules under test (docs/security.md, "Time"): a token issued up to ``max_skew`` in
the future is accepted, so no instance rejects a fresh token of a peer whose clock runs
ahead by up to that; expiry is judged strictly on each verifier's own clock (plus
``expiry_grace``, 0 by default); and however the clocks differ within ``max_skew``, a
token is never redeemed twice. Beyond ``max_skew``: a clear ``not_yet_valid`` naming the
skew.
"""

from __future__ import annotations

import pytest

from statecodec import Binding, InvalidState, KeyRing, Mode, StateCodec
from statecodec.replay.memory import MemoryReplayStore

MAX_SKEW = 60
TTL = 300
T0 = 1_750_000_000
BINDING = Binding(principal="alice", audience="https://mcp.example", method="tools/call", target="search")


class World:
    def __init__(self, mode: Mode, expiry_grace: int = 0) -> None:
        self.true_time = T0
        self.ring = KeyRing.generate("k1", created_at=T0 - 3600)
        self.store = MemoryReplayStore(clock=lambda: self.true_time)
        self.mode = mode
        self.expiry_grace = expiry_grace

    def instance(self, skew: int) -> StateCodec:
        return StateCodec(
            self.ring,
            mode=self.mode,
            ttl=TTL,
            max_skew=MAX_SKEW,
            expiry_grace=self.expiry_grace,
            replay=self.store,
            clock=lambda: self.true_time + skew,
        )


SKEWS_WITHIN = [-MAX_SKEW, -MAX_SKEW + 1, -17, -1, 0, 1, 17, MAX_SKEW - 1, MAX_SKEW]


@pytest.fixture(params=[Mode.SIGN, Mode.ENCRYPT], ids=str)
def world(request: pytest.FixtureRequest) -> World:
    return World(request.param)


# Every pair of clock offsets whose distance is within max_skew (the guarantee is for
# |minter - verifier| <= MAX_SKEW, so both may be off in opposite directions by half).
PAIRS_WITHIN = [(m, v) for m in SKEWS_WITHIN for v in SKEWS_WITHIN if abs(m - v) <= MAX_SKEW]


@pytest.mark.parametrize(("minter_skew", "verifier_skew"), PAIRS_WITHIN)
def test_no_false_rejection_within_the_skew(world: World, minter_skew: int, verifier_skew: int) -> None:
    a, b = world.instance(minter_skew), world.instance(verifier_skew)
    first, last = a.seal(b"1", BINDING), a.seal(b"2", BINDING)
    assert b.unseal(first, BINDING).payload == b"1"  # the moment it was minted
    # Just before exp on the verifier's own clock: expiry is judged there, strictly.
    at_exp = T0 + minter_skew + TTL - verifier_skew
    world.true_time = at_exp - 0.5
    assert b.unseal(last, BINDING).payload == b"2"
    world.true_time = at_exp
    with pytest.raises(InvalidState, match="expired"):
        b.unseal(last, BINDING)  # at exp: expired (judged before the store)


@pytest.mark.parametrize(("minter_skew", "verifier_skew"), PAIRS_WITHIN)
def test_an_expiry_grace_of_max_skew_keeps_every_token_its_whole_ttl(
    minter_skew: int, verifier_skew: int
) -> None:
    # Operators who prefer the full lifetime on every instance to a strict TTL set the grace
    # to the skew: then no instance rejects a token before its exp on the minter's clock.
    world = World(Mode.SIGN, expiry_grace=MAX_SKEW)
    a, b = world.instance(minter_skew), world.instance(verifier_skew)
    token = a.seal(b"x", BINDING)
    world.true_time = T0 + TTL - 0.5  # just before the minter's exp, in true time
    assert b.unseal(token, BINDING).payload == b"x"


@pytest.mark.parametrize("beyond", [1, 30, 3600])
def test_minter_ahead_beyond_the_skew_is_not_yet_valid(world: World, beyond: int) -> None:
    token = world.instance(MAX_SKEW + beyond).seal(b"x", BINDING)
    with pytest.raises(InvalidState) as info:
        world.instance(0).unseal(token, BINDING)
    assert info.value.reason == "not_yet_valid"
    assert "in the future" in info.value.detail and "clock skew" in info.value.detail
    assert f"{MAX_SKEW}s skew allowance" in info.value.detail
    assert len(world.store) == 0  # rejected before the store: nothing burnt


@pytest.mark.parametrize("ahead", [1, 30, MAX_SKEW, TTL])
def test_a_verifier_ahead_sees_the_token_expire_on_its_own_clock(world: World, ahead: int) -> None:
    token = world.instance(0).seal(b"x", BINDING)
    world.true_time += TTL - ahead  # exp on the verifier's clock: a TTL is at most its TTL
    with pytest.raises(InvalidState) as info:
        world.instance(ahead).unseal(token, BINDING)
    assert info.value.reason == "expired"
    assert "expiry grace 0s" in info.value.detail
    assert world.instance(0).unseal(token, BINDING).payload == b"x"  # still fine without the skew


@pytest.mark.parametrize("grace", [0, 30])
@pytest.mark.parametrize("behind", [1, MAX_SKEW // 2, MAX_SKEW])
def test_no_second_redemption_on_an_instance_whose_clock_is_behind(grace: int, behind: int) -> None:
    # A redeems at once; B, up to MAX_SKEW behind, keeps considering the token unexpired for
    # `behind` seconds longer than A. The store must remember it that long: check every
    # second of B's extra window (the store purges on each call).
    world = World(Mode.SIGN, expiry_grace=grace)
    a, b = world.instance(0), world.instance(-behind)
    token = a.seal(b"once", BINDING)
    a.unseal(token, BINDING)
    world.true_time = T0 + TTL + grace - 1  # A's last second of acceptance
    for _ in range(behind + 2):
        world.true_time += 1
        with pytest.raises(InvalidState) as info:
            b.unseal(token, BINDING)
        assert info.value.reason in {"replayed", "expired"}
    assert info.value.reason == "expired"  # the window closed; no accept happened inside it


def test_replay_rejected_across_instances_with_opposite_skews(world: World) -> None:
    a, b = world.instance(+MAX_SKEW // 2), world.instance(-MAX_SKEW // 2)
    token = a.seal(b"once", BINDING)
    assert b.unseal(token, BINDING).payload == b"once"
    with pytest.raises(InvalidState, match="replayed"):
        a.unseal(token, BINDING)
