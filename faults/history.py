"""The history: one JSON object per line, appended by every process of a run.

Three kinds of line:

- ``invoke``: written just before a consume is sent (token, client, process, start), so that
  a process killed mid-consume leaves a trace of the consumes it had in flight;
- ``attempt``: one finished redemption attempt: token, client, role (``honest`` or
  ``attacker``), api (``sync`` or ``async``), process id, start and end (``time.monotonic``,
  which is one clock for every process of the machine, plus wall time for people), and the
  outcome: ``accepted``, ``replayed``, ``store_unavailable`` or ``error`` with its reason;
- ``event``: what the nemesis and the runner did (a fault started or healed, a process
  killed), for the report; the checker needs only ``kill`` events.

Each line is written with one ``os.write`` on a file opened ``O_APPEND``: on a local file
system the kernel appends it whole, so lines of concurrent processes never interleave.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OUTCOMES = ("accepted", "replayed", "store_unavailable", "error")
ROLES = ("honest", "attacker")
APIS = ("sync", "async")


@dataclass(frozen=True)
class Attempt:
    token: str
    client: str
    role: str
    api: str
    process: int
    start: float
    end: float
    outcome: str
    reason: str = ""
    detail: str = ""
    wall_start: float = 0.0
    wall_end: float = 0.0
    type: str = field(default="attempt")


@dataclass(frozen=True)
class Invoke:
    token: str
    client: str
    role: str
    process: int
    start: float
    type: str = field(default="invoke")


class HistoryWriter:
    """Appends lines to the history file; safe from several threads and processes."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, record: Attempt | Invoke | dict[str, Any]) -> None:
        data = record if isinstance(record, dict) else asdict(record)
        line = (json.dumps(data, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def event(self, kind: str, **fields: Any) -> None:
        self.write({"type": "event", "kind": kind, "at": time.monotonic(), "wall": time.time(), **fields})

    def close(self) -> None:
        os.close(self._fd)


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a history, in file order; a last line cut by a kill is skipped."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.endswith("\n"):
                break  # a write cut short: only possible for the file's last line
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
