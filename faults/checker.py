"""The checker: judges a history file alone, never the store or the run that wrote it.

Definitions (docs/guarantees.md states them for readers):

- An attempt's interval is [start, end] on ``time.monotonic`` (one clock for every process
  of the machine). A consume took effect at some instant inside its interval, so of two
  overlapping attempts either may have been first.
- A **lost** consume is an ``invoke`` line with no ``attempt`` line of the same token, client
  and start: its process died (SIGKILL) while the consume was in flight, so whether the
  store recorded it is unknown. Single use is "at most once", so a lost consume may burn
  its token.
- **Accepted twice**: a token with two or more ``accepted`` attempts. Always a broken promise.
- **False replay**: an attempt answered ``replayed`` although no attempt of its token that
  could have consumed it had started before the answer: no ``accepted`` attempt and no
  lost consume of that token has ``start < end`` of the replayed one. An entry left by an
  attempt that failed closed (``store_unavailable``) does not excuse it: failing closed
  promises the token stays unconsumed. Counted for honest clients (the promise) and, apart,
  for attackers (who race the honest clients, so only for information).
- **Burnt**: a token no attempt ever got ``accepted`` for, yet some attempt was told
  ``replayed``. Excused when the token has a lost consume (a killed process's in-flight
  consume may have recorded it); every other burnt token is a broken promise.
- **Failed closed**: an attempt answered ``store_unavailable``; its latency is end - start,
  leaving out the attempts whose own process the nemesis stopped meanwhile (``pause-client``:
  that time is not the store's). Histories without ``pause`` events leave out every attempt
  that overlaps a ``pause_client`` fault.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .history import read


@dataclass
class Verdict:
    attempts: int = 0
    tokens: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    accepted_twice: list[str] = field(default_factory=list)
    false_replays: list[dict[str, Any]] = field(default_factory=list)
    attacker_false_replays: int = 0
    burnt: list[str] = field(default_factory=list)
    burnt_excused: list[str] = field(default_factory=list)
    lost_consumes: int = 0
    lost_without_kill: int = 0
    failed_closed: int = 0
    fail_closed_latency: dict[str, float] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    never_resolved: int = 0
    fault_errors: list[str] = field(default_factory=list)
    failed_closed_while_paused: int = 0
    faults_skipped: list[str] = field(default_factory=list)

    def broken(self) -> list[str]:
        """The promises this history breaks, one sentence each (empty: none)."""
        broken = []
        if self.accepted_twice:
            broken.append(f"{len(self.accepted_twice)} token(s) accepted twice: {self.accepted_twice[:5]}")
        if self.false_replays:
            broken.append(f"{len(self.false_replays)} false replay(s) told to honest clients")
        if self.burnt:
            broken.append(f"{len(self.burnt)} token(s) burnt with no lost consume to explain it")
        if self.lost_without_kill:
            broken.append(f"{self.lost_without_kill} consume(s) without an outcome in a process never killed")
        return broken

    def summary(self) -> str:
        latency = self.fail_closed_latency
        lines = [
            f"attempts {self.attempts}, tokens {self.tokens}, outcomes {dict(sorted(self.outcomes.items()))}",
            f"accepted by role: {dict(sorted(self.accepted_by.items()))}",
            f"accepted twice: {len(self.accepted_twice)}",
            f"false replays (honest): {len(self.false_replays)}; "
            f"told to attackers: {self.attacker_false_replays}",
            f"burnt: {len(self.burnt)}; excused by a lost consume of a killed process: "
            f"{len(self.burnt_excused)} (lost consumes: {self.lost_consumes})",
            f"failed closed: {self.failed_closed}"
            + (_latency(latency) if latency else "")
            + (
                f" ({self.failed_closed_while_paused} left out: their process was stopped)"
                if self.failed_closed_while_paused
                else ""
            ),
            f"tokens never resolved (honest client gave up or the run ended): {self.never_resolved}",
        ]
        if self.errors:
            lines.append(f"other errors: {dict(sorted(self.errors.items()))}")
        if self.faults:
            lines.append(f"faults: {dict(sorted(self.faults.items()))}")
        if self.faults_skipped:
            lines.append(f"faults skipped: {sorted(set(self.faults_skipped))}")
        if self.fault_errors:
            lines.append(f"faults that could not be injected: {self.fault_errors}")
        broken = self.broken()
        lines.append("VERDICT: " + ("BROKEN: " + "; ".join(broken) if broken else "ok"))
        return "\n".join(lines)

    def row(self) -> str:
        """The verdict as a row of docs/guarantees.md's table (from "faults injected" on)."""
        p99 = f"{self.fail_closed_latency['p99']:.2f} s" if self.fail_closed_latency else "-"
        burnt = f"{len(self.burnt)}" + (
            f" (+{len(self.burnt_excused)} excused)" if self.burnt_excused else ""
        )
        return (
            f"| {sum(self.faults.values())} | {self.attempts:,} | **{len(self.accepted_twice)}** | {burnt} "
            f"| {len(self.false_replays)} | {self.failed_closed:,} | {p99} |"
        )

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "broken": self.broken()}, indent=2, sort_keys=True)


def _latency(latency: dict[str, float]) -> str:
    return f"; latency p50 {latency['p50']:.3f} s, p99 {latency['p99']:.3f} s, max {latency['max']:.3f} s"


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def check(records: Iterable[dict[str, Any]]) -> Verdict:
    attempts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    invokes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    killed: set[int] = set()
    paused: dict[int | None, list[tuple[float, float]]] = defaultdict(list)
    pausing: dict[int, float] = {}
    fault_windows: list[tuple[float, float]] = []
    open_faults: dict[str, list[float]] = defaultdict(list)
    verdict = Verdict()
    faults: Counter[str] = Counter()
    for record in records:
        kind = record.get("type")
        if kind == "attempt":
            attempts[record["token"]].append(record)
        elif kind == "invoke":
            invokes[record["token"]].append(record)
        elif kind == "event":
            if record.get("kind") == "kill":
                killed.add(int(record["pid"]))
            if record.get("kind") == "pause":
                pausing[int(record["pid"])] = record["at"]
            if record.get("kind") == "resume" and int(record["pid"]) in pausing:
                paused[int(record["pid"])].append((pausing.pop(int(record["pid"])), record["at"]))
            if record.get("kind") == "fault" and record.get("fault") == "pause_client":
                if record.get("phase") == "start":
                    open_faults["pause_client"].append(record["at"])
                elif open_faults["pause_client"]:
                    fault_windows.append((open_faults["pause_client"].pop(0), record["at"]))
            if record.get("kind") == "fault_skipped":
                verdict.faults_skipped.append(f"{record.get('fault')}: {record.get('why')}")
            if record.get("kind") == "fault_error":
                verdict.fault_errors.append(f"{record.get('fault')}: {record.get('error')}")
            if record.get("kind") == "fault" and record.get("phase") == "start":
                faults[str(record.get("fault"))] += 1
    verdict.faults = dict(faults)
    for pid, since in pausing.items():
        paused[pid].append((since, math.inf))
    if not paused and fault_windows:
        paused[None] = fault_windows  # an older history: the stopped process is unknown

    lost: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for token, calls in invokes.items():
        finished = {(a["client"], a["start"]) for a in attempts.get(token, [])}
        for call in calls:
            if (call["client"], call["start"]) not in finished:
                if int(call["process"]) in killed:
                    lost[token].append(call)
                else:
                    verdict.lost_without_kill += 1
    verdict.lost_consumes = sum(map(len, lost.values()))

    outcomes: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    accepted_by: Counter[str] = Counter()
    latencies: list[float] = []
    for token in sorted(set(attempts) | set(lost)):
        tried = attempts.get(token, [])
        accepted = [a for a in tried if a["outcome"] == "accepted"]
        replayed = [a for a in tried if a["outcome"] == "replayed"]
        for a in tried:
            outcomes[a["outcome"]] += 1
            if a["outcome"] == "accepted":
                accepted_by[a["role"]] += 1
            if a["outcome"] == "error":
                errors[a.get("reason") or "unknown"] += 1
            if a["outcome"] == "store_unavailable":
                windows = paused.get(int(a["process"]), []) + paused.get(None, [])
                if any(since < a["end"] and a["start"] < until for since, until in windows):
                    verdict.failed_closed_while_paused += 1
                else:
                    latencies.append(a["end"] - a["start"])
        if len(accepted) > 1:
            verdict.accepted_twice.append(token)
        could_consume = [a["start"] for a in accepted] + [c["start"] for c in lost.get(token, [])]
        for r in replayed:
            if not any(start < r["end"] for start in could_consume):
                if r["role"] == "honest":
                    verdict.false_replays.append(
                        {"token": token, "client": r["client"], "start": r["start"], "end": r["end"]}
                    )
                else:
                    verdict.attacker_false_replays += 1
        if replayed and not accepted:
            (verdict.burnt_excused if lost.get(token) else verdict.burnt).append(token)
        honest = [a for a in tried if a["role"] == "honest"]
        if honest and not any(a["outcome"] in ("accepted", "replayed") for a in honest) and not accepted:
            verdict.never_resolved += 1
    verdict.attempts = sum(outcomes.values())
    verdict.tokens = len(set(attempts) | set(lost))
    verdict.outcomes = dict(outcomes)
    verdict.errors = dict(errors)
    verdict.accepted_by = dict(accepted_by)
    verdict.failed_closed = outcomes["store_unavailable"]
    if latencies:
        verdict.fail_closed_latency = {
            "p50": percentile(latencies, 0.50),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies),
        }
    return verdict


def check_file(path: Path) -> Verdict:
    return check(read(path))
