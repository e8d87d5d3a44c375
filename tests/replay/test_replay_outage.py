"""The Valkey server dies mid-run and comes back: fail closed, then carry on.

While the server is down every unseal fails with ``store_unavailable`` (never accepted
unchecked, never reported as a replay), and every token refused that way redeems
normally once the server is back.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import replay_outcomes
from fixtures_valkey import ValkeyServer
from processes import wait_until

import statecodec as sc
from statecodec.replay import RedisReplayStore

RING = sc.KeyRing.generate("k1")
BINDING = sc.Binding(principal="alice", audience="svc", method="tools/call", target="t")


def _attempt(codec: sc.StateCodec, token: str) -> str:
    return replay_outcomes.outcome(codec, token, BINDING)


async def _aattempt(codec: sc.StateCodec, token: str) -> str:
    return await replay_outcomes.aoutcome(codec, token, BINDING)


def test_server_stopped_mid_run_then_restarted(valkey_outage: ValkeyServer) -> None:
    store = RedisReplayStore(valkey_outage.url, connect_timeout=0.5, socket_timeout=0.5)
    codec = sc.StateCodec(RING, replay=store)
    results: list[tuple[str, str, str]] = []  # (phase at start, phase at end, outcome)
    phase = "up"
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            token = codec.seal(b"x", BINDING)
            before = phase
            outcome = _attempt(codec, token)
            results.append((before, phase, outcome))
            if outcome == "store_unavailable":
                refused.append(token)
            time.sleep(0.002)

    def settled(name: str) -> None:
        # Waits for calls made wholly in this phase, however slowly the machine runs them.
        wait_until(lambda: sum(b == a == name for b, a, _ in results) >= 5, f"5 calls {name}")

    refused: list[str] = []
    runner = threading.Thread(target=traffic)
    runner.start()
    try:
        settled("up")
        phase = "stopping"
        valkey_outage.stop()
        phase = "down"
        settled("down")
        phase = "restarting"
        valkey_outage.start()
        phase = "back"
        settled("back")
    finally:
        stop.set()
        runner.join()

    by_phase: dict[str, set[str]] = {}
    for before, after, outcome in results:
        if before == after:  # calls that straddle a transition may go either way
            by_phase.setdefault(before, set()).add(outcome)
    assert by_phase["up"] == {"ok"}
    assert by_phase["down"] == {"store_unavailable"}
    assert by_phase["back"] == {"ok"}
    # Around the transitions only these two outcomes are possible: nothing else, ever.
    assert {outcome for *_, outcome in results} == {"ok", "store_unavailable"}
    # Every refused token was left unconsumed: it redeems now, once.
    assert refused
    assert [_attempt(codec, token) for token in refused] == ["ok"] * len(refused)
    assert {_attempt(codec, token) for token in refused} == {"replayed"}
    store.close()


async def test_server_stopped_mid_run_then_restarted_async(valkey_outage: ValkeyServer) -> None:
    store = RedisReplayStore(valkey_outage.url, connect_timeout=0.5, socket_timeout=0.5)
    codec = sc.StateCodec(RING, replay=store)

    async def burst(n: int) -> tuple[list[str], list[str]]:
        tokens = [codec.seal(b"x", BINDING) for _ in range(n)]
        return tokens, list(await asyncio.gather(*(_aattempt(codec, t) for t in tokens)))

    _, up = await burst(50)
    assert set(up) == {"ok"}
    await asyncio.to_thread(valkey_outage.stop)
    refused, down = await burst(50)
    assert set(down) == {"store_unavailable"}
    await asyncio.to_thread(valkey_outage.start)
    _, back = await burst(50)
    assert set(back) == {"ok"}
    assert await asyncio.gather(*(_aattempt(codec, t) for t in refused)) == ["ok"] * 50
    assert set(await asyncio.gather(*(_aattempt(codec, t) for t in refused))) == {"replayed"}
    await store.aclose()


@pytest.mark.parametrize(
    ("retries", "after_restart"),
    [
        (1, {"replayed"}),
        # Without a retry the async client may use its dead pooled connection once, and fail
        # closed; whether it already knows that connection died when the call comes is a
        # matter of timing, so both answers are right, and "ok" never is (that is why the
        # default is one retry: safe, see RedisReplayStore).
        (0, {"replayed", "store_unavailable"}),
    ],
)
def test_a_restart_between_two_calls(
    valkey_outage: ValkeyServer, retries: int, after_restart: set[str]
) -> None:
    # Pooled connections die with the server. The sync client notices before using one.
    store = RedisReplayStore(valkey_outage.url, retries=retries)
    codec = sc.StateCodec(RING, replay=store)

    async def once(token: str) -> str:
        return await _aattempt(codec, token)

    async def scenario() -> list[str]:
        outcomes = [_attempt(codec, codec.seal(b"x", BINDING)), await once(codec.seal(b"x", BINDING))]
        await asyncio.to_thread(valkey_outage.restart)
        token = codec.seal(b"x", BINDING)
        outcomes += [_attempt(codec, token), await once(token), await once(codec.seal(b"x", BINDING))]
        await store.aclose()
        return outcomes

    sync_up, async_up, sync_after, async_again, async_fresh = asyncio.run(scenario())
    assert [sync_up, async_up, sync_after, async_fresh] == ["ok"] * 4
    assert async_again in after_restart  # the token the sync call just redeemed: never accepted twice
