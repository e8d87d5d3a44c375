"""The minimal ACL of docs/replay.md: every store operation runs with exactly those rights.

A Valkey ACL user gets the documented rights and nothing else (``-@all``, one key
pattern), on a primary with a replica and on every node of a cluster. Every operation
of the store then succeeds and the server logs no refused command; and without any one
of the rights, some operation fails or the server logs the refusal, so none is spare.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import redis
from fixtures_valkey import ValkeyCluster, ValkeyServer, in_sync, wait_until

from statecodec import ReplayStoreError
from statecodec.replay import store_from_url

PREFIX = "statecodec:replay:"
#: docs/replay.md, "Minimal ACL"; kept in step by test_the_documented_acl_is_the_tested_one.
COMMON = ["~statecodec:replay:*", "+set", "+wait", "+eval", "+get", "+pttl", "+del", "+ping"]
SERVER = [*COMMON, "+select"]  # HELLO needs no right: every user may run it
CLUSTER = [*COMMON, "+cluster|slots", "+command"]
#: redis-py sends CLIENT SETINFO on connect and ignores a refusal; statecodec needs no right for it.
IGNORED = {"client|setinfo"}


def test_the_documented_acl_is_the_tested_one() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "replay.md").read_text(encoding="utf-8")
    block = page.split("### Minimal ACL", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    documented = {word for word in block.split() if word.startswith(("+", "~"))}
    assert documented == set(SERVER) | set(CLUSTER)


def grant(ports: list[int], rights: list[str]) -> None:
    for port in ports:
        admin = redis.Redis(port=port)
        admin.execute_command("ACL", "DELUSER", "statecodec")
        admin.execute_command(
            "ACL", "SETUSER", "statecodec", "on", ">s3cret", "resetkeys", "resetchannels", "-@all", *rights
        )
        admin.execute_command("ACL", "LOG", "RESET")


def refused(ports: list[int]) -> set[tuple[str, str]]:
    """(reason, command or key) the servers refused to the statecodec user since the last grant()."""
    found: set[tuple[str, str]] = set()
    for port in ports:
        for entry in redis.Redis(port=port, decode_responses=True).execute_command("ACL", "LOG"):
            if entry["username"] == "statecodec" and entry["object"] not in IGNORED:
                found.add((entry["reason"], entry["object"]))
    return found


def assert_each_right_needed(ports: list[int], rights: list[str], run: Callable[[], None]) -> None:
    """Without any one right, the server refuses what that right allows (and operations fail)."""
    for right in rights:
        grant(ports, [r for r in rights if r != right])
        # The refusal may surface as a failed operation; the log below says which it was.
        with contextlib.suppress(ReplayStoreError, AssertionError, pytest.fail.Exception):
            run()
        log = refused(ports)
        if right.startswith("~"):
            assert any(reason == "key" for reason, _ in log), (right, log)
        else:
            assert right[1:] in {command for _, command in log}, (right, log)


@contextmanager
def stopped(pid: int | None) -> Iterator[None]:
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def every_operation(url: str, unreplicated_key: str, stop_replica: AbstractContextManager[None]) -> None:
    """check, consume (first and replay), a burst of aconsume, wait=1 accepted, undecided and taken back."""
    store = store_from_url(url)
    store.check()
    key = uuid.uuid4().hex
    assert store.consume(key, 60) is True
    assert store.consume(key, 60) is False

    async def burst() -> list[bool]:
        outcome = await asyncio.gather(*(store.aconsume(uuid.uuid4().hex, 60) for _ in range(20)))
        await store.aclose()
        return outcome

    assert asyncio.run(burst()) == [True] * 20
    store.close()
    # A running replica acknowledges within 5 s on a loaded machine too; within that window
    # (and the socket timeouts after it) another instance finds the entry not settled yet.
    joined = f"{url}{'&' if '?' in url else '?'}wait=1"
    patient, other = (store_from_url(f"{joined}&wait_timeout=5&socket_timeout=10") for _ in range(2))
    waiting = store_from_url(f"{joined}&wait_timeout=0.2")
    patient.check()
    accepted = uuid.uuid4().hex
    assert patient.consume(accepted, 60) is True
    with pytest.raises(ReplayStoreError, match="not settled yet"):  # PTTL allowed: its age is known
        other.consume(accepted, 60)
    with stop_replica, pytest.raises(ReplayStoreError, match="deleted on the primary"):  # EVAL allowed
        waiting.consume(unreplicated_key, 60)
    for store in (patient, other, waiting):
        store.close()


def test_a_primary_and_replica_with_the_minimal_acl(
    valkey_primary_replica: tuple[ValkeyServer, ValkeyServer],
) -> None:
    primary, replica = valkey_primary_replica
    ports = [primary.port, replica.port]
    url = f"redis://statecodec:s3cret@127.0.0.1:{primary.port}/1"  # database 1: SELECT

    def run() -> None:
        every_operation(url, uuid.uuid4().hex, stopped(replica.pid))
        wait_until(lambda: in_sync(replica), "the replica is in sync again")

    grant(ports, SERVER)
    run()
    assert refused(ports) == set()
    assert_each_right_needed(ports, SERVER, run)


def test_a_cluster_with_the_minimal_acl(valkey_cluster: ValkeyCluster) -> None:
    ports = [node.port for node in valkey_cluster.nodes]
    url = valkey_cluster.url.replace("redis+cluster://", "redis+cluster://statecodec:s3cret@")
    primary = valkey_cluster.primaries()[0]
    replica = valkey_cluster.node(valkey_cluster.replica_of(primary))

    def run() -> None:
        every_operation(url, valkey_cluster.keys_served_by(primary, PREFIX, 1)[0], stopped(replica.pid))
        wait_until(lambda: in_sync(replica), "the replica is in sync again")

    try:
        grant(ports, CLUSTER)
        run()
        assert refused(ports) == set()
        assert_each_right_needed(ports, CLUSTER, run)
    finally:
        for port in ports:  # the session cluster goes on without the test user
            redis.Redis(port=port).execute_command("ACL", "DELUSER", "statecodec")
        valkey_cluster.wait_healthy()
