"""The Redis batcher on redis-py's public pipelines: the same guarantees as on its direct path.

The batcher sends through redis-py's connection-level calls where they exist (a private
seam, kept for the CPU it saves per request, docs/performance.md "Private seams") and
through redis-py's public ``pipeline()`` otherwise. Every test of the batcher elsewhere
runs the direct path; this module runs the strongest of them again with the direct
path switched off, as on a redis-py release without those calls (tests/core/test_seams.py
holds the check of those calls and the simplest exactly-once test): exactly once across a
cluster failover with ``wait=1``, ``WAIT`` on the SETs' own connection, take-backs of
entries a failed call may have written, and failing closed without replicas.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from fixtures_valkey import ValkeyCluster
from test_replay_failover import (
    cluster,  # noqa: F401 - the fixture of the test below
    test_cluster_primary_killed_with_wait_accepts_no_token_twice,  # noqa: F401
)
from test_replay_topologies import (  # noqa: F401 - run again here, on the public path
    test_a_cluster_store_takes_a_thousand_concurrent_calls_on_a_fresh_client,
    test_a_consume_cut_off_mid_wait_is_taken_back_before_the_retry,
    test_wait_accepts_a_token_once_a_replica_holds_it,
    test_wait_fails_closed_without_a_replica_and_the_token_survives,
)

from statecodec.replay import RedisReplayStore
from statecodec.replay import redis as redis_store


@pytest.fixture(autouse=True)
def public_pipelines(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # As on a redis-py without the connection-level calls: _direct_calls_available() says
    # so (the calls themselves stay, redis-py's own pipeline needs them).
    monkeypatch.setattr(redis_store, "_direct_calls_available", lambda: False)
    yield


async def test_a_cluster_gets_one_plain_client_per_primary_and_closes_them(
    valkey_cluster: ValkeyCluster,
) -> None:
    store = RedisReplayStore(valkey_cluster.url, prefix=f"t-{uuid.uuid4().hex[:8]}:")
    try:
        first = await asyncio.gather(*(store.aconsume(f"k{i}", 60) for i in range(200)))
        again = await asyncio.gather(*(store.aconsume(f"k{i}", 60) for i in range(200)))
        assert all(first) and not any(again)
        (sender,) = store._senders.values()
        primaries = {f"{node.host}:{node.port}" for node in sender.client.get_primaries()}
        assert set(sender._primaries._clients) == primaries  # keys reached every primary, each on its own
    finally:
        await store.aclose()
    assert not sender._primaries._clients  # closed with the store, and forgotten
