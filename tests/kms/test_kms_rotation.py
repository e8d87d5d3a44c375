"""Rotation under traffic and Vault outages, against real OpenBao servers.

Two codec instances, each with its own KeyManager (own hvac session, own 0.2 s refresh
timer with jitter), seal on one side and unseal on the other while the real rotation
job rotates and retires transit versions. Short intervals keep it to seconds; nothing
here asserts on timing, only on outcomes (no token lost, the promoted key mints).
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import threading
import time
import uuid
from typing import Any

import pytest
from fixtures_openbao import OpenBao, clean_vault_env

from statecodec import InvalidState, KeyUnavailable, StateCodec
from statecodec.kms import KeyManager, Timeline, init_keys, rotate, source_from_url
from statecodec.replay.memory import MemoryReplayStore

# D = ceil(0.2 * 1.1 + 1 + 1) = 3 s;  M = 2 + 5 + 0 + 1 = 8 s;  min retire_after = 11 s.
TIMING: dict[str, Any] = {
    "refresh_interval": 0.2,
    "jitter": 0.1,
    "max_skew": 1,
    "max_ttl": 5,
    "staleness_limit": 2,
}
TL = Timeline(**TIMING)
TTL = 5


def _wait_for(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.slow
def test_rotation_under_traffic_from_two_instances(vault_env: OpenBao) -> None:
    name = f"traffic-{uuid.uuid4().hex[:8]}"
    url = f"vault-transit:transit/{name}"
    init_keys(url)
    managers = [KeyManager(url, **TIMING).start() for _ in range(2)]
    # One shared replay store, as two instances behind a load balancer would have.
    replay = MemoryReplayStore()
    codecs = [StateCodec(m, mode="encrypt", ttl=TTL, max_skew=1, replay=replay) for m in managers]
    stop = threading.Event()
    failures: list[str] = []
    minted: list[tuple[str, int, int]] = []  # (kid, issued_at, the key's created_at) of every token
    redeemed = collections.Counter[str]()
    lock = threading.Lock()
    inbox: list[queue.Queue[tuple[float, str]]] = [queue.Queue(), queue.Queue()]

    def traffic(me: int) -> None:
        rng = random.Random(me)
        other = 1 - me
        while not stop.is_set():
            try:
                token = codecs[me].seal(f"from {me}".encode())
            except Exception as exc:
                failures.append(f"instance {me} could not mint: {exc!r}")
                return
            opened = codecs[me].verify_unbound(token)
            created_at = managers[me].keyring().require(opened.kid).created_at  # from transit metadata
            with lock:
                minted.append((opened.kid, opened.issued_at, created_at))
            # Most tokens come back at once, some up to 2 s later (a user answering).
            inbox[other].put((time.monotonic() + (rng.uniform(0, 2) if rng.random() < 0.1 else 0), token))
            while not inbox[me].empty():
                due, theirs = inbox[me].get()
                if due > time.monotonic():
                    inbox[me].put((due, theirs))
                    break
                try:
                    got = codecs[me].unseal(theirs)
                except InvalidState as exc:
                    failures.append(f"instance {me} rejected a token of instance {other}: {exc}")
                    return
                with lock:
                    redeemed[got.kid] += 1
            time.sleep(0.0005)

    def rotation_job() -> None:
        # Every 0.3 s, like a too-eager cron: rotates only when the newest version is 1.5 s old.
        while not stop.wait(0.3):
            try:
                rotate(url, min_age=1.5, retire_after=TL.min_retire_after, timeline=TL)
            except Exception as exc:
                failures.append(f"rotation job failed: {exc!r}")
                return

    threads = [threading.Thread(target=traffic, args=(i,)) for i in range(2)]
    threads.append(threading.Thread(target=rotation_job))
    for t in threads:
        t.start()
    root = vault_env.client()
    try:
        _wait_for(
            lambda: root.secrets.transit.read_key(name)["data"]["min_decryption_version"] >= 3 or failures,
            timeout=90,
            what="two retirements",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert failures == []

    # Drain what is still in flight: all of it must unseal too.
    for me in (0, 1):
        while not inbox[me].empty():
            _, token = inbox[me].get()
            redeemed[codecs[me].unseal(token).kid] += 1

    meta = root.secrets.transit.read_key(name)["data"]
    assert meta["latest_version"] >= 4, "rotated several times"
    assert sum(redeemed.values()) == len(minted) >= 2000
    assert len({kid for kid, _, _ in minted}) >= 3, "tokens were minted with several successive keys"
    # Every token came from a promoted key (or from v1 while nothing else existed).
    for kid, iat, created_at in minted:
        if kid != f"{name}-v1":
            assert created_at + TL.promotion_delay <= iat, f"{kid} minted before its promotion"

    # After the last rotation settles, both instances mint with the newest version.
    root.secrets.transit.rotate_key(name)
    newest = f"{name}-v{root.secrets.transit.read_key(name)['data']['latest_version']}"
    for m in managers:
        _wait_for(lambda m=m: m.signing_key().kid == newest, what=f"{newest} promoted")
    for c in codecs:
        assert c.verify_unbound(c.seal(b"x")).kid == newest
    retired = [f"{name}-v{v}" for v in range(1, meta["min_decryption_version"])]
    for m in managers:
        _wait_for(lambda m=m: not set(retired) & set(m.keyring().kids), what="retired versions dropped")
        m.stop()


@pytest.mark.slow
def test_vault_sealed_then_stopped_then_back(
    openbao_persistent: OpenBao,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Outages: keep verifying and minting, stop minting after the staleness limit, recover by itself."""
    server = openbao_persistent
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("VAULT_ADDR", server.addr)
    monkeypatch.setenv("VAULT_TOKEN", server.token)
    name = "outage"
    url = f"vault-transit:transit/{name}"
    init_keys(url)
    # The fake part of the clock: skipping ahead past the staleness limit instead of sleeping.
    skip = [0.0]

    def clock() -> float:
        return time.time() + skip[0]

    timing = {**TIMING, "staleness_limit": 5, "clock": clock}
    managers = [
        KeyManager(source_from_url(url, retries=1, backoff=0.01, timeout=2), **timing).start()
        for _ in range(2)
    ]
    a, b = (StateCodec(m, ttl=60, max_skew=1, clock=clock) for m in managers)
    before = [a.seal(b"before %d" % i) for i in range(4)]
    caplog.set_level(logging.DEBUG, logger="statecodec.kms")

    def failures_logged(cause: str) -> int:
        return sum(cause in r.getMessage() for r in caplog.records)

    for phase, cause, break_it, fix_it in (
        ("sealed", "sealed", server.seal, server.unseal),
        ("stopped", "connection refused", server.stop, lambda: (server.start(), server.unseal())),
    ):
        caplog.clear()
        break_it()
        # Each manager notices, logs a WARNING once, then keeps failing quietly (DEBUG).
        _wait_for(lambda c=cause: failures_logged(c) >= 6, what=f"refreshes failing while {phase}")
        warnings = [
            r for r in caplog.records if r.levelno == logging.WARNING and "cannot refresh" in r.getMessage()
        ]
        assert len(warnings) == 2, f"one warning per manager per outage ({phase})"
        assert cause in warnings[0].getMessage()
        # Within the staleness limit: verify and mint as usual.
        token = b.seal(f"during {phase}".encode())
        assert a.unseal(token).payload == f"during {phase}".encode()
        assert b.unseal(before.pop()).payload.startswith(b"before")
        # Past it: minting stops with a clear error, verification goes on.
        skip[0] += 6
        with pytest.raises(KeyUnavailable, match="staleness limit") as info:
            a.seal(b"too stale")
        assert cause in str(info.value)
        late = [
            r for r in caplog.records if r.levelno == logging.ERROR and "minting stopped" in r.getMessage()
        ]
        assert len(late) == 1
        assert a.unseal(before.pop()).payload.startswith(b"before")
        fix_it()
        for m in managers:
            _wait_for(lambda m=m: not m.status()["stale"], what=f"recovery after {phase}")
        assert b.unseal(a.seal(b"again")).payload == b"again"
        # The refresh thread publishes the new ring, then logs the recovery: wait for the
        # line rather than assume the thread already got that far (it may not have, under load).
        _wait_for(
            lambda: any(
                "load again" in r.getMessage() and "minting resumed" in r.getMessage() for r in caplog.records
            ),
            what=f"the recovery logged after {phase}",
        )
    for m in managers:
        m.stop()
