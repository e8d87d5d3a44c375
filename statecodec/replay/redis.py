"""A replay store in Redis or Valkey: for many processes on many machines.

A consume is one command on one key: ``SET <prefix><key> <nonce> NX GET PX <ms>``.
``NX`` makes it atomic on the server (exactly one of any number of concurrent
consumers creates the key), ``PX`` makes the entry vanish by itself when the token
can no longer be accepted anyway, and ``GET`` returns what was there before. The value
is a nonce unique to the call, so that a retry of a command whose reply was lost (a
timeout after the server executed it) recognises its own write instead of reporting
the token as replayed; this is what makes retries safe.

One URL names the deployment, and redis-py does the rest: ``redis://`` one server,
``redis+cluster://`` a Redis Cluster (redis-py routes each key to the primary owning
its slot and follows the cluster through failovers), ``redis+sentinel://`` the primary
that Sentinel designates (redis-py asks the sentinels again after a failover). Single-key
commands only, so the cluster needs no hash tags and keys spread over every primary.

Replication is asynchronous: a consume acknowledged by a primary that dies before its
replica copied it is lost, and the promoted replica would accept the token once more.
``wait=N`` closes that window: each consume is followed, on the same connection, by
``WAIT N timeout``, and a token is accepted only once N replicas hold its entry; with
fewer the consume fails closed and the entry is taken back (compare-and-delete of this
call's own nonce), so the token stays redeemable once the replicas are back. That
compare-and-delete is a write like any other, and one no WAIT has confirmed: a replica
that copied the ``SET`` but not its deletion (cut off, or promoted, in between) would hold
the entry after a failover, and the token nobody accepted would be "replayed" for good. So
the entry stays listed (see :mod:`._unsettled`) and is deleted again, on whichever server
is primary by then, in the pipeline of the token's next consume, until that pipeline's
``WAIT`` confirms it.

A call that fails closed after its ``SET`` may have run (the connection broke before the
reply, a failover in the middle of ``WAIT``) reported the token as not consumed, so the
store takes that entry back, with the same compare-and-delete, before its next command
(see :mod:`._unsettled`): the client's retry then redeems the token instead of finding it
"replayed". Deleting an entry that only this call wrote is always safe: nobody accepted
the token on the strength of it.

No false replays. With ``wait=N`` an entry exists from its ``SET`` on, while its writer
may still be undecided: its ``WAIT`` running, or fallen short with the take-back on its
way. Another consume that finds it must not say "replayed" (the client would abandon a
flow nobody redeemed) and must not accept it either. So a ``wait=N`` consume writes its
nonce and its retention (``<nonce>/<ms>``), and whoever finds such an entry of someone
else asks its ``PTTL`` (one more round trip, on this rare path only): retention minus
time left is the entry's age on the server's clock, one clock for every writer and
reader. Younger than the settle window (``wait_timeout + socket_timeout x (retries +
1)``: the writer's WAIT has answered, its retries are over and its take-back sent), the
consume fails closed (``store_unavailable``, retry); older, it is settled: a replay. The
entry itself is never touched, so no second consume is accepted meanwhile, and a writer
that died undecided blocks the token for one window at most, then its entry reads
"replayed" (it may have accepted: the safe side). Keys this store object accepted are
settled at once (:class:`._settle._Recent`). With ``wait=0`` a consume is decided when
the server runs its ``SET``: the value is the bare nonce, and nothing changes.

``aconsume`` sends the commands of concurrent callers in batches (see :class:`_Sender`);
each stays a separate atomic command.

Needs Redis >= 7.0 or Valkey >= 7.2 (``SET`` with both ``NX`` and ``GET``).

Expiry is relative (``PX``, the retention the codec passes, rounded up to the next
millisecond) and runs on the server's clock from the moment it executes the command, so
the application servers' clocks and the server's may disagree by any amount without
shortening it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import math
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Generic, NamedTuple, TypeAlias, TypeVar

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.asyncio.sentinel
import redis.cluster
import redis.connection
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

from .._errors import ReplayStoreError
from ._redis_url import REDIS_STORE_OPTIONS, RedisTarget, parse_redis_url
from ._settle import _Recent
from ._unsettled import Entry, Unsettled
from ._url_text import option_defaults, scrub
from .base import ReplayStore, invalid_retention, store_settings

SyncClient: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"

_DEFAULTS: Final = option_defaults(REDIS_STORE_OPTIONS)
DEFAULT_PREFIX: Final[str] = _DEFAULTS["prefix"]
#: Deletes the key only if it still holds this call's nonce: taking back an entry whose
#: replication WAIT could not confirm never deletes anyone else's.
RELEASE_SCRIPT: Final = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
#: Replies that mean "this node does not (or no longer does) own the slot": nothing ran.
_ROUTING_ERRORS: Final = (MovedError, AskError, TryAgainError, ClusterDownError, SlotNotCoveredError)
_TRANSPORT_ERRORS: Final = (redis.ConnectionError, redis.TimeoutError, OSError)
#: A slot map that cannot be reloaded: the whole cluster is unreachable.
_REFRESH_ERRORS: Final = (RedisClusterException, *_TRANSPORT_ERRORS, redis.RedisError)
_CLUSTER_HINT: Final = (
    "this is a Redis Cluster node: use redis+cluster://HOST:PORT[,HOST:PORT...] so that each key goes to "
    "the node that owns its slot"
)


class RedisReplayStore(ReplayStore):
    """Consumed keys as expiring Redis/Valkey keys, shared by every machine using the server.

    :param url_or_client: a URL (``redis://HOST:PORT/DB``, ``rediss://...`` for TLS,
        ``unix:///path/to/socket?db=N``, ``redis+cluster://HOST:PORT[,HOST:PORT...]``,
        ``redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``; ``valkey`` spells
        ``redis``), or a ready ``redis.Redis`` / ``redis.cluster.RedisCluster`` client
        (which the store then does not close). Options in the URL's query are defaults
        for the keyword arguments below; the others are redis-py's.
    :param prefix: prepended to every key, so the store can share a database
        (default ``statecodec:replay:``).
    :param socket_timeout: seconds to wait for a reply before failing closed (default 2).
    :param connect_timeout: seconds to wait for a connection (default 2).
    :param retries: retries after a connection error, a timeout or a cluster
        redirection (each safe, see the module docstring); keep it small, an unsealing
        client is waiting (default 1).
    :param wait: replicas that must acknowledge each consume before the token is
        accepted (``WAIT``); 0 (the default) trusts the primary's acknowledgement alone.
    :param wait_timeout: seconds ``WAIT`` may take (default 1; less than
        ``socket_timeout``).
    :param async_client: a ``redis.asyncio`` client for :meth:`aconsume`. With a URL the
        store creates one per event loop by itself; with only a sync client and no
        async one, :meth:`aconsume` runs the sync call in a worker thread.
    :param options: more keyword arguments for redis-py's clients (TLS files,
        ``client_name``, ``max_connections``...).
    """

    kind = "redis"

    def __init__(
        self,
        url_or_client: str | SyncClient,
        *,
        prefix: str | None = None,
        socket_timeout: float | None = None,
        connect_timeout: float | None = None,
        retries: int | None = None,
        wait: int | None = None,
        wait_timeout: float | None = None,
        async_client: AsyncClient | None = None,
        **options: Any,
    ) -> None:
        target = parse_redis_url(url_or_client) if isinstance(url_or_client, str) else None
        given = {
            "prefix": prefix,
            "socket_timeout": socket_timeout,
            "connect_timeout": connect_timeout,
            "retries": retries,
            "wait": wait,
            "wait_timeout": wait_timeout,
        }
        settings = store_settings(_DEFAULTS, target.options if target else {}, given)
        self.prefix: str = settings["prefix"]
        self.wait: int = settings["wait"]
        self.wait_timeout: float = settings["wait_timeout"]
        self._retries: int = settings["retries"]
        _check_settings(self.prefix, self._retries, self.wait, self.wait_timeout, settings["socket_timeout"])
        self._async_given = async_client
        self._unsettled = Unsettled()
        self._decide = _Decision(self.wait, self.wait_timeout)
        #: With wait=N: how long after its SET (on the server's clock) an entry may still be
        #: undecided (its WAIT, the retries of its pipeline, its take-back); see _Recent.
        self._settle_ms = math.ceil(
            (self.wait_timeout + settings["socket_timeout"] * (self._retries + 1)) * 1000
        )
        self._accepted = _Recent(self._settle_ms / 1000)
        #: A cluster call's retries stop at the settle window (see _Rounds).
        self._round_budget = {"budget": self._settle_ms / 1000, "round_time": settings["socket_timeout"]}
        self._senders: dict[asyncio.AbstractEventLoop, _Sender] = {}
        self._lock = threading.Lock()
        self._target = target
        self._is_cluster = (
            target.topology == "cluster" if target else isinstance(url_or_client, redis.cluster.RedisCluster)
        )
        if target is not None:
            self._where = target.where
            self._clients: _Clients | None = _Clients(
                target,
                {
                    "socket_timeout": settings["socket_timeout"],
                    "socket_connect_timeout": settings["connect_timeout"],
                    **options,
                },
                self._retries,
                sentinel_auth={
                    name.removeprefix("sentinel_"): settings[name]
                    for name in ("sentinel_username", "sentinel_password")
                    if name in settings
                },
            )
            self._client: SyncClient | None = None
            self._owns_client = True
        else:
            self._where = repr(url_or_client)
            self._clients = None
            self._client = url_or_client  # type: ignore[assignment] # a str always has a target
            self._owns_client = False

    def __repr__(self) -> str:
        return f"RedisReplayStore({self._where!r}, prefix={self.prefix!r})"

    # ------------------------------------------------------------------ the contract
    def consume(self, key: str, retention: float) -> bool:
        write = self._write(key, retention)
        try:
            previous = self._consume_once(self._sync_client(), write)
        except Exception as exc:  # deny on error, with the reason and no secret
            self._note_failure(write, exc)
            raise self._error(exc) from None
        verdict = self._verdict(write, previous)
        if verdict is None:  # the rare path: one more round trip
            self._judge_undecided(previous, self._time_left(write.name))
            return False
        return verdict

    def _time_left(self, name: str) -> int | None:
        """The entry's PTTL, or None when the server refuses it (an ACL without +pttl: judged as settled)."""
        try:
            left: int = self._sync_client().pttl(name)
        except redis.ResponseError:
            return None
        except Exception as exc:
            raise self._error(exc) from None
        return left

    async def aconsume(self, key: str, retention: float) -> bool:
        write = self._write(key, retention)
        try:
            sender = self._async_sender()
        except Exception as exc:
            raise self._error(exc) from None
        if sender is None:
            return await super().aconsume(key, retention)
        try:
            previous = await sender.consume(write)
        except asyncio.CancelledError as exc:
            # The SET may be on the wire: its entry, if any, is taken back later, so the
            # token a caller gave up on is not burnt.
            self._note_failure(write, exc)
            sender._take_back_later()
            raise
        except Exception as exc:
            self._note_failure(write, exc)
            sender._take_back_later()
            raise self._error(exc) from None
        verdict = self._verdict(write, previous)
        if verdict is None:  # the rare path: one more round trip
            self._judge_undecided(previous, await self._atime_left(sender, write.name))
            return False
        return verdict

    async def _atime_left(self, sender: _Sender, name: str) -> int | None:
        """Async :meth:`_time_left`."""
        try:
            left: int = await sender.client.pttl(name)
        except redis.ResponseError:
            return None
        except Exception as exc:
            raise self._error(exc) from None
        return left

    # -- what a reply means (one place for the sync and async APIs)
    def _write(self, key: str, retention: float) -> _Write:
        """A consume's SET: the key, and as the value its nonce, with wait=N also its retention.

        The retention lets anyone who finds the entry tell its age on the server's clock
        (``px - PTTL``): see :meth:`_judge_undecided`.
        """
        px = _ms(retention)
        return _Write(self.prefix + key, f"{_nonce()}{_PENDING}{px}" if self.wait else _nonce(), px)

    def _verdict(self, write: _Write, previous: object) -> bool | None:
        """What a SET's standing reply means: accepted, a replay, or None: someone else's entry
        that may be undecided (its age decides, :meth:`_judge_undecided`).

        None as the previous value: this call created the entry. Its own nonce: an earlier
        attempt of this very call created it and only the reply was lost.
        """
        if previous is None or _is_own(previous, write.nonce):
            if self.wait:
                self._accepted.add(write.name, write.px / 1000)
            return True
        return None if self._undecided(write.name, previous) else False

    def _note_failure(self, write: _Write, exc: BaseException) -> None:
        """List the entry a failed consume may have left, to take it back later (see _unsettled)."""
        if _may_have_written(exc):
            self._unsettled.note(write.name, write.nonce, write.px / 1000)

    def _undecided(self, name: str, previous: object) -> bool:
        """Whether someone else's entry may still be undecided: written with wait=N, not accepted here."""
        return _written_px(previous) is not None and name not in self._accepted

    def _judge_undecided(self, previous: object, left: object) -> None:
        """Return if the entry is settled (a replay); raise if its writer may not have decided yet.

        ``left`` is the entry's PTTL. Its writer's SET ran ``px - left`` ms ago on the server's
        clock; younger than the settle window, its WAIT may still be running, or may have
        fallen short with the take-back on its way: nobody may have accepted the token, so
        this is no replay yet, and the caller fails closed (``store_unavailable``) like in an
        outage. Never the other way round: the entry stays, so no second consume is accepted.
        """
        px = _written_px(previous)
        if px is None or not isinstance(left, int) or left == -1:
            return  # no retention, no TTL, or its PTTL refused: judged settled, as before
        if left == -2:  # gone meanwhile: taken back, so the token is free again
            raise self._error(ReplayStoreError("the entry was taken back meanwhile; retry"))
        age = px - left
        if age < self._settle_ms:
            raise self._error(
                ReplayStoreError(
                    f"an earlier redemption of this token is not settled yet (written {max(age, 0)} ms ago, "
                    f"its replicas' confirmation may still be pending): retry"
                )
            )

    def is_consumed(self, key: str) -> bool:
        """Whether ``key`` holds a settled entry: a GET (and a PTTL if undecided), nothing written."""
        name = self.prefix + key
        try:
            value = self._sync_client().get(name)
        except Exception as exc:
            raise self._error(exc) from None
        left = self._time_left(name) if self._undecided(name, value) else None
        return self._settled(name, value, left)

    async def ais_consumed(self, key: str) -> bool:
        try:
            sender = self._async_sender()
        except Exception as exc:
            raise self._error(exc) from None
        if sender is None:
            return await super().ais_consumed(key)
        name = self.prefix + key
        try:
            value = await sender.client.get(name)
        except Exception as exc:
            raise self._error(exc) from None
        left = await self._atime_left(sender, name) if self._undecided(name, value) else None
        return self._settled(name, value, left)

    def _settled(self, name: str, value: object, left: object) -> bool:
        if value is None:
            return False
        self._judge_undecided(value, left)
        if self._unsettled.holds(name, _text(value)):
            raise self._error(ReplayStoreError("its entry is a failed-closed call's, not taken back yet"))
        return True

    def check(self) -> None:
        """Connect now and make sure the store can serve; raise :class:`ReplayStoreError` if not.

        A PING through the client the URL describes (for a cluster: after loading its
        slot map, which must cover every slot; for Sentinel: on the primary it names),
        the first-use check that a plain URL does not point at a cluster node, and with
        ``wait=N`` that every primary has N replicas connected.
        """
        try:
            client = self._sync_client()
            client.ping()
            if self.wait:
                self._check_replicas(client)
        except Exception as exc:
            raise self._error(exc) from None

    def close(self) -> None:
        """Close the sync connections the store opened (not a client passed in).

        Async connections need ``await store.aclose()`` from their event loop.
        """
        with self._lock:
            client, self._client = self._client, (None if self._owns_client else self._client)
        if self._owns_client and client is not None:
            client.close()
        if self._clients is not None:
            self._clients.close_sync()

    async def aclose(self) -> None:
        """Close the async client of the running loop, and the sync connections."""
        with self._lock:
            sender = self._senders.pop(asyncio.get_running_loop(), None)
        if sender is not None and self._async_given is None:
            await sender.aclose()
        self.close()

    # ------------------------------------------------------------------ sync internals
    def _sync_client(self) -> SyncClient:
        client, clients = self._client, self._clients
        if client is not None:
            return client
        if clients is None:  # a client passed in is never dropped
            raise RuntimeError("the store has no client")
        with self._lock:
            if self._client is None:
                built = clients.sync()
                try:
                    if clients.target.topology == "server":
                        _judge_hello(_sync_hello(built))
                except BaseException:
                    built.close()
                    raise
                self._client = built
            return self._client

    def _consume_once(self, client: SyncClient, write: _Write) -> object:
        """The SET's standing reply, after the take-backs listed for its key; with wait=N, WAITed.

        One connection of the key's primary carries all of it, so the WAIT vouches for the
        take-backs as for the SET. With nothing listed and no wait: the SET alone, through
        the client's own routing and retries.
        """
        cluster = isinstance(client, redis.cluster.RedisCluster)
        # On a cluster only this token's own entries: they share its slot, so its node.
        entries = self._unsettled.pending([write.name], spare=0 if cluster else Unsettled.SPARE)
        if not entries and not self.wait:
            args, options = _set_command(write)
            execute: Any = client.execute_command  # untyped in redis-py
            return execute(*args, **options)
        if isinstance(client, redis.cluster.RedisCluster):
            server, reading = self._on_owner(client, write, entries)
        else:
            server = client
            replies = _sync_pipeline(client, self._decide.commands([write], entries))
            reading = self._decide.read([write], entries, replies)
        self._unsettled.settle((e.key, e.nonce) for e in reading.settled)
        ((_, answer),) = reading.answers
        if isinstance(answer, _TakeBack):
            try:
                verdicts = _Decision.released(_sync_pipeline(server, _Decision.releases([write])))
            except Exception as exc:
                verdicts = [exc]
            raise self._decide.not_replicated(reading, answer, verdicts[0])
        if isinstance(answer, Exception):
            raise answer  # nothing was written: an error reply to the SET itself
        return answer

    def _on_owner(
        self, cluster: redis.cluster.RedisCluster, write: _Write, entries: list[Entry]
    ) -> tuple[redis.Redis, _Reading[_Write]]:
        """The cluster's rounds (:class:`_Rounds`) for one key: its node's connection and reading."""
        rounds = _Rounds(cluster, [write], entries, self._retries, **self._round_budget)
        while True:
            for node, writes, group_entries in rounds.groups():
                server: Any = cluster.get_redis_connection(node)
                try:
                    replies = _sync_pipeline(server, self._decide.commands(writes, group_entries))
                except Exception as exc:
                    rounds.lost(writes, group_entries, exc)
                    continue
                reading = self._decide.read(writes, group_entries, replies, routed=True)
                rounds.redirected(reading)
                if reading.answers:
                    return server, reading
            try:
                cluster.nodes_manager.initialize()
                reachable = True
            except _REFRESH_ERRORS:
                reachable = False  # the whole cluster is unreachable: this call fails closed
            if not rounds.again(reachable):
                raise rounds.failure()

    def _check_replicas(self, client: SyncClient) -> None:
        # WAIT on a connection that wrote nothing returns at once with the number of
        # replicas connected: a cheap question that needs no permission beyond WAIT.
        cluster: Any = client
        if isinstance(client, redis.cluster.RedisCluster):
            nodes = [(node.name, cluster.get_redis_connection(node)) for node in cluster.get_primaries()]
        else:
            nodes = [("the primary", cluster)]
        ((wait, _),) = self._decide.wait_command()
        for label, node in nodes:
            connected = node.execute_command(*wait)
            if isinstance(connected, int) and connected < self.wait:
                raise ReplayStoreError(
                    f"wait={self.wait} but {label} has {connected} replica(s) connected: every consume "
                    "would fail closed"
                )

    # ------------------------------------------------------------------ async internals
    def _async_sender(self) -> _Sender | None:
        # redis.asyncio connections belong to the loop that opened them, so each loop
        # gets its own client (a server normally has one loop; tests have many).
        loop = asyncio.get_running_loop()
        sender = self._senders.get(loop)
        if sender is not None:
            return sender
        client = self._async_given
        closers: list[Callable[[], Awaitable[object]]] = []
        if client is None:
            if self._clients is None:
                return None
            client, closers = self._clients.async_()
        verify = (
            self._clients is not None
            and self._async_given is None
            and self._clients.target.topology == "server"
        )
        with self._lock:
            for stale in [lp for lp in self._senders if lp.is_closed()]:
                del self._senders[stale]
            return self._senders.setdefault(loop, _Sender(self, client, closers, verify=verify))

    # ------------------------------------------------------------------ errors
    def _error(self, exc: BaseException) -> ReplayStoreError:
        if isinstance(exc, ReplayStoreError | _NotReplicated):
            message = f"Redis replay store {self._where}: {exc}"
        elif not self._is_cluster and (isinstance(exc, MovedError | AskError) or "cluster mode" in str(exc)):
            cause = f"{type(exc).__name__}: {exc}"
            message = f"Redis replay store {self._where}: {_CLUSTER_HINT} ({cause})"
        else:
            what = (
                "timed out"
                if isinstance(exc, redis.TimeoutError | TimeoutError)
                else "unreachable or failing"
            )
            message = f"Redis replay store {self._where} {what}: {type(exc).__name__}: {exc}"
        return ReplayStoreError(scrub(message, self._target.secrets) if self._target else message)


# ---------------------------------------------------------------------------- clients
class _Clients:
    """The redis-py clients a URL describes, built by redis-py from the user's URL."""

    def __init__(
        self, target: RedisTarget, connection: dict[str, Any], retries: int, sentinel_auth: dict[str, str]
    ) -> None:
        self.target = target
        self._connection = connection
        self._retries = retries
        self._sentinel_auth = sentinel_auth
        self._sync_sentinel: Any = None
        _check_redis_py_options(target, connection)

    def sync(self) -> SyncClient:
        target, retry = self.target, Retry(_backoff(), self._retries)
        if target.topology == "server":
            return redis.Redis.from_url(target.url, retry=retry, **self._connection)
        if target.topology == "cluster":
            node: Any = redis.cluster.ClusterNode  # untyped in redis-py
            return redis.cluster.RedisCluster.from_url(
                target.url,
                startup_nodes=[node(host, port) for host, port in target.seeds[1:]],
                retry=retry,
                **self._connection,
            )
        sentinel: Any = redis.sentinel.Sentinel  # untyped in redis-py
        options, sentinel_options = self._sentinel_options(
            redis.connection.parse_url, redis.connection.SSLConnection
        )
        self._sync_sentinel = sentinel(list(target.seeds), sentinel_kwargs=sentinel_options)
        client: redis.Redis = self._sync_sentinel.master_for(target.service, retry=retry, **options)
        return client

    def async_(self) -> tuple[AsyncClient, list[Callable[[], Awaitable[object]]]]:
        target, retry = self.target, AsyncRetry(_backoff(), self._retries)
        if target.topology == "server":
            return redis.asyncio.Redis.from_url(target.url, retry=retry, **self._connection), []
        if target.topology == "cluster":
            node = redis.asyncio.cluster.ClusterNode
            cluster = redis.asyncio.cluster.RedisCluster.from_url(
                target.url,
                startup_nodes=[node(host, port) for host, port in target.seeds[1:]],
                retry=retry,
                **self._connection,
            )
            return cluster, []
        sentinel: Any = redis.asyncio.sentinel.Sentinel  # untyped in redis-py
        options, sentinel_options = self._sentinel_options(
            redis.asyncio.connection.parse_url, redis.asyncio.connection.SSLConnection
        )
        manager = sentinel(list(target.seeds), sentinel_kwargs=sentinel_options)
        client: redis.asyncio.Redis = manager.master_for(target.service, retry=retry, **options)
        return client, [server.aclose for server in manager.sentinels]

    def close_sync(self) -> None:
        sentinel, self._sync_sentinel = self._sync_sentinel, None
        if sentinel is not None:
            for server in sentinel.sentinels:
                server.close()

    def _sentinel_options(
        self, parse_url: Callable[[str], Any], ssl_class: type
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """redis-py's reading of the URL for the primary, and the sentinels' share of it.

        The sentinels get the socket and TLS options (a rediss+sentinel URL means TLS to
        the sentinels too) and the sentinel_username/sentinel_password, never the
        primary's credentials.
        """
        options: dict[str, Any] = {**self._connection, **parse_url(self.target.url)}
        options.pop("host", None)  # the first sentinel's address, not the primary's
        options.pop("port", None)
        ssl = options.pop("connection_class", None) is ssl_class
        sentinel_options = {
            name: value for name, value in options.items() if name.startswith(("socket_", "ssl_"))
        }
        sentinel_options.update(self._sentinel_auth)
        if ssl:
            sentinel_options["ssl"] = options["ssl"] = True
        return options, sentinel_options


def _check_redis_py_options(target: RedisTarget, connection: Mapping[str, Any]) -> None:
    """Refuse an option redis-py would ignore silently or reject only when connecting.

    redis-py hands unknown URL options to its connection class, which fails at the first
    connection (or, in a cluster, drops them): a typo such as ``wiat=1`` would run without
    the guarantee it asked for. The accepted names are read from redis-py itself.
    """
    parse_url: Any = redis.connection.parse_url  # untyped in redis-py
    parsed = parse_url(target.url)  # also redis-py's checks of the values
    given = (parsed.keys() - {"host", "port", "path", "username", "password", "db", "connection_class"}) | (
        connection.keys() - {"socket_timeout", "socket_connect_timeout"}
    )
    base = target.url.partition(":")[0]
    known = _cluster_options() if target.topology == "cluster" else _connection_options(base)
    unknown = sorted(given - known)
    if unknown:
        client = "redis-py's cluster clients" if target.topology == "cluster" else "redis-py's connections"
        raise ValueError(
            f"unknown option {unknown[0]!r}: not one of statecodec's (prefix, wait, wait_timeout, "
            f"socket_timeout, connect_timeout, retries, sentinel_username, sentinel_password) and not "
            f"accepted by {client}"
        )
    if target.topology == "cluster":
        # The sync client would only say at its first connection that a cluster has no
        # database but 0 and no Unix socket; the async one says it when built (no I/O).
        try:
            redis.asyncio.cluster.RedisCluster.from_url(target.url, **connection)
        except (redis.RedisError, RedisClusterException) as exc:
            raise ValueError(str(exc)) from None


def _parameters(*functions: Callable[..., object]) -> set[str]:
    names: set[str] = set()
    for function in functions:
        names |= {
            p.name
            for p in inspect.signature(function).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        }
    return names


# A declared private seam (docs/architecture.md): no public redis-py API lists the options a
# connection or a cluster client accepts, and both pass unknown ones on or drop them. These
# undocumented tables are read here only; a release without them fails here, naming the fix
# (tests/test_seams.py forces it), and pyproject caps redis at the versions tested.
def _redis_py_table(module: object, name: str) -> Any:
    table = getattr(module, name, None)
    if table is None:
        raise ImportError(
            f"this redis-py ({redis.__version__}) has no {getattr(module, '__name__', module)}.{name}, which "
            "statecodec reads to refuse unknown URL options: install a tested redis-py (pip install "
            "'statecodec[redis]') or a statecodec release that supports it",
            name="redis",
        )
    return table


def _connection_options(scheme: str) -> set[str]:
    cls = {
        "rediss": redis.connection.SSLConnection,
        "unix": redis.connection.UnixDomainSocketConnection,
    }.get(scheme, redis.connection.Connection)
    inits = [vars(klass)["__init__"] for klass in cls.__mro__ if "__init__" in vars(klass)]
    return _parameters(*inits, redis.connection.ConnectionPool.__init__) | set(
        _redis_py_table(redis.connection, "URL_QUERY_ARGUMENT_PARSERS")
    )


def _cluster_options() -> set[str]:
    # The sync client keeps only REDIS_ALLOWED_KEYS; the async one takes only its parameters.
    allowed = _redis_py_table(redis.cluster, "REDIS_ALLOWED_KEYS")
    return set(allowed) & _parameters(redis.asyncio.cluster.RedisCluster.__init__)


def _check_settings(
    prefix: object, retries: object, wait: object, wait_timeout: float, socket_timeout: float
) -> None:
    if not isinstance(prefix, str):
        raise TypeError("prefix must be a string")
    for name, value in (("retries", retries), ("wait", wait)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0")
    if not 0 < wait_timeout < math.inf:
        raise ValueError("wait_timeout must be a positive number of seconds")
    if wait and wait_timeout >= socket_timeout:
        raise ValueError(
            f"wait_timeout ({wait_timeout:g} s) must be shorter than socket_timeout ({socket_timeout:g} s), "
            "or every WAIT that runs out would look like a dead server"
        )


def _backoff() -> ExponentialBackoff:
    return ExponentialBackoff(cap=0.2, base=0.02)


# ---------------------------------------------------------------------------- topology checks
def _judge_hello(hello: object) -> None:
    """A plain URL must name a plain server: say so at first use, not after the first MOVED.

    An error reply to HELLO (a server before Redis 6, an ACL without +hello) says nothing.
    """
    if isinstance(hello, redis.ResponseError):
        return
    mode = _field(hello, "mode")
    if mode == "cluster":
        raise ReplayStoreError(_CLUSTER_HINT)
    if mode == "sentinel":
        raise ReplayStoreError(
            "this is a Sentinel, not a data server: use redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE"
        )


def _field(reply: object, name: str) -> str | None:
    if isinstance(reply, list):  # RESP2 without redis-py's callback: a flat list
        reply = dict(zip(reply[::2], reply[1::2], strict=False))
    if not isinstance(reply, dict):
        return None
    for key, value in reply.items():
        if _text(key) == name:
            return _text(value)
    return None


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------------------- commands
#: A command's arguments, and the options redis-py's pipeline parses its reply with.
_Command: TypeAlias = tuple[tuple[Any, ...], dict[str, Any]]


def _sync_hello(client: SyncClient) -> object:
    execute: Any = client.execute_command  # untyped in redis-py
    try:
        return execute("HELLO")
    except redis.ResponseError as exc:
        return exc


def _set_command(write: _Write) -> _Command:
    # get=True: redis-py's reply callback then returns the previous value, not a bool.
    return ("SET", write.name, write.nonce, "NX", "GET", "PX", write.px), {"get": True}


def _release_command(name: str, nonce: str) -> _Command:
    return ("EVAL", RELEASE_SCRIPT, 1, name, nonce), {}


def _sync_pipeline(server: redis.Redis, commands: Sequence[_Command]) -> list[object]:
    """Commands on one connection of ``server``: a non-transactional redis-py pipeline."""
    pipe: Any = server.pipeline(transaction=False)
    for args, options in commands:
        pipe.execute_command(*args, **options)
    replies: list[object] = pipe.execute(raise_on_error=False)
    return replies


# ---------------------------------------------------------------------------- the consume decision
class _Write:
    """One consume's SET: the key, this call's value (its nonce), the retention in ms."""

    __slots__ = ("name", "nonce", "px")

    def __init__(self, name: str, nonce: str, px: int) -> None:
        self.name, self.nonce, self.px = name, nonce, px


W = TypeVar("W", bound=_Write)


class _TakeBack(NamedTuple):
    """A SET whose entry WAIT did not confirm: delete it now (:meth:`_Decision.releases`), fail closed."""

    #: The SET found this call's own earlier entry (a resent pipeline): this connection's
    #: WAIT says nothing about that write.
    retried: bool


class _Reading(Generic[W]):
    """What one pipeline's replies mean (:meth:`_Decision.read`)."""

    __slots__ = ("acks", "answers", "moved", "moved_entries", "redirection", "settled")

    def __init__(self, acks: object) -> None:
        self.acks = acks  # WAIT's reply (wait=N), else None
        #: Per SET that ran here: its standing reply (the previous value), an error reply, or a _TakeBack.
        self.answers: list[tuple[W, object]] = []
        self.settled: list[Entry] = []  # take-backs done for good: forget them
        self.moved: list[W] = []  # SETs and take-backs this node no longer owns (a cluster's)
        self.moved_entries: list[Entry] = []
        self.redirection: Exception | None = None


class _Decision:
    """What a consume sends and what the replies mean: one place for the sync and async callers.

    A pipeline to one server: the take-backs listed for its keys (compare-and-delete of a
    failed call's nonce), then each call's ``SET NX GET PX`` with its nonce, then with
    wait=N one ``WAIT``, which counts the replicas that acknowledged *this connection's*
    writes and so vouches for every write before it. The callers only send (a pipeline,
    or the SET alone through the client when nothing else goes with it) and answer.
    """

    def __init__(self, wait: int, wait_timeout: float) -> None:
        self.wait, self.timeout = wait, wait_timeout
        self._wait_ms = max(1, math.ceil(wait_timeout * 1000))

    def wait_command(self) -> list[_Command]:
        return [(("WAIT", self.wait, self._wait_ms), {})] if self.wait else []

    def commands(self, writes: Sequence[_Write], entries: Sequence[Entry]) -> list[_Command]:
        commands = [_release_command(e.key, e.nonce) for e in entries]
        commands += [_set_command(w) for w in writes]
        return commands + self.wait_command()

    def read(
        self,
        writes: Sequence[W],
        entries: Sequence[Entry],
        replies: Sequence[object],
        *,
        routed: bool = False,
    ) -> _Reading[W]:
        """The replies of :meth:`commands`; ``routed``: a cluster node's, whose redirections are resent."""
        acks = replies[-1] if self.wait else None
        reading: _Reading[W] = _Reading(acks)
        confirmed = not self.wait or (isinstance(acks, int) and acks >= self.wait)
        for entry, reply in zip(entries, replies, strict=False):
            if routed and isinstance(reply, _ROUTING_ERRORS):
                reading.moved_entries.append(entry)  # to the slot's new owner
            elif _forgettable(reply if isinstance(reply, Exception) else confirmed):
                reading.settled.append(entry)
        for write, reply in zip(writes, replies[len(entries) :], strict=False):
            if routed and isinstance(reply, _ROUTING_ERRORS):
                reading.moved.append(write)
                reading.redirection = reply
            elif (
                isinstance(reply, Exception)
                or not self.wait
                or _accepted_without_release(reply, write.nonce, acks, self.wait)
            ):
                reading.answers.append((write, reply))  # it stands (or it failed: nothing written)
            else:
                reading.answers.append((write, _TakeBack(retried=reply is not None)))
        return reading

    @staticmethod
    def releases(writes: Iterable[_Write]) -> list[_Command]:
        """The take-backs of unconfirmed SETs, sent at once on the same node (no WAIT)."""
        return [_release_command(w.name, w.nonce) for w in writes]

    @staticmethod
    def released(replies: Iterable[object]) -> list[object]:
        """The verdicts on :meth:`releases` (see :func:`_sent_without_wait`)."""
        return [_sent_without_wait(reply) for reply in replies]

    def not_replicated(self, reading: _Reading[W], answer: _TakeBack, verdict: object) -> _NotReplicated:
        return _NotReplicated(reading.acks, self.wait, self.timeout, verdict, retried=answer.retried)


class _Rounds(Generic[W]):
    """A cluster's retry, one for the sync and async callers: which node gets what, and resends.

    Each round sends the pending SETs and take-backs to the primaries redis-py's slot map
    names, each node's in one pipeline with its own WAIT (WAIT counts one connection's
    writes, which redis-py's cluster pipelines do not promise once they follow a
    redirection). So nothing is followed: a redirection or a dead node refreshes the slot
    map and the next round sends those again (safe: each SET carries its caller's nonce).
    At most ``retries`` more rounds, and only while one more fits in the call's ``budget``
    (a round may take ``round_time``, the socket timeout): the settle window other
    instances grant an undecided entry assumes its writer has failed closed by then. The
    SETs still pending then fail closed.
    """

    def __init__(
        self,
        cluster: Any,
        writes: Iterable[W],
        entries: Iterable[Entry],
        retries: int,
        *,
        budget: float,
        round_time: float,
    ) -> None:
        self._cluster = cluster
        self.writes, self._entries = list(writes), list(entries)
        self._left = retries
        self._failure: BaseException | None = None
        self._deadline = time.monotonic() + budget - round_time  # the last moment a round may start

    def groups(self) -> list[tuple[Any, list[W], list[Entry]]]:
        """This round's pipelines: the pending SETs and take-backs by the primary of their slot."""
        writes, entries = self.writes, self._entries
        self.writes, self._entries = [], []
        groups: dict[str, tuple[Any, list[W], list[Entry]]] = {}
        try:
            for write in writes:
                self._group(groups, write.name)[1].append(write)
            for entry in entries:
                self._group(groups, entry.key)[2].append(entry)
        except _ROUTING_ERRORS as exc:  # a slot without an owner: refresh, then try again
            self.writes, self._entries, self._failure = writes, entries, exc
            return []
        return list(groups.values())

    def _group(
        self, groups: dict[str, tuple[Any, list[W], list[Entry]]], name: str
    ) -> tuple[Any, list[W], list[Entry]]:
        node: Any = self._cluster.get_node_from_key(name)  # raises if the slot has no owner
        return groups.setdefault(node.name, (node, [], []))

    def lost(self, writes: list[W], entries: list[Entry], exc: BaseException) -> None:
        """A pipeline that failed as a whole: a dead node is tried again after the refresh."""
        if not isinstance(exc, (*_TRANSPORT_ERRORS, *_ROUTING_ERRORS)):
            raise exc
        self.writes += writes
        self._entries += entries
        self._failure = exc

    def redirected(self, reading: _Reading[W]) -> None:
        self.writes += reading.moved
        self._entries += reading.moved_entries
        self._failure = reading.redirection or self._failure

    @property
    def done(self) -> bool:
        return not self.writes and not self._entries

    def may_retry(self) -> bool:
        """Whether another round may follow: SETs pending, a retry left, and time for it."""
        return bool(self.writes) and self._left > 0 and time.monotonic() <= self._deadline

    def again(self, reachable: bool) -> bool:
        """After the slot map's refresh: another round? (Take-backs alone wait for the next consume.)"""
        if not reachable or not self.may_retry():
            return False
        self._left -= 1
        return True

    def failure(self) -> BaseException:
        return self._failure or redis.ConnectionError("the cluster did not route the keys")


class _NotReplicated(Exception):  # noqa: N818 - a verdict, turned into ReplayStoreError
    """WAIT saw fewer replicas than asked for: the token is not accepted."""

    def __init__(
        self, acks: object, wanted: int, timeout: float, taken_back: object, *, retried: bool = False
    ) -> None:
        #: The take-back's verdict (:func:`_sent_without_wait`): False (not confirmed yet) or its error.
        self.taken_back = taken_back
        count = acks if isinstance(acks, int) else 0
        if not isinstance(taken_back, Exception):
            after = (
                "its entry was deleted on the primary (and is deleted again before the token's next "
                "consume until replicas confirm it), so a retry can redeem it"
            )
        elif _forgettable(taken_back):
            after = f"taking its entry back was refused ({_reason(taken_back)}), so it stays until it expires"
        else:
            after = (
                f"taking its entry back failed ({_reason(taken_back)}): the store tries again before the "
                "token's next consume"
            )
        if retried:
            # Our own earlier write (its reply was lost): this connection's WAIT says nothing about it.
            why = "a resent consume found its own earlier entry, which this connection's WAIT can't vouch for"
        else:
            detail = "" if isinstance(acks, int) else f" (WAIT failed: {type(acks).__name__}: {acks})"
            why = f"only {count} of {wanted} replica(s) acknowledged the consume within {timeout:g} s{detail}"
        super().__init__(f"{why}; the token was not accepted and {after}")


def _reason(exc: object) -> str:
    return f"{type(exc).__name__}: {exc}"


def _sent_without_wait(reply: object) -> object:
    """The verdict on a compare-and-delete sent right after a WAIT fell short, without a WAIT of its own.

    Sent at once, so that a retry on another instance finds the token free; not
    confirmed (False) even when it ran, because a replica may hold the SET without it:
    the entry stays listed, and the next pipeline's WAIT vouches for its next deletion.
    A WAIT of its own would make every failed consume wait ``wait_timeout`` twice.
    """
    return reply if isinstance(reply, Exception) else False


def _forgettable(verdict: object) -> bool:
    """May the store stop taking this entry back? Once surely gone, or when refused for good.

    A refusal (an ACL without EVAL, a script error) will not change by retrying; a
    read-only or routing reply means this node is not (or no longer) the primary, and the
    one that is may still hold the entry.
    """
    if isinstance(verdict, Exception):
        return isinstance(verdict, redis.ResponseError) and not isinstance(
            verdict, (redis.ReadOnlyError, *_ROUTING_ERRORS)
        )
    return verdict is True


def _accepted_without_release(previous: object, nonce: str, acks: object, wanted: int) -> bool:
    """With wait=N: may this reply stand, or must the entry be taken back and the call fail?

    Someone else's nonce is a replay whatever the replicas hold (rejecting is always
    safe). A new entry stands once ``wanted`` replicas acknowledged it. Our own nonce
    means a retry after a lost reply, and the WAIT on the new connection cannot vouch for
    the earlier connection's write: take it back and fail closed.
    """
    if previous is not None:
        return not _is_own(previous, nonce)
    return isinstance(acks, int) and acks >= wanted


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


def _is_own(previous: object, nonce: str) -> bool:
    if isinstance(previous, bytes):
        previous = previous.decode("ascii", "replace")
    return previous == nonce


#: Between a wait=N entry's nonce and the retention (ms) it was written with.
_PENDING: Final = "/"


def _written_px(previous: object) -> int | None:
    """The retention a wait=N consume wrote into its entry, or None (wait=0, another writer)."""
    if isinstance(previous, bytes):
        previous = previous.decode("ascii", "replace")
    if not isinstance(previous, str):
        return None
    _, sep, px = previous.rpartition(_PENDING)
    return int(px) if sep and px.isdigit() else None


def _may_have_written(exc: BaseException) -> bool:
    """Whether a failed consume may have left an entry worth taking back.

    Not when the server refused the command or the store did before sending, nor when
    WAIT fell short and the take-back is done for good (confirmed, or refused forever).
    """
    if isinstance(exc, redis.ResponseError | ReplayStoreError):
        return False
    return not (isinstance(exc, _NotReplicated) and _forgettable(exc.taken_back))


# ---------------------------------------------------------------------------- async batching
class _Call(_Write):
    """An :meth:`RedisReplayStore.aconsume` waiting in a batch for its SET's reply."""

    __slots__ = ("future",)

    def __init__(self, write: _Write, future: asyncio.Future[object]) -> None:
        self.name, self.nonce, self.px, self.future = write.name, write.nonce, write.px, future


class _Sender:
    """Sends the SETs of concurrent :meth:`aconsume` calls of one event loop together.

    On loopback most of a command's cost is the system calls and wake-ups of one round
    trip, so while one batch is on the wire the calls that arrive queue up and leave as
    the next batch, in one non-transactional pipeline per server (for a cluster: per
    primary). This changes nothing about atomicity: every ``SET NX`` is still a separate
    atomic command on the server, and no command depends on another's result.

    With ``wait=N`` one ``WAIT`` closes each pipeline. ``WAIT`` counts the replicas that
    acknowledged the writes of *its own connection*, and a pipeline goes out on one
    connection (a retry after a broken connection resends all of it on the reconnected
    one, where an already-written SET answers with its own nonce and is not accepted,
    see :func:`_accepted_without_release`), so the ``WAIT`` covers exactly the SETs
    before it. For a cluster, the pipeline of each primary goes to that node alone and
    nothing in it is redirected elsewhere: redis-py's cluster pipeline may re-send a
    redirected command on another connection than its ``WAIT``'s, so a redirection
    refreshes the slot map and the batcher sends those calls again itself.

    How a pipeline is sent: through redis-py's connection-level calls where this redis-py
    has them (:func:`_direct_calls_available`; a private seam, kept because a request
    through the proxy costs measurably less CPU with it, docs/performance.md), else
    through redis-py's public ``pipeline()`` (for a cluster: of a plain client per
    primary, :class:`_Primaries`). Both send the same commands on one connection with the
    same retry policy; tests/core/test_seams.py runs the public one.

    Entries to take back (:mod:`._unsettled`) lead each pipeline, so they go before any
    new SET of the same token. A failed batch fails each of its calls closed.
    """

    _MAX_BATCH: Final = 256
    #: Seconds between two take-backs of listed entries while no consume comes: the tokens'
    #: next consumes may be other processes', which cannot take this one's entries back.
    _TAKE_BACK_EVERY: Final = 1.0

    def __init__(
        self,
        store: RedisReplayStore,
        client: AsyncClient,
        closers: list[Callable[[], Awaitable[object]]],
        *,
        verify: bool,
    ) -> None:
        self.client = client
        self._decide, self._retries, self._round_budget = store._decide, store._retries, store._round_budget
        self._unsettled = store._unsettled
        self._closers = closers
        self._cluster = client if isinstance(client, redis.asyncio.cluster.RedisCluster) else None
        self._direct = _direct_calls_available()
        self._primaries = _Primaries()
        self._prepared = not verify and self._cluster is None
        self._queue: list[_Call] = []
        self._flusher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def consume(self, write: _Write) -> object:
        loop = asyncio.get_running_loop()
        call = _Call(write, loop.create_future())
        self._queue.append(call)
        if self._flusher is None:
            # Started, not awaited: the calls that are already runnable queue up first.
            self._flusher = loop.create_task(self._flush())
        return await call.future

    async def aclose(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self._primaries.aclose()
        await self.client.aclose()
        for close in self._closers:
            await close()

    def _take_back_later(self) -> None:
        """While entries stay listed, send their take-backs (the oldest few) every second."""
        if self._timer is None and len(self._unsettled):
            self._timer = asyncio.get_running_loop().call_later(self._TAKE_BACK_EVERY, self._take_back)

    def _take_back(self) -> None:
        self._timer = None
        if self._flusher is None:  # else the running flush takes them back, and schedules again
            self._flusher = asyncio.get_running_loop().create_task(self._flush(take_back=True))

    async def _flush(self, *, take_back: bool = False) -> None:
        try:
            while self._queue or take_back:
                take_back = False  # one round of take-backs alone, the next one a second later
                batch = self._queue[: self._MAX_BATCH]
                del self._queue[: self._MAX_BATCH]
                entries = self._unsettled.pending(c.name for c in batch)
                # After pending(): a call cancelled from here on is listed only for the
                # next batch, whose take-backs follow this batch's SET.
                batch = [c for c in batch if not c.future.done()]
                if not batch and not entries:
                    continue
                try:
                    await self._prepare()
                    if self._cluster is not None:
                        await self._send_cluster(self._cluster, batch, entries)
                    else:
                        await self._send_server(batch, entries)
                except BaseException as exc:
                    _fail(batch, exc)
                    if not isinstance(exc, Exception):
                        raise  # cancellation or exit: the callers were failed closed above
        finally:
            self._flusher = None
        self._take_back_later()

    async def _prepare(self) -> None:
        # Before first use: a cluster client loads its slot map once, here, rather than
        # from many commands at once (redis-py 8.1 then loses connections under load:
        # "'NoneType' object has no attribute 'writelines'"); a plain URL must not name a
        # cluster node or a sentinel.
        if self._prepared:
            return
        if self._cluster is not None:
            await self._cluster.initialize()
        else:
            _judge_hello((await self._to_server([(("HELLO",), {})]))[0])
        self._prepared = True

    # -- one server (or the primary Sentinel names)
    async def _send_server(self, batch: list[_Call], entries: list[Entry]) -> None:
        replies = await self._to_server(self._decide.commands(batch, entries))
        await self._answer(self._decide.read(batch, entries, replies), self._to_server)

    async def _to_server(self, commands: list[_Command]) -> list[object]:
        server: Any = self.client  # a redis.asyncio.Redis: a cluster goes to _to_node
        if self._direct:
            return await _pooled_roundtrip(server.connection_pool, commands)
        return await _pipeline(server, commands)

    # -- a cluster: one pipeline per primary, each on one connection of that node
    async def _send_cluster(
        self, cluster: redis.asyncio.cluster.RedisCluster, batch: list[_Call], entries: list[Entry]
    ) -> None:
        rounds = _Rounds(cluster, batch, entries, self._retries, **self._round_budget)
        while True:
            groups = rounds.groups()
            results = await asyncio.gather(
                *(self._to_node(node, self._decide.commands(w, e)) for node, w, e in groups),
                return_exceptions=True,
            )
            for (node, writes, group_entries), result in zip(groups, results, strict=True):
                if isinstance(result, BaseException):
                    rounds.lost(writes, group_entries, result)
                    continue
                reading = self._decide.read(writes, group_entries, result, routed=True)
                rounds.redirected(reading)
                await self._answer(reading, functools.partial(self._to_node, node))
            if rounds.done:
                return
            if not rounds.may_retry():
                # Answered now: the refresh below is for the next batch, not on their clock.
                _fail(rounds.writes, rounds.failure())
            # Refresh even when no retry is left: nothing else would (these pipelines bypass
            # redis-py's own redirection handling), and the next batch must find the new owner.
            try:
                await cluster.nodes_manager.initialize()
                reachable = True
            except _REFRESH_ERRORS:
                reachable = False  # the whole cluster is unreachable: fail closed now
            if not rounds.again(reachable):
                _fail(rounds.writes, rounds.failure())
                return  # take-backs not sent stay listed for the next batch

    async def _to_node(self, node: Any, commands: list[_Command]) -> list[object]:
        if self._direct:
            return await _node_roundtrip(node, commands)
        return await _pipeline(self._primaries.of(node), commands)

    # -- the answers
    async def _answer(
        self, reading: _Reading[_Call], send: Callable[[list[_Command]], Awaitable[list[object]]]
    ) -> None:
        """Answer each call; with wait=N, delete the entries WAIT did not confirm, on the same node."""
        self._unsettled.settle((e.key, e.nonce) for e in reading.settled)
        unconfirmed: list[tuple[_Call, _TakeBack]] = []
        for call, answer in reading.answers:
            if call.future.done():
                continue  # the caller gave up (cancelled): aconsume listed its entry
            if isinstance(answer, _TakeBack):
                unconfirmed.append((call, answer))
            elif isinstance(answer, Exception):
                call.future.set_exception(answer)
            else:
                call.future.set_result(answer)
        if not unconfirmed:
            return
        try:
            verdicts = _Decision.released(await send(_Decision.releases(c for c, _ in unconfirmed)))
        except Exception as exc:
            verdicts = [exc] * len(unconfirmed)
        for (call, answer), verdict in zip(unconfirmed, verdicts, strict=True):
            if not call.future.done():
                call.future.set_exception(self._decide.not_replicated(reading, answer, verdict))


class _Primaries:
    """A plain ``redis.asyncio.Redis`` per cluster primary, for pipelines pinned to that node.

    Built from what redis-py's cluster client knows of the node (its address, connection
    class and connection options: TLS, credentials, timeouts, protocol), so it connects
    exactly as the cluster client would. No retry of its own: after a broken connection
    the batcher refreshes the slot map first, and the key may have moved.
    """

    def __init__(self) -> None:
        self._clients: dict[str, redis.asyncio.Redis] = {}

    def of(self, node: redis.asyncio.cluster.ClusterNode) -> redis.asyncio.Redis:
        client = self._clients.get(node.name)
        if client is None:
            pool = redis.asyncio.ConnectionPool(
                connection_class=node.connection_class,
                max_connections=node.max_connections,
                **{**node.connection_kwargs, "retry": AsyncRetry(NoBackoff(), 0)},
            )
            client = self._clients[node.name] = redis.asyncio.Redis.from_pool(pool)
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()


def _direct_calls_available() -> bool:
    """Whether this redis-py has the connection-level calls the direct path relies on.

    They lie below redis-py's public pipeline API (a pool's ``get_connection``, a
    connection's ``pack_commands``/``send_packed_command``/``read_response``, a cluster
    node's ``acquire_connection``). With a release that lacks one of them the batcher
    sends redis-py's public pipelines instead: the same commands on one connection each,
    at some more CPU per batch. tests/core/test_seams.py forces that.
    """
    needed = {
        redis.asyncio.ConnectionPool: ("get_connection", "release"),
        redis.asyncio.connection.AbstractConnection: (
            "pack_commands",
            "send_packed_command",
            "read_response",
            "disconnect",
        ),
        AsyncRetry: ("call_with_retry",),
        redis.asyncio.cluster.ClusterNode: ("acquire_connection", "release"),
    }
    return all(callable(getattr(cls, name, None)) for cls, names in needed.items() for name in names)


async def _pipeline(server: redis.asyncio.Redis, commands: Sequence[_Command]) -> list[object]:
    """The public path: one non-transactional redis-py pipeline, which runs on one connection
    (the async twin of :func:`_sync_pipeline`)."""
    pipe: Any = server.pipeline(transaction=False)
    for args, options in commands:
        pipe.execute_command(*args, **options)
    with _lost_connection():
        replies: list[object] = await pipe.execute(raise_on_error=False)
    return replies


async def _pooled_roundtrip(pool: Any, commands: Sequence[_Command]) -> list[object]:
    # The direct path: what redis-py's Pipeline.execute does for a non-transactional
    # pipeline, minus its per-command bookkeeping (response callbacks, metrics) and the
    # task that shields the connection's release, which cost more than the round trip
    # here. The connection, its pool, authentication, TLS, Sentinel discovery, packing,
    # parsing and the retry policy are redis-py's own.
    conn = await pool.get_connection()
    try:
        replies: list[object] = await conn.retry.call_with_retry(
            lambda: _roundtrip(conn, commands), lambda _error: conn.disconnect()
        )
    finally:
        await pool.release(conn)
    return replies


async def _node_roundtrip(node: Any, commands: Sequence[_Command]) -> list[object]:
    conn = node.acquire_connection()
    try:
        replies = await _roundtrip(conn, commands)
    except BaseException:
        await conn.disconnect()  # the stream may be out of step with the commands
        raise
    finally:
        node.release(conn)
    return replies


async def _roundtrip(conn: Any, commands: Sequence[_Command]) -> list[object]:
    # Retrying a whole batch is safe: each SET carries its caller's nonce, so one that
    # ran before the connection broke now answers with that nonce and counts as first.
    # The replies are redis-py's parser's, raw: what the pipeline's callbacks return for
    # these commands with their options (SET with get=True: the previous value).
    with _lost_connection():
        await conn.send_packed_command(conn.pack_commands([args for args, _ in commands]))
        replies: list[object] = []
        for _ in commands:
            try:
                replies.append(await conn.read_response())
            except redis.ResponseError as exc:  # an error reply; the stream stays in step
                replies.append(exc)
    return replies


@contextlib.contextmanager
def _lost_connection() -> Iterator[None]:
    # redis-py 8.1: a connection closed by another task while this one used it
    # (``'NoneType' object has no attribute 'writelines'``) is a broken transport,
    # retried like any other (safe: the nonce), not a bug to surface.
    try:
        yield
    except AttributeError as exc:
        raise redis.ConnectionError(f"connection lost while in use ({exc})") from exc


def _fail(calls: Iterable[_Call], exc: BaseException) -> None:
    for call in calls:
        if not call.future.done():
            call.future.set_exception(_copy(exc))


def _copy(exc: BaseException) -> BaseException:
    # One exception object per waiting caller: tracebacks are mutated when raised.
    if isinstance(exc, redis.RedisError | OSError | ReplayStoreError):
        return type(exc)(*exc.args)
    return redis.ConnectionError(f"replay batch failed: {type(exc).__name__}: {exc}")
