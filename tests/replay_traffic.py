"""Clients redeeming fresh tokens through one codec while a replay store fails over.

Sync clients run in threads (``unseal``), async ones as tasks of one event loop in
another thread (``aunseal``), so both paths of the store cross the failover. Every
attempt's outcome is kept per token, and each token that failed closed
(``store_unavailable``) is retried later, as a client would: the failover tests then
hold that every token was accepted exactly once. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import uuid
from dataclasses import dataclass

from processes import wait_until
from replay_outcomes import aoutcome, outcome

import statecodec as sc


@dataclass(frozen=True)
class Pace:
    """Seconds a client waits: after each attempt, after one that failed closed, and with no token."""

    after: float = 0.0
    after_refusal: float = 0.0
    idle: float = 0.01


class Traffic:
    """Threads and tasks redeeming tokens sealed for ``binding`` until :meth:`finish`."""

    def __init__(
        self,
        codec: sc.StateCodec,
        binding: sc.Binding,
        *,
        pace: Pace,
        bound: float,
        threads: int = 3,
        tasks: int = 3,
    ) -> None:
        self.codec = codec
        self.binding = binding
        self.pace = pace
        self.bound = bound
        self.outcomes: dict[str, list[str]] = {}
        self._retry: collections.deque[str] = collections.deque()
        self._in_flight = 0  # tokens handed to a client whose outcome is not recorded yet
        self._lock = threading.Lock()
        self._producing = True
        self._stop = threading.Event()
        self._workers = [threading.Thread(target=self._sync_client) for _ in range(threads)]
        self._workers.append(threading.Thread(target=asyncio.run, args=(self._async_clients(tasks),)))
        for worker in self._workers:
            worker.start()

    def count(self, outcome: str) -> int:
        with self._lock:
            return sum(o.count(outcome) for o in self.outcomes.values())

    def accepted(self) -> list[str]:
        with self._lock:
            return [token for token, outcomes in self.outcomes.items() if "ok" in outcomes]

    def finish(self) -> None:
        """No new tokens; wait until every token that failed closed has been accepted."""
        with self._lock:
            self._producing = False

        def settled() -> bool:
            # A token a client is redeeming right now may still fail closed and come back.
            with self._lock:
                return not self._retry and not self._in_flight

        try:
            wait_until(settled, "every token that failed closed is accepted", self.bound)
        finally:
            self._stop.set()
            for worker in self._workers:
                worker.join(timeout=self.bound)

    def _next(self) -> str | None:
        with self._lock:
            if self._retry:
                self._in_flight += 1
                return self._retry.popleft()
            if not self._producing:
                return None
            token = self.codec.seal(uuid.uuid4().bytes, self.binding)
            self.outcomes[token] = []
            self._in_flight += 1
            return token

    def _record(self, token: str, outcome: str) -> float:
        """Keeps the outcome; the seconds the client waits before its next attempt."""
        with self._lock:
            self._in_flight -= 1
            self.outcomes[token].append(outcome)
            if outcome != "store_unavailable":
                return self.pace.after
            self._retry.append(token)
            return self.pace.after + self.pace.after_refusal

    def _sync_client(self) -> None:
        while not self._stop.is_set():
            token = self._next()
            if token is None:
                self._stop.wait(self.pace.idle)
                continue
            if pause := self._record(token, outcome(self.codec, token, self.binding)):
                self._stop.wait(pause)

    async def _async_clients(self, tasks: int) -> None:
        async def client() -> None:
            while not self._stop.is_set():
                token = self._next()
                if token is None:
                    await asyncio.sleep(self.pace.idle)
                    continue
                if pause := self._record(token, await aoutcome(self.codec, token, self.binding)):
                    await asyncio.sleep(pause)  # none at all when not paced: the next round at once

        await asyncio.gather(*(client() for _ in range(tasks)))
        assert self.codec.replay is not None
        await self.codec.replay.aclose()
