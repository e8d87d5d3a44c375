"""KeyManager: a KeyProvider that refreshes its ring in the background and rotates safely.

The hot path (``keyring()``, ``signing_key()``) reads one attribute holding an immutable
view and takes no lock: CPython swaps references atomically, so a codec on any thread
or event loop sees either the old ring or the new one, never a mix. A lock is taken only
when a refresh publishes a new view, and once per promotion, when the first caller past
the promotion time recomputes the view (compare-and-swap, so a late recomputation never
overwrites a fresher ring).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Unpack

from .. import _telemetry
from .._errors import KeyUnavailable
from .._humanize import duration, iso, relative
from .._keys import Key, KeyRing
from ._errors import KeySourceError
from ._source import KeySource
from ._timeline import Timeline, TimelineSettings
from ._urls import source_from_url

logger = logging.getLogger("statecodec.kms")


@dataclass(frozen=True, slots=True)
class _View:
    base: KeyRing  # what the source said
    loaded_at: float  # when it said it (manager clock)
    ring: KeyRing  # the ring codecs use: primary by time, replaced keys with retires_at
    next_promotion: int | None


class KeyManager:
    """Keys from a :class:`KeySource`, refreshed every ``refresh_interval`` seconds (± ``jitter``).

    Implements :class:`~statecodec.KeyProvider`, so ``StateCodec(manager, ...)`` just works.
    All instances sharing a source must use the same timing (see :class:`Timeline`):

    * a key verifies as soon as a refresh sees it;
    * it mints once it is ``refresh_interval * (1 + jitter) + max_skew + 1`` seconds
      old, when every instance verifies it; the newest such key is primary;
    * the key it replaces verifies for ``staleness_limit + max_ttl + expiry_grace + 1``
      seconds more.

    When the source fails, the last good ring keeps verifying and minting; once it is
    older than ``staleness_limit``, minting stops (:class:`KeyUnavailable`) and
    verification goes on. Each outage is logged once, with its cause, and so is the
    recovery. ``max_ttl`` must be at least the ``ttl`` of every codec using the keys, and
    ``max_skew`` and ``expiry_grace`` the codecs' own. Those timing keywords are
    :class:`Timeline`'s fields (:class:`~statecodec.kms._timeline.TimelineSettings`), with its defaults.

    Threaded servers: ``start()`` at boot, ``stop()`` at shutdown (or ``with``). Async
    servers: ``async with manager:`` (the first load runs in a worker thread). In
    pre-forking servers start it in each worker: threads do not survive ``fork()``.
    """

    def __init__(
        self,
        source: KeySource | str,
        *,
        clock: Callable[[], float] = time.time,
        **timing: Unpack[TimelineSettings],
    ) -> None:
        self.source = source_from_url(source) if isinstance(source, str) else source
        self.timeline = Timeline(**timing)
        self.clock = clock
        self._view: _View | None = None
        self._load_lock = threading.Lock()  # one refresh at a time
        self._swap_lock = threading.Lock()  # publishing a view
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing_since: float | None = None
        self._last_error: str | None = None
        self._stale_logged = False

    def __repr__(self) -> str:
        view = self._view
        primary = view.ring.primary_kid if view else None
        return f"KeyManager({self.source.describe()!r}, primary={primary!r})"

    # ------------------------------------------------------------ KeyProvider
    def keyring(self) -> KeyRing:
        """The ring to verify with: stale or not, verification never stops."""
        return self._current(self.clock()).ring

    def signing_key(self) -> Key:
        """The promoted primary key, unless the ring is older than ``staleness_limit``."""
        now = self.clock()
        view = self._current(now)
        age = now - view.loaded_at
        if age > self.timeline.staleness_limit:
            raise self._stale(age)
        return view.ring.primary

    def _current(self, now: float) -> _View:
        view = self._view
        if view is None:
            raise KeyUnavailable(
                f"the key manager for {self.source.describe()} is not started; call start() before use"
            )
        if view.next_promotion is not None and now >= view.next_promotion:
            view = self._replan(view, now)
        return view

    def _replan(self, seen: _View, now: float) -> _View:
        with self._swap_lock:
            current = self._view
            if current is seen:  # a refresh may have published a newer view meanwhile
                current = self._view = self._make_view(seen.base, seen.loaded_at, now)
                self._log_primary(seen.ring, current.ring)
        return current or seen  # never None once started; the type checker cannot know

    def _make_view(self, base: KeyRing, loaded_at: float, now: float) -> _View:
        plan = self.timeline.plan(base, now)
        return _View(base, loaded_at, plan.ring, plan.next_promotion)

    # -------------------------------------------------------------- lifecycle
    def start(self, *, background: bool = True) -> KeyManager:
        """Load now (raising :class:`KeySourceError` if no keys can be had), then refresh in a thread.

        ``background=False`` loads once and leaves refreshing to :meth:`refresh_now`
        (tests, one-shot CLI commands).
        """
        self.refresh_now()
        if background and not (self._thread and self._thread.is_alive()):
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="statecodec-kms-refresh", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop refreshing and close connections. The last ring stays usable."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
        self.source.close()

    def __enter__(self) -> KeyManager:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> KeyManager:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    def _run(self) -> None:
        while not self._stop.wait(self._next_delay()):
            try:
                self.refresh_now()
            except KeySourceError:
                pass  # logged once per outage by refresh_now
            except Exception:  # never let the refresher die: it is the only way back
                logger.exception(
                    "unexpected error while refreshing keys; will retry",
                    extra=_telemetry.fields("keys_refresh_crashed", source=self.source.describe()),
                )

    def _next_delay(self) -> float:
        # Jitter keeps a fleet restarted together from hitting Vault in lockstep.
        tl = self.timeline
        return tl.refresh_interval * random.uniform(1 - tl.jitter, 1 + tl.jitter)  # nosec B311

    # ---------------------------------------------------------------- refresh
    def refresh_now(self) -> KeyRing:
        """Load from the source now; return the ring codecs will use, or raise :class:`KeySourceError`.

        On failure the previous ring stays in place (and the failure counts towards
        the staleness limit).
        """
        with self._load_lock:
            try:
                base = self.source.load()
                now = self.clock()
                view = self._make_view(base, now, now)
                if view.ring.primary_kid is None:
                    raise KeySourceError(
                        "no key in the ring verifies now (all are retired); add a key",
                        kind="invalid",
                        source=self.source.describe(),
                    )
            except KeySourceError as exc:
                self._failed(exc)
                raise
            except Exception as exc:  # fail closed, but keep the cause for the operator
                error = KeySourceError(
                    f"unexpected {type(exc).__name__}: {exc}", kind="internal", source=self.source.describe()
                )
                self._failed(error)
                raise error from exc
            with self._swap_lock:
                old, self._view = self._view, view
            self._recovered(now)
            self._log_changes(old, view, now)
            return view.ring

    def _failed(self, exc: KeySourceError) -> None:
        _telemetry.record_key_refresh_failure()
        now = self.clock()
        self._last_error = exc.message
        view = self._view
        if view is None:
            return  # start() raises it to the caller; logging it too would say it twice
        source = self.source.describe()
        if self._failing_since is not None:
            logger.debug(
                "refresh from %s still failing: %s",
                source,
                exc.message,
                extra=_telemetry.fields(
                    "keys_refresh_failed", source=source, reason=exc.kind, detail=exc.message
                ),
            )
            return
        self._failing_since = now
        age = now - view.loaded_at
        logger.warning(
            "cannot refresh keys from %s: %s. Verifying and minting with the ring loaded "
            "%s ago; minting stops %s unless a refresh succeeds.",
            source,
            exc.message,
            duration(age),
            relative(self.timeline.staleness_limit - age),
            extra={
                **_telemetry.fields(
                    "keys_refresh_failed", source=source, reason=exc.kind, detail=exc.message
                ),
                "age": age,
                "minting_stops_in": self.timeline.staleness_limit - age,
            },
        )

    def _recovered(self, now: float) -> None:
        if self._failing_since is None:
            return
        logger.warning(
            "keys from %s load again after %s of failures%s",
            self.source.describe(),
            duration(now - self._failing_since),
            "; minting resumed" if self._stale_logged else "",
            extra={
                **_telemetry.fields("keys_refresh_recovered", source=self.source.describe()),
                "failed_for": now - self._failing_since,
                "minting_resumed": self._stale_logged,
            },
        )
        self._failing_since = None
        self._last_error = None
        self._stale_logged = False

    def _stale(self, age: float) -> KeyUnavailable:
        limit = duration(self.timeline.staleness_limit)
        cause = self._last_error or "no refresh ran (is the manager stopped?)"
        if not self._stale_logged:
            self._stale_logged = True
            logger.error(
                "the key ring from %s is %s old (limit %s): minting stopped, verification continues. "
                "Last error: %s",
                self.source.describe(),
                duration(age),
                limit,
                cause,
                extra={
                    **_telemetry.fields("minting_stopped", source=self.source.describe(), detail=cause),
                    "age": age,
                },
            )
        return KeyUnavailable(
            f"no fresh keys: the ring from {self.source.describe()} was loaded {duration(age)} ago, over the "
            f"staleness limit of {limit}, so minting stopped (verification continues). Last error: {cause}"
        )

    # ---------------------------------------------------------------- logging
    def _log_changes(self, old: _View | None, new: _View, now: float) -> None:
        source = self.source.describe()
        if old is None:  # the first load: one line for the whole ring
            self._log_loaded(new, now)
            return
        states = {s.kid: s for s in self.timeline.plan(new.base, now).states}
        for kid in new.base.kids:
            if kid in old.base.kids:
                continue
            state = states[kid]
            if state.primary_from is not None:
                mints = f"mints from {_at(state.primary_from, now)}"
            else:
                mints = "mints now" if state.state == "primary" else "does not mint"
            logger.info(
                "key %s published by %s: verifies now, %s",
                kid,
                source,
                mints,
                extra={
                    **_telemetry.fields("key_published", kid=kid, source=source),
                    "primary_from": state.primary_from,
                },
            )
        for kid in set(old.base.kids) - set(new.base.kids):
            logger.info(
                "key %s is gone from %s: it no longer verifies",
                kid,
                source,
                extra=_telemetry.fields("key_removed", kid=kid, source=source),
            )
        self._log_primary(old.ring, new.ring)

    def _log_loaded(self, view: _View, now: float) -> None:
        """Which key mints now and which one next, in one line."""
        source, primary = self.source.describe(), view.ring.primary_kid
        upcoming = self.timeline.next_primary(view.base, now)
        then = (
            "; no other key is pending"
            if upcoming is None
            else (f"; {upcoming[0]} mints from {_at(upcoming[1], now)}")
        )
        logger.info(
            "keys loaded from %s (%s): minting with %s now%s",
            source,
            ", ".join(view.base.kids),
            primary,
            then,
            extra={
                **_telemetry.fields("keys_loaded", kid=primary, source=source),
                "kids": list(view.base.kids),
                "next_kid": None if upcoming is None else upcoming[0],
                "next_primary_at": None if upcoming is None else upcoming[1],
            },
        )

    @staticmethod
    def _log_primary(old: KeyRing, new: KeyRing) -> None:
        if old.primary_kid != new.primary_kid:
            logger.info(
                "minting with key %s (was %s)",
                new.primary_kid,
                old.primary_kid,
                extra={
                    **_telemetry.fields("primary_changed", kid=new.primary_kid),
                    "previous_kid": old.primary_kid,
                },
            )

    # ----------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        """The manager's state for status pages and ``statecodec keys list``; no secrets.

        ``state`` sums it up: ``"ok"``; ``"degraded"`` (refreshes fail, the last good ring
        still verifies and mints, until ``minting_stops_in`` seconds from now);
        ``"stale"`` (minting stopped, verification continues); ``"not_loaded"``. ``age``
        is the ring's age in seconds, ``failing_since`` and ``last_error`` describe the
        current outage, ``keys`` each key's place in the timeline.
        """
        now = self.clock()
        view = self._view
        age = None if view is None else now - view.loaded_at
        stale = age is None or age > self.timeline.staleness_limit
        if view is None:
            state = "not_loaded"
        elif stale:
            state = "stale"
        else:
            state = "degraded" if self._failing_since is not None else "ok"
        return {
            "state": state,
            "source": self.source.describe(),
            "running": bool(self._thread and self._thread.is_alive()),
            "loaded_at": None if view is None else view.loaded_at,
            "age": age,
            "stale": stale,
            "minting": not stale,
            "minting_stops_in": None if age is None else max(0.0, self.timeline.staleness_limit - age),
            "primary": None if view is None else self._current(now).ring.primary_kid,
            "failing_since": self._failing_since,
            "last_error": self._last_error,
            "timeline": self.timeline.describe(),
            "keys": [] if view is None else [s.to_dict() for s in self.timeline.plan(view.base, now).states],
        }


def _at(when: float, now: float) -> str:
    """``2026-12-07T03:51:42Z (in 2m07s)``."""
    return f"{iso(when)} ({relative(when - now)})"
