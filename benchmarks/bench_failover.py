"""How many accepted tokens a cluster primary failover forgets, with and without ``wait=1``.

    .venv/bin/python benchmarks/bench_failover.py              # 5 failovers per setting (~2 min)
    .venv/bin/python benchmarks/bench_failover.py --trials 2   # a quick look
    .venv/bin/python benchmarks/bench_failover.py --json out.json

Starts a Redis Cluster of 3 primaries with a replica each on loopback (see
tests/fixtures_valkey.py). Each trial: 8 async callers consume fresh keys through one
``redis+cluster://`` URL as fast as they can; after 2 s one primary is killed (SIGKILL)
and its replica takes over; the killed node then comes back as the new primary's replica.
Every key accepted on the killed primary's slots is then looked up on the promoted
replica: a key it does not hold was accepted and forgotten, so the same token would be
accepted a second time (a double acceptance). Reported per setting: keys accepted on the
victim's slots, keys forgotten, the window (from the oldest forgotten acceptance to the
kill), and the gap (from the kill to the first consume accepted again on those slots,
which with wait=1 includes the killed node's return as a replica).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # for fixtures_valkey

import redis  # noqa: E402
import redis.crc  # noqa: E402
from fixtures_valkey import ValkeyCluster  # noqa: E402
from processes import running  # noqa: E402

from statecodec import ReplayStoreError  # noqa: E402
from statecodec.replay import RedisReplayStore  # noqa: E402

CALLERS = 8
STEADY = 2.0
PREFIX = "bench:"


def on_victim(key: str, ranges: list[tuple[int, int]]) -> bool:
    slot = redis.crc.key_slot((PREFIX + key).encode())
    return any(low <= slot <= high for low, high in ranges)


def trial(cluster: ValkeyCluster, wait: int) -> dict[str, Any]:
    victim = cluster.primaries()[0]
    heir = cluster.replica_of(victim)
    ranges = [(low, high) for low, high, owner in cluster.slot_map() if owner == victim]
    url = f"{cluster.url}?wait={wait}&wait_timeout=0.5&retries=0"
    accepted: list[tuple[str, float]] = []  # (key, when the caller saw it accepted)
    failed_closed = 0
    first_after: list[float] = []
    taken_over = threading.Event()
    stop = threading.Event()
    kill_time = takeover_time = 0.0

    async def load() -> None:
        nonlocal failed_closed
        store = RedisReplayStore(url, prefix=PREFIX)

        async def caller() -> None:
            nonlocal failed_closed
            while not stop.is_set():
                key = os.urandom(16).hex()
                try:
                    ok = await store.aconsume(key, 600)
                except ReplayStoreError:
                    failed_closed += on_victim(key, ranges)
                    await asyncio.sleep(0.01)  # a client backing off; not a synchronisation
                    continue
                now = time.monotonic()
                if ok and on_victim(key, ranges):
                    accepted.append((key, now))
                    if taken_over.is_set() and not first_after:
                        first_after.append(now)

        await asyncio.gather(*(caller() for _ in range(CALLERS)))
        await store.aclose()

    worker = threading.Thread(target=asyncio.run, args=(load(),))
    worker.start()
    try:
        time.sleep(STEADY)  # steady load before the failure; a benchmark's pacing
        kill_time = time.monotonic()
        cluster.node(victim).kill()
        slot = ranges[0][0]
        deadline = time.monotonic() + 120
        while cluster.owner(slot) != heir:
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not take over")
            time.sleep(0.05)
        takeover_time = time.monotonic()
        taken_over.set()
        cluster.node(victim).start()  # back, as the heir's replica
        cluster.wait_healthy()
        deadline = time.monotonic() + 60
        while not first_after and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join()
    # Everything accepted before the takeover was the old primary's answer (some arrived
    # just after the kill: replies in flight when it died).
    before = [(key, when) for key, when in accepted if when < takeover_time]
    survivor = redis.Redis(port=heir)
    forgotten = [(key, when) for key, when in before if not survivor.exists(PREFIX + key)]
    return {
        "accepted_on_victim": len(before),
        "forgotten": len(forgotten),
        "window_ms": max(kill_time - min(w for _, w in forgotten), 0.0) * 1000 if forgotten else 0.0,
        "gap_s": (first_after[0] - kill_time) if first_after else None,
        "failed_closed_on_victim": failed_closed,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"load_average": os.getloadavg()}
    with running(ValkeyCluster) as cluster:
        for wait in (0, 1):
            runs = []
            for i in range(args.trials):
                print(f"... wait={wait} failover {i + 1}/{args.trials}", file=sys.stderr, flush=True)
                runs.append(trial(cluster, wait))
            results[f"wait={wait}"] = runs
    results["load_average_end"] = os.getloadavg()
    print(f"load average at start {results['load_average']}, at end {results['load_average_end']}")
    for setting in ("wait=0", "wait=1"):
        runs = results[setting]
        gaps = [r["gap_s"] for r in runs if r["gap_s"] is not None]
        print(
            f"{setting}: {len(runs)} failovers; accepted on the killed primary's slots "
            f"{sum(r['accepted_on_victim'] for r in runs):,}; forgotten (accepted twice) "
            f"{[r['forgotten'] for r in runs]}; window ms {[round(r['window_ms'], 1) for r in runs]}; "
            f"failed closed {[r['failed_closed_on_victim'] for r in runs]}; "
            f"gap s median {statistics.median(gaps):.1f} ({min(gaps):.1f}..{max(gaps):.1f})"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
