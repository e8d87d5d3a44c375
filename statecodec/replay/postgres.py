"""A replay store in PostgreSQL: for fleets that already run a database, on many machines.

A consume is one statement, atomic on the server::

    INSERT INTO statecodec_replay (key, nonce, expires_at)
    VALUES ($1, $2, now() + make_interval(secs => $3)) ON CONFLICT (key) DO NOTHING

The token id is the PRIMARY KEY: of any number of concurrent inserts of one key exactly
one creates the row (the others wait for its transaction, then do nothing), and the
affected-row count says which. The expiry is computed by the database from its own clock
(``now()``) and the relative retention the codec passes, so the application servers'
clocks never enter the table. An expired row that the purge has not reached yet counts as
absent: an insert that finds a row deletes it only if it has expired (``expires_at <=
now()``, again the database's clock) and inserts once more; two consumers doing that at
once still leave one winner, because the second insert is again one atomic statement.

Expired rows are purged without a cron job: every ``purge_interval`` seconds one consume
of each process starts, after answering, a background delete of expired rows in batches
of a bounded size (index on ``expires_at``), so the table holds about the live entries
plus ``purge_interval`` seconds of expired ones, whatever the traffic.

Fail closed, bounded in time: every call has one budget, ``timeout`` seconds, for the
pool, the connection (libpq's ``connect_timeout``) and the statement (the server's
``statement_timeout``, and a client-side deadline for a server that no longer answers at
all, such as a SIGSTOPped one). Past it, or on any error, the consume raises
:class:`~statecodec.ReplayStoreError` and the codec reports ``store_unavailable``.

Nothing is burnt by a failure: each attempt writes a fresh ``nonce`` with its row, and a
call whose outcome is unknown (the connection broke, or the deadline passed, after the
insert was sent: it may yet commit) lists its ``(key, nonce)`` (:mod:`._unsettled`). The
store deletes those rows (``DELETE ... WHERE (key, nonce) IN ...``) at once in the
background, once the failed call's late work has ended, and again before the next consume
of that key; every consume also takes back a few of the oldest others. And since that
insert may commit only after the retry's delete has looked (it was still running on a
loaded server), a consume whose insert finds the key taken deletes the row there too when
its nonce is listed, then inserts again. So the client's retry redeems the token instead of
finding it "replayed". Deleting a row only a failed call wrote is always safe: nobody
accepted the token on the strength of it. A row not found stays listed (it may still
commit) until it would have expired. A call marks itself over when it answers, and its
work checks that before each insert: asyncio's cancellation is only a request and can be
lost (Python 3.11's ``wait_for``, in the pool's wait for a connection, CPython gh-86296),
and work that went on would insert under a nonce nobody listed. The list lives in the
object (bounded: :attr:`.Unsettled.LIMIT`), and a process that exits leaves its listed rows
until they expire.

No false replays. A row can exist while nobody has accepted its token: its writer's commit
waits for a synchronous standby (and, cancelled at the writer's deadline, commits locally
anyway), or its writer failed closed and has not taken it back yet. A consume that finds
the row of someone else must not say "replayed" then (the client would abandon a flow
nobody redeemed), nor accept. So each row holds when it was written on the server's clock
(``written_at``), and a consume whose insert finds a row reads its age in the statement it
runs on that path anyway (the take-over of an expired or failed call's row): nothing more
on the common path, no more round trips on this one. Younger than the settle window
(``2 x timeout + 1`` s: the writer's call answers within ``timeout`` of its insert, and its
background take-back has a ``timeout`` of its own), the consume fails closed
(``store_unavailable``, retry); older, the row is settled: a replay. Keys this store object
accepted are settled at once (:class:`._settle._Recent`). What is left: a row that becomes
visible, or is taken back, more than the window after its insert (a primary frozen in the
middle of the commit, a writer that cannot reach the server for longer, its take-back
retried up to every second, or is itself stopped that long) reads "replayed" on other
instances until its writer takes it back; and a step of the server's clock shifts every row's age by it.

Replication: with a synchronous standby (``synchronous_standby_names`` and
``synchronous_commit`` ``on`` or ``remote_apply``) a consume the primary acknowledged is on
the standby, so a promoted standby never accepts it again; with asynchronous replication
the last acknowledged consumes can be lost in a failover (docs/replay.md). A failed
call's row that reached the standby is taken back there after the promotion like any
other (its nonce is listed); one that had not died with the old primary. A multi-host
URL (``host=a,b`` with ``target_session_attrs=read-write``) makes libpq find the current
primary on every new connection.

The sync API (:meth:`PostgresReplayStore.consume`, ``check``) runs the same coroutines on
an event loop of the store's own, in one thread, so that its deadline is the same one;
the async API runs them on the caller's loop, with one bounded pool per loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import math
import os
import re
import secrets
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg_pool
from psycopg import sql

from .. import _telemetry
from .._errors import ReplayStoreError
from ._postgres_url import POSTGRES_STORE_OPTIONS, PostgresTarget, parse_postgres_url
from ._settle import _Recent
from ._unsettled import Unsettled
from ._url_text import option_defaults, scrub
from .base import ReplayStore, invalid_retention, store_settings

logger = logging.getLogger("statecodec")

T = TypeVar("T")

_DEFAULTS: Final = option_defaults(POSTGRES_STORE_OPTIONS)
DEFAULT_TABLE: Final[str] = _DEFAULTS["table"]
#: A plain, unquoted SQL identifier: nothing user-supplied is ever spliced into SQL text
#: except through psycopg.sql.Identifier, and this keeps the table's name predictable.
_TABLE_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_PURGE_BATCH: Final = 1000
_PURGE_MAX_BATCHES: Final = 20
#: Seconds added to a writer's longest undecided time (see PostgresReplayStore._settle): a
#: cancelled commit's end and a loaded machine's scheduling.
_SETTLE_MARGIN: Final = 1.0
#: Keys of failed calls one lane's background take-back holds at most; the others wait for
#: their next consume or the spare take-backs.
_SOON_KEYS: Final = 1024
#: Seconds before a failed background take-back is tried again, doubling up to the second.
_RETAKE_FIRST: Final = 0.05
_RETAKE_MAX: Final = 1.0
#: Inserts one consume tries, each after deleting a row in the way that was no use of the
#: token; more means rows keep appearing (late inserts of failed calls): it fails closed.
_TAKE_OVERS: Final = 3
#: Callers waiting for a connection, per pool, before new ones are refused at once.
_MAX_WAITING: Final = 1024
#: Stores whose sync API has a thread: closed at interpreter exit, so that their
#: connections end with a goodbye to the server instead of pending tasks torn down.
_LIVE: weakref.WeakSet[PostgresReplayStore] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for store in list(_LIVE):
        with contextlib.suppress(Exception):
            store.close()


def schema_statements(table: str = DEFAULT_TABLE) -> list[str]:
    """The statements that create the table and its expiry index, or bring an older table up to date.

    Idempotent. ``written_at`` is when the row was written, on the server's clock: how a
    consume that finds it tells a settled row from one whose writer may be undecided. A
    table made before that column gets it with the epoch for its existing rows (old:
    settled), without a rewrite, and the server's clock for the rows written from then on.
    """
    _check_table(table)
    return [
        # COLLATE "C": keys are opaque ASCII; byte order needs no locale and never changes.
        f'CREATE TABLE IF NOT EXISTS {table} (key text COLLATE "C" PRIMARY KEY, '
        "nonce text NOT NULL, expires_at timestamptz NOT NULL, "
        "written_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        f"CREATE INDEX IF NOT EXISTS {table}_expires_at ON {table} (expires_at)",
        f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS written_at timestamptz NOT NULL DEFAULT 'epoch'",
        f"ALTER TABLE {table} ALTER COLUMN written_at SET DEFAULT clock_timestamp()",
    ]


def grant_statement(table: str, role: str) -> str:
    """The least privileges the store needs on its table, for ``role``."""
    _check_table(table)
    if not role or "\x00" in role:
        raise ValueError(f"not a role name: {role!r}")
    quoted = '"' + role.replace('"', '""') + '"'  # SQL's own identifier quoting: any name, no injection
    return f"GRANT SELECT, INSERT, DELETE ON {table} TO {quoted}"


def _check_table(table: str) -> None:
    if not isinstance(table, str) or not _TABLE_NAME.fullmatch(table):
        raise ValueError(
            f"table must be a lower-case SQL identifier of at most 63 of [a-z0-9_], got {table!r}"
        )


@dataclass(frozen=True)
class _Statements:
    insert: sql.Composed
    in_the_way: sql.Composed
    take_back: sql.Composed
    purge: sql.Composed
    live: sql.Composed
    exists: str
    privileges: sql.Composed
    count: sql.Composed

    @classmethod
    def for_table(cls, table: str) -> _Statements:
        t = sql.Identifier(table)
        return cls(
            insert=sql.SQL(
                "INSERT INTO {} (key, nonce, expires_at) VALUES (%s, %s, now() + make_interval(secs => %s)) "
                "ON CONFLICT (key) DO NOTHING"
            ).format(t),
            # The row in the way: deleted if it has expired or a failed call of this process
            # wrote it (the nonces deleted), else its age on the server's clock (the same
            # snapshot: NULL when the row went meanwhile, or is going: a delete of it has
            # begun, xmax, and only failed calls' and expired rows are ever deleted).
            in_the_way=sql.SQL(
                "WITH gone AS (DELETE FROM {0} WHERE key = %(key)s "
                "AND (expires_at <= now() OR nonce = ANY(%(listed)s::text[])) RETURNING nonce) "
                "SELECT ARRAY(SELECT nonce FROM gone), "
                "(SELECT extract(epoch FROM clock_timestamp() - written_at)::float8 FROM {0} "
                "WHERE key = %(key)s AND expires_at > now() AND NOT nonce = ANY(%(listed)s::text[]) "
                "AND xmax = '0'::xid)"
            ).format(t),
            take_back=sql.SQL(
                "DELETE FROM {} WHERE (key, nonce) IN (SELECT * FROM unnest(%s::text[], %s::text[])) "
                "RETURNING key, nonce"
            ).format(t),
            purge=sql.SQL(
                "DELETE FROM {0} WHERE key IN "
                "(SELECT key FROM {0} WHERE expires_at <= now() ORDER BY expires_at LIMIT %s)"
            ).format(t),
            live=sql.SQL(
                "SELECT nonce, extract(epoch FROM clock_timestamp() - written_at)::float8 "
                "FROM {} WHERE key = %s AND expires_at > now() AND xmax = '0'::xid"
            ).format(t),
            exists=(
                "SELECT to_regclass(%(t)s) IS NOT NULL, EXISTS (SELECT FROM pg_attribute "
                "WHERE attrelid = to_regclass(%(t)s) AND attname = 'written_at' AND NOT attisdropped)"
            ),
            privileges=sql.SQL(
                "SELECT has_table_privilege({0}, 'SELECT'), has_table_privilege({0}, 'INSERT'), "
                "has_table_privilege({0}, 'DELETE')"
            ).format(sql.Literal(table)),
            count=sql.SQL("SELECT count(*) FROM {}").format(t),
        )


class PostgresReplayStore(ReplayStore):
    """Consumed keys as rows of one PostgreSQL table, shared by every machine using the database.

    :param url: ``postgresql://`` or ``postgres://`` URL, handed to libpq as written (its
        hosts, ``host=a,b`` lists, ``sslmode``, ``sslrootcert``, ``options``, a Unix-socket
        ``host=/path``...) except for statecodec's own query options, which are defaults for
        the keyword arguments below.
    :param table: the table's name (default ``statecodec_replay``), in the role's search path.
    :param timeout: seconds one consume may take, all included, before it fails closed
        (default 2); also the server's ``statement_timeout`` and, unless the URL sets one,
        libpq's ``connect_timeout`` (rounded up; libpq counts whole seconds).
    :param pool_size: connections at most per event loop (the sync API has one loop).
    :param purge_interval: seconds between two purges of expired rows by this process.
    :param create_schema: create the table on first use if it is missing (needs the right
        to create it; otherwise run ``statecodec replay init`` once, as its owner).
    """

    kind = "postgres"

    def __init__(
        self,
        url: str,
        *,
        table: str | None = None,
        timeout: float | None = None,
        pool_size: int | None = None,
        purge_interval: float | None = None,
        create_schema: bool = True,
    ) -> None:
        target = parse_postgres_url(url)
        try:  # libpq's own verdict on the rest, now rather than at the first consume
            psycopg.conninfo.conninfo_to_dict(target.conninfo)
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"libpq refuses it: {str(exc).strip()}") from None
        given = {"table": table, "timeout": timeout, "pool_size": pool_size, "purge_interval": purge_interval}
        settings = store_settings(_DEFAULTS, target.options, given)
        _check_table(settings["table"])
        if not 0 < settings["timeout"] < math.inf:
            raise ValueError(f"timeout must be a positive number of seconds, got {settings['timeout']!r}")
        if (
            isinstance(settings["pool_size"], bool)
            or not isinstance(settings["pool_size"], int)
            or (settings["pool_size"] < 1)
        ):
            raise ValueError(f"pool_size must be a positive integer, got {settings['pool_size']!r}")
        if not 0 < settings["purge_interval"] < math.inf:
            raise ValueError("purge_interval must be a positive number of seconds")
        self.table: str = settings["table"]
        self.timeout: float = float(settings["timeout"])
        self.pool_size: int = settings["pool_size"]
        self.purge_interval: float = float(settings["purge_interval"])
        self.create_schema = create_schema
        self._target = target
        self._sql = _Statements.for_table(self.table)
        self._lock = threading.Lock()
        self._lanes: dict[asyncio.AbstractEventLoop, _Lane] = {}
        self._runner: _Runner | None = None
        self._pid = os.getpid()
        self._schema_ready = False
        self._unsettled = Unsettled()
        #: How long after its insert (on the server's clock) a row's writer may be undecided:
        #: its call answers within ``timeout`` of the insert, and its take-back, started at
        #: once in the background, has a ``timeout`` of its own; plus a margin.
        self._settle = 2 * self.timeout + _SETTLE_MARGIN
        self._accepted = _Recent(self._settle)
        self._next_purge = 0.0

    def __repr__(self) -> str:
        return f"PostgresReplayStore({self._target.where!r}, table={self.table!r})"

    # ------------------------------------------------------------------ the contract
    def consume(self, key: str, retention: float) -> bool:
        if not 0.0 < retention < math.inf:  # also false for NaN
            raise invalid_retention(retention)
        return self._sync(lambda: self._consume(key, retention))

    async def aconsume(self, key: str, retention: float) -> bool:
        if not 0.0 < retention < math.inf:
            raise invalid_retention(retention)
        return await self._consume(key, retention)

    def is_consumed(self, key: str) -> bool:
        """Whether ``key`` holds a settled row: one SELECT, nothing written (ReplayStore.is_consumed)."""
        return self._sync(lambda: self.ais_consumed(key))

    async def ais_consumed(self, key: str) -> bool:
        async def go(conn: psycopg.AsyncConnection[Any]) -> tuple[str, float] | None:
            row = await (await conn.execute(self._sql.live, (key,))).fetchone()
            return (str(row[0]), float(row[1])) if row else None

        try:  # a read only: a missing table is not created (it is an error, as for a consume)
            found = await self._with_connection(go, retry=True, schema=False)
        except psycopg.errors.UndefinedTable:
            raise self._error(ReplayStoreError(self._missing_table())) from None
        except Exception as exc:
            raise self._error(exc) from None
        if found is None:
            return False
        nonce, age = found
        if self._unsettled.holds(key, nonce):
            raise self._error(
                ReplayStoreError("its row was written by a call that failed closed and is not taken back yet")
            )
        self._judge(key, age)
        return True

    def check(self) -> None:
        """Connect now; make sure the table exists (creating it if allowed) and may be used.

        Raises :class:`ReplayStoreError` naming the fix: the server unreachable, the
        table missing (``statecodec replay init``), or a privilege missing.
        """
        self._sync(self._acheck)

    async def acheck(self) -> None:
        """Async :meth:`check`."""
        await self._acheck()

    def schema(self, grant_to: str | None = None) -> list[str]:
        """The SQL that creates this store's table and index, and grants ``grant_to`` its privileges."""
        statements = schema_statements(self.table)
        if grant_to is not None:
            statements.append(grant_statement(self.table, grant_to))
        return statements

    def create_schema_now(self, grant_to: str | None = None) -> None:
        """Run :meth:`schema` in one transaction (``statecodec replay init``), as a role that may."""
        statements = self.schema(grant_to)

        async def create() -> None:
            async def go(conn: psycopg.AsyncConnection[Any]) -> None:
                async with conn.transaction():
                    for statement in statements:
                        await conn.execute(statement)

            lane = await self._lane()
            deadline = time.monotonic() + self.timeout
            await _within(lane.run(go, deadline), deadline, lane)
            self._schema_ready = True

        self._sync(create)

    def purge(self) -> int:
        """Delete expired rows now; returns how many were deleted."""
        return self._sync(self._purge_all)

    def __len__(self) -> int:
        """Rows held, including expired ones not purged yet."""

        async def count() -> int:
            async def go(conn: psycopg.AsyncConnection[Any]) -> int:
                row = await (await conn.execute(self._sql.count)).fetchone()
                return int(row[0]) if row else 0

            return await self._with_connection(go)

        return self._sync(count)

    def close(self) -> None:
        """Close the sync API's connections and its thread (a later call opens them again).

        Connections of the async API belong to their event loops: ``await store.aclose()``.
        """
        with self._lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop(self)

    async def aclose(self) -> None:
        """Close the running loop's pool, and the sync API's."""
        with self._lock:
            lane = self._lanes.pop(asyncio.get_running_loop(), None)
        if lane is not None:
            await lane.aclose()
        await asyncio.to_thread(self.close)

    # ------------------------------------------------------------------ one consume
    async def _consume(self, key: str, retention: float) -> bool:
        # A fresh nonce per attempt: a listed (key, nonce) never names the row of an attempt
        # that succeeded, so a take-back can only ever delete a row nobody was told about.
        writes = _Writes()

        async def go(conn: psycopg.AsyncConnection[Any]) -> float | None:
            """None once this call's row is in; else the age of the row in the way."""
            if writes.sent:  # a retry of this call: the earlier attempt's insert may have committed
                self._unsettled.note(key, writes.sent.pop(), retention)
            await self._take_back(conn, [key])
            nonce = writes.nonce()
            for _ in range(_TAKE_OVERS):
                if (await conn.execute(self._sql.insert, (key, nonce, retention))).rowcount == 1:
                    return None
                # Taken: live, expired and not purged yet (absent), or a failed call's (not a use).
                age = await self._in_the_way(conn, key)
                if age is not None:
                    return age
                writes.check()
            raise ReplayStoreError(f"the row of this token was rewritten {_TAKE_OVERS} times meanwhile")

        try:
            in_the_way = await self._with_connection(go, retry=True)
        except BaseException as exc:
            # From here on this call has answered: its work, if it goes on regardless, writes
            # nothing more, and the insert it may have sent is listed to be taken back.
            writes.over = True
            if writes.sent:
                self._unsettled.note(key, writes.sent.pop(), retention)
                self._take_back_soon(key)
            if isinstance(exc, Exception):
                raise self._error(exc) from None
            raise
        self._maybe_purge()
        if in_the_way is None:
            self._accepted.add(key, retention)
            return True
        self._judge(key, in_the_way)
        return False

    def _judge(self, key: str, age: float) -> None:
        """Return if the live row of ``key`` is settled (a replay); raise if its writer may be undecided.

        ``age`` is how long ago the row was inserted, on the server's clock. Younger than the
        settle window, its writer may still be waiting for its commit (a synchronous
        standby), or may have failed closed with the take-back on its way: nobody may have
        accepted the token, so this is no replay yet, and the caller fails closed
        (``store_unavailable``) as in an outage. The row stays: no second consume is accepted.
        """
        if age >= self._settle or key in self._accepted:
            return
        raise self._error(
            ReplayStoreError(
                f"an earlier redemption of this token is not settled yet (written {max(age, 0.0):.2f} s ago, "
                f"its commit or its take-back may still be pending): retry"
            )
        )

    async def _in_the_way(self, conn: psycopg.AsyncConnection[Any], key: str) -> float | None:
        """The age of ``key``'s live row, or None once the way is clear.

        Clear: the row had expired, or a failed call of this process wrote it (an insert
        that committed only after this call's take-back had looked: nobody accepted the
        token on the strength of it), and it is deleted now; or it went meanwhile.
        """
        listed = self._unsettled.nonces(key)
        cursor = await conn.execute(self._sql.in_the_way, {"key": key, "listed": listed})
        row = await cursor.fetchone()
        deleted, age = row if row else ([], None)
        self._unsettled.settle((key, nonce) for nonce in deleted)
        return None if deleted or age is None else float(age)

    async def _take_back(self, conn: psycopg.AsyncConnection[Any], keys: list[str]) -> None:
        """Delete the rows failed calls of this process may have written: all of ``keys``', a few others."""
        pending = self._unsettled.pending(keys)
        if not pending:
            return
        try:
            cursor = await conn.execute(
                self._sql.take_back, ([e.key for e in pending], [e.nonce for e in pending])
            )
            deleted = {(row[0], row[1]) for row in await cursor.fetchall()}
        except Exception:
            if any(entry.key in keys for entry in pending):
                raise  # these very tokens may still hold a failed call's row: fail closed
            return
        self._unsettled.settle(deleted)
        # Not found: never written, or an insert that may still commit (a stuck server).
        self._unsettled.later((e.key, e.nonce) for e in pending if (e.key, e.nonce) not in deleted)

    def _take_back_soon(self, key: str) -> None:
        """Take back a call's row right after it failed closed, without waiting for more traffic.

        Other instances answer the row ``store_unavailable`` only for the settle window;
        past it, a row still there reads ``replayed``. One task per lane does it (a burst of
        failures adds keys to its next round, not tasks).
        """
        try:
            lane = self._lanes.get(asyncio.get_running_loop())
        except RuntimeError:
            return
        if lane is None:
            return
        if len(lane.failed) < _SOON_KEYS:
            lane.failed.add(key)
        if lane.taker is None or lane.taker.done():
            lane.taker = asyncio.ensure_future(self._take_back_failed(lane))
            lane.adopt(lane.taker)

    async def _take_back_failed(self, lane: _Lane) -> None:
        """Rounds of take-backs while failed calls' keys come in; a round that fails is tried again.

        Until its writer takes the row back, another instance answers it ``store_unavailable``
        for the settle window and ``replayed`` after: so a round that could not reach the
        server (a partition, a failover) is retried at once and then every second at most,
        until one gets through; the first after an outage then deletes the row, usually
        before the other instances' retries come.
        """
        pause, awaited = _RETAKE_FIRST, set[asyncio.Task[Any]]()
        while lane.failed:
            keys = list(lane.failed)
            lane.failed.clear()
            # First the late work of failed calls: an insert still waiting for its commit is
            # invisible to a delete; once it has ended (cancelled), its row can be deleted.
            # Each once: a retry after an outage must not wait again for work stuck in it.
            if late := lane.late - awaited:
                awaited = set(lane.late)
                await asyncio.wait(late, timeout=self.timeout)

            async def go(conn: psycopg.AsyncConnection[Any], keys: list[str] = keys) -> None:
                await self._take_back(conn, keys)

            try:
                await self._with_connection(go)
            except Exception as exc:
                logger.debug(
                    "taking back failed consumes' rows of %s failed, will retry: %s",
                    self._target.where,
                    scrub(_describe(exc), self._target.secrets),
                    extra=_telemetry.fields("take_back_failed", store=self.kind, detail=type(exc).__name__),
                )
                lane.failed.update(keys[: _SOON_KEYS - len(lane.failed)])
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETAKE_MAX)
            else:
                pause = _RETAKE_FIRST

    async def _with_connection(
        self,
        work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        *,
        retry: bool = False,
        schema: bool = True,
    ) -> T:
        """``work`` on a pooled connection, within one deadline of ``timeout`` seconds.

        A connection found broken (the server restarted, a failover) is dropped and the
        work done once more on a fresh one, if time is left: safe, because the work takes
        back its own earlier attempt's row first. The deadline is enforced here, not by
        cancelling and waiting (psycopg would then spend up to 10 s trying to cancel the
        query on a server that does not answer): the late work finishes in the background.
        """
        lane = await self._lane()
        if schema:
            await self._ensure_schema(lane)
        deadline = time.monotonic() + self.timeout
        for attempt in range(2 if retry else 1):
            try:
                return await _within(lane.run(work, deadline), deadline, lane)
            except (TimeoutError, psycopg_pool.PoolTimeout) as exc:
                if lane.connect_error is not None:  # no connection to be had: say why
                    raise ReplayStoreError(f"cannot connect: {_describe(lane.connect_error)}") from exc
                raise
            except psycopg.OperationalError as exc:
                broken = not isinstance(exc, psycopg.errors.QueryCanceled)
                if attempt or not retry or not broken or time.monotonic() >= deadline:
                    raise
                await _within(lane.pool.check(), deadline, lane)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ schema and check
    async def _ensure_schema(self, lane: _Lane) -> None:
        if self._schema_ready:
            return
        async with lane.schema_lock:  # one look at the table per loop, not one per first caller
            if not self._schema_ready:
                await self._look_at_schema(lane)

    async def _look_at_schema(self, lane: _Lane) -> None:
        deadline = time.monotonic() + self.timeout

        async def go(conn: psycopg.AsyncConnection[Any]) -> None:
            row = await (await conn.execute(self._sql.exists, {"t": self.table})).fetchone()
            if row and row[0]:
                if not row[1]:
                    raise ReplayStoreError(self._outdated_table())
                return
            if not self.create_schema:
                raise ReplayStoreError(self._missing_table())
            try:
                async with conn.transaction():
                    for statement in schema_statements(self.table):
                        await conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege:
                raise ReplayStoreError(
                    self._missing_table() + "; this role may not create it, so the store tried and stopped"
                ) from None
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                # Another process created it at the same instant: PostgreSQL's IF NOT EXISTS
                # looks before it creates, and the loser of a race fails on pg_type's unique
                # index, or on the name's second look ("relation ... already exists").
                pass

        await _within(lane.run(go, deadline), deadline, lane)
        self._schema_ready = True

    def _missing_table(self) -> str:
        return (
            f"the table {self.table!r} does not exist; create it once as a role that may "
            f"(statecodec replay init --replay URL), then grant this role SELECT, INSERT and DELETE on it"
        )

    def _outdated_table(self) -> str:
        return (
            f"the table {self.table!r} has no written_at column (an earlier statecodec made it); "
            f"add it once as the table's owner: statecodec replay init --replay URL"
        )

    async def _acheck(self) -> None:
        async def go(conn: psycopg.AsyncConnection[Any]) -> None:
            row = await (await conn.execute(self._sql.privileges)).fetchone()
            missing = [
                name for name, ok in zip(("SELECT", "INSERT", "DELETE"), row or (), strict=False) if not ok
            ]
            if missing:
                raise ReplayStoreError(
                    f"this role lacks {', '.join(missing)} on the table {self.table!r}: "
                    f"GRANT SELECT, INSERT, DELETE ON {self.table} TO <role>"
                )

        try:
            await self._with_connection(go, retry=True)
        except Exception as exc:
            raise self._error(exc) from None

    # ------------------------------------------------------------------ purging
    def _maybe_purge(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now < self._next_purge:
                return
            self._next_purge = now + self.purge_interval
        lane = self._lanes.get(asyncio.get_running_loop())
        if lane is not None:
            lane.background(self._purge_logged())

    async def _purge_logged(self) -> None:
        try:
            await self._purge_all()
        except Exception as exc:  # the consume already answered; the rows wait for the next purge
            logger.warning(
                "purging expired rows of %s failed, will retry: %s",
                self._target.where,
                scrub(str(exc), self._target.secrets),
                extra=_telemetry.fields("purge_failed", store=self.kind, detail=type(exc).__name__),
            )

    async def _purge_all(self) -> int:
        """Expired rows deleted in batches (each its own short transaction), a bounded number."""
        deleted = 0
        for _ in range(_PURGE_MAX_BATCHES):

            async def batch(conn: psycopg.AsyncConnection[Any]) -> int:
                return (await conn.execute(self._sql.purge, (_PURGE_BATCH,))).rowcount

            try:
                count = await self._with_connection(batch)
            except Exception as exc:
                raise self._error(exc) from None
            deleted += count
            if count < _PURGE_BATCH:
                break
        return deleted

    # ------------------------------------------------------------------ loops and pools
    async def _lane(self) -> _Lane:
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is None or self._pid != os.getpid():
            with self._lock:
                self._after_fork()
                for stale in [lp for lp in self._lanes if lp.is_closed()]:
                    del self._lanes[stale]
                lane = self._lanes.setdefault(loop, _Lane(self._target, self.timeout, self.pool_size))
        await lane.open()
        return lane

    def _sync(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run a coroutine of this store on the sync API's own loop; wait at most its deadline."""
        with self._lock:
            self._after_fork()
            if self._runner is None:
                self._runner = _Runner()
                _LIVE.add(self)
            runner = self._runner
        try:
            return runner.run(make(), self.timeout * 3 + 5)
        except ReplayStoreError:
            raise
        except Exception as exc:
            raise self._error(exc) from None

    def _after_fork(self) -> None:
        """In a fork child (under ``_lock``): the parent's thread, pools and sockets are not ours."""
        if self._pid != os.getpid():
            self._pid, self._runner, self._lanes = os.getpid(), None, {}
            self._unsettled = Unsettled()

    # ------------------------------------------------------------------ errors
    def _error(self, exc: BaseException) -> ReplayStoreError:
        if isinstance(exc, psycopg.errors.UndefinedColumn):
            exc = ReplayStoreError(self._outdated_table())
        if isinstance(exc, ReplayStoreError):
            message = str(exc)
            if not message.startswith("PostgreSQL replay store"):
                message = f"PostgreSQL replay store {self._target.where}: {message}"
        else:
            timed_out = isinstance(
                exc, TimeoutError | psycopg.errors.QueryCanceled | psycopg_pool.PoolTimeout
            )
            what = f"timed out (timeout={self.timeout:g}s)" if timed_out else "unreachable or failing"
            message = f"PostgreSQL replay store {self._target.where} {what}: {_describe(exc)}"
        return ReplayStoreError(scrub(message, self._target.secrets))


# ---------------------------------------------------------------------------- helpers
def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split()) or 'no detail'}"


async def _within(work: Awaitable[T], deadline: float, lane: _Lane) -> T:
    """``work``'s result, or TimeoutError at ``deadline``; late work goes on in the background."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - time.monotonic()))
    except BaseException:  # the caller was cancelled: so is the work, in the background
        task.cancel()
        lane.adopt(task, late=True)
        raise
    if not done:
        task.cancel()
        lane.adopt(task, late=True)
        raise TimeoutError("no answer within the deadline (the server may be stuck)")
    return task.result()


class _Lane:
    """One event loop's bounded pool, and the tasks it left running (late work, purges)."""

    def __init__(self, target: PostgresTarget, timeout: float, size: int) -> None:
        kwargs: dict[str, Any] = {"autocommit": True}
        if "connect_timeout" not in target.libpq_keys:
            kwargs["connect_timeout"] = max(2, math.ceil(timeout))  # libpq: whole seconds, 2 at least
        ms = max(1, math.ceil(timeout * 1000))

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            # The server's own bound on each statement (a lock wait, an overloaded server).
            await conn.execute("SELECT set_config('statement_timeout', %s, false)", (f"{ms}ms",))

        #: Why the pool's last connection attempt failed (None once one succeeds): a call
        #: that found no connection in time says this, not just "timed out".
        self.connect_error: BaseException | None = None
        lane = self

        class _Connection(psycopg.AsyncConnection[Any]):
            @classmethod
            async def connect(cls, *args: Any, **kw: Any) -> Any:
                try:
                    conn = await super().connect(*args, **kw)
                except BaseException as exc:
                    lane.connect_error = exc
                    raise
                lane.connect_error = None
                return conn

        self.pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]] = (
            psycopg_pool.AsyncConnectionPool(
                target.conninfo,
                connection_class=_Connection,
                kwargs=kwargs,
                min_size=1,
                max_size=size,
                open=False,
                configure=configure,
                timeout=timeout,
                max_waiting=_MAX_WAITING,
                reconnect_timeout=max(timeout, 60.0),
                name="statecodec-replay",
            )
        )
        self._opening: asyncio.Future[None] | None = None
        self.schema_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Work of calls that have already answered (failed closed), still running.
        self.late: set[asyncio.Task[Any]] = set()
        #: Keys whose calls failed closed lately, and the task taking their rows back.
        self.failed: set[str] = set()
        self.taker: asyncio.Task[None] | None = None

    async def open(self) -> None:
        # Once per lane, and every caller waits for it: a pool that is still opening
        # refuses connections ("not open yet"), which would fail the concurrent first calls.
        if self._opening is None:
            self._opening = asyncio.ensure_future(self.pool.open(wait=False))
        await asyncio.shield(self._opening)

    async def run(self, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]], deadline: float) -> T:
        async with self.pool.connection(timeout=max(0.001, deadline - time.monotonic())) as conn:
            return await work(conn)

    def adopt(self, task: asyncio.Future[Any], *, late: bool = False) -> None:
        if isinstance(task, asyncio.Task) and not task.done():
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            task.add_done_callback(_swallow)
            if late:
                self.late.add(task)
                task.add_done_callback(self.late.discard)

    def background(self, work: Coroutine[Any, Any, Any]) -> None:
        self.adopt(asyncio.ensure_future(work))

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), 12)
        await self.pool.close(timeout=1.0)


def _swallow(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: the caller was already told the call failed


class _Runner:
    """An event loop in a daemon thread of its own, for the sync API."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="statecodec-postgres", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], wait: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=wait)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self, store: PostgresReplayStore) -> None:
        async def close() -> None:
            with store._lock:
                lane = store._lanes.pop(self.loop, None)
            if lane is not None:
                await lane.aclose()
            await _finish_tasks()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=20)
        if not self._thread.is_alive():
            self.loop.close()


async def _finish_tasks() -> None:
    """Cancel and await every other task of this loop, as ``asyncio.run`` does at its end.

    The sync API's loop is the store's own, and it is closed next. The pool's close
    waits only a second for its workers, and during an outage where the server does not
    answer (a frozen or unreachable host, not a refused port) a worker may be inside a
    connection attempt for up to libpq's ``connect_timeout``: left pending in a closed
    loop, it is torn down at exit with asyncio's "Task was destroyed but it is pending!".
    Cancelled here, it ends now and its connection attempt with it.
    """
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class _Writes:
    """The inserts of one consume: a fresh nonce for each attempt, and none once it has answered.

    A call that failed closed may leave its work running (asyncio cancellation is only a
    request: Python 3.11's ``wait_for``, in the pool's wait for a connection, can lose it
    when the connection arrives at that very moment, CPython gh-86296). Work that carried
    on would insert a row under a nonce nobody listed, and burn the token of the request
    just told it failed; so the call marks itself over when it answers, and its work
    checks that before each insert. Both run on one event loop, and nothing awaits
    between the check and the send: an insert is either sent before the call answered
    (then it is in ``sent``, and listed), or never.
    """

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.over = False

    def check(self) -> None:
        if self.over:
            raise ReplayStoreError("this call has already failed closed; its late work writes nothing")

    def nonce(self) -> str:
        self.check()
        nonce = secrets.token_hex(16)
        self.sent.append(nonce)
        return nonce
