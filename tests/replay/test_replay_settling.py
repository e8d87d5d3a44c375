"""No false replays: an entry whose redemption is not decided yet is answered like an outage.

With ``wait=N`` a consume's entry exists on the primary from its ``SET`` on, while its
``WAIT`` for the replicas is still running; if the WAIT falls short the token is not
accepted and the entry is taken back. Another instance redeeming the same token in
between used to be told ``replayed`` (-32602: the client abandons a flow nobody redeemed).
Now it is told ``store_unavailable`` (-32603, retry) until the entry is settled: taken
back (then the retry redeems the token) or old enough that its writer has decided (then
``replayed``). Real servers: a Valkey primary whose replica is SIGSTOPped, so that WAIT
blocks for real while a second client redeems the token.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import redis
from fixtures_valkey import ValkeyServer, in_sync, wait_until
from replay_outcomes import aoutcome, outcome

import statecodec as sc
from statecodec.replay import store_from_url

BINDING = sc.Binding(principal="alice", audience="svc", method="tools/call", target="pay")


def blocked_in_wait(admin: redis.Redis) -> bool:
    return any(c["cmd"] == "wait" and "b" in c["flags"] for c in admin.client_list())


def test_a_token_whose_wait_is_pending_is_not_replayed_and_redeems_once_settled(
    valkey_primary_replica: tuple[ValkeyServer, ValkeyServer],
) -> None:
    primary, replica = valkey_primary_replica
    admin = redis.Redis(port=primary.port, decode_responses=True)
    url = f"{primary.url}?wait=1&wait_timeout=3&socket_timeout=5&retries=0&prefix=s:"
    ring = sc.KeyRing.generate("k1")
    first = sc.StateCodec(ring, replay=store_from_url(url))
    second = sc.StateCodec(ring, replay=store_from_url(url))  # another instance of the fleet
    token = first.seal(b"pay", BINDING)
    outcomes: list[str] = []
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        waiting = threading.Thread(target=lambda: outcomes.append(outcome(first, token, BINDING)))
        waiting.start()
        wait_until(lambda: blocked_in_wait(admin), "the first redemption blocks in WAIT")
        # The entry is there, undecided: not a replay, an outage (retry).
        assert outcome(second, token, BINDING) == "store_unavailable"
        assert asyncio.run(aoutcome(second, token, BINDING)) == "store_unavailable"
        waiting.join(timeout=60)
        assert outcomes == ["store_unavailable"]  # WAIT fell short: not accepted, taken back
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    wait_until(lambda: in_sync(replica), "the replica is in sync again")
    redeemed = time.monotonic()
    assert outcome(second, token, BINDING) == "ok"  # the retry redeems it, once
    # From the first instance, the second's fresh entry is undecided until its settle window
    # (wait_timeout + socket_timeout x (retries + 1) = 8 s) has passed; then it is a replay.
    seen = []
    first_look = time.monotonic()
    deadline = first_look + 60
    while (reason := outcome(first, token, BINDING)) != "replayed":
        assert reason == "store_unavailable" and time.monotonic() < deadline, reason
        seen.append(reason)
        time.sleep(0.5)
    # (Unless this machine took the whole window to get to the first look.)
    assert seen or first_look - redeemed >= 8, "a fresh entry of another instance read as settled at once"
    assert outcome(second, token, BINDING) == "replayed"  # its own acceptance: known at once
    for codec in (first, second):
        assert codec.replay is not None
        codec.replay.close()


def test_a_settled_entry_is_replayed_and_the_window_is_bounded(
    valkey_primary_replica: tuple[ValkeyServer, ValkeyServer],
) -> None:
    """An accepted entry is `replayed` everywhere once its settle window (here 2.2 s) has passed."""
    primary, _ = valkey_primary_replica
    url = f"{primary.url}?wait=1&wait_timeout=0.2&socket_timeout=2&retries=0&prefix=b:"
    one, other = store_from_url(url), store_from_url(url)
    started = time.monotonic()
    assert one.consume("k", 60) is True
    assert one.consume("k", 60) is False  # its own acceptance
    assert one.is_consumed("k") is True
    try:  # the read-only check tells an undecided entry too (unless this machine took 2.2 s to get here)
        assert other.is_consumed("k") is True
        assert time.monotonic() - started >= 2.2
    except sc.ReplayStoreError as exc:
        assert "not settled yet" in str(exc)
    while True:
        try:
            assert other.consume("k", 60) is False
            break
        except sc.ReplayStoreError as exc:
            assert "not settled yet" in str(exc)
            assert time.monotonic() - started < 30
            time.sleep(0.05)
    assert other.is_consumed("k") is True
    assert not other.consume("k", 60)  # never accepted twice, before or after
    one.close()
    other.close()
