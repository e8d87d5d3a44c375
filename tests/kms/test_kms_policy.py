"""The rotation decision (kms/_policy.py): pure, one for every source, with the safety floor inside."""

from __future__ import annotations

from pathlib import Path

import pytest

from statecodec import KeyRing
from statecodec._keys import Key
from statecodec.kms import Timeline, VaultSettings, init_keys, rotate
from statecodec.kms._policy import RotationPolicy
from statecodec.kms._transit import TransitSource

TL = Timeline(refresh_interval=10, jitter=0.1, max_skew=5, max_ttl=300, staleness_limit=100)
DAY = 86400


def test_an_unsafe_retire_after_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    before = path.read_bytes()
    with pytest.raises(ValueError, match="too short"):
        rotate(
            f"file:{path}", min_age=0, retire_after=TL.min_retire_after - 1, timeline=TL, clock=lambda: DAY
        )
    assert path.read_bytes() == before


def test_the_floor_is_checked_before_the_transit_source_calls_vault(refused_port: int) -> None:
    # Nothing listens on the port: reaching Vault would raise KeySourceError, not ValueError.
    settings = VaultSettings(addr=f"http://127.0.0.1:{refused_port}", token="t", retries=0)
    with TransitSource("transit", "k", settings) as source, pytest.raises(ValueError, match="too short"):
        rotate(source, min_age=0, retire_after=60, dry_run=True, timeline=TL)


def test_min_age_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="min_age"):
        RotationPolicy(-1, TL.min_retire_after, TL)


def _key(kid: str, created_at: int, retires_at: int | None = None) -> Key:
    return Key(kid, bytes(32), created_at, retires_at)


def test_the_decision_rotates_retires_and_removes_from_metadata_alone() -> None:
    after = TL.min_retire_after
    policy = RotationPolicy(min_age=DAY, retire_after=after, timeline=TL)
    ring = KeyRing([_key("gone", 0, 10), _key("old", 100), _key("mid", 200), _key("new", 300)])
    now = 300 + after  # "new" is exactly retire_after old: "mid" retires now, "old" too
    decision = policy.decide(ring, now)
    assert not decision.rotate  # "new" is younger than a day
    assert decision.newest is not None and decision.newest.kid == "new"
    assert decision.newest_age == after
    assert decision.primary == "new"
    assert decision.retire == (("old", 200 + after), ("mid", 300 + after))
    assert decision.remove == ("gone",)  # retired at 10, more than retire_after ago
    assert policy.decide(ring, now - 1).retire == (("old", 200 + after),)  # one second early: not "mid"


def test_the_decision_never_retires_the_primary_and_rotates_an_empty_ring() -> None:
    policy = RotationPolicy(min_age=0, retire_after=TL.min_retire_after, timeline=TL)
    only = KeyRing([_key("a", 0)])
    decision = policy.decide(only, 10 * DAY)
    assert decision.rotate and decision.retire == () and decision.primary == "a"
    empty = policy.decide(KeyRing([_key("x", 0, 1)]), 10 * DAY)  # nothing verifies any more
    assert empty.rotate and empty.newest is None and empty.newest_age is None
