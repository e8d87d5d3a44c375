"""Rotation of a keyring *document* (a file, a KV v2 secret): one pure function.

The caller reads the document, calls :func:`rotate_ring`, and writes the result only if
nobody else wrote in between (a file lock, a KV check-and-set). Because the decision
depends only on the document and the clock, a second run right after the first finds a
fresh newest key and changes nothing: the job is idempotent.
"""

from __future__ import annotations

import itertools

from .._keys import Key, KeyRing, new_kid
from ._source import RotationReport
from ._timeline import Timeline


def rotate_ring(
    ring: KeyRing,
    *,
    source: str,
    min_age: float,
    retire_after: float,
    now: float,
    dry_run: bool,
    timeline: Timeline,
) -> tuple[KeyRing | None, RotationReport]:
    """The document to write (``None`` when nothing changes) and the report."""
    live = sorted((k for k in ring.keys if k.verifies_at(now)), key=lambda k: k.created_at)
    newest = live[-1] if live else None
    age = None if newest is None else now - newest.created_at
    keys = list(ring.keys)
    new: Key | None = None
    if newest is None or now - newest.created_at >= min_age:
        new = Key.generate(_unused_kid(ring), created_at=int(now))
        keys.append(new)
        live.append(new)

    # The stored primary follows the same rule as every KeyManager, so a reader that
    # uses the document directly (KeyRing.from_json) mints with a key everyone verifies.
    primary = timeline.plan(KeyRing(keys, _keep(ring.primary_kid, keys)), now).ring.primary_kid

    retired: list[str] = []
    for older, successor in itertools.pairwise(live):
        until = successor.created_at + int(retire_after)
        if older.retires_at is None and until <= now and older.kid != primary:
            keys = [Key(k.kid, k.secret, k.created_at, until) if k.kid == older.kid else k for k in keys]
            retired.append(older.kid)
    # Retired keys stay one more retire_after as tombstones (``keys list`` shows them),
    # then their secrets leave the document for good.
    removed = [k.kid for k in keys if k.retires_at is not None and k.retires_at <= now - retire_after]
    keys = [k for k in keys if k.kid not in removed]

    out = KeyRing(keys, primary)
    after = new or newest
    report = RotationReport(
        source=source,
        rotated=new is not None,
        newest_kid=after.kid if after else None,
        newest_age=age,
        new_kid=new.kid if new else None,
        retired=tuple(retired),
        removed=tuple(removed),
        dry_run=dry_run,
    )
    return (None if out == ring else out), report


def _unused_kid(ring: KeyRing) -> str:
    while (kid := new_kid()) in ring.kids:
        pass  # 2**32 random kids: a collision is rare, never twice in a row
    return kid


def _keep(primary: str | None, keys: list[Key]) -> str | None:
    return primary if any(k.kid == primary for k in keys) else None
