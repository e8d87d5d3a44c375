"""What a probe finds: verdicts, the evidence behind them, and the report.

Plain data, no MCP: the engine (:mod:`._engine`) fills it in, the CLI renders it. Every
string that came from the server is cut to :data:`MAX_TEXT` characters here; escaping it
for a terminal is the renderer's job (JSON output is ASCII-escaped anyway).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .._errors import StateCodecError

#: The public model, re-exported as it stands by :mod:`statecodec.probe` (listed once, here).
__all__ = [
    "CHECKS",
    "CHECK_TITLES",
    "Attempt",
    "Baseline",
    "CheckResult",
    "Outcome",
    "ProbeError",
    "Reply",
    "Report",
    "Verdict",
    "with_side_effects",
]

#: The checks, in the order they run and are reported.
CHECKS: Final = (
    "readable",
    "forge",
    "tamper",
    "replay",
    "arguments",
    "cross-tool",
    "cross-user",
    "garbage",
    "expiry",
)

#: The checks that only read round 1's state. Every other one completes real flows, the
#: baseline first, so it may set off the tool's side effects (a deployment, a payment).
READ_ONLY: Final = frozenset({"readable"})


def with_side_effects(checks: Iterable[str]) -> tuple[str, ...]:
    """The checks of ``checks`` that run the tool for real: what a caller must consent to.

    Pure and free of MCP, so ``statecodec probe`` refuses them without that consent
    before it imports the ``mcp`` client, and the engine completes flows for exactly these.
    """
    return tuple(c for c in checks if c not in READ_ONLY)


#: One line per check, for ``--help`` and the report.
CHECK_TITLES: Final[Mapping[str, str]] = {
    "readable": "can the client read the state?",
    "forge": "a state edited, or invented from nothing",
    "tamper": "one character changed, truncated, payload swapped",
    "replay": "the same state again after a completed round",
    "arguments": "the state with other arguments",
    "cross-tool": "the state sent to another tool",
    "cross-user": "the state presented by another user",
    "garbage": "1 MiB state, non-ASCII state, a JSON object",
    "expiry": "the state presented after --wait",
}

#: Longest server-chosen text kept in a report (error messages, result excerpts).
MAX_TEXT: Final = 200


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters, marked when cut: servers choose these strings."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Verdict(enum.StrEnum):
    """PASS: rejected as the spec asks. FAIL: not rejected. SKIP: not tried, and why."""

    # A verdict, not a password (ruff S105, bandit B105).
    PASS = "PASS"  # noqa: S105  # nosec B105
    FAIL = "FAIL"
    SKIP = "SKIP"


class Outcome(enum.StrEnum):
    """What the server did with one request."""

    REJECTED = "rejected"  # a JSON-RPC error (HTTP errors arrive as one too)
    COMPLETED = "completed"  # a final result: the tool ran to the end
    TOOL_ERROR = "tool_error"  # a final result with isError: the state reached the tool
    INPUT_REQUIRED = "input_required"  # the server carried on with the flow
    MALFORMED = "malformed"  # an answer that is not a valid MCP result
    NO_ANSWER = "no_answer"  # timeout, connection closed, response too large

    @property
    def result_came_back(self) -> bool:
        return self in (Outcome.COMPLETED, Outcome.TOOL_ERROR)


@dataclass(frozen=True)
class Reply:
    """One ``tools/call`` as the client saw it: the evidence of an attempt."""

    outcome: Outcome
    http_status: int | None = None
    error: Mapping[str, Any] | None = None  # code, message and (clipped) data of a JSON-RPC error
    detail: str = ""  # one line for people: what came back
    state: Any = None  # the requestState of an input_required answer (any JSON: servers are untrusted)
    input_requests: Mapping[str, Any] | None = None

    @property
    def summary(self) -> str:
        """The detail, after the HTTP status when there was one."""
        return self.detail if self.http_status is None else f"HTTP {self.http_status}, {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "http_status": self.http_status,
            "error": None if self.error is None else dict(self.error),
            "result_came_back": self.outcome.result_came_back,
            "detail": self.detail,
        }


def judge(reply: Reply) -> Verdict:
    """PASS only for an error: anything else means the state got past the server's boundary.

    The spec says a server MUST reject state that fails verification, and its conformance
    scenario expects a JSON-RPC error. A tool error, a new ``input_required`` round, a
    hang or a dropped connection are not that, whatever the tool did with the state.
    """
    return Verdict.PASS if reply.outcome is Outcome.REJECTED else Verdict.FAIL


@dataclass(frozen=True)
class Attempt:
    """One way of trying a check: what was sent, what came back, and the verdict."""

    name: str
    verdict: Verdict
    sent: str
    reply: Reply | None = None  # None: skipped, or a check that sends nothing (readable)
    note: str | None = None  # why it was skipped, or what the verdict rests on

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.name,
            "verdict": self.verdict.value,
            "sent": self.sent,
            "evidence": None if self.reply is None else self.reply.to_json(),
            "note": self.note,
        }


def overall(attempts: tuple[Attempt, ...]) -> Verdict:
    """FAIL if any attempt failed, PASS if some passed and none failed, else SKIP."""
    verdicts = {a.verdict for a in attempts}
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    return Verdict.PASS if Verdict.PASS in verdicts else Verdict.SKIP


@dataclass(frozen=True)
class CheckResult:
    check: str
    attempts: tuple[Attempt, ...]
    facts: Mapping[str, Any] = field(default_factory=dict)  # check-specific (readable: format, fields)

    @property
    def verdict(self) -> Verdict:
        return overall(self.attempts)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "title": CHECK_TITLES[self.check],
            "verdict": self.verdict.value,
            "attempts": [a.to_json() for a in self.attempts],
            "facts": dict(self.facts),
        }


def skipped(check: str, why: str, sent: str = "nothing") -> CheckResult:
    return CheckResult(check, (Attempt(check, Verdict.SKIP, sent, note=why),))


@dataclass(frozen=True)
class Baseline:
    """The legitimate flow the probe ran first: what success looks like on this server."""

    rounds: int  # input_required rounds before the final result (0 if not completed)
    input_requests: Mapping[str, str]  # round 1: key -> method
    state_chars: int
    state_format: str  # what the readable analysis named it
    completed: bool
    result: str  # one line: what the final result said, or why there is none

    def to_json(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "input_requests": dict(self.input_requests),
            "state_chars": self.state_chars,
            "state_format": self.state_format,
            "completed": self.completed,
            "result": self.result,
        }


@dataclass(frozen=True)
class Report:
    url: str
    tool: str
    protocol_version: str
    server: Mapping[str, str] | None  # name, version when the server said
    baseline: Baseline
    checks: tuple[CheckResult, ...]
    elapsed: float

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.verdict is Verdict.FAIL)

    def counts(self) -> dict[str, int]:
        verdicts = [c.verdict for c in self.checks]
        return {v.value.lower(): verdicts.count(v) for v in Verdict}

    def to_json(self) -> dict[str, Any]:
        return {
            "target": {
                "url": self.url,
                "tool": self.tool,
                "protocol_version": self.protocol_version,
                "server": None if self.server is None else dict(self.server),
            },
            "baseline": self.baseline.to_json(),
            "checks": [c.to_json() for c in self.checks],
            "summary": self.counts(),
            "elapsed_seconds": round(self.elapsed, 2),
        }


class ProbeError(StateCodecError):
    """The probe could not run: unreachable, not MCP, not 2026-07-28, no multi-round-trip flow."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
