"""The publish / promote / retire timeline, on a fake clock.

The last test is a simulation: several instances with skewed clocks and independent
refresh schedules share one real key file that the real rotation job rotates; every
token any healthy instance mints must verify on every other healthy instance.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from clocks import ManualClock
from hypothesis import example, given, settings
from hypothesis import strategies as st

from statecodec import InvalidState, Key, KeyRing, KeyUnavailable, StateCodec
from statecodec import _codec as sc_codec
from statecodec.kms import FileSource, KeyManager, Timeline, init_keys, key_states, rotate

SECRET = bytes(range(32))


def key(kid: str, created_at: int, retires_at: int | None = None) -> Key:
    return Key(kid, SECRET, created_at, retires_at)


# R=10, jitter 0.1, skew 5: D = ceil(11 + 5 + 1) = 17.  M = 100 + 300 + 0 (grace) + 1 = 401.
TL = Timeline(refresh_interval=10, jitter=0.1, max_skew=5, max_ttl=300, expiry_grace=0, staleness_limit=100)


def test_numbers() -> None:
    assert TL.promotion_delay == 17
    assert TL.retirement_margin == 401
    assert TL.min_retire_after == 418
    # The expiry grace adds to M; the skew does not (exp and retires_at are both read on the
    # verifier's clock), but it delays promotion.
    graced = Timeline(
        refresh_interval=10, jitter=0.1, max_skew=5, max_ttl=300, expiry_grace=30, staleness_limit=100
    )
    assert (graced.promotion_delay, graced.retirement_margin) == (17, 431)
    skewed = Timeline(refresh_interval=10, jitter=0.1, max_skew=60, max_ttl=300, staleness_limit=100)
    assert (skewed.promotion_delay, skewed.retirement_margin) == (72, 401)
    default = Timeline()
    # The defaults documented in docs/keys.md: 60 s refresh, 60 s skew, 10 min ttl, no expiry
    # grace, 15 min staleness; and the codec's own defaults.
    assert (default.promotion_delay, default.retirement_margin) == (127, 1501)
    assert (default.max_skew, default.max_ttl, default.expiry_grace) == (
        sc_codec.DEFAULT_MAX_SKEW,
        sc_codec.DEFAULT_TTL,
        sc_codec.DEFAULT_EXPIRY_GRACE,
    )


def test_publish_promote_retire() -> None:
    ring = KeyRing([key("a", 1000), key("b", 5000)])
    # Before b's promotion: a mints, b only verifies.
    plan = TL.plan(ring, 5016)
    assert plan.ring.primary_kid == "a"
    assert plan.ring.require("a").retires_at is None
    assert plan.next_promotion == 5017
    assert [s.state for s in plan.states] == ["primary", "pending"]
    # At b's promotion: b mints; a verifies until 5017 + 401.
    plan = TL.plan(ring, 5017)
    assert plan.ring.primary_kid == "b"
    assert plan.ring.require("a").retires_at == 5017 + 401
    assert plan.next_promotion is None
    assert [s.state for s in plan.states] == ["verify-only", "primary"]
    # After that, a is retired (still listed, no longer verifying).
    states = {s.kid: s for s in TL.plan(ring, 5418).states}
    assert states["a"].state == "retired"
    assert not TL.plan(ring, 5418).ring.require("a").verifies_at(5418)
    assert TL.plan(ring, 5417).ring.require("a").verifies_at(5417)


def test_bootstrap_mints_with_the_oldest_when_nothing_is_promoted() -> None:
    ring = KeyRing([key("new", 1000), key("newer", 1001)])
    plan = TL.plan(ring, 1002)
    assert plan.ring.primary_kid == "new"
    assert plan.ring.require("new").retires_at is None


def test_stored_primary_only_breaks_ties() -> None:
    ring = KeyRing([key("a", 0), key("b", 0)], primary="a")
    assert TL.plan(ring, 100).ring.primary_kid == "a"
    # A newer key still wins over the stored primary once promoted.
    ring = KeyRing([key("a", 0), key("b", 50)], primary="a")
    assert TL.plan(ring, 50 + 17).ring.primary_kid == "b"


def test_operator_retirement_wins_and_never_mints() -> None:
    ring = KeyRing([key("a", 0), key("b", 100, retires_at=2000)])
    plan = TL.plan(ring, 500)
    # b is marked for retirement, so it never becomes primary even though it is newer.
    assert plan.ring.primary_kid == "a"
    # An earlier stored retires_at is kept over the computed one.
    ring = KeyRing([key("a", 0, retires_at=130), key("b", 100)])
    assert TL.plan(ring, 120).ring.require("a").retires_at == 130


def test_all_retired_gives_no_primary() -> None:
    ring = KeyRing([key("a", 0, retires_at=10)])
    plan = TL.plan(ring, 20)
    assert plan.ring.primary_kid is None
    assert [s.state for s in plan.states] == ["retired"]


def test_key_states_function_matches_the_timeline() -> None:
    ring = KeyRing([key("a", 1000), key("b", 5000), key("c", 9000)])
    states = key_states(ring, 9001, 10, 5, 300, 0, jitter=0.1, staleness_limit=100)
    assert [(s.kid, s.state) for s in states] == [("a", "retired"), ("b", "primary"), ("c", "pending")]
    assert states[2].promotes_at == 9017
    assert states[0].retires_at == 5017 + 401
    assert states[1].to_dict()["retires_at"] is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"refresh_interval": 0}, "refresh_interval"),
        ({"jitter": 1}, "jitter"),
        ({"max_skew": -1}, "max_skew"),
        ({"expiry_grace": -1}, "expiry_grace"),
        ({"expiry_grace": float("nan")}, "expiry_grace"),
        ({"max_ttl": 0}, "max_ttl"),
        ({"refresh_interval": 100, "staleness_limit": 100}, "staleness_limit"),
    ],
)
def test_invalid_timelines(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Timeline(**kwargs)


# --------------------------------------------------------------------- manager, fake clock


def manager(
    path: Path,
    clock: Callable[[], float],
    skew: float = 0.0,
    *,
    max_ttl: float = 300,
    staleness_limit: float = 100,
) -> KeyManager:
    return KeyManager(
        FileSource(path),
        refresh_interval=10,
        jitter=0.1,
        max_skew=5,
        max_ttl=max_ttl,
        staleness_limit=staleness_limit,
        clock=lambda: clock() + skew,
    )


def test_manager_promotes_lazily_between_refreshes(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    clock = ManualClock(10_000)
    init_keys(f"file:{path}", clock=lambda: 0)
    mgr = manager(path, clock).start(background=False)
    first = mgr.signing_key().kid
    rotate(f"file:{path}", min_age=0, retire_after=TL.min_retire_after, clock=lambda: clock.now, timeline=TL)
    mgr.refresh_now()
    new = next(k for k in mgr.keyring().kids if k != first)
    codec = StateCodec(mgr, ttl=300, max_skew=5, clock=clock)
    assert codec.unseal(codec.seal(b"x")).kid == first  # published, not promoted
    clock.now += 16
    assert codec.unseal(codec.seal(b"x")).kid == first
    clock.now += 1  # promotion time: no refresh needed
    assert codec.unseal(codec.seal(b"x")).kid == new
    assert mgr.keyring().require(first).retires_at == (10_000 + 17 + 401)
    assert mgr.status()["primary"] == new


class TickingClock(ManualClock):
    """Time moves on by ``step`` at every reading, as it does between two calls on a busy machine."""

    def __init__(self, now: float, step: float) -> None:
        super().__init__(now)
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.mark.parametrize("offset", [i / 20 for i in range(20)])
def test_a_token_is_never_issued_before_its_key_was_promoted(tmp_path: Path, offset: float) -> None:
    # The cause of test_kms_rotation's "minted before its promotion" under load: seal()
    # read its clock, was preempted, and then asked the manager for the key, which had
    # been promoted meanwhile; the token carried the earlier second. Here the codec and
    # the manager share one clock that moves 0.25 s at every reading, started at 20
    # offsets within a second so that some reading falls just before the promotion.
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    mgr = manager(path, ManualClock(10_000)).start(background=False)
    rotate(f"file:{path}", min_age=0, retire_after=TL.min_retire_after, clock=lambda: 10_000, timeline=TL)
    mgr.refresh_now()
    clock = TickingClock(10_000 + TL.promotion_delay - 3 + offset, step=0.25)
    mgr.clock = clock
    codec = StateCodec(mgr, ttl=300, max_skew=5, clock=clock)
    kids = set()
    for _ in range(12):
        opened = codec.verify_unbound(codec.seal(b"x"))
        kids.add(opened.kid)
        created = mgr.keyring().require(opened.kid).created_at
        if created > 0:  # the new key (the first one is dated 0: promoted long ago)
            assert created + TL.promotion_delay <= opened.issued_at, "minted before its promotion"
    assert len(kids) == 2, "the run crossed the promotion"


def test_a_key_never_mints_before_its_promotion_while_a_promoted_one_lives() -> None:
    # An operator marked the only promoted key for retirement (say, after a leak) and added
    # a new one. Minting at once with the new key would have instances that have not
    # refreshed yet reject its tokens; the retiring key keeps minting until the new one is
    # promoted, and never past its own retirement.
    ring = KeyRing([key("leaked", 0, retires_at=5000), key("fresh", 1000)])
    assert TL.plan(ring, 1000 + 16).ring.primary_kid == "leaked"
    assert TL.plan(ring, 1000 + 17).ring.primary_kid == "fresh"
    # Retired before the successor's promotion: the manager must switch at that instant,
    # without waiting for a refresh (a retired key's tokens verify nowhere).
    ring = KeyRing([key("leaked", 0, retires_at=1010), key("fresh", 1000)])
    plan = TL.plan(ring, 1005)
    assert (plan.ring.primary_kid, plan.next_promotion) == ("leaked", 1010)
    assert TL.plan(ring, 1010).ring.primary_kid == "fresh"
    # With several retiring keys promoted, the one that verifies longest mints.
    ring = KeyRing([key("a", 0, retires_at=4000), key("b", 10, retires_at=3000), key("fresh", 1000)])
    assert TL.plan(ring, 1010).ring.primary_kid == "a"
    # Once the retiring keys are gone, nothing is promoted: the new key mints (bootstrap).
    assert TL.plan(ring, 5000).ring.primary_kid == "fresh"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 200), st.none() | st.integers(0, 400)),
        min_size=1,
        max_size=6,
        unique_by=lambda t: t,
    ),
    st.integers(0, 400),
)
def test_the_primary_is_promoted_whenever_a_live_key_is(
    specs: list[tuple[int, int | None]], now: int
) -> None:
    ring = KeyRing([key(f"k{i}", created, retires) for i, (created, retires) in enumerate(specs)])
    plan = TL.plan(ring, now)
    live = [k for k in ring.keys if k.verifies_at(now)]
    if not live:
        assert plan.ring.primary_kid is None
        return
    primary = ring.require(plan.ring.primary_kid or "")
    assert primary.verifies_at(now)
    if any(TL.promotes_at(k) <= now for k in live):
        assert TL.promotes_at(primary) <= now, "an unpromoted key mints while a promoted one lives"
        steady = [k for k in live if k.retires_at is None and TL.promotes_at(k) <= now]
        if steady:
            assert primary.retires_at is None


def test_staleness_stops_minting_not_verifying(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "ring.json"
    clock = ManualClock(10_000)
    init_keys(f"file:{path}", clock=lambda: 0)
    mgr = manager(path, clock).start(background=False)
    codec = StateCodec(mgr, ttl=300, max_skew=5, clock=clock)
    token = codec.seal(b"before the outage")
    moved = path.rename(tmp_path / "elsewhere.json")  # the source goes away
    caplog.set_level("DEBUG", logger="statecodec.kms")
    for _ in range(5):
        clock.now += 10
        with pytest.raises(Exception, match="no such file"):
            mgr.refresh_now()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, "one warning per outage, not one per failed refresh"
    assert "no such file" in warnings[0].getMessage()
    late = codec.seal(b"still minting")  # 50 s stale < 100 s limit
    clock.now += 51
    with pytest.raises(KeyUnavailable, match="staleness limit"):
        codec.seal(b"too stale")
    with pytest.raises(KeyUnavailable):
        codec.seal(b"still too stale")
    assert sum(r.levelname == "ERROR" for r in caplog.records) == 1
    assert codec.unseal(token).payload == b"before the outage"  # verification continues
    assert codec.unseal(late).payload == b"still minting"
    assert mgr.status()["stale"] is True
    assert "no such file" in mgr.status()["last_error"]
    moved.rename(path)
    mgr.refresh_now()
    assert codec.unseal(codec.seal(b"back")).payload == b"back"
    assert any("load again" in r.getMessage() and "minting resumed" in r.getMessage() for r in caplog.records)
    assert mgr.status()["last_error"] is None


def test_not_started_manager_is_a_clear_error(tmp_path: Path) -> None:
    mgr = KeyManager(f"file:{tmp_path / 'absent.json'}")
    with pytest.raises(KeyUnavailable, match="not started"):
        mgr.signing_key()
    with pytest.raises(Exception, match="no such file"):
        mgr.start()


# --------------------------------------------------------------------------- simulation
@settings(max_examples=25, deadline=None)
# A cut that leaves the ring 25 s old: the test's old bound called its refusals wrong.
@example(seed=7775, skews=[0.0, 0.0, 0.0], job_skew=0.0, partition=(82, 11), rotation_every=20)
@given(
    seed=st.integers(0, 2**32 - 1),
    skews=st.lists(st.floats(-2.5, 2.5), min_size=3, max_size=3),
    job_skew=st.floats(-2.5, 2.5),
    partition=st.tuples(st.integers(0, 250), st.integers(0, 100)),
    rotation_every=st.integers(20, 90),
)
def test_simulated_fleet_loses_no_token(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    skews: list[float],
    job_skew: float,
    partition: tuple[int, int],
    rotation_every: int,
) -> None:
    """Three instances, clocks within +-2.5 s (skew 5), one cut off from the source for a while.

    Every token a healthy or partitioned instance mints must unseal on the healthy ones
    until it expires, and every token must come from a promoted key.
    """
    rng = random.Random(seed)
    tl = Timeline(refresh_interval=10, jitter=0.1, max_skew=5, max_ttl=30, staleness_limit=25)
    path = tmp_path_factory.mktemp("sim") / "ring.json"
    t = 1_000_000.0
    init_keys(f"file:{path}", clock=lambda: t - 3600)

    clocks = [lambda s=s: t + s for s in skews]
    managers = [manager(path, c, max_ttl=30, staleness_limit=25).start(background=False) for c in clocks]
    codecs = [StateCodec(m, ttl=30, max_skew=5, clock=c) for m, c in zip(managers, clocks, strict=True)]
    next_refresh = [t + rng.uniform(0, 10) for _ in managers]
    refreshed = [t for _ in managers]  # when each ring was last read from the source
    cut_from, cut_for = t + partition[0], partition[1]
    pending: list[tuple[float, str, int]] = []
    minted = verified = refused = 0
    next_rotation = t + rng.uniform(0, rotation_every)
    end = t + 300
    while t < end:
        if t >= next_rotation:
            rotate(
                FileSource(path),
                min_age=0,
                retire_after=tl.min_retire_after,
                clock=lambda at=t + job_skew: at,
                timeline=tl,
            )
            next_rotation = t + rotation_every
        for i, m in enumerate(managers):
            cut = i == 0 and cut_from <= t < cut_from + cut_for
            if t >= next_refresh[i]:
                if not cut:
                    m.refresh_now()
                    refreshed[i] = t
                next_refresh[i] = t + 10 * rng.uniform(0.9, 1.1)
            try:
                token = codecs[i].seal(b"state")
            except KeyUnavailable:
                # Only the cut-off instance, until its first refresh after the cut, and only
                # once its ring is older than the limit: a cut that misses no refresh, or
                # one short enough, refuses nothing.
                assert i == 0 and cut_from <= t < cut_from + cut_for + 13
                assert t - refreshed[i] > tl.staleness_limit
                refused += 1
                continue
            minted += 1
            kid = codecs[i].verify_unbound(token).kid
            key_ = m.keyring().require(kid)
            oldest = min(k.created_at for k in m.keyring().keys)
            assert key_.created_at + tl.promotion_delay <= clocks[i]() or key_.created_at == oldest
            # Expiry is strict on each verifier's clock: the answer comes back within
            # ttl - 2 s step lag - 5 s skew, so it is inside the token's life on every clock.
            pending.append((t + rng.uniform(0, 22), token, i))
        due = [p for p in pending if p[0] <= t]
        pending = [p for p in pending if p[0] > t]
        for _, token, minter in due:
            for j, codec in enumerate(codecs):
                healthy = not (j == 0 and cut_from <= t < cut_from + cut_for + 13)
                if j != minter and healthy:
                    try:
                        codec.unseal(token)
                    except InvalidState as exc:
                        pytest.fail(f"instance {j} rejected a token of instance {minter}: {exc}")
                    verified += 1
        t += rng.uniform(0.5, 2.0)
    assert minted > 200 and verified > 200
    if cut_for == 0:
        assert refused == 0
