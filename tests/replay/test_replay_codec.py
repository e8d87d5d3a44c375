"""Replay stores through the codec: single use, check order, namespaces, fail-closed outages.

Every store is real (memory, an SQLite file, a Valkey/Redis server). The codec runs on
real time, except where a test sets its clock a year away from the stores' own clocks
(the machine's monotonic or wall clock, the Valkey server's) to show that single use
does not depend on them agreeing.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_valkey import ValkeyServer
from processes import running
from replay_outcomes import ticking

import statecodec as sc
from statecodec.replay import (
    MemoryReplayStore,
    RedisReplayStore,
    ReplayStore,
    SQLiteReplayStore,
    store_from_url,
)

RING = sc.KeyRing.generate("k1")
OTHER_RING = sc.KeyRing.generate("k1")  # same kid, different secret
ALICE = sc.Binding(
    principal="alice", audience="svc", method="tools/call", target="deploy", arguments={"v": 1}
)
MALLORY = sc.Binding(
    principal="mallory", audience="svc", method="tools/call", target="deploy", arguments={"v": 1}
)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReplayStore]:
    if request.param == "memory":
        made: ReplayStore = MemoryReplayStore()
    elif request.param == "sqlite":
        made = SQLiteReplayStore(tmp_path / "replay.db")
    else:
        url = request.getfixturevalue("valkey_server").url
        made = RedisReplayStore(url, prefix=f"t-{uuid.uuid4().hex[:8]}:")
    yield made
    made.close()


def _reason(call: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(sc.InvalidState) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return info.value.reason


async def _areason(codec: sc.StateCodec, token: str, binding: sc.Binding | None) -> str:
    with pytest.raises(sc.InvalidState) as info:
        await codec.aunseal(token, binding)
    return info.value.reason


@pytest.mark.parametrize("mode", [sc.Mode.SIGN, sc.Mode.ENCRYPT])
def test_a_token_unseals_once_then_is_replayed(store: ReplayStore, mode: sc.Mode) -> None:
    codec = sc.StateCodec(RING, mode=mode, replay=store)
    token = codec.seal(b"state", ALICE)
    assert codec.unseal(token, ALICE).payload == b"state"
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(token, ALICE)
    assert info.value.reason == "replayed"
    assert info.value.token_id == sc.StateCodec(RING, mode=mode).unseal(token, ALICE).token_id
    # consume=False (for inspection) neither needs nor burns an entry.
    fresh = codec.seal(b"x", ALICE)
    codec.unseal(fresh, ALICE, consume=False)
    assert codec.unseal(fresh, ALICE).payload == b"x"


async def test_aunseal_once_then_replayed(store: ReplayStore) -> None:
    codec = sc.StateCodec(RING, replay=store)
    token = codec.seal(b"state", ALICE)
    assert (await codec.aunseal(token, ALICE)).payload == b"state"
    assert await _areason(codec, token, ALICE) == "replayed"
    assert _reason(codec.unseal, token, ALICE) == "replayed"  # sync and async share entries
    await store.aclose()


async def test_concurrent_aunseal_of_one_token_has_one_winner(store: ReplayStore) -> None:
    codec = sc.StateCodec(RING, replay=store)
    token = codec.seal(b"once", ALICE)
    results = await asyncio.gather(*(codec.aunseal(token, ALICE) for _ in range(50)), return_exceptions=True)
    wins = [r for r in results if isinstance(r, sc.OpenedState)]
    assert len(wins) == 1 and wins[0].payload == b"once"
    assert all(isinstance(r, sc.InvalidState) and r.reason == "replayed" for r in results if r not in wins)
    await store.aclose()


def test_failed_checks_never_consume_the_real_token(store: ReplayStore) -> None:
    codec = sc.StateCodec(RING, replay=store)
    token = codec.seal(b"real", ALICE)
    tampered = token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1]
    forged = sc.StateCodec(OTHER_RING).seal(b"real", ALICE)
    # Every failing attempt first, in the order an attacker might try them.
    assert _reason(codec.unseal, token, MALLORY) == "binding_mismatch"
    assert _reason(codec.unseal, token, None) == "binding_mismatch"
    assert _reason(codec.unseal, tampered, ALICE) == "tampered"
    assert _reason(codec.unseal, forged, ALICE) == "tampered"
    assert _reason(sc.StateCodec(RING, mode="encrypt", replay=store).unseal, token, ALICE) == "wrong_mode"
    future = sc.StateCodec(RING, replay=store, clock=lambda: time.time() + 3600)
    assert _reason(future.unseal, token, ALICE) == "expired"
    # ...and the genuine redemption still works, exactly once.
    assert codec.unseal(token, ALICE).payload == b"real"
    assert _reason(codec.unseal, token, ALICE) == "replayed"


async def test_failed_async_checks_never_consume(store: ReplayStore) -> None:
    codec = sc.StateCodec(RING, replay=store)
    token = codec.seal(b"real", ALICE)
    assert await _areason(codec, token, MALLORY) == "binding_mismatch"
    assert (await codec.aunseal(token, ALICE)).payload == b"real"
    await store.aclose()


def test_namespaces_sharing_one_store_never_collide(store: ReplayStore) -> None:
    # Two services with the same keys (so each accepts the other's token) share a store:
    # a redemption at one must not count as a redemption at the other.
    billing = sc.StateCodec(RING, replay=store, namespace="billing")
    deploy = sc.StateCodec(RING, replay=store, namespace="deploy")
    token = billing.seal(b"t", ALICE)
    assert billing.unseal(token, ALICE).payload == b"t"
    assert deploy.unseal(token, ALICE).payload == b"t"
    assert _reason(billing.unseal, token, ALICE) == "replayed"
    assert _reason(deploy.unseal, token, ALICE) == "replayed"


def test_namespaced_keys_in_the_sqlite_table(tmp_path: Path) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db")
    token = sc.StateCodec(RING).seal(b"t", ALICE)
    tid = sc.StateCodec(RING).unseal(token, ALICE).token_id
    for name in ("billing", "deploy"):
        sc.StateCodec(RING, replay=store, namespace=name).unseal(token, ALICE)
    with sqlite3.connect(tmp_path / "r.db") as conn:
        keys = sorted(row[0] for row in conn.execute("SELECT key FROM statecodec_replay"))
    assert keys == [f"billing:{tid}", f"deploy:{tid}"]
    store.close()


def test_entries_outlive_the_token_and_then_go(tmp_path: Path) -> None:
    # The store keeps an entry while any instance may still accept the token.
    store = SQLiteReplayStore(tmp_path / "r.db")
    codec = sc.StateCodec(RING, replay=store, ttl=30, max_skew=5, expiry_grace=2)
    opened = codec.unseal(codec.seal(b"t", ALICE), ALICE)
    with sqlite3.connect(tmp_path / "r.db") as conn:
        (expires_at,) = conn.execute("SELECT expires_at FROM statecodec_replay").fetchone()
    # Accepted here while now < exp + grace, and max_skew longer by an instance behind.
    last_acceptance = opened.expires_at + 2 + 5
    assert expires_at >= last_acceptance
    # ...measured from the store's reading of the host clock, a moment after the codec's.
    assert expires_at <= last_acceptance + 1
    store.close()


# ------------------------------------------------------- the codec's clock is not the store's
YEAR = 365 * 24 * 3600
TTL, MAX_SKEW = 300, 60


def _remembered_for(store: ReplayStore, key: str) -> float:
    """How long the store will still hold ``key``, read from the store itself, in seconds."""
    if isinstance(store, MemoryReplayStore):
        return store._entries[key] - time.monotonic()
    if isinstance(store, SQLiteReplayStore):
        with sqlite3.connect(store.path) as conn:
            (expires_at,) = conn.execute(
                "SELECT expires_at FROM statecodec_replay WHERE key = ?", (key,)
            ).fetchone()
        return float(expires_at) - time.time()
    assert isinstance(store, RedisReplayStore)
    pttl = store._client.pttl(store.prefix + key)
    assert isinstance(pttl, int) and pttl > 0
    return pttl / 1000


def _sealed_at(instant: float, binding: sc.Binding) -> str:
    return sc.StateCodec(RING, ttl=TTL, clock=lambda: instant).seal(b"once", binding)


@pytest.mark.parametrize("offset", [-YEAR, YEAR], ids=["codec-a-year-behind", "codec-a-year-ahead"])
async def test_single_use_does_not_depend_on_the_codec_and_store_clocks_agreeing(
    store: ReplayStore, offset: int
) -> None:
    # The codec runs on an injected clock a year away from the clock the store keeps
    # time with (the machine's, or the Valkey server's). A deadline computed on one and
    # judged on the other was forgotten at once (codec behind: every token redeemed
    # twice) or kept for a year (codec ahead). A retention from now is neither.
    codec = sc.StateCodec(RING, replay=store, ttl=TTL, max_skew=MAX_SKEW, clock=lambda: time.time() + offset)
    for late in (0, TTL - 1):  # redeemed at once, and a second before its last second
        token = _sealed_at(time.time() + offset - late, ALICE)
        opened = codec.unseal(token, ALICE)
        assert _reason(codec.unseal, token, ALICE) == "replayed"
        assert await _areason(codec, token, ALICE) == "replayed"
        # Until no instance accepts it: exp + expiry_grace (0) + max_skew on this clock.
        needed = opened.expires_at + MAX_SKEW - (time.time() + offset)
        remembered = _remembered_for(store, f"default:{opened.token_id}")
        assert needed - 1 <= remembered <= needed + 1
    token = codec.seal(b"async", ALICE)
    assert (await codec.aunseal(token, ALICE)).payload == b"async"
    assert _reason(codec.unseal, token, ALICE) == "replayed"
    assert await _areason(codec, token, ALICE) == "replayed"
    await store.aclose()


def test_the_reported_frozen_clock_cannot_redeem_twice(tmp_path: Path) -> None:
    # The report: a codec on a frozen clock more than ~12 minutes behind the machine's
    # accepted every token twice with memory: and sqlite: stores.
    now = [time.time() - 3600]
    for url in ("memory:", f"sqlite:{tmp_path / 'r.db'}"):
        codec = sc.StateCodec(RING, replay=store_from_url(url), clock=lambda: now[0])
        token = codec.seal(b"x")
        codec.unseal(token)
        assert _reason(codec.unseal, token) == "replayed", url


def test_a_full_memory_store_fails_closed_and_consumes_nothing() -> None:
    store = MemoryReplayStore(max_entries=1)
    codec = sc.StateCodec(RING, replay=store)
    first, second = codec.seal(b"1", ALICE), codec.seal(b"2", ALICE)
    codec.unseal(first, ALICE)
    assert _reason(codec.unseal, second, ALICE) == "store_unavailable"
    assert len(store) == 1


def test_sqlite_locked_is_store_unavailable_and_the_token_survives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db", busy_timeout=0.1)
    codec = sc.StateCodec(RING, replay=store)
    token = codec.seal(b"t", ALICE)
    blocker = sqlite3.connect(tmp_path / "r.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    with caplog.at_level(logging.WARNING, logger="statecodec"), pytest.raises(sc.InvalidState) as info:
        codec.unseal(token, ALICE)
    assert info.value.reason == "store_unavailable"
    assert "locked" in info.value.detail and "not consumed" in info.value.detail
    assert any("sqlite replay store unavailable" in r.getMessage() for r in caplog.records)
    blocker.execute("ROLLBACK")
    blocker.close()
    assert codec.unseal(token, ALICE).payload == b"t"  # the client's retry succeeds
    assert _reason(codec.unseal, token, ALICE) == "replayed"
    store.close()


async def test_sqlite_aunseal_does_not_block_the_event_loop(tmp_path: Path) -> None:
    store = SQLiteReplayStore(tmp_path / "r.db", busy_timeout=120)  # waits for the lock until COMMIT
    codec = sc.StateCodec(RING, replay=store)
    token = codec.seal(b"t", ALICE)
    blocker = sqlite3.connect(tmp_path / "r.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # the consume will wait on this lock
    async with ticking() as ticks:
        unseal = asyncio.create_task(codec.aunseal(token, ALICE))
        async with asyncio.timeout(60):  # a loop blocked by the consume would tick only after it
            while ticks.count < 10:
                await asyncio.sleep(0.01)
        assert not unseal.done()  # the loop kept running while the store waited for the lock
        blocker.execute("COMMIT")
        assert (await unseal).payload == b"t"
    blocker.close()
    store.close()


def test_redis_down_is_store_unavailable_and_the_token_survives(valkey_outage: ValkeyServer) -> None:
    server = valkey_outage
    store = RedisReplayStore(server.url, connect_timeout=0.5)
    codec = sc.StateCodec(RING, replay=store)
    token = codec.seal(b"t", ALICE)
    server.stop()
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(token, ALICE)
    assert info.value.reason == "store_unavailable"
    assert "redis replay store" in info.value.detail
    server.start()
    assert codec.unseal(token, ALICE).payload == b"t"
    assert _reason(codec.unseal, token, ALICE) == "replayed"
    store.close()


async def test_redis_down_async_is_store_unavailable_and_the_token_survives(
    valkey_outage: ValkeyServer,
) -> None:
    server = valkey_outage
    store = RedisReplayStore(server.url, connect_timeout=0.5)
    codec = sc.StateCodec(RING, replay=store)
    tokens = [codec.seal(str(i).encode(), ALICE) for i in range(5)]
    assert (await codec.aunseal(tokens[0], ALICE)).payload == b"0"
    server.stop()
    reasons = await asyncio.gather(*(_areason(codec, t, ALICE) for t in tokens[1:]))
    assert reasons == ["store_unavailable"] * 4
    await asyncio.to_thread(server.start)
    opened = await asyncio.gather(*(codec.aunseal(t, ALICE) for t in tokens[1:]))
    assert [o.payload for o in opened] == [b"1", b"2", b"3", b"4"]
    reasons = await asyncio.gather(*(_areason(codec, t, ALICE) for t in tokens[1:]))
    assert reasons == ["replayed"] * 4
    # (tokens[0] was consumed before the restart, and this test server keeps nothing on
    # disk, so it is forgotten: see test_redis_with_persistence_remembers_across_restarts.)
    await store.aclose()


def test_redis_with_persistence_remembers_across_restarts(tmp_path: Path) -> None:
    # Why docs/replay.md asks for appendonly: without it a restart forgets every entry.
    with running(
        lambda: ValkeyServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
    ) as server:
        store = RedisReplayStore(server.url)
        codec = sc.StateCodec(RING, replay=store)
        token = codec.seal(b"t", ALICE)
        codec.unseal(token, ALICE)
        server.restart()
        assert _reason(codec.unseal, token, ALICE) == "replayed"
        store.close()
