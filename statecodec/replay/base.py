"""The replay-store contract: consume a token id exactly once.

A store answers one question atomically: "is this the first time anyone consumed this
key?" The codec asks it only after a token has passed every other check, so a forged,
expired or mis-bound token can never burn the real one. Entries must disappear by
themselves after ``expires_at`` (the token's expiry plus twice the codec's leeway, so
that an instance whose clock lags by the leeway still finds the entry): by then every
instance rejects the token as expired, so nothing needs remembering.

Write your own store by subclassing :class:`ReplayStore` and implementing
:meth:`consume` (and :meth:`aconsume` when a native async client exists; the default
runs :meth:`consume` in a worker thread so the event loop never blocks on I/O).
Raise any exception when the answer is unknown: the codec fails closed with reason
``store_unavailable`` and leaves the token unconsumed.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Self


class ReplayStore(abc.ABC):
    """A set of consumed keys whose entries expire on their own."""

    #: A short scheme-like name used in logs and metrics ("memory", "sqlite", "redis").
    kind: str = "custom"

    @abc.abstractmethod
    def consume(self, key: str, expires_at: float) -> bool:
        """Record ``key`` until Unix time ``expires_at``.

        Return True if this call recorded it (first use), False if it was already there
        (a replay). Must be atomic across every process that shares the store.
        """

    async def aconsume(self, key: str, expires_at: float) -> bool:
        """Async :meth:`consume`; by default in a worker thread."""
        return await asyncio.to_thread(self.consume, key, expires_at)

    def close(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Release connections or files."""

    async def aclose(self) -> None:
        """Async :meth:`close`; stores with async connections override it."""
        self.close()

    def __bool__(self) -> bool:
        # A store is a service, not a container: an empty one must not be falsy, or
        # ``replay=store or fallback`` and ``if codec.replay:`` would skip it.
        return True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
