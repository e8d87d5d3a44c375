"""The PostgreSQL replay store against a real PostgreSQL 15: contract, race, outages, clocks, privileges.

One server for the module's tests (tests/fixtures_postgres.py, session-scoped); each test
keeps apart with a table of its own. Outage tests get a server of their own, which they
stop, restart, or SIGSTOP (every process of it: a stuck server whose sockets stay open).
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import multiprocessing.pool
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fixtures_postgres import APP_PASSWORD, DATABASE, PostgresServer, wait_until
from replay_outcomes import aoutcome, outcome, ticking

import statecodec as sc
from statecodec import ReplayStoreError
from statecodec.replay import PostgresReplayStore, store_from_url
from statecodec.replay import postgres as postgres_module

RING = sc.KeyRing.generate("k1")
ALICE = sc.Binding(principal="alice", audience="svc", method="tools/call", target="pay")
YEAR = 365 * 24 * 3600
TTL, MAX_SKEW = 300, 60


def _table() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


#: Seconds per consume where the contract is tested (atomicity, expiry), not latency: on a
#: loaded 2-core machine, bursts and races (pools opening SCRAM connections at once) can take
#: longer than the 2 s default, and a consume that fails closed there says nothing about who
#: won. The outage tests below set their own short timeout, since there the deadline is the point.
CONTRACT_TIMEOUT = "30"


@pytest.fixture
def store(postgres_server: PostgresServer) -> Iterator[PostgresReplayStore]:
    made = store_from_url(postgres_server.url(table=_table(), timeout=CONTRACT_TIMEOUT))
    assert isinstance(made, PostgresReplayStore)
    yield made
    made.close()


def _reason(codec: sc.StateCodec, token: str) -> str:
    return outcome(codec, token, ALICE)


async def _areason(codec: sc.StateCodec, token: str) -> str:
    return await aoutcome(codec, token, ALICE)


def _until_it_answers(codec: sc.StateCodec) -> str:
    """Fresh tokens redeemed until one is not refused as ``store_unavailable`` (60 s at most): that one."""
    deadline = time.monotonic() + 60
    while _reason(codec, (probe := codec.seal(b"p", ALICE))) == "store_unavailable":
        assert time.monotonic() < deadline, "the store did not recover"
        time.sleep(0.1)
    return probe


async def _auntil_it_answers(codec: sc.StateCodec) -> str:
    """:func:`_until_it_answers` through ``aunseal``, the event loop running on meanwhile."""
    deadline = time.monotonic() + 60
    while await _areason(codec, (probe := codec.seal(b"p", ALICE))) == "store_unavailable":
        assert time.monotonic() < deadline, "the store did not recover"
        await asyncio.sleep(0.1)
    return probe


def _rows(server: PostgresServer, table: str) -> list[tuple[Any, ...]]:
    """(key, seconds the row still has on the server's clock) of every row."""
    return server.sql(f"SELECT key, extract(epoch FROM expires_at - now())::float FROM {table}", DATABASE)


# ---------------------------------------------------------------- the contract
def test_first_consume_wins_then_every_repeat_is_a_replay(store: PostgresReplayStore) -> None:
    assert store.consume("k", 60) is True
    assert store.consume("k", 60) is False
    assert store.consume("k", 600) is False  # a longer retention does not reopen it
    assert store.consume("other", 60) is True


async def test_async_and_sync_share_entries_and_a_burst_has_one_winner(store: PostgresReplayStore) -> None:
    assert await store.aconsume("k", 60) is True
    assert store.consume("k", 60) is False
    results = await asyncio.gather(*(store.aconsume("burst", 60) for _ in range(64)))
    assert results.count(True) == 1
    keys = [uuid.uuid4().hex for _ in range(200)]
    assert await asyncio.gather(*(store.aconsume(k, 60) for k in keys)) == [True] * 200
    assert await asyncio.gather(*(store.aconsume(k, 60) for k in keys)) == [False] * 200
    await store.aclose()


def test_threads_racing_on_one_key_have_one_winner(store: PostgresReplayStore) -> None:
    barrier = threading.Barrier(16)
    results: list[bool | str] = []

    def race() -> None:
        barrier.wait()
        try:
            results.append(store.consume("contended", 60))
        except ReplayStoreError as exc:  # kept, so that a failure says why
            results.append(str(exc))

    threads = [threading.Thread(target=race) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=str) == [False] * 15 + [True], results


def test_an_expired_row_counts_as_absent(store: PostgresReplayStore) -> None:
    assert store.consume("short", 0.3) is True
    assert store.consume("short", 0.3) is False
    time.sleep(0.5)  # expired on the server's clock; the purge has not run
    assert store.consume("short", 60) is True
    assert store.consume("short", 60) is False


@pytest.mark.parametrize("retention", [0, -1, math.nan, math.inf])
async def test_a_retention_that_cannot_be_honoured_fails_closed(
    store: PostgresReplayStore, retention: float
) -> None:
    with pytest.raises(ReplayStoreError, match="positive, finite"):
        store.consume("k", retention)
    with pytest.raises(ReplayStoreError, match="positive, finite"):
        await store.aconsume("k", retention)
    assert store.consume("k", 60) is True
    await store.aclose()


def test_expiry_is_the_database_clock_plus_the_retention(
    store: PostgresReplayStore, postgres_server: PostgresServer
) -> None:
    store.consume("k", 30)
    ((key, left),) = _rows(postgres_server, store.table)
    assert key == "k" and 28 < left <= 30


def test_expired_rows_are_purged_in_the_background(postgres_server: PostgresServer) -> None:
    """No cron: a consume due to purge deletes expired rows (in batches) after it answers."""
    store = PostgresReplayStore(postgres_server.url(), table=_table(), purge_interval=0.5)
    assert store.consume("first", 60)  # the first consume also starts a purge: nothing to do yet
    postgres_server.sql(  # more than two purge batches of rows that expired a second ago
        f"INSERT INTO {store.table} SELECT 'old' || g, 'n', now() - interval '1 s' "
        "FROM generate_series(1, 2500) AS g",
        DATABASE,
    )
    assert len(store) == 2501
    time.sleep(0.6)  # the next purge is due
    assert store.consume("trigger", 60) is True

    def purged() -> bool:
        return len(store) == 2

    deadline = time.monotonic() + 30
    while not purged():
        assert time.monotonic() < deadline, f"{len(store)} rows left"
        time.sleep(0.05)
    assert store.consume("first", 60) is False  # live rows stay
    store.close()


def test_the_table_stays_bounded_under_steady_traffic(postgres_server: PostgresServer) -> None:
    """Rows expire and go as fast as they come: about live rows plus one purge interval's worth."""
    store = PostgresReplayStore(postgres_server.url(), table=_table(), purge_interval=0.2)
    sizes = []
    for burst in range(10):
        for i in range(200):
            store.consume(f"{burst}-{i}", 0.1)
        time.sleep(0.25)
        sizes.append(len(store))
    store.close()
    assert max(sizes[3:]) <= 3 * 200, sizes  # 2,000 consumed; never more than a few bursts held


def test_a_codec_a_year_off_the_database_clock_cannot_redeem_twice(
    store: PostgresReplayStore, postgres_server: PostgresServer
) -> None:
    # Retention is relative: measured from the database's now(), the codec's clock never enters.
    for offset in (-YEAR, YEAR):
        codec = sc.StateCodec(
            RING, replay=store, ttl=TTL, max_skew=MAX_SKEW, clock=lambda o=offset: time.time() + o
        )
        token = codec.seal(b"once", ALICE)
        opened = codec.unseal(token, ALICE)
        assert _reason(codec, token) == "replayed"
        needed = opened.expires_at + 1 + MAX_SKEW - (time.time() + offset)
        (left,) = [left for key, left in _rows(postgres_server, store.table) if key.endswith(opened.token_id)]
        assert needed - 2 <= left <= needed + 1


async def test_a_codec_a_year_off_async(store: PostgresReplayStore) -> None:
    codec = sc.StateCodec(RING, replay=store, clock=lambda: time.time() - YEAR)
    token = codec.seal(b"once", ALICE)
    assert await _areason(codec, token) == "ok"
    assert await _areason(codec, token) == "replayed"
    assert _reason(codec, token) == "replayed"
    await store.aclose()


def test_failed_checks_never_consume_the_real_token(store: PostgresReplayStore) -> None:
    codec = sc.StateCodec(RING, replay=store)
    token = codec.seal(b"real", ALICE)
    other = sc.Binding(principal="mallory", audience="svc", method="tools/call", target="pay")
    with pytest.raises(sc.InvalidState, match="binding"):
        codec.unseal(token, other)
    assert _reason(codec, token) == "ok"
    assert _reason(codec, token) == "replayed"


# ---------------------------------------------------------------- 4 processes x 20 threads
PROCESSES, THREADS = 4, 20
_START: Any = None
_CODECS: dict[str, sc.StateCodec] = {}


def _init_worker(start: Any) -> None:
    global _START
    _START = start


def _race(args: tuple[str, str, str]) -> list[str]:
    url, ring_json, token = args
    codec = _CODECS.get(url)
    if codec is None:
        codec = _CODECS[url] = sc.StateCodec(sc.KeyRing.from_json(ring_json), replay=store_from_url(url))
    outcomes: list[str] = []
    ready = threading.Barrier(THREADS, action=lambda: _START.wait(timeout=120))

    def attempt() -> None:
        ready.wait(timeout=120)
        outcomes.append(_reason(codec, token))

    threads = [threading.Thread(target=attempt) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_4_processes_x_20_threads_on_one_token_have_exactly_one_winner(
    postgres_server: PostgresServer,
) -> None:
    # 80 threads opening 32 SCRAM connections at once: see CONTRACT_TIMEOUT.
    url = postgres_server.url(table=_table(), timeout=CONTRACT_TIMEOUT)
    with store_from_url(url) as first:
        first.check()  # the table exists before the race (creating it races too: below)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PROCESSES)
    with ctx.Pool(PROCESSES, initializer=_init_worker, initargs=(start,)) as pool:
        for _ in range(3):  # three tokens, each raced by all 80 threads
            token = sc.StateCodec(RING).seal(b"pay", ALICE)
            per_process = pool.map(_race, [(url, RING.to_json(), token)] * PROCESSES, chunksize=1)
            _one_winner(per_process)
        # A fresh table: every process creates it on first use at the same instant.
        fresh = postgres_server.url(table=_table(), timeout=CONTRACT_TIMEOUT)
        token = sc.StateCodec(RING).seal(b"pay", ALICE)
        per_process = pool.map(_race, [(fresh, RING.to_json(), token)] * PROCESSES, chunksize=1)
        _one_winner(per_process)


def _one_winner(per_process: list[list[str]]) -> None:
    """One acceptance; every loser refused, as a replay or, in the settle window, unsettled.

    A loser in another process than the winner's finds a row written moments ago by
    someone else, whose writer it cannot tell from one still undecided: store_unavailable
    (retry) until the settle window has passed (test_replay_postgres_settle.py).
    """
    outcomes = Counter(o for process in per_process for o in process)
    assert outcomes["ok"] == 1, outcomes
    assert set(outcomes) <= {"ok", "replayed", "store_unavailable"}, outcomes
    assert outcomes.total() == PROCESSES * THREADS


# ---------------------------------------------------------------- outages
def _outage_codec(server: PostgresServer) -> tuple[PostgresReplayStore, sc.StateCodec]:
    """A store with a 1 s budget on ``server`` and a codec consuming through it."""
    store = PostgresReplayStore(server.url(), timeout=1.0)
    return store, sc.StateCodec(RING, replay=store)


async def _aoutage_codec(
    server: PostgresServer, outage: Callable[[], None]
) -> tuple[PostgresReplayStore, sc.StateCodec]:
    """:func:`_outage_codec`, a pooled idle connection (one consume through ``aunseal``), then ``outage``."""
    store, codec = _outage_codec(server)
    assert await _areason(codec, codec.seal(b"x", ALICE)) == "ok"
    await asyncio.to_thread(outage)
    return store, codec


def _redeemed_once(codec: sc.StateCodec, tokens: list[str]) -> None:
    """Every one of ``tokens`` redeems now, exactly once: none was burnt while it was refused."""
    assert [_reason(codec, t) for t in tokens] == ["ok"] * len(tokens)
    assert [_reason(codec, t) for t in tokens] == ["replayed"] * len(tokens)


def test_server_stopped_fails_closed_burns_nothing_and_recovers(postgres_outage: PostgresServer) -> None:
    server = postgres_outage
    store, codec = _outage_codec(server)
    assert _reason(codec, codec.seal(b"x", ALICE)) == "ok"
    server.stop()
    refused = [codec.seal(b"x", ALICE) for _ in range(5)]
    for token in refused:
        started = time.monotonic()
        assert _reason(codec, token) == "store_unavailable"
        assert time.monotonic() - started < 5
    with pytest.raises(ReplayStoreError, match=r"cannot connect: .*Connection refused"):
        store.check()
    server.start()
    # The pool reconnects; every refused token redeems now, exactly once.
    probe = _until_it_answers(codec)
    assert _reason(codec, probe) == "replayed"
    _redeemed_once(codec, refused)
    store.close()


async def test_server_stopped_async(postgres_outage: PostgresServer) -> None:
    server = postgres_outage
    store, codec = await _aoutage_codec(server, server.stop)
    refused = [codec.seal(b"x", ALICE) for _ in range(20)]
    started = time.monotonic()
    assert await asyncio.gather(*(_areason(codec, t) for t in refused)) == ["store_unavailable"] * 20
    assert time.monotonic() - started < 5
    await asyncio.to_thread(server.start)
    await _auntil_it_answers(codec)
    assert await asyncio.gather(*(_areason(codec, t) for t in refused)) == ["ok"] * 20
    assert await asyncio.gather(*(_areason(codec, t) for t in refused)) == ["replayed"] * 20
    await store.aclose()


def test_a_stuck_server_fails_closed_in_bounded_time_and_burns_nothing(
    postgres_outage: PostgresServer,
) -> None:
    """SIGSTOP every server process: connections stay open, nothing answers, not even a cancel.

    The consumes sent meanwhile sit in the sockets and commit when the server resumes;
    each was reported as failed, so the store takes those rows back before their tokens'
    retries: none of them is burnt.
    """
    server = postgres_outage
    store, codec = _outage_codec(server)
    assert _reason(codec, codec.seal(b"x", ALICE)) == "ok"  # a pooled, idle connection
    # ... once the purge that first consume started is done: frozen in the middle, it would
    # hold that connection, and the refused consumes would wait for new ones, sending nothing.
    wait_until(lambda: not any(lane._tasks for lane in store._lanes.values()), "the first purge ends")
    server.freeze()
    try:
        refused = [codec.seal(b"x", ALICE) for _ in range(3)]
        for token in refused:
            started = time.monotonic()
            assert _reason(codec, token) == "store_unavailable"
            assert time.monotonic() - started < 3  # the 1 s budget, plus scheduling on a loaded machine
    finally:
        server.thaw()
    assert len(store._unsettled) >= 1  # at least the insert sent on the idle connection
    _until_it_answers(codec)
    _redeemed_once(codec, refused)
    store.close()


async def test_a_stuck_server_async_does_not_block_the_loop(postgres_outage: PostgresServer) -> None:
    server = postgres_outage
    store, codec = await _aoutage_codec(server, server.freeze)
    try:
        async with ticking() as ticks:
            token = codec.seal(b"x", ALICE)
            started = time.monotonic()
            assert await _areason(codec, token) == "store_unavailable"
            assert time.monotonic() - started < 3
            assert ticks.count >= 20  # the loop ran on while the consume waited
    finally:
        await asyncio.to_thread(server.thaw)
    await _auntil_it_answers(codec)
    assert await _areason(codec, token) == "ok"
    assert await _areason(codec, token) == "replayed"
    await store.aclose()


def test_a_lost_answer_is_taken_back_before_the_retry(
    store: PostgresReplayStore, postgres_server: PostgresServer
) -> None:
    """The insert committed but its answer never came: the retry must redeem, not find a replay.

    The lost answer itself cannot be produced on demand; the row a committed-but-unanswered
    insert leaves is written by hand, with the nonce the store noted for that call (the
    only substitution here).
    """
    store.check()  # creates the table
    store._unsettled.note("lost", "f" * 32, 60)
    postgres_server.sql(
        f"INSERT INTO {store.table} VALUES ('lost', '{'f' * 32}', now() + interval '60 s')", DATABASE
    )
    assert store.consume("lost", 60) is True
    assert len(store._unsettled) == 0
    assert store.consume("lost", 60) is False


def test_a_failed_calls_row_that_commits_after_the_take_back_does_not_burn_the_token(
    postgres_server: PostgresServer,
) -> None:
    """A failed call's insert commits late, after its retry's take-back: the retry still redeems.

    The insert of a call that failed closed can still be running on the server (a loaded
    server, a commit waiting for a synchronous standby) when the client retries at once: the
    retry's take-back finds no row yet, and its own insert then meets the late row, waiting
    for its transaction if it is still open. That row is the failed call's (its nonce is
    listed), so it is taken back there too, not counted as a replay. Staged: the late insert
    is an open transaction of the test's, with the nonce the store noted for that call (the
    only substitution); it commits while the retry's insert waits for it.
    """
    store = PostgresReplayStore(postgres_server.url(table=_table()), timeout=30)  # atomicity, not latency
    store.check()
    store._unsettled.note("late", "a" * 32, 60)
    answers: list[bool] = []
    with postgres_server.admin(DATABASE) as admin:  # type: ignore[attr-defined]
        with admin.transaction():
            admin.execute(
                f"INSERT INTO {store.table} VALUES ('late', %s, now() + interval '60 s')", ("a" * 32,)
            )
            retry = threading.Thread(target=lambda: answers.append(store.consume("late", 60)))
            retry.start()
            wait_until(
                lambda: (
                    postgres_server.sql(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        f"AND query LIKE 'INSERT INTO \"{store.table}\"%'"
                    )
                    == [(1,)]
                ),
                "the retry's insert waits for the late row's transaction",
            )
        retry.join(timeout=30)
    assert answers == [True]
    assert len(store._unsettled) == 0
    assert postgres_server.sql(f"SELECT nonce <> '{'a' * 32}' FROM {store.table}", DATABASE) == [(True,)]
    assert store.consume("late", 60) is False
    store.close()


def test_work_that_outlives_its_failed_call_writes_nothing(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that failed closed while its work went on regardless burns nothing.

    asyncio's cancellation can be lost: Python 3.11's ``wait_for``, in psycopg_pool's wait
    for a connection, returns the connection instead of raising when both come at once
    (CPython gh-86296), and the call's work then runs after the call reported
    ``store_unavailable``. That race cannot be produced on demand; it is staged (the only
    substitution) by a pool that hands the connection over only after the deadline, with
    the work shielded from the cancellation. The work must then write nothing.
    """
    store = PostgresReplayStore(postgres_server.url(table=_table()), timeout=1.0)
    store.check()
    handed_over = postgres_module._Lane.run
    finished = threading.Event()
    late: list[BaseException] = []

    async def after_the_deadline(lane: Any, work: Any, deadline: float) -> Any:
        async def run() -> Any:
            try:
                await asyncio.sleep(max(0.0, deadline - time.monotonic()) + 0.2)
                return await handed_over(lane, work, time.monotonic() + 30)
            except Exception as exc:
                late.append(exc)
                raise
            finally:
                finished.set()

        return await asyncio.shield(run())

    monkeypatch.setattr(postgres_module._Lane, "run", after_the_deadline)
    with pytest.raises(ReplayStoreError, match="timed out"):
        store.consume("outlived", 60)
    assert finished.wait(30)
    monkeypatch.undo()
    assert postgres_server.sql(f"SELECT count(*) FROM {store.table}", DATABASE) == [(0,)]
    assert store.consume("outlived", 60) is True  # the retry redeems: nothing was burnt
    assert store.consume("outlived", 60) is False
    assert [str(exc) for exc in late] == ["this call has already failed closed; its late work writes nothing"]
    store.close()


def test_a_row_that_keeps_coming_back_fails_closed(postgres_server: PostgresServer) -> None:
    """A key whose row is back after every take-over: a bounded number of inserts, then fail closed.

    Each row deleted in the way of an insert (expired, or a failed call's) lets the consume
    insert again; a row that keeps reappearing (here a trigger of the test's puts every
    deleted row back) must not keep it looping, nor be counted as a replay.
    """
    table = _table()
    store = PostgresReplayStore(postgres_server.url(table=table), timeout=5)
    store.check()
    for statement in (
        f"CREATE FUNCTION {table}_back() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN INSERT INTO {table} VALUES (OLD.key, OLD.nonce, OLD.expires_at); RETURN NULL; END $$",
        f"CREATE TRIGGER back AFTER DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {table}_back()",
        f"INSERT INTO {table} VALUES ('back', 'old', now() - interval '1 s')",
    ):
        postgres_server.sql(statement, DATABASE)
    with pytest.raises(ReplayStoreError, match="rewritten 3 times meanwhile"):
        store.consume("back", 60)
    store.close()


# ---------------------------------------------------------------- schema and privileges
def _role(server: PostgresServer, name: str, password: str = "R0le-Pa55") -> str:
    server.sql(f"DROP ROLE IF EXISTS {name}")
    server.sql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    server.sql(f"GRANT CONNECT ON DATABASE {DATABASE} TO {name}")
    return server.url(user=name, password=password)


def test_a_least_privileged_role_works_with_select_insert_delete_only(
    postgres_server: PostgresServer,
) -> None:
    table = _table()
    url = _role(postgres_server, "replay_least")
    # PostgreSQL 15: PUBLIC may not create in the public schema; this role holds no CREATE either.
    # Without the table, the store says how to create it (it may not) and fails closed.
    store = PostgresReplayStore(url, table=table, timeout=2)
    with pytest.raises(ReplayStoreError, match=r"does not exist.*statecodec replay init.*may not create"):
        store.check()
    store.close()
    owner = PostgresReplayStore(postgres_server.url(), table=table)
    owner.create_schema_now(grant_to="replay_least")
    owner.close()
    store = PostgresReplayStore(url, table=table, timeout=2, purge_interval=0.1)
    store.check()
    codec = sc.StateCodec(RING, replay=store)
    token = codec.seal(b"t", ALICE)
    assert _reason(codec, token) == "ok"
    assert _reason(codec, token) == "replayed"
    assert store.consume("short", 0.1) is True
    time.sleep(0.2)
    assert store.consume("short", 60) is True  # take-over of an expired row: DELETE
    assert store.purge() == 0
    store._unsettled.note("gone", "n" * 32, 60)
    assert store.consume("gone", 60) is True  # take-back: DELETE ... RETURNING (SELECT)
    privileges = postgres_server.sql(
        "SELECT privilege_type FROM information_schema.role_table_grants "
        f"WHERE grantee = 'replay_least' AND table_name = '{table}'",
        DATABASE,
    )
    assert sorted(p for (p,) in privileges) == ["DELETE", "INSERT", "SELECT"]
    store.close()
    # Each of the three is needed: without it check() names it, and consumes fail closed.
    for privilege in ("SELECT", "INSERT", "DELETE"):
        postgres_server.sql(f"REVOKE {privilege} ON {table} FROM replay_least", DATABASE)
        lacking = PostgresReplayStore(url, table=table, timeout=2)
        with pytest.raises(ReplayStoreError, match=f"lacks {privilege}"):
            lacking.check()
        with pytest.raises(ReplayStoreError, match="permission denied"):
            for i in range(3):  # a fresh key, a live one, an expired one: each path
                lacking.consume(f"p{i}", 60)
                lacking.consume(f"p{i}", 60)
        lacking.close()
        postgres_server.sql(f"GRANT {privilege} ON {table} TO replay_least", DATABASE)


def test_bad_settings_and_urls_are_value_errors() -> None:
    with pytest.raises(ValueError, match="table"):
        PostgresReplayStore("postgresql://h/db", table="Robert'); DROP TABLE x;--")
    with pytest.raises(ValueError, match="timeout"):
        store_from_url("postgresql://h/db?timeout=0")
    with pytest.raises(ValueError, match="pool_size"):
        store_from_url("postgresql://h/db?pool_size=0")
    with pytest.raises(ValueError, match="libpq refuses"):
        store_from_url("postgresql://h/db?no_such_libpq_option=1")
    with pytest.raises(ValueError, match="given twice"):
        store_from_url("postgresql://h/db?table=a&table=b")


def test_libpq_reads_the_url_as_written(postgres_server: PostgresServer) -> None:
    """Unix-socket host, options, application_name: libpq's own parameters reach libpq."""
    from urllib.parse import quote  # noqa: PLC0415

    sock = quote(str(postgres_server.socket_dir), safe="")
    url = (
        f"postgres://statecodec_app:{quote(APP_PASSWORD, safe='')}@/statecodec?host={sock}"
        f"&port={postgres_server.port}&application_name=replay-test&options=-c%20search_path%3Dpublic"
        f"&table={_table()}&timeout=3"
    )
    store = store_from_url(url)
    assert isinstance(store, PostgresReplayStore) and store.timeout == 3
    assert store.consume("k", 60) is True
    seen = postgres_server.sql(
        "SELECT application_name, client_addr IS NULL FROM pg_stat_activity "
        "WHERE application_name = 'replay-test'"
    )
    assert seen and all(local for _, local in seen)  # over the Unix socket
    store.close()


def test_psycopg_is_imported_only_with_a_postgres_store() -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = "import sys, statecodec, statecodec.replay; print('psycopg' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        == "False\n"
    )


def test_statements_are_single_and_parameterised() -> None:
    statements = postgres_module._Statements.for_table("statecodec_replay")
    text = statements.insert.as_string(None)
    assert text.startswith('INSERT INTO "statecodec_replay"') and "ON CONFLICT (key) DO NOTHING" in text
    assert "now() + make_interval(secs => %s)" in text and ";" not in text
