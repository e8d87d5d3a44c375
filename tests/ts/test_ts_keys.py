"""The TypeScript key manager agrees with the Python one: the same timeline, the same sources.

A mixed fleet only works if every instance promotes and retires keys at the same instants,
so the TypeScript ``Timeline.plan`` is held to ``statecodec.kms.Timeline.plan`` on a few
hundred generated rings (primary, computed retirements, next promotion), and the
environment source reads a bare secret into the same ring as Python's ``EnvSource``.
"""

from __future__ import annotations

import os
import random
import secrets
from typing import Any

import pytest
from ts_package import SKIPS, run_tool

import statecodec as sc
from statecodec.kms import EnvSource, Timeline

pytestmark = SKIPS

T = 1_750_000_000


def random_ring(rng: random.Random) -> sc.KeyRing:
    keys = []
    for i in range(rng.randint(1, 5)):
        created = T - rng.choice([0, 10, 93, 94, 95, 500, 3000, 86_400]) - rng.randint(0, 3)
        retires = rng.choice([None, None, None, T - 5, T + 1, T + 2000])
        keys.append(sc.Key(f"k{i}", secrets.token_bytes(32), created, retires))
    primary = rng.choice([None, *(k.kid for k in keys)])
    return sc.KeyRing(keys, primary)


def test_the_timeline_plans_as_python_does() -> None:
    rng = random.Random(94)
    settings = [
        ({}, Timeline()),
        (
            {
                "refreshInterval": 30,
                "jitter": 0,
                "maxSkew": 5,
                "maxTtl": 120,
                "expiryGrace": 3,
                "stalenessLimit": 60,
            },
            Timeline(30, 0, 5, 120, 3, 60),
        ),
    ]
    cases: list[tuple[sc.KeyRing, float, dict[str, Any], Timeline]] = []
    for _ in range(300):
        ts_settings, timeline = rng.choice(settings)
        cases.append((random_ring(rng), T + rng.choice([0, 0.5, 1, 100]), ts_settings, timeline))
    ops = [{"op": "plan", "keyring": r.to_dict(), "now": now, "timeline": s} for r, now, s, _ in cases]
    spec = {"keyring": sc.KeyRing.generate("x").to_dict(), "ops": ops}
    results = run_tool("interop", spec)["results"]
    for (ring, now, _, timeline), got in zip(cases, results, strict=True):
        plan = timeline.plan(ring, now)
        assert got["ring"] == plan.ring.to_dict(), (ring.to_dict(), now)
        assert got["next_promotion"] == plan.next_promotion


@pytest.mark.parametrize("value", ["bare", "json"])
def test_the_environment_source_reads_what_python_reads(value: str) -> None:
    text = secrets.token_urlsafe(32) if value == "bare" else sc.KeyRing.generate("e1").to_json()
    name = f"STATECODEC_TS_TEST_{value.upper()}"
    os.environ[name] = text
    try:
        python_ring = EnvSource(name).load()
        spec = {"keyring": python_ring.to_dict(), "ops": [{"op": "env", "name": name}]}
        (got,) = run_tool("interop", spec)["results"]
    finally:
        del os.environ[name]
    assert got["ring"] == python_ring.to_dict()
