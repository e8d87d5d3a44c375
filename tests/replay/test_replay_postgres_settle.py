"""No false replays on PostgreSQL: a row whose writer may be undecided is an outage, not a replay.

A row is undecided while its writer may still be waiting for its commit (a synchronous
standby that does not answer) or has failed closed without having taken it back yet.
Another instance that meets such a row answers ``store_unavailable`` (retry) until the row
is older than the settle window on the server's clock, or gone; a settled row is
``replayed``. Real PostgreSQL 15; the stalled commit is a real synchronous standby stopped
with SIGSTOP.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from fixtures_postgres import DATABASE, PostgresServer, synchronous_pair, wait_until

from statecodec import ReplayStoreError
from statecodec.replay import PostgresReplayStore

#: The settle window is 2 x timeout + 1 s: 61 s here, far longer than these tests' steps,
#: so a row written by the test is young when the store looks at it.
LONG = 30.0


def _table() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def _count(server: PostgresServer, table: str, key: str) -> int:
    (count,) = server.sql(f"SELECT count(*) FROM {table} WHERE key = '{key}'", DATABASE)[0]
    assert isinstance(count, int)
    return count


def _waiting_for_the_standby(server: PostgresServer) -> int:
    """Backends whose commit waits for the synchronous standby (invisible to others meanwhile)."""
    (count,) = server.sql("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")[0]
    assert isinstance(count, int)
    return count


def test_the_settle_window_is_the_writers_budget_and_its_take_backs(postgres_server: PostgresServer) -> None:
    store = PostgresReplayStore(postgres_server.url(), timeout=2)
    assert store._settle == 2 * 2 + 1


def test_someone_elses_fresh_row_is_unsettled_an_old_one_is_replayed(postgres_server: PostgresServer) -> None:
    table = _table()
    writer = PostgresReplayStore(postgres_server.url(table=table), timeout=LONG)
    other = PostgresReplayStore(postgres_server.url(table=table), timeout=LONG)
    assert writer.consume("k", 600) is True
    # The writer's own process knows it accepted: a replay at once, no extra question.
    assert writer.consume("k", 600) is False
    assert writer.is_consumed("k") is True
    # Another instance cannot tell this row from one whose writer is still undecided.
    for _ in range(2):
        with pytest.raises(ReplayStoreError, match="not settled yet"):
            other.consume("k", 600)
        with pytest.raises(ReplayStoreError, match="not settled yet"):
            other.is_consumed("k")
    # Older than the window on the server's clock: settled, a replay for everyone.
    postgres_server.sql(f"UPDATE {table} SET written_at = written_at - interval '1 hour'", DATABASE)
    assert other.consume("k", 600) is False
    assert other.is_consumed("k") is True
    assert other.is_consumed("never") is False
    writer.close()
    other.close()


def test_a_row_its_writer_took_back_leaves_the_token_free(postgres_server: PostgresServer) -> None:
    """A row left by a failed call (here written by hand) is unsettled; once deleted the token redeems."""
    table = _table()
    store = PostgresReplayStore(postgres_server.url(table=table), timeout=LONG)
    store.check()
    postgres_server.sql(f"INSERT INTO {table} VALUES ('left', 'n', now() + interval '600 s')", DATABASE)
    with pytest.raises(ReplayStoreError, match="not settled yet"):
        store.consume("left", 600)
    assert _count(postgres_server, table, "left") == 1  # the row stays: no second consume meanwhile
    postgres_server.sql(f"DELETE FROM {table} WHERE key = 'left'", DATABASE)  # its writer's take-back
    assert store.consume("left", 600) is True
    assert store.consume("left", 600) is False
    store.close()


def test_an_old_row_its_writer_is_deleting_is_no_replay(postgres_server: PostgresServer) -> None:
    """A row older than the window whose take-back has begun (its delete not committed yet) is going.

    Only failed calls' rows and expired ones are ever deleted, so it is no use of the token:
    the consume that meets it inserts again (waiting for that delete) instead of saying
    ``replayed``. The writer's take-back is a delete in an open transaction of the test's.
    """
    table = _table()
    store = PostgresReplayStore(postgres_server.url(table=table), timeout=LONG)
    store.check()
    postgres_server.sql(
        f"INSERT INTO {table} VALUES ('going', 'n', now() + interval '600 s', now() - interval '1 hour')",
        DATABASE,
    )
    with postgres_server.admin(DATABASE) as admin:  # type: ignore[attr-defined]
        with admin.transaction():
            admin.execute(f"DELETE FROM {table} WHERE key = 'going'")
            assert store.is_consumed("going") is False

            async def look() -> float | None:  # what a consume runs once its insert met the row
                lane = await store._lane()
                return await lane.run(lambda conn: store._in_the_way(conn, "going"), time.monotonic() + LONG)

            assert store._sync(look) is None
            answers: list[bool] = []
            insert = threading.Thread(target=lambda: answers.append(store.consume("going", 600)))
            insert.start()
            waiting = (
                "SELECT count(*) FROM pg_stat_activity "
                f"WHERE wait_event_type = 'Lock' AND query LIKE '%{table}%'"
            )
            wait_until(
                lambda: postgres_server.sql(waiting) == [(1,)], "the consume's insert waits for the delete"
            )
        insert.join(30)
    assert answers == [True]
    store.close()


def test_a_table_made_before_written_at_is_refused_with_the_fix_then_migrated(
    postgres_server: PostgresServer,
) -> None:
    table = _table()
    postgres_server.sql(
        f'CREATE TABLE {table} (key text COLLATE "C" PRIMARY KEY, nonce text NOT NULL, '
        "expires_at timestamptz NOT NULL)",
        DATABASE,
    )
    postgres_server.sql(f"ALTER TABLE {table} OWNER TO statecodec_app", DATABASE)
    postgres_server.sql(f"INSERT INTO {table} VALUES ('old', 'n', now() + interval '600 s')", DATABASE)
    store = PostgresReplayStore(postgres_server.url(table=table), timeout=LONG)
    for call in (store.check, lambda: store.consume("k", 60), lambda: store.is_consumed("old")):
        with pytest.raises(ReplayStoreError, match=r"no written_at column.*statecodec replay init"):
            call()
    store.close()
    owner = PostgresReplayStore(postgres_server.url(table=table), timeout=LONG)
    owner.create_schema_now()  # what statecodec replay init runs
    owner.create_schema_now()  # idempotent
    owner.close()
    store = PostgresReplayStore(postgres_server.url(table=table), timeout=LONG)
    assert store.consume("old", 60) is False  # the rows from before count as settled (the epoch)
    assert store.consume("new", 60) is True
    ((fresh,),) = postgres_server.sql(
        f"SELECT clock_timestamp() - written_at < interval '1 minute' FROM {table} WHERE key = 'new'",
        DATABASE,
    )
    assert fresh is True
    store.close()


def test_a_take_back_that_cannot_reach_the_server_is_retried_until_it_gets_through(
    postgres_outage: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    """After an outage the failed call's row goes without any traffic of its writer.

    Other instances read such a row ``replayed`` once it is older than the settle window,
    so its writer must delete it as soon as the server answers again, not at its next
    consume. The row a failed call left is written by hand, with the nonce the store
    listed for that call (the only substitution); the server is stopped, so the first
    rounds of the background take-back fail.
    """
    server = postgres_outage
    table = _table()
    store = PostgresReplayStore(server.url(table=table), timeout=1)
    store.check()
    server.sql(f"INSERT INTO {table} VALUES ('left', 'n', now() + interval '600 s')", DATABASE)
    store._unsettled.note("left", "n", 600)
    caplog.set_level(logging.DEBUG, logger="statecodec")
    server.stop()
    try:

        async def failed() -> None:
            await store._lane()
            store._take_back_soon("left")  # what a call that failed closed does

        store._sync(failed)
        wait_until(lambda: "will retry" in caplog.text, "a take-back round fails, the server down")
    finally:
        server.start()
    wait_until(lambda: len(store._unsettled) == 0, "the row is taken back once the server answers")
    assert _count(server, table, "left") == 0
    store.close()


def test_a_consume_waiting_for_a_stopped_standby_is_never_a_replay_and_its_row_goes_back() -> None:
    """The fault suite's false replay, staged: a commit waits for a synchronous standby that is stopped.

    The writer's insert is committed locally and waits for the standby; its call fails
    closed at its deadline, which cancels the wait (the row stays, committed locally and
    visible). Another instance redeeming the token meanwhile, or right after, must fail
    closed too, never be told ``replayed``. The writer then takes its row back by itself, with no further
    consume of its own; and once the standby is back the token redeems.
    """
    with synchronous_pair() as (primary, standby):
        table = _table()
        url = primary.url(table=table)
        writer = PostgresReplayStore(url, timeout=2)
        other = PostgresReplayStore(url, timeout=2)
        writer.check()  # the table, while the standby still answers
        other.check()
        standby.freeze()
        try:
            failed: list[BaseException] = []

            def write() -> None:
                try:
                    writer.consume("k", 600)
                except ReplayStoreError as exc:
                    failed.append(exc)

            thread = threading.Thread(target=write)
            thread.start()
            wait_until(
                lambda: _waiting_for_the_standby(primary) == 1,
                "the writer's commit waits for the standby",
            )
            # Whatever the interleaving (the writer's row in the way, or gone and this
            # insert waiting in turn), a call during the wait and one after the writer
            # failed closed are refused as an outage.
            with pytest.raises(ReplayStoreError, match=r"not settled yet|timed out"):
                other.consume("k", 600)
            thread.join(30)
            assert [str(e) for e in failed] and "timed out" in str(failed[0])
            with pytest.raises(ReplayStoreError, match=r"not settled yet|timed out"):
                other.consume("k", 600)
            # Its row, committed locally once the wait was cancelled, is taken back in the
            # background (that delete commits locally too, its own wait cancelled).
            wait_until(
                lambda: _waiting_for_the_standby(primary) == 0 and _count(primary, table, "k") == 0,
                "the failed call's row is taken back",
            )
        finally:
            standby.thaw()
        wait_until(
            lambda: primary.sql("SELECT sync_state FROM pg_stat_replication") == [("sync",)],
            "the standby is back",
        )
        assert other.consume("k", 600) is True
        assert other.consume("k", 600) is False
        writer.close()
        other.close()
