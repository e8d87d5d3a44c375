"""An in-process replay store: thread-safe, bounded, expiring. For one process and tests."""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable
from typing import Final

from .._errors import ReplayStoreError
from .base import ReplayStore, invalid_retention

# A module global: reading it is cheaper than math.inf's attribute lookup, on every unseal.
_INFINITY: Final = math.inf


class MemoryReplayStore(ReplayStore):
    """Consumed keys in a dict, grouped by the whole second in which they expire.

    Inserting costs one dict write and one list append (a per-entry heap cost more, see
    docs/performance.md, and this runs on every unseal). Purging pops whole one-second buckets from a
    min-heap, so its cost is proportional to what it drops; it runs when a new expiry
    second first appears (about once a second under load) and when the store is full.

    ``max_entries`` bounds memory: when the store is full of live entries it refuses to
    answer (the codec then fails closed with ``store_unavailable``) rather than forget a
    live entry, which would let that token be replayed.

    Retentions run on ``clock``, the monotonic clock by default: setting the wall clock
    (NTP, an operator, a test's injected codec clock) never shortens or stretches them.

    Entries live in this process only: two worker processes, or two machines, each
    with their own memory store, would each accept the same token once. Use
    :class:`~statecodec.replay.SQLiteReplayStore` or
    :class:`~statecodec.replay.RedisReplayStore` as soon as there is more than one process.
    """

    kind = "memory"

    def __init__(self, max_entries: int = 100_000, *, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive integer, got {max_entries!r}")
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, float] = {}  # key -> when it is forgotten, on self._clock
        self._buckets: dict[int, list[str]] = {}  # whole second of expiry -> keys
        self._bucket_heap: list[int] = []
        self._last_second: int | None = None  # the bucket the last insert used
        self._last_bucket: list[str] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryReplayStore(max_entries={self.max_entries})"

    def consume(self, key: str, retention: float) -> bool:
        if not 0.0 < retention < _INFINITY:  # also false for NaN
            raise invalid_retention(retention)
        # acquire/release rather than ``with``: this is the hot path of every unseal and
        # the context-manager protocol costs measurably more (docs/performance.md).
        self._lock.acquire()
        try:
            now = self._clock()
            expires_at = now + retention
            entries = self._entries
            if key in entries:
                # Present but expired (not purged yet) counts as absent: the contract is
                # that entries vanish when their retention ends, whatever the purge schedule.
                if entries[key] > now:
                    return False
            elif len(entries) >= self.max_entries and not self._make_room(now):
                raise ReplayStoreError(
                    f"memory replay store is full ({self.max_entries} live entries); raise max_entries, "
                    "shorten the token ttl, or use a SQLite or Redis store"
                )
            entries[key] = expires_at
            second = int(expires_at)
            if second == self._last_second:  # nearly always: tokens expire in time order
                self._last_bucket.append(key)
            else:
                self._bucket_for(second, now).append(key)
            return True
        finally:
            self._lock.release()

    async def aconsume(self, key: str, retention: float) -> bool:
        # No I/O: the lock is held for microseconds, so no worker thread is needed.
        return self.consume(key, retention)

    def is_consumed(self, key: str) -> bool:
        """Whether ``key`` holds a live entry; reads only (a consume is settled when it returns)."""
        with self._lock:
            expires_at = self._entries.get(key)
            return expires_at is not None and expires_at > self._clock()

    async def ais_consumed(self, key: str) -> bool:
        return self.is_consumed(key)

    def purge(self) -> int:
        """Drop expired entries now; returns how many were dropped."""
        with self._lock:
            return self._purge(self._clock())

    def _bucket_for(self, second: int, now: float) -> list[str]:
        bucket = self._buckets.get(second)
        if bucket is None:
            # A new expiry second means the clock has moved on: the natural moment to
            # purge, about once a second under steady traffic, never on the hot path.
            self._purge(now)
            bucket = self._buckets[second] = []
            heapq.heappush(self._bucket_heap, second)
        self._last_second, self._last_bucket = second, bucket
        return bucket

    def _make_room(self, now: float) -> bool:
        self._purge(now)
        return len(self._entries) < self.max_entries

    def _purge(self, now: float) -> int:
        dropped = 0
        heap, buckets, entries = self._bucket_heap, self._buckets, self._entries
        while heap and heap[0] <= now:
            second = heapq.heappop(heap)
            if second == self._last_second:
                self._last_second = None  # the cached list is leaving the index
            live = []
            for key in buckets.pop(second):
                expiry = entries.get(key)
                if expiry is None:
                    continue
                if expiry <= now:
                    del entries[key]
                    dropped += 1
                elif int(expiry) == second:  # not a stale copy of a key consumed again later
                    live.append(key)
            if live:
                # Only the current second can be partly live; every later one is too.
                buckets[second] = live
                heapq.heappush(heap, second)
                break
        return dropped

    def __len__(self) -> int:
        """Entries held, including expired ones not purged yet."""
        with self._lock:
            return len(self._entries)
