"""Exactly once across a primary failover, with real processes.

Redis replication is asynchronous: a consume the primary acknowledged can die with it, and
the promoted replica then accepts the token again. ``wait=N`` makes the store accept a
token only once N replicas hold its entry. Here, each test builds servers of its own
(it changes them): a Sentinel-managed primary failed over with ``SENTINEL FAILOVER``,
and Redis Cluster primaries killed with SIGKILL so that their replicas take over, while
clients keep redeeming tokens. Every wait is bounded (tests/fixtures_valkey.wait_until).
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
from collections.abc import Callable, Iterator

import pytest
import redis
from fixtures_valkey import ValkeyCluster, ValkeySentinels, running, wait_until
from replay_traffic import Pace, Traffic

import statecodec as sc
from statecodec import ReplayStoreError
from statecodec.replay import ReplayStore, store_from_url

pytestmark = pytest.mark.slow

BINDING = sc.Binding(principal="alice", audience="svc", method="tools/call", target="pay")
#: Seconds between two attempts of one client: enough traffic to cross the failover, no more.
PACE = Pace(after=0.005, idle=0.005)
BOUND = 90.0


@pytest.fixture
def cluster() -> Iterator[ValkeyCluster]:
    with running(ValkeyCluster) as made:
        yield made


@pytest.fixture
def sentinels() -> Iterator[ValkeySentinels]:
    with running(ValkeySentinels) as made:
        yield made


def admin(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=5, decode_responses=True)


def assert_exactly_once(traffic: Traffic) -> None:
    """Each token accepted once; nothing but acceptances and fail-closed rounds; none lost."""
    assert traffic.outcomes
    for outcomes in traffic.outcomes.values():
        # "replayed" before any acceptance would be a token lost (burnt) by the failover.
        assert set(outcomes) <= {"ok", "store_unavailable"}, outcomes
        assert outcomes.count("ok") == 1 and outcomes[-1] == "ok", outcomes
    # And the store still remembers every one of them, on whichever node now serves it.
    replays: collections.Counter[str] = collections.Counter()
    for token in traffic.outcomes:
        try:
            traffic.codec.unseal(token, BINDING)
            replays["accepted twice"] += 1
        except sc.InvalidState as exc:
            replays[exc.reason] += 1
    assert replays == {"replayed": len(traffic.outcomes)}, replays
    assert traffic.codec.replay is not None
    traffic.codec.replay.close()


def report(name: str, traffic: Traffic) -> None:
    tokens, failed = len(traffic.outcomes), traffic.count("store_unavailable")
    print(f"{name}: {tokens} tokens accepted once each; {failed} rounds failed closed during the failover")


def across(url: str, failover: Callable[[], None]) -> Traffic:
    """Traffic through a store at ``url``: 100 acceptances, the failover, 100 more, then the retries."""
    store = store_from_url(url)
    store.check()
    traffic = Traffic(sc.StateCodec(sc.KeyRing.generate("k1"), replay=store), BINDING, pace=PACE, bound=BOUND)
    try:
        wait_until(lambda: traffic.count("ok") >= 100, "100 tokens are accepted", BOUND)
        failover()
        mark = traffic.count("ok")
        wait_until(lambda: traffic.count("ok") >= mark + 100, "100 more tokens are accepted", BOUND)
    finally:
        traffic.finish()
    return traffic


# ---------------------------------------------------------------- Sentinel
def test_sentinel_failover_with_wait_accepts_no_token_twice(sentinels: ValkeySentinels) -> None:
    def failover() -> None:
        old = sentinels.primary_port()
        assert admin(sentinels.sentinels[0].port).execute_command("SENTINEL", "FAILOVER", sentinels.SERVICE)
        wait_until(lambda: sentinels.primary_port() != old, "Sentinel names the new primary", BOUND)
        sentinels.wait_healthy(BOUND)  # the old primary is now the new one's replica, in sync

    traffic = across(f"{sentinels.url}?wait=1&wait_timeout=0.5&socket_timeout=2", failover)
    report("sentinel", traffic)
    assert_exactly_once(traffic)


# ---------------------------------------------------------------- Cluster
@pytest.mark.usefixtures("redis_pipelines")
def test_cluster_primary_killed_with_wait_accepts_no_token_twice(cluster: ValkeyCluster) -> None:
    def failover() -> None:
        victim = cluster.primaries()[0]
        heir, slot = cluster.replica_of(victim), cluster.slot_of(victim)
        cluster.node(victim).kill()
        wait_until(lambda: cluster.owner(slot) == heir, "the replica takes over the slots", BOUND)
        # The promoted replica has no replica of its own until the killed node returns (as
        # its replica): until then wait=1 fails its slots closed, as it must.
        cluster.node(victim).start()
        cluster.wait_healthy(BOUND)

    # retries=0: no retry hides a client that would not find the new owner by itself.
    traffic = across(f"{cluster.url}?wait=1&wait_timeout=0.5&socket_timeout=2&retries=0", failover)
    report("cluster", traffic)
    assert traffic.count("store_unavailable") > 0  # the killed primary's slots failed closed
    assert_exactly_once(traffic)


def burst(store: ReplayStore, keys: list[str]) -> list[object]:
    async def run() -> list[object]:
        outcome = await asyncio.gather(*(store.aconsume(k, 300) for k in keys), return_exceptions=True)
        await store.aclose()
        return outcome

    return asyncio.run(run())


def test_lost_replication_accepts_tokens_twice_without_wait_and_never_with_it(cluster: ValkeyCluster) -> None:
    """The double acceptance made certain: the primary's link to its replica is cut, then it dies.

    Without wait, each token the primary alone accepted is accepted again by the promoted
    replica. With wait=1, none was accepted, none was burnt, and each redeems once later.
    """
    victim = cluster.primaries()[0]
    heir, slot = cluster.replica_of(victim), cluster.slot_of(victim)
    trusting = store_from_url(f"{cluster.url}?prefix=a:")
    waiting = store_from_url(f"{cluster.url}?prefix=b:&wait=1&wait_timeout=0.3")
    trusting.check()
    waiting.check()
    a_keys = cluster.keys_served_by(victim, "a:", 30)
    b_keys = cluster.keys_served_by(victim, "b:", 30)
    heir_pid = cluster.node(heir).pid
    assert heir_pid is not None
    os.kill(heir_pid, signal.SIGSTOP)
    try:
        admin(victim).client_kill_filter(_type="replica")  # the writes below never leave the primary
        assert burst(trusting, a_keys) == [True] * 30
        refused = burst(waiting, b_keys)
        # The deletions after WAIT's shortfall reached the primary alone: listed, to be sent again.
        assert all(isinstance(r, ReplayStoreError) and "deleted on the primary" in str(r) for r in refused), (
            refused
        )
        cluster.node(victim).kill()
    finally:
        os.kill(heir_pid, signal.SIGCONT)
    wait_until(lambda: cluster.owner(slot) == heir, "the replica takes over the slots", BOUND)
    wait_until(succeeds(trusting.check), "the store reaches the new primary", BOUND)
    # Without wait: the entries died with the primary, so every one of those tokens is accepted again.
    assert [trusting.consume(k, 300) for k in a_keys] == [True] * 30
    # With wait: no token was accepted, and none was lost - once a replica is back, each redeems once.
    cluster.node(victim).start()
    cluster.wait_healthy(BOUND)
    wait_until(succeeds(waiting.check), "wait=1 can be met again", BOUND)
    # A replica that is connected may still miss a 0.3 s WAIT on a loaded machine: such a
    # round fails closed (its entry taken back, or listed to be) and its retry redeems the
    # token, as a client's would.
    assert [redeem(waiting, k) for k in b_keys] == [True] * 30
    assert [waiting.consume(k, 300) for k in b_keys] == [False] * 30
    trusting.close()
    waiting.close()


def redeem(store: ReplayStore, key: str) -> bool:
    """``consume``, retried while it fails closed with the entry taken back (bounded)."""
    outcome: list[bool] = []

    def attempt() -> bool:
        try:
            outcome.append(store.consume(key, 300))
        except ReplayStoreError as exc:
            # Taken back, or listed to be: anything else is a real failure.
            assert "deleted on the primary" in str(exc), exc
            return False
        return True

    wait_until(attempt, f"token {key[:8]} redeemed", BOUND)
    return outcome[-1]


def succeeds(check: Callable[[], None]) -> Callable[[], bool]:
    def attempt() -> bool:
        try:
            check()
        except ReplayStoreError:
            return False
        return True

    return attempt
