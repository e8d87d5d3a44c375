"""The Redis batcher on redis-py's public pipelines: the same guarantees as on its direct path.

The batcher sends through redis-py's connection-level calls where they exist (a private
seam, kept for the CPU it saves per request, docs/performance.md "Private seams") and
through redis-py's public ``pipeline()`` otherwise. The strongest tests of the batcher run
on both paths where they are written (the ``redis_pipelines`` fixture, tests/replay/conftest.py):
exactly once across a cluster failover with ``wait=1`` (test_replay_failover.py), ``WAIT`` on
the SETs' own connection, take-backs of entries a failed call may have written, and failing
closed without replicas (test_replay_topologies.py); tests/core/test_seams.py holds the check
of those calls and the simplest exactly-once test. This module holds what only the public
path does, as on a redis-py release without those calls.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from fixtures_valkey import ValkeyCluster

from statecodec.replay import RedisReplayStore

# Only the public path here: tests/replay/conftest.py's redis_pipelines, held to "public".
pytestmark = [
    pytest.mark.usefixtures("redis_pipelines"),
    pytest.mark.parametrize("redis_pipelines", ["public"], indirect=True),
]


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
