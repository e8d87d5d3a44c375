"""Keys this process accepted lately: a replay of them is one whatever the entry looks like.

A shared store answers an entry it cannot yet call settled (its writer's redemption may
still be undecided) like an outage, ``store_unavailable``. An entry this very process
accepted is settled by definition (it said yes), so its replays are ``replayed`` at once
without asking the server how old the entry is. Kept only as long as an entry can look
undecided (the store's settle window), bounded, and only where the store needs it.
"""

from __future__ import annotations

import threading
import time
from typing import Final


class _Recent:
    """Keys accepted within the last ``window`` seconds (or less, once ``LIMIT`` is reached)."""

    #: Beyond this many, the oldest are forgotten first: their replays then ask the
    #: server (one more round trip) instead of being known here; nothing else changes.
    LIMIT: Final = 100_000

    def __init__(self, window: float) -> None:
        self._window = window
        self._until: dict[str, float] = {}  # key -> monotonic deadline, oldest first
        self._lock = threading.Lock()

    def add(self, key: str, retention: float) -> None:
        now = time.monotonic()
        until = now + min(self._window, retention)
        with self._lock:
            self._expire(now)
            if len(self._until) >= self.LIMIT:
                del self._until[next(iter(self._until))]
            self._until.pop(key, None)  # re-inserted last: the dict stays in deadline order
            self._until[key] = until

    def __contains__(self, key: object) -> bool:
        until = self._until.get(key)  # type: ignore[call-overload]
        return until is not None and until > time.monotonic()

    def _expire(self, now: float) -> None:
        until = self._until
        while until:
            first = next(iter(until))
            if until[first] > now:
                return
            del until[first]
