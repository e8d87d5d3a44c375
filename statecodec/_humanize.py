"""Durations and instants for people: ``duration(252) == "4m12s"``, ``iso(0) == "1970-01-01T00:00:00Z"``."""

from __future__ import annotations

import datetime as dt


def duration(seconds: float) -> str:
    """Render a non-negative span compactly: 45s, 4m12s, 3h05m, 2d04h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        m, s = divmod(s, 60)
        return f"{m}m{s:02d}s" if s else f"{m}m"
    if s < 86400:
        h, rem = divmod(s, 3600)
        return f"{h}h{rem // 60:02d}m"
    d, rem = divmod(s, 86400)
    return f"{d}d{rem // 3600:02d}h"


def iso(ts: float) -> str:
    """A Unix time as ISO 8601 UTC, to the second."""
    return dt.datetime.fromtimestamp(int(ts), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def relative(delta: float) -> str:
    """'in 4m12s' for a future offset, '3m ago' for a past one."""
    return f"in {duration(delta)}" if delta >= 0 else f"{duration(-delta)} ago"


def one_line(text: str, limit: int | None = 500) -> str:
    """``text`` on one line (every run of whitespace, newlines included, becomes one space), clipped.

    Error messages reach terminals and log lines; a message from a dependency may span
    several lines (Vault's error lists, tracebacks in exception text). ``limit=None``
    keeps it whole (a message statecodec wrote itself, however many problems it lists).
    """
    flat = " ".join(text.split())
    return flat if limit is None or len(flat) <= limit else flat[:limit] + "..."
