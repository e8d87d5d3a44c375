"""Single use under real contention: 8 processes x 50 threads on SQLite, one Valkey, a Valkey Cluster.

The worker processes are started with 'spawn' (no state inherited from pytest) once per
module and reused. A process-wide Barrier, reached from a threading.Barrier's action
inside each process, releases all 400 threads at the same instant.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import random
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fixtures_valkey import ValkeyCluster

import statecodec as sc
from statecodec.replay import ReplayStore, SQLiteReplayStore, store_from_url

PROCESSES = 8
THREADS = 50
DISTINCT = 1000
BINDING = sc.Binding(
    principal="alice", audience="svc", method="tools/call", target="pay", arguments={"eur": 5}
)

# ---------------------------------------------------------------- in the worker processes
_START: Any = None  # the cross-process Barrier, set by the pool initializer
_STORES: dict[str, ReplayStore] = {}


def _init_worker(start: Any) -> None:
    global _START
    _START = start


def _codec(url: str, ring_json: str) -> sc.StateCodec:
    store = _STORES.get(url)
    if store is None:
        store = _STORES[url] = store_from_url(url)
    return sc.StateCodec(sc.KeyRing.from_json(ring_json), replay=store)


def _run_threads(work: list[list[str]], codec: sc.StateCodec) -> list[list[str]]:
    """Each thread unseals its list of tokens after every thread of every process is ready."""
    ready = threading.Barrier(len(work), action=lambda: _START.wait(timeout=120))
    outcomes: list[list[str]] = [[] for _ in work]

    def attempt(index: int) -> None:
        ready.wait(timeout=120)
        for token in work[index]:
            try:
                codec.unseal(token, BINDING)
                outcomes[index].append("ok")
            except sc.InvalidState as exc:
                outcomes[index].append(exc.reason)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def race_one_token(args: tuple[str, str, str]) -> list[str]:
    url, ring_json, token = args
    return [o for outcome in _run_threads([[token]] * THREADS, _codec(url, ring_json)) for o in outcome]


def redeem_shuffled(args: tuple[str, str, list[str], int]) -> dict[str, str]:
    url, ring_json, tokens, seed = args
    order = tokens[:]
    random.Random(seed).shuffle(order)  # each process meets the tokens in its own order
    work = [order[i::THREADS] for i in range(THREADS)]
    outcomes = _run_threads(work, _codec(url, ring_json))
    return {
        token: outcome
        for chunk, results in zip(work, outcomes, strict=True)
        for token, outcome in zip(chunk, results, strict=True)
    }


def create_and_consume(path: str) -> bool:
    _START.wait(timeout=120)  # all processes create the schema at the same instant
    store = SQLiteReplayStore(path)
    try:
        return store.consume("first", 3600)
    finally:
        store.close()


# ---------------------------------------------------------------- in pytest
@pytest.fixture(scope="module")
def workers() -> Iterator[multiprocessing.pool.Pool]:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PROCESSES)
    pool = ctx.Pool(PROCESSES, initializer=_init_worker, initargs=(start,))
    try:
        yield pool
    finally:
        pool.close()
        pool.join()


@pytest.fixture
def ring() -> sc.KeyRing:
    return sc.KeyRing.generate("k1")


@pytest.fixture(params=["sqlite", "valkey", "valkey-cluster"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        path = tmp_path / "replay.db"
        SQLiteReplayStore(path).close()  # create the file and table once, up front
        return f"sqlite://{path}"
    if request.param == "valkey-cluster":  # one URL, 3 primaries: redis-py routes each key
        cluster: ValkeyCluster = request.getfixturevalue("valkey_cluster")
        return f"{cluster.url}?prefix=race-{uuid.uuid4().hex[:8]}:"
    server = request.getfixturevalue("valkey_server")
    return f"{server.url}?prefix=race-{uuid.uuid4().hex[:8]}:"


def assert_spread_over_every_primary(url: str, request: pytest.FixtureRequest, count: int) -> None:
    """On the cluster, the consumed keys live on every primary, each on the one owning its slot."""
    if not url.startswith("redis+cluster"):
        return
    cluster: ValkeyCluster = request.getfixturevalue("valkey_cluster")
    prefix = url.partition("prefix=")[2]
    per_primary = {
        port: sum(1 for _ in redis.Redis(port=port).scan_iter(match=prefix + "*", count=1000))
        for port in cluster.primaries()
    }
    assert len(per_primary) == 3 and all(per_primary.values()), per_primary
    assert sum(per_primary.values()) == count


def test_400_concurrent_unseals_of_one_token_one_success(
    workers: multiprocessing.pool.Pool, ring: sc.KeyRing, url: str
) -> None:
    token = sc.StateCodec(ring).seal(b"pay 5 EUR", BINDING)
    per_process = workers.map(race_one_token, [(url, ring.to_json(), token)] * PROCESSES, chunksize=1)
    outcomes = Counter(o for process in per_process for o in process)
    assert outcomes == {"ok": 1, "replayed": PROCESSES * THREADS - 1}


def test_1000_distinct_tokens_each_redeemed_exactly_once(
    workers: multiprocessing.pool.Pool, ring: sc.KeyRing, url: str, request: pytest.FixtureRequest
) -> None:
    codec = sc.StateCodec(ring)
    tokens = [codec.seal(str(i).encode(), BINDING) for i in range(DISTINCT)]
    jobs = [(url, ring.to_json(), tokens, seed) for seed in range(PROCESSES)]
    per_process = workers.map(redeem_shuffled, jobs, chunksize=1)
    # Every process tried every token once; for each token exactly one process won.
    for token in tokens:
        outcomes = Counter(process[token] for process in per_process)
        assert outcomes == {"ok": 1, "replayed": PROCESSES - 1}, outcomes
    wins_per_process = [list(process.values()).count("ok") for process in per_process]
    assert sum(wins_per_process) == DISTINCT
    assert_spread_over_every_primary(url, request, DISTINCT)


def test_processes_creating_one_new_sqlite_file_at_once(
    workers: multiprocessing.pool.Pool, tmp_path: Path
) -> None:
    path = str(tmp_path / "fresh.db")  # does not exist yet: WAL switch and CREATE TABLE race
    assert sorted(workers.map(create_and_consume, [path] * PROCESSES, chunksize=1)) == [False] * 7 + [True]
