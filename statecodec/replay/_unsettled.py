"""Entries that failed-closed consumes may have written: the take-back bookkeeping of a shared store.

A consume fails closed (``store_unavailable``: "the token was not consumed, retry") when
the fate of its write is unknown: the connection broke after the write was sent, the
deadline passed while the server still ran it, the caller was cancelled, or the replicas
did not confirm it. If the write did happen, the store holds an entry nobody accepted
the token for, and a retry of the token would be told "replayed": the token would be
burnt by a request that never redeemed it. So the store lists ``(key, nonce)`` (each
attempt writes a fresh nonce beside the key) and deletes exactly that entry when it can:
before the next consume of the same key, and a few of the oldest others with every
consume, so that the list drains while traffic flows. Deleting an entry that only a
failed call wrote is always safe, whenever it happens: nobody was told "accepted" for it.

The list is per process and bounded (:attr:`Unsettled.LIMIT`: the oldest is forgotten
first; its entry then stays until it expires, which is the worst a failure could do
without this list), and an entry is dropped once it would have expired in the store
anyway. What a store sends to delete an entry, and when a deletion counts as confirmed
(Redis with ``wait=N`` also waits for the replicas), is the store's; the list is this
module's, written once for every store.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from typing import Final, NamedTuple


class Entry(NamedTuple):
    """One entry to take back: the token's key, the failed attempt's nonce, when it expires."""

    key: str
    nonce: str
    deadline: float  # time.monotonic(): past it, the store has dropped the entry itself


class Unsettled:
    """The ``(key, nonce)`` pairs a store's failed-closed consumes may have left, oldest first."""

    #: At most this many listed at once (about 200 bytes each).
    LIMIT: Final = 100_000
    #: Take-backs of other keys' entries that lead each consume: enough to drain the list
    #: after an outage without sending the whole of it with every request.
    SPARE: Final = 16

    def __init__(self) -> None:
        self._deadlines: dict[tuple[str, str], float] = {}  # insertion order = oldest first
        self._nonces: dict[str, set[str]] = {}  # the listed nonces of each key
        self._lock = threading.Lock()

    def note(self, key: str, nonce: str, retention: float) -> None:
        """List the entry a failed attempt may have written, until it expires (``retention`` s)."""
        with self._lock:
            if len(self._deadlines) >= self.LIMIT:
                self._forget(next(iter(self._deadlines)))  # the oldest: it expires first
            self._deadlines.pop((key, nonce), None)  # re-listed last: the order stays by deadline
            self._deadlines[(key, nonce)] = time.monotonic() + retention
            self._nonces.setdefault(key, set()).add(nonce)

    def pending(self, keys: Iterable[str], *, spare: int = SPARE) -> list[Entry]:
        """The entries to delete before consuming ``keys``: all of theirs, and the ``spare`` oldest.

        They stay listed until :meth:`settle` says they are gone.
        """
        if not self._deadlines:  # the common case, without the lock
            return []
        with self._lock:
            self._expire(time.monotonic())
            chosen = dict.fromkeys(itertools.islice(self._deadlines, spare))
            for key in keys:
                chosen.update(dict.fromkeys((key, nonce) for nonce in self._nonces.get(key, ())))
            return [Entry(key, nonce, self._deadlines[key, nonce]) for key, nonce in chosen]

    def nonces(self, key: str) -> list[str]:
        """The nonces listed for ``key``: an entry of ``key`` holding one of them is no use of the token."""
        if not self._deadlines:
            return []
        with self._lock:
            return list(self._nonces.get(key, ()))

    def holds(self, key: str, nonce: str) -> bool:
        """Whether ``nonce`` is listed for ``key`` (the entry is a failed-closed call's)."""
        if not self._deadlines:
            return False
        with self._lock:
            return nonce in self._nonces.get(key, ())

    def settle(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Forget these ``(key, nonce)`` pairs (an :class:`Entry` is one): their entries are gone."""
        with self._lock:
            for key, nonce, *_ in pairs:
                self._forget((key, nonce))

    def __len__(self) -> int:
        return len(self._deadlines)

    def _expire(self, now: float) -> None:
        # Oldest first; retentions differ little, so the expired ones lead (one that does
        # not is dropped a little later, and its take-back meanwhile is harmless).
        while self._deadlines:
            pair, deadline = next(iter(self._deadlines.items()))
            if deadline > now:
                return
            self._forget(pair)

    def _forget(self, pair: tuple[str, str]) -> None:
        if self._deadlines.pop(pair, None) is None:
            return
        key, nonce = pair
        nonces = self._nonces[key]
        nonces.discard(nonce)
        if not nonces:
            del self._nonces[key]
