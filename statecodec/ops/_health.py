"""Readiness: can this instance mint, and did its replay store answer lately?

Two checks, each answering with a reason an operator can act on:

- ``keys``: the key provider can mint now (``signing_key()`` succeeds). For a
  :class:`~statecodec.kms.KeyManager` that means loaded and not past its staleness limit;
  its :meth:`~statecodec.kms.KeyManager.status` adds how it is doing (``degraded``: the
  source fails, minting stops in N seconds).
- ``replay_store``: the store answered :meth:`~statecodec.replay.ReplayStore.check` (for
  Redis a PING) within the last ``max_silence`` seconds, and its last check did not fail.
  A check that *fails* (connection refused, an error answer) turns the instance not-ready
  at once, since every redemption now fails too: waiting out ``max_silence`` would keep
  traffic coming to an instance that refuses it. ``max_silence`` is for a store that says
  nothing at all (a hang), where one slow answer must not flap readiness. The store is asked when a
  readiness probe comes and the last answer is older than ``interval``, so probes cost
  at most one call per interval whatever their rate, and the answer is never older than
  the probe period. The call runs in a thread of its own: a store that hangs (a
  SIGSTOPped server, a black-holed network) delays a probe by at most ``timeout`` and
  never blocks the event loop or piles up threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, Final

from .._humanize import one_line
from .._keys import KeyProvider
from ..replay.base import ReplayStore

DEFAULT_INTERVAL: Final = 1.0
DEFAULT_MAX_SILENCE: Final = 5.0
DEFAULT_TIMEOUT: Final = 2.0


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness check: whether it passes, and why (one line, no secret)."""

    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Readiness:
    """Every check's verdict; ready only when all pass."""

    checks: Mapping[str, Check]

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks.values())

    @property
    def status(self) -> int:
        """The HTTP status of ``/readyz``: 200 or 503."""
        return 200 if self.ready else 503

    @property
    def failing(self) -> list[str]:
        return [name for name, check in self.checks.items() if not check.ok]

    def to_dict(self) -> dict[str, Any]:
        """The ``/readyz`` body: ``ready``, the ``failing`` checks' names, and every check."""
        return {
            "ready": self.ready,
            "failing": self.failing,
            "checks": {name: check.to_dict() for name, check in self.checks.items()},
        }


@dataclass(eq=False, repr=False)  # the settings are declared; the probe state is set after
class Health:
    """The readiness of one server: its key provider and (optionally) its replay store.

    :param keys: what the codec mints with (a :class:`~statecodec.kms.KeyManager`, a
        ``KeyRing``, any :class:`~statecodec.KeyProvider`).
    :param store: the replay store, or ``None`` when the codec has none.
    :param interval: the store is asked at most once per ``interval`` seconds.
    :param max_silence: ready while the store answered within this many seconds.
    :param timeout: how long a probe waits for the store's answer.
    """

    keys: KeyProvider
    store: ReplayStore | None = None
    _: KW_ONLY
    interval: float = DEFAULT_INTERVAL
    max_silence: float = DEFAULT_MAX_SILENCE
    timeout: float = DEFAULT_TIMEOUT
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if not 0 < self.interval <= self.max_silence:
            raise ValueError("interval must be positive and at most max_silence")
        self._lock = threading.Lock()
        self._pinger: concurrent.futures.ThreadPoolExecutor | None = None
        self._ping: concurrent.futures.Future[None] | None = None
        self._asked_at: float | None = None
        self._answered_at: float | None = None
        self._error: str | None = None

    def __repr__(self) -> str:
        return f"Health(keys={self.keys!r}, store={self.store!r})"

    # ---------------------------------------------------------------- checks
    def check(self) -> Readiness:
        """Every check now (blocking for at most ``timeout``), for synchronous servers."""
        ping = self._start_ping()
        if ping is not None:
            with contextlib.suppress(TimeoutError):
                ping.result(timeout=self.timeout)
        return self._verdict()

    async def acheck(self) -> Readiness:
        """:meth:`check` for async servers: waits for the store without blocking the loop."""
        ping = self._start_ping()
        if ping is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(ping)), self.timeout)
        return self._verdict()

    def keys_check(self) -> Check:
        """Whether the keys can mint now, and the key manager's account of it."""
        try:
            key = self.keys.signing_key()
        except Exception as exc:  # KeyUnavailable, or whatever a custom provider raises
            return Check(False, one_line(str(exc)) or type(exc).__name__)
        status = getattr(self.keys, "status", None)
        if callable(status):
            state = status()
            if state.get("state") == "degraded":
                return Check(
                    True,
                    one_line(
                        f"minting with {key.kid}, but refreshes fail ({state.get('last_error')}); "
                        f"minting stops in {state.get('minting_stops_in', 0):.0f}s"
                    ),
                )
        return Check(True, f"minting with {key.kid}")

    def store_check(self) -> Check:
        """The replay store's last answer, as of now (no call is made here)."""
        if self.store is None:
            return Check(True, "no replay store")
        kind = getattr(self.store, "kind", type(self.store).__name__)
        with self._lock:
            answered_at, error = self._answered_at, self._error
        if answered_at is None:
            return Check(
                False, f"the {kind} replay store has not answered yet" + (f": {error}" if error else "")
            )
        silence = self.clock() - answered_at
        if error is not None:  # the last check failed, after the answer above
            last = f"last answer {silence:.1f}s ago"
            return Check(False, one_line(f"the {kind} replay store failed its last check: {error} ({last})"))
        if silence > self.max_silence:
            return Check(
                False,
                one_line(
                    f"the {kind} replay store has not answered for {silence:.1f}s: {error or 'no answer'}"
                ),
            )
        return Check(True, f"the {kind} replay store answered {silence:.1f}s ago")

    def close(self) -> None:
        """Stop the store-checking thread (a call in progress finishes on its own)."""
        with self._lock:
            pinger, self._pinger = self._pinger, None
        if pinger is not None:
            pinger.shutdown(wait=False, cancel_futures=True)

    # -------------------------------------------------------------- internals
    def _verdict(self) -> Readiness:
        return Readiness({"keys": self.keys_check(), "replay_store": self.store_check()})

    def _start_ping(self) -> concurrent.futures.Future[None] | None:
        """The store call to wait for: one in flight at most, one per ``interval``."""
        if self.store is None:
            return None
        now = self.clock()
        with self._lock:
            if self._ping is not None and not self._ping.done():
                return self._ping  # still waiting for the last call: never a second thread
            if self._asked_at is not None and now - self._asked_at < self.interval:
                return None
            if self._pinger is None:
                self._pinger = concurrent.futures.ThreadPoolExecutor(1, "statecodec-readiness")
            self._asked_at = now
            self._ping = self._pinger.submit(self._ask_store)
            return self._ping

    def _ask_store(self) -> None:
        store = self.store
        if store is None:
            return
        try:
            store.check()
        except Exception as exc:  # whatever a store raises: it did not answer
            with self._lock:
                self._error = one_line(str(exc)) or type(exc).__name__
            return
        with self._lock:
            self._answered_at = self.clock()
            self._error = None
