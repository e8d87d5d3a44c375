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
- **Stuck**: a token no attempt got ``accepted`` for and none was told ``replayed``
  (else it is burnt), whose honest client gave up after failing closed (a ``gave_up``
  event: its retries ran out, not the run) while the store accepted other tokens during
  its last ``STUCK_WINDOW`` seconds of retries: the store answered everyone but this
  token, as it does for an entry a failed-closed call left and nobody takes back.
  Excused like a burn when the token has a lost consume. Reported, not a broken promise:
  the history shows that the client gave up, not that the token would be refused for
  good (an entry may be taken back, or expire, later).
- **Failed closed**: an attempt answered ``store_unavailable``; its latency is end - start,
  leaving out the attempts whose own process the nemesis stopped meanwhile (``pause-client``:
  that time is not the store's). Histories without ``pause`` events leave out every attempt
  that overlaps a ``pause_client`` fault.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .history import read

#: Seconds before giving up during which another token's acceptance shows the store answering.
STUCK_WINDOW = 10.0


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
    stuck: list[str] = field(default_factory=list)
    stuck_excused: list[str] = field(default_factory=list)
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
        return _present([
            (self.accepted_twice,
             f"{len(self.accepted_twice)} token(s) accepted twice: {self.accepted_twice[:5]}"),
            (self.false_replays, f"{len(self.false_replays)} false replay(s) told to honest clients"),
            (self.burnt, f"{len(self.burnt)} token(s) burnt with no lost consume to explain it"),
            (self.lost_without_kill,
             f"{self.lost_without_kill} consume(s) without an outcome in a process never killed"),
        ])  # fmt: skip

    def summary(self) -> str:
        latency = self.fail_closed_latency
        paused = f" ({self.failed_closed_while_paused} left out: their process was stopped)"
        lines = [
            f"attempts {self.attempts}, tokens {self.tokens}, outcomes {dict(sorted(self.outcomes.items()))}",
            f"accepted by role: {dict(sorted(self.accepted_by.items()))}",
            f"accepted twice: {len(self.accepted_twice)}",
            f"false replays (honest): {len(self.false_replays)}; "
            f"told to attackers: {self.attacker_false_replays}",
            f"burnt: {len(self.burnt)}; excused by a lost consume of a killed process: "
            f"{len(self.burnt_excused)} (lost consumes: {self.lost_consumes})",
            f"stuck (never accepted, honest client gave up failing closed while others were accepted): "
            f"{len(self.stuck)}; excused by a lost consume: {len(self.stuck_excused)}",
            f"failed closed: {self.failed_closed}"
            + (_latency(latency) if latency else "")
            + (paused if self.failed_closed_while_paused else ""),
            f"tokens never resolved (honest client gave up or the run ended): {self.never_resolved}",
        ]
        lines += _present([
            (self.errors, f"other errors: {dict(sorted(self.errors.items()))}"),
            (self.faults, f"faults: {dict(sorted(self.faults.items()))}"),
            (self.faults_skipped, f"faults skipped: {sorted(set(self.faults_skipped))}"),
            (self.fault_errors, f"faults that could not be injected: {self.fault_errors}"),
        ])  # fmt: skip
        broken = self.broken()
        lines.append("VERDICT: " + ("BROKEN: " + "; ".join(broken) if broken else "ok"))
        return "\n".join(lines)

    def row(self) -> str:
        """The verdict as a row of docs/guarantees.md's table (from "faults injected" on)."""
        p99 = f"{self.fail_closed_latency['p99']:.2f} s" if self.fail_closed_latency else "-"
        burnt, stuck = (
            _with_excused(self.burnt, self.burnt_excused),
            _with_excused(self.stuck, self.stuck_excused),
        )
        return (
            f"| {sum(self.faults.values())} | {self.attempts:,} | **{len(self.accepted_twice)}** | {burnt} "
            f"| {stuck} | {len(self.false_replays)} | {self.failed_closed:,} | {p99} |"
        )

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "broken": self.broken()}, indent=2, sort_keys=True)


def _present(pairs: Iterable[tuple[object, str]]) -> list[str]:
    """The texts whose value is set (non-empty, non-zero), in order."""
    return [text for value, text in pairs if value]


def _with_excused(found: list[str], excused: list[str]) -> str:
    return f"{len(found)}" + (f" (+{len(excused)} excused)" if excused else "")


def _latency(latency: dict[str, float]) -> str:
    return f"; latency p50 {latency['p50']:.3f} s, p99 {latency['p99']:.3f} s, max {latency['max']:.3f} s"


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


@dataclass
class History:
    """A history's records, sorted by kind."""

    attempts: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    invokes: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    killed: set[int] = field(default_factory=set)
    #: Per process, the intervals the nemesis kept it stopped (None: a process unknown).
    paused: dict[int | None, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    #: (token, client) -> when the honest client gave up on it.
    gave_up: dict[tuple[str, str], float] = field(default_factory=dict)
    #: When each acceptance ended, sorted.
    acceptances: list[float] = field(default_factory=list)


def _read(records: Iterable[dict[str, Any]], verdict: Verdict) -> History:
    history = History()
    pausing: dict[int, float] = {}
    pause_faults: list[float] = []
    fault_windows: list[tuple[float, float]] = []
    faults: Counter[str] = Counter()
    for record in records:
        kind = record.get("type")
        if kind in ("attempt", "invoke"):
            (history.attempts if kind == "attempt" else history.invokes)[record["token"]].append(record)
        elif kind == "event":
            event, pid = record.get("kind"), record.get("pid")
            if event == "kill":
                history.killed.add(int(pid))  # type: ignore[arg-type]
            elif event == "pause":
                pausing[int(pid)] = record["at"]  # type: ignore[arg-type]
            elif event == "resume" and int(pid) in pausing:  # type: ignore[arg-type]
                history.paused[int(pid)].append((pausing.pop(int(pid)), record["at"]))  # type: ignore[arg-type]
            elif event == "gave_up":
                history.gave_up[(record["token"], record["client"])] = record["at"]
            elif event == "fault_skipped":
                verdict.faults_skipped.append(f"{record.get('fault')}: {record.get('why')}")
            elif event == "fault_error":
                verdict.fault_errors.append(f"{record.get('fault')}: {record.get('error')}")
            elif event == "fault":
                _fault_event(record, faults, pause_faults, fault_windows)
    verdict.faults = dict(faults)
    for pid, since in pausing.items():
        history.paused[pid].append((since, math.inf))
    if not history.paused and fault_windows:
        history.paused[None] = fault_windows  # an older history: the stopped process is unknown
    history.acceptances = sorted(
        a["end"] for tried in history.attempts.values() for a in tried if a["outcome"] == "accepted"
    )
    return history


def _fault_event(record: dict[str, Any], faults: Counter[str], opened: list[float],
                 windows: list[tuple[float, float]]) -> None:  # fmt: skip
    """Count a fault's start; keep pause_client's intervals (for histories without pause events)."""
    if record.get("phase") == "start":
        faults[str(record.get("fault"))] += 1
    if record.get("fault") == "pause_client":
        if record.get("phase") == "start":
            opened.append(record["at"])
        elif opened:
            windows.append((opened.pop(0), record["at"]))


def _lost(history: History, verdict: Verdict) -> dict[str, list[dict[str, Any]]]:
    """Per token, the consumes lost with a killed process (an invoke with no attempt)."""
    lost: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for token, calls in history.invokes.items():
        finished = {(a["client"], a["start"]) for a in history.attempts.get(token, [])}
        for call in calls:
            if (call["client"], call["start"]) not in finished:
                if int(call["process"]) in history.killed:
                    lost[token].append(call)
                else:
                    verdict.lost_without_kill += 1
    verdict.lost_consumes = sum(map(len, lost.values()))
    return lost


@dataclass
class _Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    accepted_by: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)


def _count(tried: list[dict[str, Any]], history: History, tally: _Tally, verdict: Verdict) -> None:
    """Count a token's outcomes and the latency of its failed-closed attempts (not those stopped)."""
    for a in tried:
        tally.outcomes[a["outcome"]] += 1
        if a["outcome"] == "accepted":
            tally.accepted_by[a["role"]] += 1
        elif a["outcome"] == "error":
            tally.errors[a.get("reason") or "unknown"] += 1
        elif a["outcome"] == "store_unavailable":
            windows = history.paused.get(int(a["process"]), []) + history.paused.get(None, [])
            if any(since < a["end"] and a["start"] < until for since, until in windows):
                verdict.failed_closed_while_paused += 1
            else:
                tally.latencies.append(a["end"] - a["start"])


def _judge(token: str, tried: list[dict[str, Any]], lost: list[dict[str, Any]], history: History,
           verdict: Verdict) -> None:  # fmt: skip
    """Accepted twice, false replays, burnt, stuck and unresolved: the rules for one token."""
    accepted = [a for a in tried if a["outcome"] == "accepted"]
    replayed = [a for a in tried if a["outcome"] == "replayed"]
    if len(accepted) > 1:
        verdict.accepted_twice.append(token)
    could_consume = [a["start"] for a in accepted] + [c["start"] for c in lost]
    for r in replayed:
        if not any(start < r["end"] for start in could_consume):
            if r["role"] == "honest":
                verdict.false_replays.append(
                    {"token": token, "client": r["client"], "start": r["start"], "end": r["end"]}
                )
            else:
                verdict.attacker_false_replays += 1
    if accepted:
        return
    if replayed:
        (verdict.burnt_excused if lost else verdict.burnt).append(token)
    elif _stuck(token, tried, history):
        (verdict.stuck_excused if lost else verdict.stuck).append(token)
    honest = [a for a in tried if a["role"] == "honest"]
    if honest and all(a["outcome"] != "replayed" for a in honest):
        verdict.never_resolved += 1


def _stuck(token: str, tried: list[dict[str, Any]], history: History) -> bool:
    """Whether the honest client gave up on ``token``, failing closed, while the store accepted others."""
    honest = [a for a in tried if a["role"] == "honest"]
    if not honest or honest[-1]["outcome"] != "store_unavailable":
        return False
    gave_up = history.gave_up.get((token, honest[-1]["client"]))
    if gave_up is None:
        return False
    first = bisect.bisect_left(history.acceptances, gave_up - STUCK_WINDOW)
    return first < len(history.acceptances) and history.acceptances[first] <= gave_up


def check(records: Iterable[dict[str, Any]]) -> Verdict:
    verdict = Verdict()
    history = _read(records, verdict)
    lost = _lost(history, verdict)
    tally = _Tally()
    for token in sorted(set(history.attempts) | set(lost)):
        tried = history.attempts.get(token, [])
        _count(tried, history, tally, verdict)
        _judge(token, tried, lost.get(token, []), history, verdict)
    verdict.attempts = sum(tally.outcomes.values())
    verdict.tokens = len(set(history.attempts) | set(lost))
    verdict.outcomes, verdict.errors = dict(tally.outcomes), dict(tally.errors)
    verdict.accepted_by = dict(tally.accepted_by)
    verdict.failed_closed = tally.outcomes["store_unavailable"]
    if tally.latencies:
        verdict.fail_closed_latency = {
            "p50": percentile(tally.latencies, 0.50),
            "p99": percentile(tally.latencies, 0.99),
            "max": max(tally.latencies),
        }
    return verdict


def check_file(path: Path) -> Verdict:
    return check(read(path))
