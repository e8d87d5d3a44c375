"""Pacing: holding an early retry until its time (the one hold loop), bounded by
:class:`Holds`, while the client stays."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar

from .. import _telemetry
from .._codec import StateCodec
from .._errors import InvalidState

logger = logging.getLogger("statecodec")


#: How long an early retry of a paced round may be held before it runs (seconds); a retry
#: that would wait longer is answered at once with the same state.
DEFAULT_MAX_HOLD: Final = 10.0


#: The longest ``max_hold`` (seconds): a held request keeps its client connection open.
MAX_HOLD_LIMIT: Final = 300


#: Early retries held at once by one adapter; one more is answered at once with its state.
DEFAULT_MAX_HOLDS: Final = 100


#: Early retries of one token held at once (a client has one retry outstanding; two
#: allow for a client that gave up waiting and sent the retry again).
DEFAULT_MAX_HOLDS_PER_TOKEN: Final = 2


#: An early retry is held at most this many times (the clock may wake a hair early).
HOLDS_MAX: Final = 3


#: ``wait(seconds)``: hold an early retry that long; raise (any exception, or be cancelled)
#: when its client went away. The hold is then abandoned: nothing consumed, nothing run.
Waiter: TypeAlias = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Hold:
    """An early retry its adapter holds itself (``judge_request(..., wait=None)``).

    ``seconds`` to hold it before judging the request again; ``early`` is the
    ``too_early`` verdict, for :class:`Holds` (its token id) and the log records.
    """

    seconds: float
    early: InvalidState

    @property
    def token_id(self) -> str:
        return self.early.token_id or "-"


class Holds:
    """How many early retries are held at once: at most ``total``, ``per_token`` of one token.

    A held retry costs a coroutine and what its adapter keeps of the request until it
    runs (the ASGI middleware keeps the raw body, one copy); these bounds keep a client
    that sends one token's early retry a hundred times, or many tokens' at once, from
    holding memory without limit. A retry over either bound is answered at once with the
    same state (unconsumed), as one due beyond ``max_hold`` is: a well-behaved client just
    retries later, where a refusal would end its flow. One instance per adapter; not
    thread-safe (one event loop).
    """

    __slots__ = ("_by_token", "held", "per_token", "total")

    def __init__(self, total: int = DEFAULT_MAX_HOLDS, per_token: int = DEFAULT_MAX_HOLDS_PER_TOKEN) -> None:
        check_hold_counts(total, per_token)
        self.total = total
        self.per_token = per_token
        self.held = 0
        self._by_token: dict[str, int] = {}

    def enter(self, token_id: str) -> bool:
        """Take a place for an early retry of ``token_id``; False when a bound is reached."""
        count = self._by_token.get(token_id, 0)
        if self.held >= self.total or count >= self.per_token:
            return False
        self.held += 1
        self._by_token[token_id] = count + 1
        return True

    def leave(self, token_id: str) -> None:
        self.held -= 1
        count = self._by_token.pop(token_id) - 1
        if count:
            self._by_token[token_id] = count


def check_hold_counts(total: object, per_token: object) -> None:
    if not (isinstance(total, int) and isinstance(per_token, int) and total >= 0 and per_token >= 0):
        raise ValueError(f"max_holds and max_holds_per_token must be counts, got {total!r}, {per_token!r}")


#: ``stays(seconds)``: wait that long while the client is there; False as soon as it left.
#: An adapter's I/O for a hold (:func:`client_stays` for an ASGI ``receive``).
ClientStays: TypeAlias = Callable[[float], Awaitable[bool]]


Verdict = TypeVar("Verdict", bound=tuple[Any, ...])


async def hold_early(
    judge: Callable[[float], Awaitable[Verdict]],
    *,
    max_hold: float,
    holds: Holds | None,
    stays: ClientStays,
) -> Verdict | None:
    """Judge a request, holding an early retry until its time: the one hold loop of every adapter.

    ``judge(max_hold_left)`` judges the request from the start (re-reading it: an adapter
    keeps only its raw form during a hold) without holding, and returns a tuple whose
    first item is the :class:`Judged` verdict. An early verdict with a :attr:`Judged.hold`
    takes a place in ``holds`` (none left: answered at once, unconsumed), waits
    ``stays(seconds)`` and is judged again, at most :data:`HOLDS_MAX` times, within
    ``max_hold`` seconds in all. ``None``: the client left during a hold (logged and
    counted; nothing consumed, nothing run). A ``stays`` that raises (or is cancelled)
    abandons the hold the same way and the exception goes on.
    """
    held = 0.0
    for attempt in range(HOLDS_MAX + 1):
        verdict = await judge(max_hold - held)
        hold = verdict[0].hold
        if hold is None or attempt == HOLDS_MAX:
            return verdict  # judged, or early and answered at once
        if holds is not None and not holds.enter(hold.token_id):
            hold_refused(holds, hold.early, hold.seconds)
            return verdict
        del verdict  # nothing of the request but its raw form is kept during the hold
        try:
            present = await _hold(stays, hold)
        finally:
            if holds is not None:
                holds.leave(hold.token_id)
        if not present:
            return None
        held += hold.seconds
    raise AssertionError("unreachable: the last attempt returns")  # pragma: no cover


async def _hold(stays: ClientStays, hold: Hold) -> bool:
    early, seconds = hold.early, hold.seconds
    log_early(logging.DEBUG, "early_retry_held", early, seconds, "held for %.3fs", seconds)
    try:
        present = await stays(seconds)
    except BaseException:
        hold_abandoned(early, seconds)
        raise
    if not present:
        hold_abandoned(early, seconds)
    return present


def staying(wait: Waiter) -> ClientStays:
    """A :data:`Waiter` (raises when its client leaves) as a :data:`ClientStays`."""

    async def stays(seconds: float) -> bool:
        await wait(seconds)
        return True

    return stays


async def sleeping(seconds: float) -> bool:
    """The :data:`ClientStays` of a transport that cannot tell a client left: wait, and say it stayed."""
    await asyncio.sleep(seconds)
    return True


async def client_stays(receive: Callable[[], Awaitable[Mapping[str, Any]]], seconds: float) -> bool:
    """Wait ``seconds`` watching an ASGI ``receive`` whose request body is read: False once the client left.

    The next message of such a channel is ``http.disconnect`` when the client closes its
    connection; a channel that breaks means the same. Any other message is unexpected
    once the body is read: the rest of the wait goes unwatched.
    """
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    listener = asyncio.ensure_future(receive())
    try:
        done, _ = await asyncio.wait((listener,), timeout=seconds)
    finally:
        if not listener.done():
            listener.cancel()
    if not done:
        return True
    try:
        if listener.result().get("type") == "http.disconnect":
            return False
    except Exception:  # a receive channel that broke: the client is as good as gone
        return False
    await asyncio.sleep(max(until - loop.time(), 0.0))
    return True


def hold_refused(holds: Holds, early: InvalidState, seconds: float) -> None:
    """Log and count an early retry answered at once because ``holds`` is full."""
    _telemetry.record_shed("hold_limit")
    log_early(
        logging.WARNING, "early_retry_answered", early, seconds,
        "answered with the same state: %d retries held, at most %d (%d of one token)",
        holds.held, holds.total, holds.per_token, reason="hold_limit",
    )  # fmt: skip


def hold_abandoned(early: InvalidState, seconds: float) -> None:
    """Log and count a hold given up because its client went away: nothing consumed, nothing run."""
    _telemetry.record_shed("hold_abandoned")
    log_early(
        logging.INFO, "early_retry_abandoned", early, seconds,
        "abandoned by its client during the hold; token not consumed", reason="hold_abandoned",
    )  # fmt: skip


def log_early(
    level: int,
    event: str,
    early: InvalidState,
    seconds: float,
    what: str,
    *args: object,
    reason: str = "too_early",
) -> None:
    """One record on an early retry, "early retry of flow F round R " then ``what``; its facts as fields."""
    if not logger.isEnabledFor(level):
        return
    fields = _telemetry.fields(
        event, reason=reason, kid=early.kid, token_id=early.token_id, flow_id=early.flow_id,
        round=early.round, wait=round(seconds, 3),
    )  # fmt: skip
    logger.log(
        level,
        "early retry of flow %s round %s " + what,
        (early.flow_id or "-")[:8],
        early.round,
        *args,
        extra=fields,
    )


def wait_until(codec: StateCodec, early: InvalidState) -> float:
    """Seconds from now (the codec's clock) until ``early``'s token is redeemable; at least 1 ms."""
    try:
        wait = float(early.retry_at) - codec.clock()  # type: ignore[arg-type]
    except Exception:  # deny on error: a clock that fails now holds nothing
        wait = math.nan
    if not math.isfinite(wait):
        raise InvalidState(
            "internal_error", "the clock failed while pacing", kid=early.kid, token_id=early.token_id
        )
    return max(wait, 0.001)
