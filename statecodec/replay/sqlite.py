"""A replay store in one SQLite file: the default for one machine and several worker processes.

Why this is safe across threads and processes:

* The token id is the table's PRIMARY KEY, and a consume is one ``INSERT ... ON
  CONFLICT DO UPDATE ... WHERE <existing row expired>`` statement in autocommit mode.
  SQLite serialises writers on the database file, so of any number of concurrent
  consumers of one key exactly one sees ``changes() == 1``; the others find a live row,
  the ``WHERE`` is false, and they see 0. An expired row that the purge has not reached
  yet counts as absent, in the same statement.
* WAL mode lets readers and the single writer proceed together, and the busy timeout
  makes a writer wait its turn instead of failing at once. Past the timeout the consume
  fails closed (``store_unavailable``), it never guesses.
* sqlite3 connections must not be shared between threads or survive ``fork()``: each
  thread opens its own, and a child process drops (without closing, which could disturb
  the parent's locks) every connection it inherited and opens fresh ones.

Time: a row stores when it is forgotten (``expires_at``) on the host's clock, the one
time base every process using the file shares; the store computes it from the relative
retention the codec passes, so the codec's own clock never enters the file. Moving the
host clock forward by more than the margin the codec adds (its skew allowance) forgets
rows early; keep the machine on NTP.

Durability: with ``synchronous="NORMAL"`` (the default, and SQLite's recommendation for
WAL) a consume survives a crash of the process, but the last commits before a power
loss or kernel crash may be lost, so tokens redeemed in that last instant could be
redeemed once more within their lifetime. ``synchronous="FULL"`` closes that gap at
roughly a third of the throughput.

Async consumes (:meth:`SQLiteReplayStore.aconsume`) run on the event loop when SQLite
can answer at once: a consume is one short write, and handing it to a worker thread
cost several times the write itself in wake-ups and context switches (docs/performance.md).
That connection never waits (busy timeout 0) and never checkpoints; a consume that would
wait for another writer, or that is due to purge, goes to a worker thread as before, and
so does one consume in every few hundred, which then checkpoints the WAL.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final, Literal

from .. import _telemetry
from .._errors import ReplayStoreError
from .base import ReplayStore, invalid_retention

logger = logging.getLogger("statecodec")

# Plain literals, no string building: nothing user-supplied ever reaches SQL text.
_SCHEMA: Final = (
    # WITHOUT ROWID: the key is the only lookup path, so the table is the key's b-tree.
    "CREATE TABLE IF NOT EXISTS statecodec_replay "
    "(key TEXT PRIMARY KEY NOT NULL, expires_at REAL NOT NULL) WITHOUT ROWID",
    # Lets the purge find expired rows without a full scan under the write lock.
    "CREATE INDEX IF NOT EXISTS statecodec_replay_expiry ON statecodec_replay (expires_at)",
)
# One statement, so one atomic write: insert, or take over a row that has expired.
_CONSUME: Final = (
    "INSERT INTO statecodec_replay (key, expires_at) VALUES (?, ?) "
    "ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at "
    "WHERE statecodec_replay.expires_at <= ?"
)
# Batches keep each purge transaction short, so consumers never wait long behind it.
_PURGE: Final = (
    "DELETE FROM statecodec_replay WHERE key IN "
    "(SELECT key FROM statecodec_replay WHERE expires_at <= ? LIMIT ?)"
)
_COUNT: Final = "SELECT count(*) FROM statecodec_replay"
# A read: an expired row that the purge has not reached counts as absent, as in _CONSUME.
_LIVE: Final = "SELECT 1 FROM statecodec_replay WHERE key = ? AND expires_at > ?"
_PURGE_BATCH: Final = 2000
# Loop-side commits between two checkpoints run from a worker thread (SQLite's own
# automatic checkpoint comes after about 1,000 pages).
_CHECKPOINT_EVERY: Final = 256

_SYNCHRONOUS: Final = ("NORMAL", "FULL")

# Connections inherited through fork(): kept referenced forever so the child never
# closes them (closing could checkpoint or unlink the WAL the parent is using).
_ORPHANED: list[sqlite3.Connection] = []
_STORES: weakref.WeakSet[SQLiteReplayStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._forget_inherited_connections()


os.register_at_fork(after_in_child=_after_fork_in_child)


class SQLiteReplayStore(ReplayStore):
    """Consumed keys in a table of one SQLite file, shared by every process that opens it.

    :param path: the database file; created with its table if missing. The directory
        must exist and be writable (SQLite puts ``-wal`` and ``-shm`` files next to it).
        It must be on a local file system: WAL needs shared memory, which NFS and most
        network file systems do not provide.
    :param busy_timeout: seconds a consume waits for another writer before it fails
        closed with :class:`ReplayStoreError`.
    :param purge_interval: seconds between two purges of expired rows (per process).
    :param synchronous: ``"NORMAL"`` or ``"FULL"``; see the module docstring.
    :param clock: the host's current Unix time (rows hold absolute times, shared by every
        process using the file); inject one in tests.
    """

    kind = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 5.0,
        purge_interval: float = 60.0,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        clock: Callable[[], float] = time.time,
    ) -> None:
        path = os.fspath(path)
        if not path or path == ":memory:" or path.startswith("file:"):
            raise ValueError(
                f"SQLiteReplayStore needs a file path, got {path!r}: an in-memory database would be "
                "private to each thread; use MemoryReplayStore for a single process"
            )
        if not busy_timeout >= 0 or not purge_interval > 0:
            raise ValueError("busy_timeout must be >= 0 and purge_interval > 0 (seconds)")
        if str(synchronous).upper() not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        self.path = os.path.abspath(path)
        self.busy_timeout = float(busy_timeout)
        self.purge_interval = float(purge_interval)
        self.synchronous = str(synchronous).upper()
        self._clock = clock
        self._lock = threading.Lock()
        self._local = threading.local()
        self._conns: list[tuple[threading.Thread, sqlite3.Connection]] = []
        self._closed = False
        self._next_purge = 0.0
        self._loop_commits = 0
        _STORES.add(self)
        # Fail fast on a bad path or a file that is not a database, and create the
        # table once here rather than racing on it in every worker thread.
        self._connection(create_schema=True)

    def __repr__(self) -> str:
        return f"SQLiteReplayStore({self.path!r})"

    # ------------------------------------------------------------------ the contract
    def consume(self, key: str, retention: float) -> bool:
        if not 0.0 < retention < math.inf:  # also false for NaN
            raise invalid_retention(retention)
        now = self._clock()
        try:
            cursor: sqlite3.Cursor = self._local.cursor
        except AttributeError:
            cursor = self._connection().cursor()
            self._local.cursor = cursor  # reused: a fresh cursor per call costs more (docs/performance.md)
        try:
            first = cursor.execute(_CONSUME, (key, now + retention, now)).rowcount == 1
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        if now >= self._next_purge:
            self._scheduled_purge(cursor.connection, now)
        return first

    async def aconsume(self, key: str, retention: float) -> bool:
        """:meth:`consume` on the event loop if SQLite answers at once, else in a worker thread.

        Exactly once all the same: a write that finds another writer holding the lock
        fails with SQLITE_BUSY before it changes anything, and is then done again, whole,
        by :meth:`consume` in a thread, where waiting for the lock blocks no one.
        """
        if not 0.0 < retention < math.inf:  # also false for NaN
            raise invalid_retention(retention)
        now = self._clock()
        if self._closed or now >= self._next_purge:  # a purge is due: not on the loop
            return await asyncio.to_thread(self.consume, key, retention)
        if self._loop_commits >= _CHECKPOINT_EVERY:  # an fsync: not on the loop either
            self._loop_commits = 0
            return await asyncio.to_thread(self._consume_then_checkpoint, key, retention)
        conn: sqlite3.Connection | None = getattr(self._local, "loop_conn", None)
        if conn is None:
            conn = await self._loop_connection()
        try:
            first: bool = conn.execute(_CONSUME, (key, now + retention, now)).rowcount == 1
        except sqlite3.OperationalError as exc:
            if not getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
                raise self._error(exc) from None
            if conn.in_transaction:  # never the case in autocommit; never left open either
                conn.rollback()
            return await asyncio.to_thread(self.consume, key, retention)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        self._loop_commits += 1
        return first

    async def _loop_connection(self) -> sqlite3.Connection:
        """This thread's connection for :meth:`aconsume`, opened in a worker thread (setting
        up may wait for other processes), then used by this thread alone."""
        try:
            conn = await asyncio.to_thread(self._open_for_loop)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        existing: sqlite3.Connection | None = getattr(self._local, "loop_conn", None)
        if existing is not None:  # another consume of this loop opened one meanwhile
            conn.close()
            return existing
        with self._lock:
            self._conns.append((threading.current_thread(), conn))
        self._local.loop_conn = conn
        return conn

    def _open_for_loop(self) -> sqlite3.Connection:
        conn = self._open(False)
        # Never wait on the loop, never checkpoint (an fsync) there: see the module docstring.
        conn.execute("PRAGMA busy_timeout=0")
        conn.execute("PRAGMA wal_autocheckpoint=0")
        return conn

    def _consume_then_checkpoint(self, key: str, retention: float) -> bool:
        first = self.consume(key, retention)
        try:
            self._connection().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:  # the consume succeeded; the WAL is only longer for now
            logger.warning(
                "checkpointing %s failed, will retry: %s",
                self.path,
                exc,
                extra=_telemetry.fields("checkpoint_failed", store=self.kind, detail=str(exc)),
            )
        return first

    def is_consumed(self, key: str) -> bool:
        """Whether ``key`` holds a live row; one read, no write (a consume is settled when it commits)."""
        try:
            return self._connection().execute(_LIVE, (key, self._clock())).fetchone() is not None
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    async def ais_consumed(self, key: str) -> bool:
        return await asyncio.to_thread(self.is_consumed, key)

    def purge(self) -> int:
        """Delete expired rows now; returns how many were deleted."""
        try:
            return self._purge(self._connection(), self._clock())
        except sqlite3.Error as exc:
            raise self._error(exc) from None

    def close(self) -> None:
        """Close every connection this store opened, in any thread."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, []
        for _, conn in conns:
            conn.close()

    def __len__(self) -> int:
        """Rows held, including expired ones not purged yet."""
        try:
            row = self._connection().execute(_COUNT).fetchone()
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        return int(row[0])

    # ------------------------------------------------------------------ connections
    def _connection(self, *, create_schema: bool = False) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and not self._closed:
            return conn
        if self._closed:
            raise ReplayStoreError(f"SQLite replay store {self.path} is closed")
        try:
            conn = self._open(create_schema)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        with self._lock:
            self._prune_dead_threads()
            self._conns.append((threading.current_thread(), conn))
        self._local.conn = conn
        return conn

    def _open(self, create_schema: bool) -> sqlite3.Connection:
        # isolation_level=None: autocommit, so each consume is exactly one transaction.
        # check_same_thread=False only so close() may close connections of other threads;
        # each connection is still used by the thread that opened it alone.
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            _retry_while_busy(lambda: self._set_up(conn, create_schema), self.busy_timeout)
        except BaseException:
            conn.close()
            raise
        return conn

    def _set_up(self, conn: sqlite3.Connection, create_schema: bool) -> None:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise ReplayStoreError(
                f"SQLite replay store {self.path}: could not switch to WAL (journal_mode is {mode}); "
                "is the file on a network file system?"
            )
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        if create_schema:
            for statement in _SCHEMA:
                conn.execute(statement)

    def _prune_dead_threads(self) -> None:
        # A thread that exits leaves its connection behind; close those now rather than
        # holding one file descriptor per thread that ever consumed.
        alive = []
        for thread, conn in self._conns:
            if thread.is_alive():
                alive.append((thread, conn))
            else:
                conn.close()
        self._conns = alive

    def _forget_inherited_connections(self) -> None:
        # Runs in a fork child, where only the forking thread exists: every inherited
        # connection belongs to the parent. Keep them referenced and never use them.
        _ORPHANED.extend(conn for _, conn in self._conns)
        self._conns = []
        self._local = threading.local()
        self._lock = threading.Lock()  # another thread may have held it at fork time

    # ------------------------------------------------------------------ purging
    def _scheduled_purge(self, conn: sqlite3.Connection, now: float) -> None:
        with self._lock:
            if now < self._next_purge:
                return  # another thread of this process just did it
            self._next_purge = now + self.purge_interval
        try:
            self._purge(conn, now)
        except sqlite3.Error as exc:
            # The consume already succeeded; a failed purge only delays reclaiming space.
            logger.warning(
                "purging expired entries from %s failed, will retry: %s",
                self.path,
                exc,
                extra=_telemetry.fields("purge_failed", store=self.kind, detail=str(exc)),
            )

    @staticmethod
    def _purge(conn: sqlite3.Connection, now: float) -> int:
        total = 0
        while True:
            deleted = conn.execute(_PURGE, (now, _PURGE_BATCH)).rowcount
            total += deleted
            if deleted < _PURGE_BATCH:
                return total

    # ------------------------------------------------------------------ errors
    def _error(self, exc: sqlite3.Error) -> ReplayStoreError:
        if self._closed:
            return ReplayStoreError(f"SQLite replay store {self.path} is closed")
        name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
        why = _explain(name, self.busy_timeout)
        return ReplayStoreError(f"SQLite replay store {self.path}: {why} ({name}: {exc})")


def _retry_while_busy(action: Callable[[], None], timeout: float) -> None:
    """Run ``action`` again while SQLite answers "busy", for up to ``timeout`` seconds.

    Consumes never need this: each is one write statement, for which SQLite waits on the
    busy timeout by itself. Setting up a connection does: switching a new file to WAL
    and creating the table (a read that turns into a write) may get SQLITE_BUSY at once,
    without waiting, when several processes open the same new file together.
    """
    deadline = time.monotonic() + timeout
    pause = 0.002
    while True:
        try:
            action()
            return
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
            if not busy or time.monotonic() >= deadline:
                raise
        # Jitter, not a secret: contenders must not retry in lockstep.
        time.sleep(random.uniform(pause / 2, pause))  # nosec B311
        pause = min(pause * 2, 0.1)


def _explain(name: str, busy_timeout: float) -> str:
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return (
            f"database is locked: another connection held the write lock for longer than the busy "
            f"timeout ({busy_timeout:g}s)"
        )
    if name == "SQLITE_FULL":
        return "disk (or quota) is full"
    if name.startswith("SQLITE_READONLY"):
        return "database is read-only (file or directory permissions, or a read-only mount)"
    if name.startswith("SQLITE_CANTOPEN"):
        return "cannot open the database file (does the directory exist, and is it writable?)"
    if name in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        return "the file is not an SQLite database, or it is corrupt"
    if name.startswith("SQLITE_IOERR"):
        return "I/O error while reading or writing the database"
    return "the database reported an error"
