"""Key ring *documents* (a file, a KV v2 secret): pure changes, written by read-modify-write.

A :class:`DocumentSource` reads the document, applies a pure function of the document
and the clock, and writes the result only if nobody else wrote in between (a file lock,
a KV check-and-set). Because :func:`rotate_ring` applies the policy's decision
(:mod:`._policy`), which depends only on the document and the clock, a second run right
after the first finds a fresh newest key and changes nothing: the rotation job is
idempotent.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from .._keys import Key, KeyRing, new_kid
from ._policy import RotationRequest
from ._source import KeySource, RotationReport
from ._timeline import Timeline

#: A change to a document: the ring to write, or None to leave it as it is.
Change = Callable[[KeyRing], KeyRing | None]


class DocumentSource(KeySource):
    """A source whose keys are one key ring document, changed only through :meth:`_update`."""

    @abc.abstractmethod
    def _update(self, change: Change) -> None:
        """Read the document, apply ``change``, write its result unless another writer came first.

        ``change`` may run more than once (after a lost check-and-set it decides again
        from what the other writer wrote), so it must be pure.
        """

    def rotate(self, request: RotationRequest) -> RotationReport:
        reports: list[RotationReport] = []

        def change(ring: KeyRing) -> KeyRing | None:
            new, report = rotate_ring(ring, source=self.describe(), request=request)
            reports.append(report)
            return None if request.dry_run else new

        self._update(change)
        return reports[-1]  # the decision that was written

    def retire_scope(self, ring: KeyRing, kid: str) -> tuple[tuple[str, ...], str | None]:
        return (kid,), None  # a document loses exactly the one key

    def add_key(self, *, now: float, timeline: Timeline, notes: list[str]) -> str:
        added: list[str] = []

        def change(ring: KeyRing) -> KeyRing:
            key = Key.generate(_unused_kid(ring), created_at=int(now))
            added.append(key.kid)
            return with_primary([*ring.keys, key], ring.primary_kid, timeline, now)

        self._update(change)
        return added[-1]

    def remove_keys(self, kids: tuple[str, ...], *, now: float, timeline: Timeline, notes: list[str]) -> None:
        gone: list[bool] = []

        def change(ring: KeyRing) -> KeyRing | None:
            keys = [k for k in ring.keys if k.kid not in kids]
            gone.append(len(keys) == len(ring.keys))
            return None if gone[-1] else with_primary(keys, ring.primary_kid, timeline, now)

        self._update(change)
        if gone[-1]:
            notes.append(f"{', '.join(kids)} had already left the document (a concurrent retire?)")


def with_primary(keys: list[Key], primary: str | None, timeline: Timeline, now: float) -> KeyRing:
    """``keys`` as a document whose stored primary is the one every KeyManager would choose.

    So a reader that uses the document directly (``KeyRing.from_json``) mints with a key
    everyone verifies. The old primary is kept only to break ties within one second.
    """
    kept = primary if any(k.kid == primary for k in keys) else None
    return KeyRing(keys, timeline.plan(KeyRing(keys, kept), now).ring.primary_kid)


def rotate_ring(
    ring: KeyRing, *, source: str, request: RotationRequest
) -> tuple[KeyRing | None, RotationReport]:
    """The document to write (``None`` when nothing changes) and the report: the
    policy's decision, applied to a document (a new key, ``retires_at`` marks, tombstones dropped)."""
    policy, now = request.policy, request.now
    decision = policy.decide(ring, now)
    keys = list(ring.keys)
    new: Key | None = None
    if decision.rotate:
        new = Key.generate(_unused_kid(ring), created_at=int(now))
        keys.append(new)
    primary = with_primary(keys, ring.primary_kid, policy.timeline, now).primary_kid
    until = dict(decision.retire)
    keys = [
        Key(k.kid, k.secret, k.created_at, until[k.kid]) if k.kid in until else k
        for k in keys
        if k.kid not in decision.remove
    ]
    out = KeyRing(keys, primary)
    after = new or decision.newest
    report = RotationReport(
        source=source,
        rotated=new is not None,
        newest_kid=after.kid if after else None,
        newest_age=decision.newest_age,
        new_kid=new.kid if new else None,
        retired=tuple(until),
        removed=decision.remove,
        dry_run=request.dry_run,
        notes=tuple(note for note in (policy.held_back(decision, now),) if note),
        held_back=policy.held_back(decision, now) is not None,
    )
    return (None if out == ring else out), report


def _unused_kid(ring: KeyRing) -> str:
    while (kid := new_kid()) in ring.kids:
        pass  # 2**32 random kids: a collision is rare, never twice in a row
    return kid
