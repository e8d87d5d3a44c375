"""The replay-store contract: consume a token id exactly once.

A store answers one question atomically: "is this the first time anyone consumed this
key?" The codec asks it only after a token has passed every other check, so a forged,
expired or mis-bound token can never burn the real one. Entries must disappear by
themselves once the token can no longer be accepted anywhere: by then every instance
rejects it as expired, so nothing needs remembering.

How long to remember is a *retention*, in seconds from now, not an instant. Single use
must not depend on two clocks agreeing: an absolute deadline computed on the codec's
clock and compared with the store's would be forgotten at once by a store whose clock
runs ahead (or kept for a year by one that lags), and every token would redeem twice.
Each store measures the retention on its own time base (a monotonic clock in memory,
the host clock shared by the processes using a SQLite file, the server's clock in
Redis). A store asked to remember a key for a non-positive or non-finite time cannot
honour it and must raise (:func:`invalid_retention`), never record it for zero seconds.

Write your own store by subclassing :class:`ReplayStore` and implementing
:meth:`consume` (and :meth:`aconsume` when a native async client exists; the default
runs :meth:`consume` in a worker thread so the event loop never blocks on I/O).
Raise any exception when the answer is unknown: the codec fails closed with reason
``store_unavailable`` and leaves the token unconsumed.

A store may also answer "was this key consumed?" without consuming it
(:meth:`ReplayStore.is_consumed`, for ``statecodec verify --replay``); one that cannot
keeps the default, which raises :class:`ReplayCheckUnsupported`.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Mapping
from typing import Any, Self

from .._errors import ReplayCheckUnsupported, ReplayStoreError

__all__ = ["ReplayCheckUnsupported", "ReplayStore", "ReplayStoreError", "invalid_retention", "store_settings"]


class ReplayStore(abc.ABC):
    """A set of consumed keys whose entries expire on their own."""

    #: A short scheme-like name used in logs and metrics ("memory", "sqlite", "redis").
    kind: str = "custom"

    @abc.abstractmethod
    def consume(self, key: str, retention: float) -> bool:
        """Record ``key`` for ``retention`` seconds from now, on the store's own clock.

        Return True if this call recorded it (first use), False if it was already there
        and not yet forgotten (a replay). Must be atomic across every process that shares
        the store. Raise when ``retention`` is not a positive finite number
        (``if not 0.0 < retention < math.inf: raise invalid_retention(retention)``) and
        whenever the answer is unknown.
        """

    async def aconsume(self, key: str, retention: float) -> bool:
        """Async :meth:`consume`; by default in a worker thread."""
        return await asyncio.to_thread(self.consume, key, retention)

    def is_consumed(self, key: str) -> bool:
        """Whether ``key`` holds a settled entry now, read without writing anything.

        True: a consume of ``key`` now would find it (``replayed``). False: it holds no
        live entry (a consume now would record it, unless another one comes first). Raises
        :class:`ReplayStoreError` when the store cannot answer, or when the entry is not
        settled yet (a redemption in flight, or one that failed closed and is not taken
        back yet): a consume then fails closed too. Optional: this default raises
        :class:`ReplayCheckUnsupported`, so a store written before it existed says so
        rather than guess.
        """
        raise ReplayCheckUnsupported(
            f"the {self.kind} replay store has no read-only check (ReplayStore.is_consumed); "
            "only a consume can tell, and it would redeem the token"
        )

    async def ais_consumed(self, key: str) -> bool:
        """Async :meth:`is_consumed`; by default in a worker thread."""
        return await asyncio.to_thread(self.is_consumed, key)

    def check(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Make sure, at start-up, that the store can answer; raise :class:`ReplayStoreError` if not.

        Servers and ``statecodec proxy`` call it before accepting requests, so that an
        unreachable or misconfigured store stops the start instead of failing every
        request. The default does nothing (memory and SQLite stores open when built).
        """

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


def invalid_retention(retention: object) -> ReplayStoreError:
    """The error for a retention no store can honour: zero, negative, NaN or infinite.

    Failing closed matters here: "remember for -3 s" read as "forget at once" would
    accept the token's next redemption too.
    """
    return ReplayStoreError(
        f"asked to remember a token id for {retention!r} seconds; the retention must be a positive, "
        "finite number of seconds (a codec bug or a custom caller's mistake: nothing was recorded)"
    )


def store_settings(
    defaults: Mapping[str, Any], url_options: Mapping[str, Any], given: Mapping[str, object]
) -> dict[str, Any]:
    """A shared store's settings: a keyword given wins over the URL's option, then the default.

    One rule for every store, so that ``?timeout=5`` in a URL and ``timeout=5`` in code
    mean the same everywhere, and a keyword left at ``None`` means "not given" (the URL's
    or the default value stands), never "unset". Each store validates the result once.
    """
    settings = {**defaults, **url_options}
    settings.update((name, value) for name, value in given.items() if value is not None)
    return settings
