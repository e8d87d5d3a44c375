"""A replay store in Redis or Valkey: for many processes on many machines.

A consume is one command on one key: ``SET <prefix><key> <nonce> NX GET PX <ms>``.
``NX`` makes it atomic on the server (exactly one of any number of concurrent
consumers creates the key), ``PX`` makes the entry vanish by itself when the token
can no longer be accepted anyway, and ``GET`` returns what was there before. The value
is a nonce unique to the call, so that a retry of a command whose reply was lost (a
timeout after the server executed it) recognises its own write instead of reporting
the token as replayed; this is what makes retries safe.

``aconsume`` sends the commands of concurrent callers in batches (see :class:`_Sender`);
each stays a separate atomic command.

Single-key commands only, so it works unchanged on Redis Cluster: each consume goes to
the one node that owns its key, and no hash tags are needed because no command ever
touches two keys. Pass a ``redis.cluster.RedisCluster`` (and a
``redis.asyncio.RedisCluster``) client to use a cluster.

Needs Redis >= 7.0 or Valkey >= 7.2 (``SET`` with both ``NX`` and ``GET``).

Expiry is relative (``PX``, the retention the codec passes, rounded up to the next
millisecond) and runs on the server's clock from the moment it executes the command, so
the application servers' clocks and the server's may disagree by any amount without
shortening it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import secrets
import threading
from typing import Any, Final, TypeAlias

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from .._errors import ReplayStoreError
from ._url import redact
from .base import ReplayStore, invalid_retention

SyncClient: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"

DEFAULT_PREFIX: Final = "statecodec:replay:"
_SCHEMES: Final = {
    "redis": "redis",
    "rediss": "rediss",
    "valkey": "redis",
    "valkeys": "rediss",
    "unix": "unix",
}


def normalize_url(url: str) -> str:
    """``valkey://`` and ``valkeys://`` are aliases of ``redis://`` and ``rediss://``."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ValueError(
            f"not a Redis URL: {redact(url)!r}; use redis://HOST:PORT/DB, rediss://HOST:PORT/DB (TLS), "
            "valkey://..., valkeys://... or unix:///PATH?db=N"
        )
    return f"{_SCHEMES[scheme.lower()]}://{rest}"


class RedisReplayStore(ReplayStore):
    """Consumed keys as expiring Redis/Valkey keys, shared by every machine using the server.

    :param url_or_client: ``redis://HOST:PORT/DB``, ``rediss://...`` (TLS),
        ``valkey://...``, ``unix:///path/to/socket?db=N``, or a ready ``redis.Redis`` /
        ``redis.cluster.RedisCluster`` client (which the store then does not close).
    :param prefix: prepended to every key, so the store can share a database.
    :param socket_timeout: seconds to wait for a reply before failing closed.
    :param connect_timeout: seconds to wait for a connection.
    :param retries: retries after a connection error or timeout (each safe, see the
        module docstring); keep it small, an unsealing client is waiting.
    :param async_client: a ``redis.asyncio`` client for :meth:`aconsume`. With a URL the
        store creates one per event loop by itself; with only a sync client and no
        async one, :meth:`aconsume` runs the sync call in a worker thread.
    :param options: more keyword arguments for ``redis.Redis.from_url`` (TLS files,
        ``client_name``, ``max_connections``...).
    """

    kind = "redis"

    def __init__(
        self,
        url_or_client: str | SyncClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout: float = 2.0,
        connect_timeout: float = 2.0,
        retries: int = 1,
        async_client: AsyncClient | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(prefix, str):
            raise TypeError("prefix must be a string")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.prefix = prefix
        self._async_given = async_client
        self._senders: dict[asyncio.AbstractEventLoop, _Sender] = {}
        self._lock = threading.Lock()
        self._options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            **options,
        }
        self._retries = retries
        if isinstance(url_or_client, str):
            self._url: str | None = normalize_url(url_or_client)
            self._where = redact(self._url)
            self._client: SyncClient = redis.Redis.from_url(
                self._url, retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries), **self._options
            )
            self._owns_client = True
        else:
            self._url = None
            self._where = repr(url_or_client)
            self._client = url_or_client
            self._owns_client = False

    def __repr__(self) -> str:
        return f"RedisReplayStore({self._where!r}, prefix={self.prefix!r})"

    # ------------------------------------------------------------------ the contract
    def consume(self, key: str, retention: float) -> bool:
        px = _ms(retention)
        nonce = _nonce()
        try:
            previous = self._client.set(self.prefix + key, nonce, nx=True, get=True, px=px)
        except (redis.RedisError, OSError) as exc:
            raise self._error(exc) from None
        return _first(previous, nonce)

    async def aconsume(self, key: str, retention: float) -> bool:
        px = _ms(retention)
        sender = self._async_sender()
        if sender is None:
            return await super().aconsume(key, retention)
        nonce = _nonce()
        try:
            previous = await sender.set_nx_get(self.prefix + key, nonce, px)
        except (redis.RedisError, OSError) as exc:
            raise self._error(exc) from None
        return _first(previous, nonce)

    def close(self) -> None:
        """Close the sync connections the store opened (not a client passed in).

        Async connections need ``await store.aclose()`` from their event loop.
        """
        if self._owns_client:
            self._client.close()

    async def aclose(self) -> None:
        """Close the async client of the running loop, and the sync connections."""
        with self._lock:
            sender = self._senders.pop(asyncio.get_running_loop(), None)
        if sender is not None and self._async_given is None:
            await sender.client.aclose()
        self.close()

    # ------------------------------------------------------------------ internals
    def _async_sender(self) -> _Sender | None:
        # redis.asyncio connections belong to the loop that opened them, so each loop
        # gets its own client (a server normally has one loop; tests have many).
        loop = asyncio.get_running_loop()
        sender = self._senders.get(loop)
        if sender is not None:
            return sender
        client = self._async_given
        if client is None:
            if self._url is None:
                return None
            client = redis.asyncio.Redis.from_url(
                self._url,
                retry=AsyncRetry(ExponentialBackoff(cap=0.2, base=0.02), self._retries),
                **self._options,
            )
        with self._lock:
            for stale in [lp for lp in self._senders if lp.is_closed()]:
                del self._senders[stale]
            return self._senders.setdefault(loop, _Sender(client))

    def _error(self, exc: BaseException) -> ReplayStoreError:
        what = "timed out" if isinstance(exc, redis.TimeoutError | TimeoutError) else "unreachable or failing"
        return ReplayStoreError(f"Redis replay store {self._where} {what}: {type(exc).__name__}: {exc}")


class _Nonces:
    """Unique values for the SET: they tell a call's own earlier write from anyone else's.

    Unique, not secret: 128 random bits per process, then a counter (os.urandom per call
    was a system call on the hot path). A fork() child draws new random bits.
    """

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self._prefix = secrets.token_hex(16)
        self._counter = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter)}"


_nonce = _Nonces()
os.register_at_fork(after_in_child=_nonce.reseed)


def _ms(retention: float) -> int:
    # Rounded up: a key is never kept shorter than asked (and never for 0 ms, which the
    # server would refuse).
    if not 0.0 < retention < math.inf:  # also false for NaN
        raise invalid_retention(retention)
    return math.ceil(retention * 1000)


def _first(previous: object, nonce: str) -> bool:
    # None: the key did not exist and this call created it. Our own nonce: an earlier
    # attempt of this very call created it and only the reply was lost.
    if previous is None:
        return True
    if isinstance(previous, bytes):
        previous = previous.decode("ascii", "replace")
    return previous == nonce


class _Sender:
    """Sends the SETs of concurrent :meth:`aconsume` calls of one event loop together.

    On loopback most of a command's cost is the system calls and wake-ups of one round
    trip, so while one batch is on the wire the calls that arrive queue up and leave as
    the next batch, in one non-transactional pipeline. This changes nothing about
    atomicity: every ``SET NX`` is still a separate atomic command on the server, and
    no command depends on another's result. A failed batch fails each of its calls
    closed. Cluster clients send one command per call (their pipelines re-route).
    """

    _MAX_BATCH: Final = 256

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self._pool = client.connection_pool if isinstance(client, redis.asyncio.Redis) else None
        self._queue: list[tuple[str, str, int, asyncio.Future[object]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def set_nx_get(self, name: str, nonce: str, px: int) -> object:
        if self._pool is None:
            return await self.client.set(name, nonce, nx=True, get=True, px=px)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        self._queue.append((name, nonce, px, future))
        if self._flusher is None:
            # Started, not awaited: the calls that are already runnable queue up first.
            self._flusher = loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self._MAX_BATCH]
                del self._queue[: self._MAX_BATCH]
                await self._send(batch)
        finally:
            self._flusher = None

    async def _send(self, batch: list[tuple[str, str, int, asyncio.Future[object]]]) -> None:
        commands = [("SET", name, nonce, "NX", "GET", "PX", px) for name, nonce, px, _ in batch]
        try:
            replies = await self._pipeline(commands)
        except BaseException as exc:
            for *_, future in batch:
                if not future.done():
                    future.set_exception(_copy(exc))
            if not isinstance(exc, Exception):
                raise  # cancellation or exit: the callers were failed closed above
            return
        for (*_, future), reply in zip(batch, replies, strict=True):
            if future.done():
                continue  # the caller gave up (cancelled); the entry stands: fail closed
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _pipeline(self, commands: list[tuple[str, str, str, str, str, str, int]]) -> list[object]:
        # What redis-py's Pipeline.execute does for a non-transactional pipeline, minus
        # its per-command bookkeeping (response callbacks, metrics), which cost more
        # than the round trip here. The connection, its pool, authentication, TLS,
        # packing, parsing and the retry policy are redis-py's own.
        pool = self._pool
        if pool is None:
            raise RuntimeError("batching needs a redis.asyncio.Redis client")
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            replies: list[object] = await conn.retry.call_with_retry(
                lambda: _roundtrip(conn, commands), lambda _error: conn.disconnect()
            )
        finally:
            await pool.release(conn)
        return replies


async def _roundtrip(
    conn: redis.asyncio.Connection, commands: list[tuple[str, str, str, str, str, str, int]]
) -> list[object]:
    # Retrying a whole batch is safe: each SET carries its caller's nonce, so one that
    # ran before the connection broke now answers with that nonce and counts as first.
    await conn.send_packed_command(conn.pack_commands(commands))
    replies: list[object] = []
    for _ in commands:
        try:
            replies.append(await conn.read_response())
        except redis.ResponseError as exc:  # an error reply; the stream stays in step
            replies.append(exc)
    return replies


def _copy(exc: BaseException) -> BaseException:
    # One exception object per waiting caller: tracebacks are mutated when raised.
    if isinstance(exc, redis.RedisError | OSError):
        return type(exc)(*exc.args)
    return redis.ConnectionError(f"replay batch failed: {type(exc).__name__}: {exc}")
