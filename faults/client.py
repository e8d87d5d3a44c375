"""The workload: honest clients and attackers, each a thread (sync API) or an event loop (async API).

``python -m faults.client ROLE...`` runs the roles given (``honest:sync:c1``,
``attacker:async:a1``) in one process: one role per process for the shared stores, every
role in one process for the memory store (which only one process can share).

An honest client mints a token (the real :class:`StateCodec`, the run's shared keys),
publishes it to the attackers (a line appended to the tokens file), waits a few
milliseconds so that the copies race it, and redeems it, retrying on ``store_unavailable``
with jittered exponential backoff until it is accepted, told ``replayed``, rejected for
another reason, or gives up. An attacker redeems a copy of every published token, once,
retrying a failed-closed attempt a few times. Every attempt goes to the history.

The codec's clock is the host's plus an offset the nemesis may change at any time (a file
per process, read every 50 ms): a clock jump of this one process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from statecodec import Binding, InvalidState, KeyRing, StateCodec
from statecodec.replay import store_from_url

from .history import Attempt, HistoryWriter, Invoke

BINDING = Binding(principal="faults", audience="faults", method="tools/call", target="t", arguments={})
TTL = 600
GIVE_UP = 30.0  # seconds an honest client keeps retrying one token
ATTACKER_RETRIES = 3
THINK = 0.01  # at most this long between two tokens of an honest client (the rest of its flow)


@dataclass
class Run:
    """What every role of a process shares."""

    workdir: Path
    store_url: str
    seed: int
    history: HistoryWriter
    codec: StateCodec

    @property
    def stopped(self) -> bool:
        return (self.workdir / "stop").exists()

    @property
    def tokens_path(self) -> Path:
        return self.workdir / "tokens.txt"


class Clock:
    """time.time() plus an offset read from a file the nemesis writes (absent: 0)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0.0
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        while True:
            with contextlib.suppress(OSError, ValueError):
                self.offset = float(self.path.read_text() or 0) if self.path.exists() else 0.0
            time.sleep(0.05)

    def __call__(self) -> float:
        return time.time() + self.offset


def classify(exc: InvalidState | None) -> tuple[str, str]:
    if exc is None:
        return "accepted", ""
    if exc.reason in ("replayed", "store_unavailable"):
        return exc.reason, ""
    return "error", exc.reason


class Role:
    def __init__(self, run: Run, role: str, api: str, name: str) -> None:
        self.run, self.role, self.api, self.name = run, role, api, name
        self.rng = random.Random(f"{run.seed}:{name}")

    def _record(self, token_id: str, start: float, wall: float, exc: InvalidState | None) -> str:
        outcome, reason = classify(exc)
        self.run.history.write(Attempt(
            token=token_id, client=self.name, role=self.role, api=self.api, process=os.getpid(),
            start=start, end=time.monotonic(), outcome=outcome, reason=reason,
            detail="" if exc is None or outcome == "replayed" else exc.detail[:300],
            wall_start=wall, wall_end=time.time(),
        ))  # fmt: skip
        return outcome

    def _invoke(self, token_id: str) -> tuple[float, float]:
        start, wall = time.monotonic(), time.time()
        self.run.history.write(Invoke(token_id, self.name, self.role, os.getpid(), start))
        return start, wall

    def redeem(self, token_id: str, token: str) -> str:
        start, wall = self._invoke(token_id)
        try:
            self.run.codec.unseal(token, BINDING)
        except InvalidState as exc:
            return self._record(token_id, start, wall, exc)
        return self._record(token_id, start, wall, None)

    async def aredeem(self, token_id: str, token: str) -> str:
        start, wall = self._invoke(token_id)
        try:
            await self.run.codec.aunseal(token, BINDING)
        except InvalidState as exc:
            return self._record(token_id, start, wall, exc)
        return self._record(token_id, start, wall, None)

    # ------------------------------------------------------------------ honest
    def mint(self) -> tuple[str, str]:
        token = self.run.codec.seal(os.urandom(8), BINDING, ttl=TTL)
        token_id = self.run.codec.verify_unbound(token).token_id
        with self.run.tokens_path.open("a", encoding="utf-8") as tokens:
            tokens.write(f"{token_id} {token}\n")
        return token_id, token

    def backoffs(self) -> Iterator[float]:
        delay = 0.02
        deadline = time.monotonic() + GIVE_UP
        while time.monotonic() < deadline and not self.run.stopped:
            yield delay * self.rng.uniform(0.5, 1.5)
            delay = min(delay * 2, 1.0)

    def gave_up(self, token_id: str) -> None:
        """Record that the retries ran out (the checker's *stuck*), unless the run is what ended them."""
        if not self.run.stopped:
            self.run.history.event("gave_up", token=token_id, client=self.name, pid=os.getpid())

    def race_delay(self) -> float:
        """How long an honest client waits between publishing a token and redeeming it.

        Half the time not at all (the honest client usually wins), else up to 3 ms (the
        copies usually win): both orders, and real races between them.
        """
        return 0.0 if self.rng.random() < 0.5 else self.rng.uniform(0.0, 0.003)

    def honest(self) -> None:
        while not self.run.stopped:
            time.sleep(self.rng.uniform(0.0, THINK))
            token_id, token = self.mint()
            time.sleep(self.race_delay())
            if self.redeem(token_id, token) != "store_unavailable":
                continue
            for delay in self.backoffs():
                time.sleep(delay)
                if self.redeem(token_id, token) != "store_unavailable":
                    break
            else:
                self.gave_up(token_id)

    async def ahonest(self) -> None:
        while not self.run.stopped:
            await asyncio.sleep(self.rng.uniform(0.0, THINK))
            token_id, token = self.mint()
            await asyncio.sleep(self.race_delay())
            if await self.aredeem(token_id, token) != "store_unavailable":
                continue
            for delay in self.backoffs():
                await asyncio.sleep(delay)
                if await self.aredeem(token_id, token) != "store_unavailable":
                    break
            else:
                self.gave_up(token_id)

    # ------------------------------------------------------------------ attacker
    def published(self) -> Iterator[list[tuple[str, str]]]:
        """Batches of tokens published since the attacker started, until the run stops."""
        self.run.tokens_path.touch()
        with self.run.tokens_path.open(encoding="utf-8") as tokens:
            tokens.seek(0, os.SEEK_END)  # a replacement attacker starts with the new tokens
            pending = ""
            while not self.run.stopped:
                pending += tokens.read()
                lines, _, pending = pending.rpartition("\n")
                if lines:
                    yield [tuple(line.split(" ", 1)) for line in lines.split("\n")]  # type: ignore[misc]
                else:
                    time.sleep(0.002)

    def attack_one(self, token_id: str, token: str) -> None:
        for _ in range(ATTACKER_RETRIES):
            if self.redeem(token_id, token) != "store_unavailable":
                return
            time.sleep(self.rng.uniform(0.05, 0.2))

    async def aattack_one(self, token_id: str, token: str) -> None:
        for _ in range(ATTACKER_RETRIES):
            if await self.aredeem(token_id, token) != "store_unavailable":
                return
            await asyncio.sleep(self.rng.uniform(0.05, 0.2))

    def attacker(self) -> None:
        with ThreadPoolExecutor(8) as pool:
            for batch in self.published():
                list(pool.map(lambda pair: self.attack_one(*pair), batch))

    async def aattacker(self) -> None:
        for batch in self.published():
            await asyncio.gather(*(self.aattack_one(*pair) for pair in batch))

    def main(self) -> Callable[[], None]:
        if self.api == "async":
            body = self.ahonest if self.role == "honest" else self.aattacker
            return lambda: asyncio.run(body())
        return self.honest if self.role == "honest" else self.attacker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m faults.client")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--store", required=True, help="the replay store's URL")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--name", required=True, help="this process's name (its clock file's)")
    parser.add_argument("roles", nargs="+", help="role:api:name, e.g. honest:sync:c1")
    args = parser.parse_args(argv)
    ring = KeyRing.from_json((args.workdir / "keys.json").read_text())
    store = store_from_url(args.store)
    clock = Clock(args.workdir / "clock" / args.name)
    codec = StateCodec(ring, replay=store, clock=clock, namespace="faults")
    run = Run(args.workdir, args.store, args.seed, HistoryWriter(args.workdir / "history.jsonl"), codec)
    run.history.event("ready", name=args.name, pid=os.getpid())
    threads = []
    for spec in args.roles:
        role, api, name = spec.split(":")
        threads.append(threading.Thread(target=Role(run, role, api, name).main(), name=name))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()


if __name__ == "__main__":
    main()
