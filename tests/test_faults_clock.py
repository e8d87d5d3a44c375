"""Clock skew between two instances that share keys and a replay store.

Instance A mints (and sometimes redeems); instance B, whose clock is off by ``skew``,
redeems. Real clocks of two processes cannot be set apart without root tricks, so each
codec gets an injected clock around one "true" time, and both share one store whose
own clock is the true time (as a Redis server's or the minting host's would be).

Up to the leeway: no false rejection at any moment of the token's life, and never a
second redemption. Beyond it: a clear ``not_yet_valid`` or ``expired`` naming the skew.
"""

from __future__ import annotations

import pytest

from statecodec import Binding, InvalidState, KeyRing, Mode, StateCodec
from statecodec.replay.memory import MemoryReplayStore

LEEWAY = 60
TTL = 300
T0 = 1_750_000_000
BINDING = Binding(principal="alice", audience="https://mcp.example", method="tools/call", target="search")


class World:
    def __init__(self, mode: Mode) -> None:
        self.true_time = T0
        self.ring = KeyRing.generate("k1", now=T0 - 3600)
        self.store = MemoryReplayStore(clock=lambda: self.true_time)
        self.mode = mode

    def instance(self, skew: int) -> StateCodec:
        return StateCodec(
            self.ring,
            mode=self.mode,
            ttl=TTL,
            leeway=LEEWAY,
            replay=self.store,
            clock=lambda: self.true_time + skew,
        )


SKEWS_WITHIN = [-LEEWAY, -LEEWAY + 1, -17, -1, 0, 1, 17, LEEWAY - 1, LEEWAY]


@pytest.fixture(params=[Mode.SIGN, Mode.ENCRYPT], ids=str)
def world(request: pytest.FixtureRequest) -> World:
    return World(request.param)


# Every pair of clock offsets whose distance is within the leeway (the guarantee is for
# |minter - verifier| <= LEEWAY, so both may be off in opposite directions by half).
PAIRS_WITHIN = [(m, v) for m in SKEWS_WITHIN for v in SKEWS_WITHIN if abs(m - v) <= LEEWAY]


@pytest.mark.parametrize(("minter_skew", "verifier_skew"), PAIRS_WITHIN)
def test_no_false_rejection_within_the_leeway(world: World, minter_skew: int, verifier_skew: int) -> None:
    a, b = world.instance(minter_skew), world.instance(verifier_skew)
    first, last = a.seal(b"1", BINDING), a.seal(b"2", BINDING)
    assert b.unseal(first, BINDING).payload == b"1"  # the moment it was minted
    world.true_time += TTL - 1  # one second before it expires on the minter's clock
    assert b.unseal(last, BINDING).payload == b"2"


@pytest.mark.parametrize("beyond", [1, 30, 3600])
def test_minter_ahead_beyond_the_leeway_is_not_yet_valid(world: World, beyond: int) -> None:
    token = world.instance(LEEWAY + beyond).seal(b"x", BINDING)
    with pytest.raises(InvalidState) as info:
        world.instance(0).unseal(token, BINDING)
    assert info.value.reason == "not_yet_valid"
    assert "in the future" in info.value.detail and "clock skew" in info.value.detail
    assert len(world.store) == 0  # rejected before the store: nothing burnt


@pytest.mark.parametrize("beyond", [1, 30, 3600])
def test_verifier_ahead_beyond_the_leeway_sees_expired(world: World, beyond: int) -> None:
    token = world.instance(0).seal(b"x", BINDING)
    world.true_time += TTL  # expired on the minter's clock, within leeway for a verifier at 0
    with pytest.raises(InvalidState) as info:
        world.instance(LEEWAY + beyond).unseal(token, BINDING)
    assert info.value.reason == "expired"
    assert f"leeway {LEEWAY}s" in info.value.detail
    assert world.instance(0).unseal(token, BINDING).payload == b"x"  # still fine without the skew


@pytest.mark.parametrize("behind", [1, LEEWAY // 2, LEEWAY])
def test_no_second_redemption_on_an_instance_whose_clock_is_behind(world: World, behind: int) -> None:
    # A redeems on time; B, up to LEEWAY behind, keeps considering the token unexpired for
    # `behind` seconds longer than A. The store must remember it that long: check every
    # second of B's extra window (the store purges on each call).
    a, b = world.instance(0), world.instance(-behind)
    token = a.seal(b"once", BINDING)
    a.unseal(token, BINDING)
    world.true_time = T0 + TTL + LEEWAY - 1  # A's last second of acceptance
    for _ in range(behind + 2):
        world.true_time += 1
        with pytest.raises(InvalidState) as info:
            b.unseal(token, BINDING)
        assert info.value.reason in {"replayed", "expired"}
    assert info.value.reason == "expired"  # the window closed; no accept happened inside it


def test_replay_rejected_across_instances_with_opposite_skews(world: World) -> None:
    a, b = world.instance(+LEEWAY // 2), world.instance(-LEEWAY // 2)
    token = a.seal(b"once", BINDING)
    assert b.unseal(token, BINDING).payload == b"once"
    with pytest.raises(InvalidState, match="replayed"):
        a.unseal(token, BINDING)
