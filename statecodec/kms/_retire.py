"""Emergency retirement: after a leak, make a key stop verifying everywhere, now.

Removing a key from the source is easy; doing it without failing any other token takes
an order, because every instance refreshes on its own:

1. If the key is the primary (instances mint with it), something else must mint first.
   A pending key, if there is one, takes over; otherwise a new key is created. Before
   the cut, that successor must be promoted on every instance: ``promotion_delay`` after
   its creation (by then every instance has loaded it) plus ``max_skew`` (by then every
   instance's clock says it is promoted). Cutting earlier would make an instance that
   refreshes in between mint with a key the others do not verify yet, or fall back to an
   older key the others already consider retired.
2. Cut: the key leaves the source (a document loses exactly that key; transit raises
   ``min_decryption_version``, which also cuts every older version). Each instance drops
   it at its next refresh, so within one refresh interval (``refresh_interval * (1 +
   jitter)``) no healthy instance accepts it any more. Tokens sealed with other keys are
   untouched.

A key that is not the primary is cut at once. ``at_once`` (``keys retire KID --now``)
cuts the primary at once too, for a leak where the wait (promotion delay + skew) is
exposure: the successor is still made, but the cut does not wait for it, so honest rounds
minted with the key meanwhile fail, and until the successor is promoted an instance mints
with an older key or not at all. The plan says so. Nothing here needs more than the
rotation job's policy: transit metadata, ``rotate`` and ``config``; the KV document itself.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _telemetry
from .._humanize import duration
from .._keys import KeyRing
from ._errors import KeySourceError
from ._rotate import with_source
from ._source import KeySource
from ._timeline import Timeline

logger = logging.getLogger("statecodec.kms")


@dataclass(frozen=True, slots=True)
class RetirementReport:
    """What one ``retire()`` run found and did (or, with ``dry_run``, would do)."""

    source: str
    kid: str
    retired: tuple[str, ...]  # every key that stops verifying: kid, and for transit the older versions
    primary: str | None  # the key minting when the run started
    new_key: bool = False  # the primary is retired and no pending key can take over: one is made
    successor: str | None = None  # the key that mints instead (None while a new one is only planned)
    wait: float = 0.0  # seconds waited (planned, on a dry run) before the cut, for the successor
    drop_within: float = 0.0  # after the cut, every healthy instance drops the keys within this
    dry_run: bool = False
    cut_at: float | None = None  # when the keys left the source; None on a dry run
    notes: tuple[str, ...] = field(default_factory=tuple)
    at_once: bool = False  # cut without waiting for the successor (keys retire --now)
    successor_in: float = 0.0  # at_once: seconds until every instance mints with the successor

    @property
    def changed(self) -> bool:
        return self.cut_at is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "kid": self.kid,
            "retired": list(self.retired),
            "primary": self.primary,
            "new_key": self.new_key,
            "successor": self.successor,
            "wait": self.wait,
            "drop_within": self.drop_within,
            "dry_run": self.dry_run,
            "cut_at": self.cut_at,
            "notes": list(self.notes),
            "at_once": self.at_once,
            "successor_in": self.successor_in,
        }

    def _handover(self) -> str:
        who = f"new key {self.successor}" if self.new_key and self.successor else "a new key"
        wait = duration(self.wait)
        if self.at_once:
            wait = duration(self.successor_in)
            made = f"{who} {'would be' if self.dry_run else 'was'} made" if self.new_key else self.successor
            within = f"within at most {wait}" if self.dry_run else f"within {wait}"
            return (
                f"{'mints' if self.dry_run else 'minted'}: cut at once (--now), without waiting for {made} "
                f"to spread: honest rounds minted with {self.kid} meanwhile fail, and until it is promoted "
                f"everywhere ({within}) an instance mints with an older key or not at all"
            )
        if self.dry_run:
            made = f"{self.successor} would take over"
            if self.new_key:
                made = f"{who} would be made and take over"
            # At most: the wait runs from the successor's creation, whose timestamp is whole
            # seconds, so the run waits up to a second less (and never more) than planned.
            return f"mints now: first {made}, once every instance mints with it (a wait of at most {wait})"
        made = f"{who} was made and took over" if self.new_key else f"{self.successor} took over"
        return f"minted: first {made}, once every instance minted with it (waited {wait})"

    def __str__(self) -> str:
        would = "would " if self.dry_run else ""
        others = [k for k in self.retired if k != self.kid]
        lines = [f"{self.source}: {would}retire {self.kid}" + (f" and {', '.join(others)}" if others else "")]
        if self.new_key or self.successor is not None:
            lines.append(f"  {self.primary} {self._handover()}")
        when = "once cut" if self.dry_run else "now cut"
        lines.append(
            f"  {when}, every instance rejects tokens of {', '.join(self.retired)} within "
            f"{duration(self.drop_within) if self.drop_within >= 1 else f'{self.drop_within:.1f}s'} "
            "(its next refresh); other tokens are unaffected"
        )
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def retire(
    source: KeySource | str,
    kid: str,
    *,
    timeline: Timeline | None = None,
    dry_run: bool = False,
    at_once: bool = False,
    expect: Sequence[str] | None = None,
    progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> RetirementReport:
    """Make ``kid`` stop verifying on every instance, without failing any other token.

    ``timeline`` must be the services' (:class:`Timeline`; default the library's). When
    ``kid`` is the primary, a successor is made (or a pending key chosen) first and this
    call waits, up to ``promotion_delay + max_skew`` seconds, until every instance
    mints with it; then the key is cut at the source. ``dry_run`` changes nothing and
    reports the plan. ``at_once``: cut without that wait (after a leak, when the wait is
    exposure); tokens minted with ``kid`` meanwhile fail. ``expect``: the kids a person
    confirmed from a dry run; if the run
    would retire others (the source changed meanwhile), it refuses. ``progress``
    receives one line before a wait.
    """
    tl = timeline or Timeline()
    return with_source(
        source,
        lambda src: _retire(
            src,
            kid,
            tl=tl,
            dry_run=dry_run,
            at_once=at_once,
            expect=expect,
            progress=progress or _log_progress,
            clock=clock,
            sleep=sleep,
        ),
    )


def _retire(
    src: KeySource,
    kid: str,
    *,
    tl: Timeline,
    dry_run: bool,
    at_once: bool,
    expect: Sequence[str] | None,
    progress: Callable[[str], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> RetirementReport:
    plan, ready_at = _plan(src, kid, tl, expect, clock())
    if at_once:  # nothing is waited for: the wait becomes the successor's time to spread
        plan = dataclasses.replace(plan, at_once=True, successor_in=plan.wait, wait=0.0)
    if dry_run:
        return plan
    notes = list(plan.notes)
    successor = plan.successor
    if plan.new_key:
        successor = src.add_key(now=clock(), timeline=tl, notes=notes)
        ready_at = src.metadata().require(successor).created_at + tl.promotion_delay + tl.max_skew
        _log(src, f"created {successor} to take over from {kid}", kid=kid, successor=successor)
    started = clock()
    if ready_at > started and not at_once:
        progress(
            f"waiting {duration(ready_at - started)} until every instance mints with {successor} "
            f"before cutting {', '.join(plan.retired)}"
        )
        while (remaining := ready_at - clock()) > 0:
            sleep(remaining)
    waited = max(0.0, clock() - started) if ready_at > started and not at_once else 0.0
    cut_at = _cut(src, plan, tl=tl, clock=clock, notes=notes)
    return dataclasses.replace(
        plan,
        successor=successor,
        wait=waited,
        successor_in=max(0.0, ready_at - cut_at) if at_once else 0.0,
        dry_run=False,
        cut_at=cut_at,
        notes=tuple(notes),
    )


def _plan(
    src: KeySource, kid: str, tl: Timeline, expect: Sequence[str] | None, now: float
) -> tuple[RetirementReport, float]:
    """What retiring ``kid`` means now, and from when the cut is safe."""
    ring = src.metadata()
    retired, why = _scope(src, ring, kid)
    if expect is not None and set(expect) != set(retired):
        raise KeySourceError(
            f"the keys changed since the plan was shown: retiring {kid} now retires {', '.join(retired)}, "
            f"not {', '.join(expect) or 'nothing'}; nothing was changed, run the retire again",
            kind="conflict",
            source=src.describe(),
        )
    timing = tl.plan(ring, now)
    primary = timing.ring.primary_kid
    successor: str | None = None
    ready_at = now
    if primary in retired:
        pending = [s for s in timing.states if s.state == "pending" and s.kid not in retired]
        if pending:
            first = min(pending, key=lambda s: s.created_at)  # the first to be promoted
            successor, ready_at = first.kid, first.promotes_at + tl.max_skew
        else:  # a new key, created now
            ready_at = now + tl.promotion_delay + tl.max_skew
    plan = RetirementReport(
        source=src.describe(),
        kid=kid,
        retired=retired,
        primary=primary,
        new_key=primary in retired and successor is None,
        successor=successor,
        wait=max(0.0, ready_at - now),
        drop_within=tl.max_refresh_gap,
        dry_run=True,
        notes=(why,) if why else (),
    )
    return plan, ready_at


def _cut(
    src: KeySource, plan: RetirementReport, *, tl: Timeline, clock: Callable[[], float], notes: list[str]
) -> float:
    """Remove the planned keys unless the source changed meanwhile; when it happened."""
    # Decide again from what the source says now: a rotation or another retire may have run.
    kid, retired, now = plan.kid, plan.retired, clock()
    ring = src.metadata()
    again, _ = _scope(src, ring, kid)
    primary = tl.plan(ring, now).ring.primary_kid
    if set(again) != set(retired) or (primary in retired and not plan.at_once):
        raise KeySourceError(
            f"the keys changed while waiting (retiring {kid} now means {', '.join(again)}, and "
            f"{primary} mints); nothing was cut, run the retire again",
            kind="conflict",
            source=src.describe(),
        )
    src.remove_keys(retired, now=now, timeline=tl, notes=notes)
    cut_at = clock()
    _log(src, f"retired {', '.join(retired)}", kids=list(retired))
    return cut_at


def _scope(src: KeySource, ring: KeyRing, kid: str) -> tuple[tuple[str, ...], str | None]:
    if kid not in ring.kids:
        raise KeySourceError(
            f"no key {kid} (keys: {', '.join(ring.kids) or 'none'}); nothing retired. "
            "`statecodec keys list` shows the kids; a retired key is no longer listed",
            kind="missing",
            source=src.describe(),
        )
    retired, why = src.retire_scope(ring, kid)
    return retired, why


def _log(src: KeySource, what: str, **fields: Any) -> None:
    # What the operator asked for, done: INFO (a warning is for what went wrong).
    logger.info(
        "%s: %s",
        src.describe(),
        what,
        extra={**_telemetry.fields("keys_retired", source=src.describe()), **fields},
    )


def _log_progress(line: str) -> None:
    logger.info("%s", line, extra=_telemetry.fields("retire_progress"))
