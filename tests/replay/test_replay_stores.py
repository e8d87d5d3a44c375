"""Each replay store on its own: the consume contract, expiry, bounds, and its own failure modes.

Real components only: SQLite files in tmp_path and a real Valkey/Redis server
(tests/fixtures_valkey.py). Where a failure cannot be produced for real as root on a
shared machine (a full disk, a read-only file), SQLite's own limits produce the very
same SQLite error on the store's connection; those spots say so.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import multiprocessing.queues
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from clocks import ManualClock
from fixtures_valkey import ValkeyServer
from hypothesis import given, settings
from hypothesis import strategies as st
from processes import pick_port, running
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from statecodec import ReplayStoreError
from statecodec.replay import MemoryReplayStore, RedisReplayStore, ReplayStore, SQLiteReplayStore
from statecodec.replay import redis as redis_module
from statecodec.replay.sqlite import _CONSUME

T0 = 2_000_000_000.0


def _key() -> str:
    return f"test:{uuid.uuid4().hex}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:8]}:"


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path, prefix: str) -> Iterator[ReplayStore]:
    """Every store, on real time (Redis expires keys on the server's clock)."""
    if request.param == "memory":
        made: ReplayStore = MemoryReplayStore()
    elif request.param == "sqlite":
        made = SQLiteReplayStore(tmp_path / "replay.db")
    else:
        made = RedisReplayStore(request.getfixturevalue("valkey_server").url, prefix=prefix)
    yield made
    made.close()


# ---------------------------------------------------------------- the contract, every store
def test_first_consume_wins_then_every_repeat_is_a_replay(store: ReplayStore) -> None:
    key, retention = _key(), 60
    assert store.consume(key, retention) is True
    assert store.consume(key, retention) is False
    assert store.consume(key, retention + 100) is False  # a longer retention does not reopen it
    assert store.consume(_key(), retention) is True  # other keys are independent


async def test_aconsume_shares_entries_with_consume(store: ReplayStore) -> None:
    key, retention = _key(), 60
    assert await store.aconsume(key, retention) is True
    assert store.consume(key, retention) is False
    assert await store.aconsume(key, retention) is False
    other = _key()
    assert store.consume(other, retention) is True
    assert await store.aconsume(other, retention) is False
    await store.aclose()


async def test_concurrent_aconsume_of_one_key_has_one_winner(store: ReplayStore) -> None:
    key, retention = _key(), 60
    results = await asyncio.gather(*(store.aconsume(key, retention) for _ in range(64)))
    assert results.count(True) == 1
    assert results.count(False) == 63
    # And many distinct keys in one burst (the Redis store batches them): each once.
    keys = [_key() for _ in range(300)]
    firsts = await asyncio.gather(*(store.aconsume(k, retention) for k in keys))
    again = await asyncio.gather(*(store.aconsume(k, retention) for k in keys))
    assert firsts == [True] * 300
    assert again == [False] * 300
    await store.aclose()


def test_threads_racing_on_one_key_have_one_winner(store: ReplayStore) -> None:
    key, retention = _key(), 60
    barrier = threading.Barrier(16)
    results: list[bool] = []

    def race() -> None:
        barrier.wait()
        results.append(store.consume(key, retention))

    threads = [threading.Thread(target=race) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 15 + [True]


def test_an_entry_vanishes_after_it_expires(store: ReplayStore) -> None:
    key = _key()
    recorded = time.monotonic()
    assert store.consume(key, 1) is True
    # Still there, unless this machine took the whole second to ask again.
    assert store.consume(key, 1) is False or time.monotonic() - recorded >= 1
    # Gone once expired (by the store's own clock): consuming again records it afresh (the
    # codec would reject the token as expired long before, so only the store's own contract
    # is tested here).
    deadline = recorded + 60
    while not store.consume(key, 60):
        assert time.monotonic() < deadline, "the entry never expired"
        time.sleep(0.1)
    assert store.consume(key, 60) is False


@pytest.mark.parametrize("retention", [0, 0.0, -0.001, -3600, math.nan, math.inf, -math.inf])
async def test_a_retention_that_cannot_be_honoured_fails_closed(store: ReplayStore, retention: float) -> None:
    # "Remember for -3 s" read as "forget at once" would accept the next redemption too.
    key = _key()
    with pytest.raises(ReplayStoreError, match="positive, finite"):
        store.consume(key, retention)
    with pytest.raises(ReplayStoreError, match="positive, finite"):
        await store.aconsume(key, retention)
    assert store.consume(key, 60) is True  # nothing was recorded by the refusals
    await store.aclose()


def test_a_tiny_retention_is_still_honoured(store: ReplayStore) -> None:
    # Redis counts milliseconds: 0.1 ms rounds up to 1 ms, never down to a refused 0.
    key = _key()
    assert store.consume(key, 0.0001) is True
    # Whether it is still there a moment later depends on timing; that it was accepted,
    # and recorded for no less than asked, is the contract.


def test_an_empty_store_is_still_truthy(store: ReplayStore) -> None:
    assert bool(store) is True  # ``replay=store or fallback`` must keep an empty store


def test_context_manager_closes(tmp_path: Path) -> None:
    with SQLiteReplayStore(tmp_path / "r.db") as store:
        assert store.consume("k", 60)
    with pytest.raises(ReplayStoreError, match="closed"):
        store.consume("k2", 60)


async def test_async_context_manager_closes_the_loops_client(
    valkey_server: ValkeyServer, prefix: str
) -> None:
    async with RedisReplayStore(valkey_server.url, prefix=prefix) as store:
        assert await store.aconsume("k", 60) is True
        assert store._senders  # a client for this event loop
    assert store._senders == {}


# ---------------------------------------------------------------- memory
def test_memory_expired_entries_are_purged_and_count_as_absent(clock: ManualClock) -> None:
    store = MemoryReplayStore(clock=clock)
    for i in range(100):
        assert store.consume(f"k{i}", 10 + i / 10)
    assert len(store) == 100
    clock.now = T0 + 15.05  # half of them expired
    assert store.consume("k0", 100) is True  # expired: absent, recorded afresh
    # A new expiry second triggered a purge: k1..k50 went (k50 expired at T0 + 15.0),
    # k0 was taken over and lives on.
    assert len(store) == 50
    assert store.consume("k50", 100) is True
    assert store.consume("k0", 100) is False
    assert store.consume("k99", 100) is False  # still live
    clock.now = T0 + 20
    assert store.purge() == 49  # k51..k99
    assert len(store) == 2


def test_memory_purges_by_itself_as_time_moves_on(clock: ManualClock) -> None:
    store = MemoryReplayStore(clock=clock)
    for second in range(50):
        clock.now = T0 + second
        for j in range(10):
            store.consume(f"{second}-{j}", 5)
    # Only about the last five seconds' worth stays: no unbounded growth.
    assert len(store) <= 60


def test_memory_bound_fails_closed_and_recovers_when_entries_expire(clock: ManualClock) -> None:
    store = MemoryReplayStore(max_entries=2, clock=clock)
    assert store.consume("a", 10)
    assert store.consume("b", 20)
    with pytest.raises(ReplayStoreError, match="full"):
        store.consume("c", 10)
    assert store.consume("a", 10) is False  # still answers for what it holds
    clock.now = T0 + 10
    assert store.consume("c", 20) is True  # "a" expired and made room
    with pytest.raises(ReplayStoreError, match="full"):
        store.consume("d", 20)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("consume"), st.integers(0, 15), st.floats(0.001, 5)),
            st.tuples(st.just("advance"), st.just(0), st.floats(0, 3)),
            st.tuples(st.just("purge"), st.just(0), st.just(0.0)),
        ),
        max_size=80,
    )
)
def test_memory_store_matches_a_reference_model(ops: list[tuple[str, int, float]]) -> None:
    """Random consumes, clock moves and purges against the obvious model of the contract."""
    clock = ManualClock(T0)
    store = MemoryReplayStore(clock=clock)
    model: dict[str, float] = {}  # key -> expiry
    for op, key_no, amount in ops:
        if op == "consume":
            key = f"k{key_no}"
            expected = not (key in model and model[key] > clock.now)
            assert store.consume(key, amount) is expected
            if expected:
                model[key] = clock.now + amount
        elif op == "advance":
            clock.now += amount
        else:
            store.purge()
            assert len(store) == sum(1 for e in model.values() if e > clock.now)
    # Nothing leaks: once everything has expired, a purge empties the store.
    clock.now += 10
    store.purge()
    assert len(store) == 0
    assert store._buckets == {} and store._bucket_heap == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_memory_rejects_bad_bounds(bad: object) -> None:
    with pytest.raises(ValueError, match="max_entries"):
        MemoryReplayStore(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------- SQLite
def test_sqlite_uses_wal_and_one_row_per_key(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "r.db"
    store = SQLiteReplayStore(path, clock=clock)
    store.consume("ns:abc", 60)  # a retention: the row holds the host clock's now + 60
    with sqlite3.connect(path) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = other.execute("SELECT key, expires_at FROM statecodec_replay").fetchall()
    assert rows == [("ns:abc", T0 + 60)]
    store.close()


def test_sqlite_two_stores_on_one_file_see_each_other(tmp_path: Path) -> None:
    first, second = SQLiteReplayStore(tmp_path / "r.db"), SQLiteReplayStore(tmp_path / "r.db")
    key = _key()
    assert first.consume(key, 60) is True
    assert second.consume(key, 60) is False
    first.close()
    second.close()


def test_sqlite_expired_rows_count_as_absent_and_are_purged_periodically(
    tmp_path: Path, clock: ManualClock
) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db", purge_interval=30, clock=clock)
    for i in range(20):
        assert store.consume(f"k{i}", 10)
    assert len(store) == 20
    clock.now = T0 + 10
    assert store.consume("k0", 90) is True  # expired row taken over in one statement
    assert store.consume("k0", 90) is False
    assert len(store) == 20  # not purged yet: the last purge was at T0
    clock.now = T0 + 31
    store.consume("new", 69)  # the interval has passed: this consume purges
    assert len(store) == 2  # k0 (taken over) and new
    assert store.purge() == 0


def test_sqlite_purge_deletes_in_batches(tmp_path: Path, clock: ManualClock) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db", clock=clock)
    conn = sqlite3.connect(tmp_path / "r.db")
    with conn:
        conn.executemany(
            "INSERT INTO statecodec_replay VALUES (?, ?)", [(f"k{i}", T0 + 1) for i in range(4500)]
        )
    conn.close()
    clock.now = T0 + 2
    assert store.purge() == 4500
    assert len(store) == 0


def test_sqlite_each_thread_gets_its_own_connection_and_dead_ones_are_closed(tmp_path: Path) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db")
    seen: list[sqlite3.Connection] = []

    def work() -> None:
        store.consume(_key(), 60)
        seen.append(store._connection())

    for _ in range(3):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert len({id(conn) for conn in seen}) == 3
    assert store._connection() not in seen
    # The three threads are dead: opening the next connection closed theirs.
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        seen[0].execute("SELECT 1")
    store.close()


def test_sqlite_locked_past_busy_timeout_fails_closed_then_recovers(tmp_path: Path) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db", busy_timeout=0.2)
    blocker = sqlite3.connect(tmp_path / "r.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    started = time.monotonic()
    with pytest.raises(ReplayStoreError, match=r"locked.*busy timeout \(0.2s\)"):
        store.consume("k", 60)
    assert time.monotonic() - started >= 0.15  # it waited for the lock first
    blocker.execute("ROLLBACK")
    assert store.consume("k", 60) is True  # nothing was recorded before
    blocker.close()
    store.close()


def test_sqlite_a_writer_that_holds_the_lock_briefly_is_waited_for(tmp_path: Path) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db", busy_timeout=120)  # however late the timer runs
    blocker = sqlite3.connect(tmp_path / "r.db", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    timer = threading.Timer(0.2, blocker.execute, ("COMMIT",))
    timer.start()
    assert store.consume("k", 60) is True
    timer.join()
    blocker.close()
    store.close()


async def test_sqlite_aconsume_never_waits_for_a_writer_on_the_event_loop(tmp_path: Path) -> None:
    """A consume that finds the write lock taken goes to a worker thread and waits there.

    Had it waited on the loop, the loop would stand still for the store's busy timeout
    (120 s here) before anything else ran: the step that starts it would take that long.
    """
    store = SQLiteReplayStore(tmp_path / "r.db", busy_timeout=120)
    assert await store.aconsume("first", 60) is True  # the start-up purge; the loop connection opens next
    assert await store.aconsume("second", 60) is True
    blocker = sqlite3.connect(tmp_path / "r.db", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    pending = asyncio.ensure_future(store.aconsume("k", 60))
    started = time.monotonic()
    await asyncio.sleep(0)  # the consume starts, finds the lock taken, and hands over
    assert time.monotonic() - started < 60  # not the busy timeout: the loop went on at once
    assert not pending.done()
    blocker.execute("COMMIT")
    assert await asyncio.wait_for(pending, 30) is True
    assert await store.aconsume("k", 60) is False
    blocker.close()
    store.close()


async def test_sqlite_aconsume_purges_and_checkpoints_off_the_loop(
    tmp_path: Path, clock: ManualClock
) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db", purge_interval=30, clock=clock)
    for i in range(2000):
        assert await store.aconsume(f"k{i}", 10) is True
    # Every commit appends a page to the WAL; the periodic checkpoints let SQLite start
    # it over (about 2,000 pages, 8 MB, without them).
    assert (tmp_path / "r.db-wal").stat().st_size < 3 * 1024 * 1024
    clock.now = T0 + 31
    assert await store.aconsume("new", 60) is True  # the interval has passed: this one purges
    assert len(store) == 1
    assert await store.aconsume("new", 60) is False
    store.close()
    with pytest.raises(ReplayStoreError, match="closed"):
        await store.aconsume("after", 60)


def test_sqlite_disk_full_is_a_clear_store_error(tmp_path: Path) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db")
    # A real full disk cannot be arranged here; SQLite's page limit raises the very
    # same SQLITE_FULL error from the same code path.
    conn = store._connection()
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(ReplayStoreError, match=r"full \(SQLITE_FULL"):
        for i in range(10_000):
            store.consume(f"{i:064d}", 60)
    store.close()


def test_sqlite_read_only_is_a_clear_store_error(tmp_path: Path) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db")
    # As root, file permissions do not stop writes; query_only makes SQLite refuse
    # them with the same SQLITE_READONLY error a read-only file or mount gives.
    store._connection().execute("PRAGMA query_only = ON")
    with pytest.raises(ReplayStoreError, match=r"read-only .*\(SQLITE_READONLY"):
        store.consume("k", 60)
    store.close()


def test_sqlite_not_a_database_fails_at_construction(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    path.write_bytes(b"this is not a database, just some text that is long enough" * 20)
    with pytest.raises(ReplayStoreError, match=r"not an SQLite database.*SQLITE_NOTADB"):
        SQLiteReplayStore(path)


def test_sqlite_missing_directory_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ReplayStoreError, match="cannot open the database file"):
        SQLiteReplayStore(tmp_path / "no" / "such" / "dir" / "r.db")


@pytest.mark.parametrize("path", ["", ":memory:", "file:x.db?mode=memory"])
def test_sqlite_refuses_in_memory_databases(path: str) -> None:
    with pytest.raises(ValueError, match="file path"):
        SQLiteReplayStore(path)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"busy_timeout": -1}, "busy_timeout"),
        ({"purge_interval": 0}, "purge_interval"),
        ({"synchronous": "OFF"}, "synchronous"),
    ],
)
def test_sqlite_rejects_bad_settings(tmp_path: Path, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SQLiteReplayStore(tmp_path / "r.db", **kwargs)  # type: ignore[arg-type]


def test_sqlite_synchronous_full_is_applied(tmp_path: Path) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db", synchronous="FULL")
    assert store._connection().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert SQLiteReplayStore(tmp_path / "r.db")._connection().execute("PRAGMA synchronous").fetchone()[0] == 1


def test_sqlite_consume_statement_is_one_atomic_upsert() -> None:
    # The whole check-and-set is one statement; there is no read-then-write window.
    assert _CONSUME.startswith("INSERT INTO statecodec_replay")
    assert "ON CONFLICT (key) DO UPDATE" in _CONSUME
    assert ";" not in _CONSUME


_INHERITED: list[SQLiteReplayStore] = []


def _fork_child(key_seen: str, key_new: str, out: multiprocessing.queues.Queue[tuple[bool, bool]]) -> None:
    store = _INHERITED[0]  # inherited through fork(), with the parent's open connection
    out.put((store.consume(key_seen, 60), store.consume(key_new, 60)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_sqlite_store_is_safe_to_use_after_fork(tmp_path: Path) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db")
    assert store.consume("seen", 60)  # the parent has an open connection
    _INHERITED[:] = [store]
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_fork_child, args=("seen", "new", out))
    child.start()
    result = out.get(timeout=30)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert result == (False, True)  # the child saw the parent's entry and recorded its own
    # The parent's connection still works after the child exited (nothing closed it).
    assert store.consume("new", 60) is False
    assert store.consume("after", 60) is True
    store.close()


# ---------------------------------------------------------------- Redis / Valkey
def test_redis_key_layout_and_expiry_on_the_server(valkey_server: ValkeyServer, prefix: str) -> None:
    url = valkey_server.url
    store = RedisReplayStore(url, prefix=prefix)
    assert store.consume("default:abc", 30)  # SET ... PX 30000: relative, on the server's clock
    raw = redis.Redis.from_url(url)
    assert raw.exists(f"{prefix}default:abc") == 1
    assert 28_000 < raw.pttl(f"{prefix}default:abc") <= 30_000
    raw.close()
    store.close()


def test_redis_two_prefixes_never_collide(valkey_server: ValkeyServer, prefix: str) -> None:
    url = valkey_server.url
    a, b = RedisReplayStore(url, prefix=prefix + "a:"), RedisReplayStore(url, prefix=prefix + "b:")
    assert a.consume("k", 60) and b.consume("k", 60)
    assert not a.consume("k", 60) and not b.consume("k", 60)
    a.close()
    b.close()


def test_redis_recognises_its_own_write_when_a_reply_was_lost(
    valkey_server: ValkeyServer, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A retry after a lost reply finds the key already holding this call's nonce. The
    # lost reply itself cannot be provoked reliably, so the first attempt's write is
    # made by hand and the nonce is fixed (the only substitution in this test).
    url = valkey_server.url
    monkeypatch.setattr(redis_module, "_nonce", lambda: "f" * 32)
    raw = redis.Redis.from_url(url)
    raw.set(f"{prefix}mine", "f" * 32, px=60_000)
    raw.set(f"{prefix}theirs", "0" * 32, px=60_000)
    store = RedisReplayStore(url, prefix=prefix)
    assert store.consume("mine", 60) is True
    assert store.consume("theirs", 60) is False
    raw.close()
    store.close()


def test_redis_with_a_client_passed_in(valkey_server: ValkeyServer, prefix: str) -> None:
    url = valkey_server.url
    client = redis.Redis.from_url(url, decode_responses=True)
    store = RedisReplayStore(client, prefix=prefix)
    assert store.consume("k", 60) is True
    assert store.consume("k", 60) is False
    store.close()
    assert client.ping()  # not the store's to close

    async def via_thread() -> tuple[bool, bool]:
        # No async client given: aconsume runs the sync call in a worker thread.
        return await store.aconsume("j", 60), await store.aconsume("j", 60)

    assert asyncio.run(via_thread()) == (True, False)
    client.close()


async def test_redis_with_an_async_client_passed_in(valkey_server: ValkeyServer, prefix: str) -> None:
    url = valkey_server.url
    aclient = redis.asyncio.Redis.from_url(url)
    store = RedisReplayStore(url, prefix=prefix, async_client=aclient)
    assert await store.aconsume("k", 60) is True
    assert store.consume("k", 60) is False
    await store.aclose()
    assert await aclient.ping()  # not the store's to close
    await aclient.aclose()


def test_redis_works_in_several_event_loops(valkey_server: ValkeyServer, prefix: str) -> None:
    store = RedisReplayStore(valkey_server.url, prefix=prefix)
    key = _key()
    results = [asyncio.run(store.aconsume(key, 60)) for _ in range(3)]
    assert results == [True, False, False]
    store.close()


def test_redis_error_replies_fail_only_their_own_call(valkey_server: ValkeyServer, prefix: str) -> None:
    url = valkey_server.url
    raw = redis.Redis.from_url(url)
    raw.lpush(f"{prefix}wrongtype", "x")  # SET ... GET on a list is a WRONGTYPE error
    store = RedisReplayStore(url, prefix=prefix)

    async def burst() -> list[object]:
        calls = [store.aconsume(k, 60) for k in ("a", "wrongtype", "b")]
        out = await asyncio.gather(*calls, return_exceptions=True)
        await store.aclose()
        return out

    a, wrong, b = asyncio.run(burst())
    assert a is True and b is True
    assert isinstance(wrong, ReplayStoreError) and "WRONGTYPE" in str(wrong)
    with pytest.raises(ReplayStoreError, match="WRONGTYPE"):
        store.consume("wrongtype", 60)
    raw.close()


def test_redis_errors_never_show_the_password(refused_port: int) -> None:
    store = RedisReplayStore(f"redis://:hunter2@127.0.0.1:{refused_port}/0", connect_timeout=0.5)
    with pytest.raises(ReplayStoreError) as info:
        store.consume("k", 60)
    assert "hunter2" not in str(info.value) and "***" in str(info.value)
    assert "hunter2" not in repr(store)


def test_redis_timeouts_are_store_errors(prefix: str) -> None:
    # A listener that accepts and never answers: the socket timeout must fire.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        store = RedisReplayStore(f"redis://127.0.0.1:{port}/0", socket_timeout=0.2, retries=0)
        started = time.monotonic()
        with pytest.raises(ReplayStoreError, match="timed out"):
            store.consume("k", 60)
        assert time.monotonic() - started < 5


def test_redis_cluster_client(prefix: str, tmp_path: Path) -> None:
    """A one-node Redis Cluster (all 16384 slots on one real server) through RedisCluster."""

    def one_node() -> ValkeyServer:
        config = tmp_path / f"{uuid.uuid4().hex}.conf"
        return ValkeyServer(
            extra_args=["--cluster-enabled", "yes", "--cluster-config-file", str(config),
                        "--cluster-port", str(pick_port())]
        )  # fmt: skip

    with running(one_node) as server:
        admin = redis.Redis(port=server.port)
        admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while admin.execute_command("CLUSTER", "INFO").decode().find("cluster_state:ok") < 0:
            assert time.monotonic() < deadline, "cluster did not become ready"
            time.sleep(0.05)
        cluster = RedisCluster(host="127.0.0.1", port=server.port)
        store = RedisReplayStore(cluster, prefix=prefix)
        keys = [_key() for _ in range(50)]  # spread over many hash slots
        assert [store.consume(k, 60) for k in keys] == [True] * 50
        assert [store.consume(k, 60) for k in keys] == [False] * 50

        async def via_async_cluster() -> list[bool]:
            acluster = AsyncRedisCluster(host="127.0.0.1", port=server.port)
            astore = RedisReplayStore(cluster, prefix=prefix, async_client=acluster)
            fresh = [_key() for _ in range(20)]
            out = await asyncio.gather(*(astore.aconsume(k, 60) for k in fresh + keys[:5]))
            await acluster.aclose()
            return out

        assert asyncio.run(via_async_cluster()) == [True] * 20 + [False] * 5
        cluster.close()
        admin.close()


@pytest.mark.parametrize("retries", [-1])
def test_redis_rejects_bad_settings(retries: int) -> None:
    with pytest.raises(ValueError, match="retries"):
        RedisReplayStore("redis://127.0.0.1:6379/0", retries=retries)
