"""Rotation under load: 10,000 complete MRTR flows (more until keys have rotated three times)
across two servers while keys rotate.

Two processes of the deploy scenario (statecodec._demo, lowlevel flavour) sit behind
an alternating router: round 1 of flow *i* goes to instance *i mod 2*, round 2
(with the sealed ``requestState``) to the other one. Unlike the adapter tests, their
keys come from a :class:`~statecodec.kms.KeyManager` on an OpenBao transit key (the
example itself loads a fixed ring, so this module doubles as the small launcher that
swaps the key provider and reuses everything else: ``python tests/kms/test_kms_rotation_flows.py
serve ...``; processes are started and stopped with tests/fixtures_mcp.py's helpers).
Meanwhile ``statecodec.kms.rotate`` runs every few seconds with a compressed timeline,
so keys are created, promoted and retired many times during the run.

Every tenth flow also replays its round 2 to the instance that did not redeem it.
Required: zero failed flows, every replay rejected with -32602, and the servers' logs
show no rejection other than those replays.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOWS = int(os.environ.get("STATECODEC_ROTATION_FLOWS", "10000"))
CONCURRENCY = 8
REPLAY_EVERY = 10
ROTATE_EVERY = 3.0
# The load goes on past FLOWS until keys have rotated three times and three keys minted
# tokens, so that a fast machine cannot finish before the rotations it is meant to meet;
# this bounds how long it may take to get there.
ROTATIONS_WITHIN = 300.0
# A compressed timeline, the same in the servers and in the rotation job.
# max_skew 2 s: the processes share one clock, but on a loaded machine a refresh can run
# late, and D = refresh * (1 + jitter) + max_skew + 1 s must cover it (docs/keys.md: "plus
# slack for slow refreshes"); with 0 an instance once met a key its peer had just promoted.
TIMING = {"refresh_interval": 1.0, "jitter": 0.1, "max_skew": 2.0, "max_ttl": 30.0, "expiry_grace": 0.0,
          "staleness_limit": 5.0}  # fmt: skip
TTL = 30


# ------------------------------------------------------------ the server process
def serve(argv: list[str]) -> None:
    """The deploy example with its keys from a KeyManager (VAULT_ADDR/VAULT_TOKEN in the env)."""
    from statecodec import StateCodec  # noqa: PLC0415 - only in the server process
    from statecodec.kms import KeyManager  # noqa: PLC0415
    from statecodec.replay import store_from_url  # noqa: PLC0415

    parser = argparse.ArgumentParser()
    for name in ("--keys", "--replay", "--instance", "--mode"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    from statecodec._demo._serve import serve_http  # noqa: PLC0415
    from statecodec._demo._servers import build_lowlevel  # noqa: PLC0415

    manager = KeyManager(args.keys, **TIMING).start()
    codec = StateCodec(
        manager,
        mode=args.mode,
        ttl=TTL,
        max_skew=int(TIMING["max_skew"]),
        expiry_grace=int(TIMING["expiry_grace"]),
        replay=store_from_url(args.replay),
        namespace="deploy",
    )
    http_app, _ = build_lowlevel(codec, args.instance, auth=True)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, force=True,
        format=f"[{args.instance}] %(levelname)s %(name)s: %(message)s",
    )  # fmt: skip
    logging.getLogger("deploy").setLevel(logging.WARNING)  # 20,000 round lines would only slow us
    try:
        # Idle connections outlive the run. With uvicorn's 5 s a request sent on a pooled
        # connection just as the server closes it for idleness meets a reset (ReadError): an
        # HTTP race, not a failed flow, seen about once in 10,000 flows at load 6.
        asyncio.run(serve_http(http_app(), "127.0.0.1", 0, keep_alive=3600))
    finally:
        manager.stop()


# ----------------------------------------------------------------------- the test
class Rotator(threading.Thread):
    """The scheduled rotation job, every ROTATE_EVERY seconds, until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(name="rotation-job", daemon=True)
        from statecodec.kms import Timeline  # noqa: PLC0415

        self.url = url
        self.timeline = Timeline(**TIMING)
        self.stop_event = threading.Event()
        self.runs = self.rotated = 0
        self.retired: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        from statecodec.kms import rotate  # noqa: PLC0415

        while not self.stop_event.wait(ROTATE_EVERY):
            try:
                report = rotate(
                    self.url,
                    min_age=ROTATE_EVERY,
                    retire_after=self.timeline.min_retire_after,
                    timeline=self.timeline,
                )
            except Exception as exc:  # recorded and asserted on: the job must not fail
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            self.runs += 1
            self.rotated += report.rotated
            self.retired += list(report.retired)


class Load:
    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.failures: list[str] = []
        self.flows_run = 0
        self.replays_sent = 0
        self.replays_accepted = 0
        self.replay_errors: Counter[str] = Counter()
        self.kids: Counter[str] = Counter()
        self.deployed_on: Counter[str] = Counter()

    async def flow(self, http: Any, i: int) -> None:
        from fixtures_proxy import ANSWERS, META, TOOL  # noqa: PLC0415 - tests/ is not on the server's path

        from statecodec import _format  # noqa: PLC0415

        params = {"name": TOOL, "arguments": {"version": f"1.{i}"}, "_meta": META}
        first, second = self.urls[i % 2], self.urls[(i + 1) % 2]
        try:
            r1 = await http.post(
                first, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
            )
            result = r1.json()["result"]
            assert result["resultType"] == "input_required", result
            state = result["requestState"]
            self.kids[_format.parse(state, 8192).kid] += 1
            retry = {**params, "requestState": state, "inputResponses": ANSWERS}
            body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": retry}
            r2 = await http.post(second, json=body)
            done = r2.json()["result"]
            assert done["resultType"] == "complete" and done["structuredContent"]["deployed"] == f"1.{i}", (
                done
            )
            self.deployed_on[done["structuredContent"]["deployed_on"]] += 1
        except Exception as exc:  # every failure is counted and shown, never raised mid-run
            self.failures.append(f"flow {i}: {type(exc).__name__}: {str(exc)[:300]}")
            return
        if i % REPLAY_EVERY == 0:
            self.replays_sent += 1
            replay = await http.post(first, json={**body, "id": 3})
            answer = replay.json()
            if "result" in answer:
                self.replays_accepted += 1
            else:
                self.replay_errors[f"{answer['error']['code']} {answer['error']['message']}"] += 1

    async def run(self, flows: int, enough: Callable[[], bool]) -> float:
        """At least ``flows`` flows, then more until ``enough()`` (at most ROTATIONS_WITHIN s).

        Flow numbers are drawn in order and, once a worker stops, every later draw stops
        too (``enough`` only becomes true, the clock only moves on): the flows run are
        0 .. flows_run - 1, which the replay count relies on.
        """
        import httpx  # noqa: PLC0415
        from fixtures_proxy import TOOL, modern_headers  # noqa: PLC0415

        numbers = itertools.count()
        # No client-side keep-alive expiry. httpcore's pool closes an idle connection whose
        # expiry has passed even when it was just handed to a request that has not started
        # yet; on a loaded machine that request then fails with ReadError
        # (ClosedResourceError <- "pop from an empty deque", seen with expiries of 1 s and
        # of 5 s). Connections the server closes are still dropped: the pool checks an idle
        # connection for EOF before it reuses it.
        limits = httpx.Limits(
            max_connections=CONCURRENCY * 2, max_keepalive_connections=CONCURRENCY * 2, keepalive_expiry=None
        )
        headers = {**modern_headers("tools/call", TOOL), "authorization": "Bearer alice-token"}
        async with httpx.AsyncClient(timeout=60, headers=headers, limits=limits) as http:

            def go_on(i: int) -> bool:
                return i < flows or (not enough() and time.monotonic() < started + ROTATIONS_WITHIN)

            async def worker() -> None:
                while go_on(i := next(numbers)):
                    self.flows_run += 1
                    await self.flow(http, i)

            started = time.monotonic()
            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_rotation_under_load_zero_failed_flows_zero_replays(
    vault_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fixtures_mcp import Instance  # noqa: PLC0415
    from processes import start_all  # noqa: PLC0415

    from statecodec.kms import init_keys  # noqa: PLC0415

    url = f"vault-transit:transit/rotation-{uuid.uuid4().hex[:8]}"
    init_keys(url)
    replay = f"sqlite:{tmp_path / 'replay.sqlite3'}"
    instances: list[Instance] = []
    commands = [
        (name, [sys.executable, __file__, "serve", "--keys", url, "--replay", replay, "--instance", name,
                "--mode", "sign"], tmp_path / f"{name}.log")
        for name in ("A", "B")
    ]  # fmt: skip
    rotator = Rotator(url)
    try:  # start_all stops both if one does not start
        instances = [Instance(*started) for started in await asyncio.to_thread(start_all, commands, "READY ")]
        rotator.start()
        load = Load([i.url for i in instances])
        elapsed = await load.run(FLOWS, lambda: rotator.rotated >= 3 and len(load.kids) >= 3)
    finally:
        rotator.stop_event.set()
        for instance in instances:
            instance.stop()
        rotator.join(timeout=30)

    logs = "\n".join(i.log() for i in instances)
    rejections = Counter(
        line.split("reason=")[1].split()[0] for line in logs.splitlines() if "rejected requestState" in line
    )
    summary = (
        f"\nrotation under load: {load.flows_run} flows in {elapsed:.0f}s "
        f"({load.flows_run / elapsed:.0f} flows/s, "
        f"concurrency {CONCURRENCY}), {len(load.failures)} failed; {load.replays_sent} replays sent, "
        f"{load.replays_accepted} accepted; rotation job ran {rotator.runs}x, rotated {rotator.rotated}x, "
        f"retired {len(rotator.retired)} versions; {len(load.kids)} keys minted tokens; deployed on "
        f"{dict(load.deployed_on)}; server-side rejections {dict(rejections)}"
    )
    with capsys.disabled():
        print(summary)
    assert load.failures == [], summary + "\n" + "\n".join(load.failures[:20])
    assert load.replays_accepted == 0, summary
    assert load.replays_sent == len(range(0, load.flows_run, REPLAY_EVERY))
    assert set(load.replay_errors) == {"-32602 Invalid or expired requestState"}, load.replay_errors
    assert rejections == Counter({"replayed": load.replays_sent}), summary
    assert rotator.errors == [], rotator.errors
    assert rotator.rotated >= 3 and len(load.kids) >= 3, (
        "keys must actually rotate during the run: " + summary
    )
    assert load.deployed_on["A"] > 0 and load.deployed_on["B"] > 0
    assert "Traceback" not in logs and " ERROR " not in logs, logs[-3000:]


if __name__ == "__main__" and sys.argv[1:2] == ["serve"]:
    serve(sys.argv[2:])
