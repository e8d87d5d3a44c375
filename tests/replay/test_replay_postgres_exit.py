"""The PostgreSQL store's sync API leaves no task pending when it closes, even mid-outage.

After an outage in which the server stops answering (not a refused port: a frozen or
unreachable host), a pool worker may be inside a connection attempt for up to libpq's
``connect_timeout`` when the store closes, longer than the pool waits for its workers.
Left pending in the sync API's closed loop, such a task was torn down at interpreter exit
with asyncio's "Task was destroyed but it is pending!". The store now finishes every
task of its own loop before closing it.
"""

from __future__ import annotations

import asyncio

import pytest
from fixtures_postgres import PostgresServer

from statecodec import ReplayStoreError
from statecodec.replay import PostgresReplayStore


def test_close_after_an_unanswering_outage_leaves_no_task_pending(postgres_outage: PostgresServer) -> None:
    server = postgres_outage
    store = PostgresReplayStore(server.url(), timeout=1.0)
    assert store.consume("before", 60) is True
    assert store._runner is not None
    loop = store._runner.loop
    server.freeze()  # connections and new connection attempts hang: nothing answers
    try:
        for n in range(3):  # each one fails closed, and the pool tries new connections meanwhile
            with pytest.raises(ReplayStoreError):
                store.consume(f"during-{n}", 60)
        store.close()
    finally:
        server.thaw()
    assert loop.is_closed()
    assert {task.get_name() for task in asyncio.all_tasks(loop)} == set()  # nothing left to destroy at exit
