"""Replay stores under faults: a Valkey server killed mid-load, a locked SQLite file, a full disk.

The contract under test (statecodec/_codec.py): a token is accepted only after the store
recorded it; when the store cannot answer, unseal fails closed with
``store_unavailable`` and the token stays redeemable once the store is back.
Everything here is real: a Valkey process killed with SIGKILL and restarted on its
port, a second OS process holding SQLite's write lock, a file system that is really
full (a 256 KiB tmpfs when this machine lets us mount one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fixtures_valkey import ValkeyServer
from processes import running

from statecodec import Binding, InvalidState, KeyRing, StateCodec
from statecodec.replay import RedisReplayStore, SQLiteReplayStore

RING = KeyRing.generate("fault-k1")
BINDING = Binding(principal="alice", audience="aud", method="tools/call", target="t", arguments={})
PREFIX = "faults:"


def outcome(codec: StateCodec, token: str) -> str:
    try:
        codec.unseal(token, BINDING)
    except InvalidState as exc:
        return exc.reason
    return "accepted"


# ------------------------------------------------------------------------- Valkey
@pytest.fixture
def durable_valkey() -> Iterator[ValkeyServer]:
    """A Valkey of this test's own whose acknowledged writes survive SIGKILL (AOF, fsync always)."""
    with running(
        lambda: ValkeyServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    ) as server:
        yield server


def kill_hard(server: ValkeyServer) -> None:
    assert server.pid is not None
    os.kill(server.pid, signal.SIGKILL)  # no shutdown hook, no final save: a crash
    server.stop()  # reaps the process by its PID


async def test_valkey_killed_mid_load_fails_closed_recovers_and_never_accepts_twice(
    durable_valkey: ValkeyServer,
) -> None:
    store = RedisReplayStore(durable_valkey.url, prefix=PREFIX, socket_timeout=1.0, connect_timeout=1.0)
    codec = StateCodec(RING, replay=store, namespace="kill")
    tokens = [codec.seal(b"%d" % i, BINDING) for i in range(3000)]
    results: dict[str, list[str]] = defaultdict(list)
    queue: asyncio.Queue[str] = asyncio.Queue()
    for token in tokens:
        queue.put_nowait(token)
    killed, restarted = asyncio.Event(), asyncio.Event()

    async def worker() -> None:
        while not queue.empty():
            token = queue.get_nowait()
            try:
                await codec.aunseal(token, BINDING)
                results[token].append("accepted")
            except InvalidState as exc:
                results[token].append(exc.reason)
            if killed.is_set() and not restarted.is_set():
                await asyncio.sleep(0.005)  # keep the outage from draining the whole queue

    async def chaos() -> None:
        while sum(r == ["accepted"] for r in results.values()) < 800:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(kill_hard, durable_valkey)
        killed.set()
        async with asyncio.timeout(60):  # the load keeps coming while the store is down, until it meets it
            while not any("store_unavailable" in r for r in results.values()):
                await asyncio.sleep(0.01)
        await asyncio.to_thread(durable_valkey.start)
        restarted.set()

    started = time.monotonic()
    await asyncio.gather(chaos(), *(worker() for _ in range(32)))
    first_pass = time.monotonic() - started

    counts = Counter(r for rs in results.values() for r in rs)
    assert set(counts) <= {"accepted", "store_unavailable"}, counts
    assert counts["store_unavailable"] > 0, "the kill did not hit the load"
    assert counts["accepted"] > 800, "no load before the kill"

    # Every token again, store healthy: accepted ones must be replays; the ones that met
    # the outage are redeemable now (or, if the server executed the SET but the reply
    # died with it, "replayed": fail closed, never a double accept).
    unavailable = [t for t, r in results.items() if r == ["store_unavailable"]]
    for token in tokens:
        results[token].append(outcome(codec, token))
    accepted_twice = [t for t, rs in results.items() if rs.count("accepted") > 1]
    assert accepted_twice == []
    assert all(results[t] == ["accepted", "replayed"] for t in tokens if t not in unavailable)
    lost_ack = [t for t in unavailable if results[t][-1] == "replayed"]
    assert all(results[t][-1] in {"accepted", "replayed"} for t in unavailable)
    assert len(lost_ack) <= 32, "at most one in-flight command per worker can lose its reply"

    # Nothing was accepted unchecked: every accepted token has its entry in Valkey.
    direct = redis.Redis.from_url(durable_valkey.url)
    try:
        accepted_ids = [codec.verify_unbound(t).token_id for t in tokens if "accepted" in results[t]]
        keys = [f"{PREFIX}kill:{tid}" for tid in accepted_ids]
        present = sum(direct.exists(*keys[i : i + 500]) for i in range(0, len(keys), 500))
        assert present == len(keys)
    finally:
        direct.close()
        await store.aclose()
    print(  # the evidence quoted in docs/security.md
        f"\nvalkey kill: {len(tokens)} tokens, first pass {first_pass:.1f}s, {dict(counts)}, "
        f"{len(unavailable)} redeemed after restart, {len(lost_ack)} lost acks, 0 accepted twice"
    )


def test_sync_unseal_during_an_outage_is_store_unavailable_then_recovers(
    durable_valkey: ValkeyServer,
) -> None:
    store = RedisReplayStore(durable_valkey.url, prefix=PREFIX, socket_timeout=1.0, connect_timeout=1.0)
    codec = StateCodec(RING, replay=store, namespace="sync")
    token = codec.seal(b"x", BINDING)
    kill_hard(durable_valkey)
    try:
        started = time.monotonic()
        with pytest.raises(InvalidState) as info:
            codec.unseal(token, BINDING)
        assert info.value.reason == "store_unavailable"
        assert "not consumed, retry later" in info.value.detail
        assert time.monotonic() - started < 10  # connect refused + one retry, not a hang
    finally:
        durable_valkey.start()
    assert outcome(codec, token) == "accepted"
    assert outcome(codec, token) == "replayed"
    store.close()


def test_without_persistence_a_crash_forgets_consumed_tokens(valkey_outage: ValkeyServer) -> None:
    # The operational requirement docs/security.md states, shown: with the default
    # "--appendonly no", a crash erases the store, so run Valkey with AOF (fsync always)
    # or accept that tokens redeemed before a crash can be redeemed again within their TTL.
    store = RedisReplayStore(valkey_outage.url, prefix=PREFIX)
    codec = StateCodec(RING, replay=store, namespace="volatile")
    token = codec.seal(b"x", BINDING)
    assert outcome(codec, token) == "accepted"
    kill_hard(valkey_outage)
    valkey_outage.start()
    assert outcome(codec, token) == "accepted"
    store.close()


# ------------------------------------------------------------------------- SQLite
LOCK_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
conn.execute("INSERT INTO statecodec_replay VALUES ('holder', 1e12)")
print("LOCKED", flush=True)
sys.stdin.read()  # hold the write lock until the test closes our stdin
conn.execute("ROLLBACK")
"""


def test_sqlite_file_locked_by_another_process_fails_closed_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "replay.sqlite3"
    store = SQLiteReplayStore(path, busy_timeout=0.3)
    codec = StateCodec(RING, replay=store)
    token, other = codec.seal(b"x", BINDING), codec.seal(b"y", BINDING)
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "LOCKED"
        for t in (token, other):
            started = time.monotonic()
            with pytest.raises(InvalidState) as info:
                codec.unseal(t, BINDING)
            assert info.value.reason == "store_unavailable"
            assert "database is locked" in info.value.detail
            assert time.monotonic() - started < 5  # the busy timeout, not forever
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
        holder.stdout.close()  # type: ignore[union-attr]
    assert outcome(codec, token) == "accepted"  # nothing was consumed while locked
    assert outcome(codec, token) == "replayed"
    assert outcome(codec, other) == "accepted"
    store.close()


@contextlib.contextmanager
def tiny_filesystem(where: Path) -> Iterator[Path | None]:
    """A 256 KiB tmpfs at ``where`` if this machine lets us mount one (root), else None."""
    where.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(where)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    try:
        yield where if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(where)], check=False)


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):  # ENOSPC is the point
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    return filler


def test_disk_full_fails_closed_with_store_unavailable(tmp_path: Path) -> None:
    with tiny_filesystem(tmp_path / "tiny") as tiny:
        store = SQLiteReplayStore((tiny or tmp_path) / "replay.sqlite3")
        codec = StateCodec(RING, replay=store)
        good = [codec.seal(b"%d" % i, BINDING) for i in range(3)]
        assert outcome(codec, good[0]) == "accepted"
        if tiny is not None:
            filler = fill(tiny)  # a real ENOSPC from the kernel
        else:
            # No mount possible here: SQLite's own page cap is the failing-filesystem
            # stand-in, applied to the store's real connection of this thread.
            conn = store._connection()
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={pages}")
        tokens = [codec.seal(b"full%d" % i, BINDING) for i in range(300)]
        reasons = Counter(outcome(codec, t) for t in tokens)
        assert reasons["store_unavailable"] > 0, reasons
        assert set(reasons) <= {"accepted", "store_unavailable"}, reasons  # WAL slack may take a few
        with pytest.raises(InvalidState) as info:
            codec.unseal(good[1], BINDING)
        assert info.value.reason == "store_unavailable"
        assert "full" in info.value.detail

        if tiny is not None:
            filler.unlink()
        else:
            store._connection().execute("PRAGMA max_page_count=1073741823")
        assert outcome(codec, good[1]) == "accepted"  # recovers without a restart
        assert outcome(codec, good[0]) == "replayed"  # and forgot nothing
        store.close()
    print(f"\ndisk full via {'a 256 KiB tmpfs' if tiny else 'PRAGMA max_page_count'}: {dict(reasons)}")


def test_replay_store_file_on_a_read_only_directory_fails_at_construction(tmp_path: Path) -> None:
    # The same class of failure caught at boot instead of per request.
    with pytest.raises(Exception, match="SQLite replay store"):
        SQLiteReplayStore(tmp_path / "missing-dir" / "replay.sqlite3")
    assert sqlite3.sqlite_version  # the system library the stores above ran on
