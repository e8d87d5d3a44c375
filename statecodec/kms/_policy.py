"""The rotation decision, once: from a ring's metadata and the clock, what the job does.

Every source that can rotate (a file or KV document, a transit key) asks
:meth:`RotationPolicy.decide` and only *applies* the answer in its own way: a document
adds the new key and writes ``retires_at``, transit calls ``rotate`` and raises
``min_decryption_version``. The decision never sees a secret (a
:func:`~statecodec.kms._source.metadata_ring` is enough) and depends only on the ring and
``now``, so a second run right after the first changes nothing.

The safety floor lives here, in the policy's constructor: a ``retire_after`` shorter
than :attr:`Timeline.min_retire_after` would let a replaced key vanish while tokens
minted with it still live, so no source can decide with one, whoever calls it. A source
is asked to rotate with a :class:`RotationRequest`, which holds a policy: there is no
way to ask one without the floor having been checked.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .._humanize import duration, iso, relative
from .._keys import Key, KeyRing
from ._timeline import Timeline


@dataclass(frozen=True, slots=True)
class Decision:
    """What one rotation run does to a ring (nothing is done here)."""

    rotate: bool  # add a key: the newest live one is at least min_age old (or there is none)
    newest: Key | None  # the newest live key before the run
    newest_age: float | None
    primary: str | None  # the key that mints at ``now``, which is never retired
    retire: tuple[tuple[str, int], ...]  # (kid, retires_at): its successor is retire_after old
    remove: tuple[str, ...]  # retired more than retire_after ago: the secret may leave for good
    #: When the newest key, added by an earlier rotation and not promoted yet, becomes primary.
    pending_until: int | None = None


@dataclass(frozen=True, slots=True)
class RotationPolicy:
    """``min_age`` and ``retire_after`` (seconds) under the services' :class:`Timeline`."""

    min_age: float
    retire_after: float
    timeline: Timeline
    force: bool = False  # rotate even while the key of an earlier rotation is still pending

    def __post_init__(self) -> None:
        if self.min_age < 0:
            raise ValueError("min_age must be >= 0 seconds")
        tl = self.timeline
        if self.retire_after < tl.min_retire_after:
            raise ValueError(
                f"retire_after={duration(self.retire_after)} is too short: a replaced key must verify for "
                f"{duration(tl.min_retire_after)} after its successor is created (promotion delay "
                f"{tl.promotion_delay}s + staleness limit {tl.staleness_limit:g}s + max ttl {tl.max_ttl:g}s "
                f"+ expiry grace {tl.expiry_grace:g}s + 1s); raise it, or pass the timeline your services "
                "really use"
            )

    def decide(self, ring: KeyRing, now: float) -> Decision:
        """Rotate when the newest live key is ``min_age`` old and no longer pending (or ``force``);
        retire a key once its successor is ``retire_after`` old (never the primary); drop
        tombstones ``retire_after`` later.

        A key stamped ``now`` changes neither the primary (it is not promoted yet) nor any
        retirement (its predecessor waits ``retire_after`` from now), so for a document the
        decision over the ring before the new key is also the decision after it. A source
        that dates new keys by its own clock (transit) decides again after adding one.
        """
        live = sorted((k for k in ring.keys if k.verifies_at(now)), key=lambda k: k.created_at)
        newest = live[-1] if live else None
        age = None if newest is None else now - newest.created_at
        plan = self.timeline.plan(ring, now)
        primary = plan.ring.primary_kid if live else None
        newest_state = next((st for st in plan.states if newest is not None and st.kid == newest.kid), None)
        retire = tuple(
            (older.kid, successor.created_at + int(self.retire_after))
            for older, successor in itertools.pairwise(live)
            if older.retires_at is None
            and successor.created_at + int(self.retire_after) <= now
            and older.kid != primary
        )
        # Retired keys stay one more retire_after as tombstones (``keys list`` shows them),
        # then their secrets leave the document for good.
        until = dict(retire)
        remove = tuple(
            k.kid
            for k in ring.keys
            if (at := until.get(k.kid, k.retires_at)) is not None and at <= now - self.retire_after
        )
        pending_until = None if newest_state is None else newest_state.primary_from
        return Decision(
            rotate=(age is None or age >= self.min_age) and (self.force or pending_until is None),
            newest=newest,
            newest_age=age,
            primary=primary,
            retire=retire,
            remove=remove,
            pending_until=pending_until,
        )

    def held_back(self, decision: Decision, now: float) -> str | None:
        """Why no key is added although the newest is ``min_age`` old: an earlier rotation's key is pending.

        A new key would promote right behind it and replace it moments after its own
        promotion: two rotations for one. ``force`` adds it anyway.
        """
        due = decision.newest_age is None or decision.newest_age >= self.min_age
        if not due or self.force or decision.pending_until is None or decision.newest is None:
            return None
        return (
            f"no new key: {decision.newest.kid}, made by an earlier rotation "
            f"{relative(-(decision.newest_age or 0))}, is still pending and becomes primary at "
            f"{iso(decision.pending_until)} ({relative(decision.pending_until - now)}); "
            "a new key now would replace it as soon as it is promoted (--force adds one anyway)"
        )


@dataclass(frozen=True, slots=True)
class RotationRequest:
    """One rotation run, as its caller asked for it: what every source's ``rotate`` takes.

    Built once, by :func:`~statecodec.kms.rotate` (and so by ``statecodec keys rotate``),
    before any source is opened: the policy (its floor checked when it was made), the
    instant every age is judged at, and whether to write or only say what would change.
    """

    policy: RotationPolicy
    now: float
    dry_run: bool = False
