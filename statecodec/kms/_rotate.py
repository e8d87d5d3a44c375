"""The scheduled rotation job and first-time setup, as two functions the CLI wraps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from ._policy import RotationPolicy, RotationRequest
from ._source import KeySource, RotationReport
from ._timeline import Timeline
from ._urls import source_from_url

DEFAULT_KEY_TYPE = "chacha20-poly1305"

T = TypeVar("T")


def rotate(
    source: KeySource | str,
    *,
    min_age: float,
    retire_after: float,
    dry_run: bool = False,
    timeline: Timeline | None = None,
    clock: Callable[[], float] = time.time,
    force: bool = False,
) -> RotationReport:
    """Rotate if the newest key is at least ``min_age`` old; retire keys past their window.

    Ages are judged at ``clock()``, read once (``time.time``; a fixed instant in tests).

    Idempotent: run it every hour with ``min_age=24h`` and it rotates once a day. Two runs
    at once are safe: files are locked, KV writes use check-and-set, and transit (which
    has no check-and-set) gets at most one extra version per concurrent run, which is
    harmless. A key is retired once its successor is ``retire_after`` old; that must be
    at least ``timeline.min_retire_after`` for the services' timeline (default
    :class:`Timeline`), or a replaced key could vanish while tokens minted with it live.
    The decision and that floor are :class:`~statecodec.kms._policy.RotationPolicy`'s; the
    request every source's own ``rotate`` takes (:class:`RotationRequest`) is built here,
    once, before any source is opened.

    While the key of an earlier rotation is still pending (a ``min_age`` shorter than the
    promotion delay, or a rotation run twice by hand), no key is added, and a note says
    which key is pending and when it becomes primary; ``force`` adds one anyway.
    """
    policy = RotationPolicy(min_age, retire_after, timeline or Timeline(), force)
    request = RotationRequest(policy, now=clock(), dry_run=dry_run)
    return with_source(source, lambda src: src.rotate(request))


def init_keys(
    source: KeySource | str, *, key_type: str = DEFAULT_KEY_TYPE, clock: Callable[[], float] = time.time
) -> str:
    """Create the transit key, KV document or key file when absent; never overwrite one.

    Transit keys are created exportable (statecodec needs the secret bytes) with
    deletion disallowed; ``key_type`` is one of ``chacha20-poly1305`` (default),
    ``xchacha20-poly1305``, ``aes256-gcm96`` or ``hmac`` (transit only; hmac keys carry
    no creation times, so ``rotate()`` cannot manage them). A new file or KV document's
    key is stamped ``clock()``.
    """
    return with_source(source, lambda src: src.init(key_type=key_type, now=clock()))


def with_source(source: KeySource | str, action: Callable[[KeySource], T]) -> T:
    src = source_from_url(source) if isinstance(source, str) else source
    try:
        return action(src)
    finally:
        if src is not source:
            src.close()
