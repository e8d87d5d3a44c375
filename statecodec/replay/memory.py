"""An in-process replay store: thread-safe, bounded, expiring. For one process and tests."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable

from .._errors import ReplayStoreError
from .base import ReplayStore


class MemoryReplayStore(ReplayStore):
    """Consumed keys in a dict, with a min-heap of expiries for cheap purging.

    ``max_entries`` bounds memory: when the store is full of live entries it refuses to
    answer (the codec then fails closed with ``store_unavailable``) rather than forget a
    live entry, which would let that token be replayed.
    """

    kind = "memory"

    def __init__(self, max_entries: int = 100_000, *, clock: Callable[[], float] = time.time) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, float] = {}
        self._expiries: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def consume(self, key: str, expires_at: float) -> bool:
        with self._lock:
            now = self._clock()
            if self._expiries and self._expiries[0][0] <= now:
                self._purge(now)  # amortised: each entry is popped once
            entries = self._entries
            if key in entries:
                return False
            if len(entries) >= self.max_entries:
                raise ReplayStoreError(f"memory replay store is full ({self.max_entries} live entries)")
            entries[key] = expires_at
            heapq.heappush(self._expiries, (expires_at, key))
            return True

    async def aconsume(self, key: str, expires_at: float) -> bool:
        # No I/O: the lock is held for microseconds, so no worker thread is needed.
        return self.consume(key, expires_at)

    def purge(self) -> int:
        """Drop expired entries now; returns how many were dropped."""
        with self._lock:
            return self._purge(self._clock())

    def _purge(self, now: float) -> int:
        dropped = 0
        heap, entries = self._expiries, self._entries
        while heap and heap[0][0] <= now:
            expiry, key = heapq.heappop(heap)
            if entries.get(key) == expiry:
                del entries[key]
                dropped += 1
        return dropped

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
