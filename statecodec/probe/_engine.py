"""The probe's run: one legitimate flow to learn what success looks like, then the attacks.

Order of a run: the expiry flow is started first (its wait overlaps the other checks),
then round 1 of the baseline gives the state the readable check reads. Unless only that
check runs, the baseline is completed, answering every round (``--answers``, else
defaults from each request's schema): a flow that cannot complete makes every verdict
meaningless (an attack "rejected" by a server that rejects everything proves nothing),
so that stops the probe. Each attack then runs on a fresh flow of its own, with the
answers of that flow's round 1, as a real retry would carry them: a state the server
wrongly accepts really completes the tool.

Checks that change something besides the state (other arguments, another tool, another
user) first make a control call without any state: if the server refuses that already,
a refusal of the state would prove nothing, and the check is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

import anyio

from ..boundary import WIRE_ERROR_CODE, WIRE_ERROR_MESSAGE
from . import _mutate as mutate
from ._model import (
    CHECKS,
    Attempt,
    Baseline,
    CheckResult,
    Outcome,
    ProbeError,
    Reply,
    Report,
    Verdict,
    clip,
    judge,
    skipped,
    with_side_effects,
)
from ._mutate import Readability
from ._wire import NO_STATE, Connection, connect, leaf

DEFAULT_TIMEOUT: Final = 30.0
MAX_ROUNDS: Final = 10
#: Before a retry that carries only requestState, as the official clients pace them.
STATE_ONLY_PAUSE: Final = 0.25


@dataclass(frozen=True)
class Settings:
    """What to probe and how. ``checks`` defaults to all of :data:`~._model.CHECKS`."""

    url: str
    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    answers: Mapping[str, Any] = field(default_factory=dict)  # input request key -> full response
    headers: Mapping[str, str] = field(default_factory=dict)
    other_headers: Mapping[str, str] | None = None  # a second user's credentials (cross-user)
    other_tool: str | None = None
    other_arguments: Mapping[str, Any] | None = None  # default: ``arguments``
    checks: tuple[str, ...] = CHECKS
    wait: float | None = None  # expiry: how long to wait before presenting a state
    timeout: float = DEFAULT_TIMEOUT  # per request


@dataclass(frozen=True)
class _Flow:
    """Round 1 of a flow: the state the server issued and the answers to its questions."""

    state: str
    responses: dict[str, Any]
    input_requests: Mapping[str, Any]
    started: float  # time.time() when round 1's answer arrived


@contextlib.contextmanager
def _sdk_logs_off_stderr() -> Iterator[None]:
    """While the probe runs, the ``mcp`` SDK's log records never reach Python's last resort.

    A hostile server makes the SDK's client log an ERROR with a traceback for each answer
    it cannot parse ("Error parsing JSON response"); with no handler configured, Python
    prints those on stderr, where they read as the probe crashing. The probe reports what
    the server did as evidence, and its verdicts do not depend on these records. A
    handler the embedding application put on ``mcp`` or the root logger still gets them.
    """
    sdk, held = logging.getLogger("mcp"), logging.NullHandler()
    sdk.addHandler(held)
    try:
        yield
    finally:
        sdk.removeHandler(held)


async def probe(settings: Settings) -> Report:
    """Run the selected checks against ``settings.url``; :class:`ProbeError` if it cannot run.

    The ``mcp`` client's failures arrive wrapped in anyio's exception groups; a
    :class:`ProbeError` inside one is raised alone (one cause, one message), anything else
    as it came.
    """
    with _sdk_logs_off_stderr():
        try:
            return await _probe(settings)
        except BaseExceptionGroup as group:
            first = leaf(group)
            if isinstance(first, ProbeError):
                raise first from None
            raise


async def _probe(settings: Settings) -> Report:
    started = time.monotonic()
    async with connect(settings.url, settings.headers, settings.timeout) as main:
        tools = await main.tool_names()
        if tools is not None and settings.tool not in tools:
            listed = ", ".join(clip(t, 60) for t in tools[:20]) or "none"
            raise ProbeError(f"the server lists no tool {settings.tool!r} (it lists: {listed})")
        run = _Run(settings, main, tools)
        baseline, checks = await run.checks()
        return Report(
            settings.url,
            settings.tool,
            main.protocol_version,
            main.server,
            baseline,
            checks,
            time.monotonic() - started,
        )


class _Run:
    first: _Flow  # round 1 of the baseline, set by checks()

    def __init__(self, settings: Settings, main: Connection, tools: list[str] | None) -> None:
        self.s = settings
        self.main = main
        self.tools = tools
        self.selected = [c for c in CHECKS if c in settings.checks]

    # ------------------------------------------------------------ flows
    def answers(self, requests: Mapping[str, Any] | None) -> dict[str, Any]:
        return {
            str(key): self.s.answers[key] if key in self.s.answers else mutate.default_response(request)
            for key, request in (requests or {}).items()
        }

    async def round_one(
        self,
        conn: Connection | None = None,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> _Flow | Reply:
        """A fresh flow's round 1, or the reply that was not a state-carrying input_required."""
        reply = await (conn or self.main).call(
            tool or self.s.tool, self.s.arguments if arguments is None else arguments
        )
        # The state was issued at the latest now: a --wait counted from here outlasts its lifetime
        # however slowly round 1 ran, and "N s after it was issued" stays a lower bound.
        at = time.time()
        if reply.outcome is Outcome.INPUT_REQUIRED and isinstance(reply.state, str):
            requests = reply.input_requests or {}
            return _Flow(reply.state, self.answers(requests), requests, at)
        return reply

    async def attack(
        self,
        name: str,
        sent: str,
        state: Any,
        flow: _Flow,
        *,
        conn: Connection | None = None,
        tool: str | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> Attempt:
        reply = await (conn or self.main).call(
            tool or self.s.tool,
            self.s.arguments if arguments is None else arguments,
            state=state,
            responses=flow.responses,
        )
        return Attempt(name, judge(reply), sent, reply, note=_note(reply))

    async def fresh_attack(self, name: str, make: Any, *, why: str = "", **kw: Any) -> Attempt:
        """Round 1 of a new flow, then ``make(state) -> (bad state, what it is) | None`` sent back.

        ``why`` says why the attempt is skipped when ``make`` has nothing to send.
        """
        flow = await self.round_one()
        if not isinstance(flow, _Flow):
            return _no_flow(name, flow)
        made = make(flow.state)
        if made is None:
            return Attempt(name, Verdict.SKIP, "nothing", note=why or "not applicable to this state")
        bad, sent = made
        return await self.attack(name, sent, bad, flow, **kw)

    # ------------------------------------------------------------ the run
    async def checks(self) -> tuple[Baseline, tuple[CheckResult, ...]]:
        expiry_flow = None
        if "expiry" in self.selected and self.s.wait is not None:
            expiry_flow = await self.round_one()
        first = await self.round_one()
        if not isinstance(first, _Flow):
            raise ProbeError(_no_mrtr(self.s.tool, first))
        self.first = first
        readability = mutate.analyse(first.state)
        results: dict[str, CheckResult] = {}
        if "readable" in self.selected:
            results["readable"] = _readable(readability)
        side_effects = with_side_effects(self.selected)
        baseline = await self.baseline(first, readability, complete=bool(side_effects))
        # Replay first, while the baseline's state is as young as it can be (a short lifetime
        # must not pass for replay protection); expiry last, after its wait.
        for check in sorted(side_effects, key=lambda c: (c != "replay", c == "expiry")):
            if check == "expiry":
                results[check] = await self.check_expiry(expiry_flow)
            else:
                results[check] = await getattr(self, "check_" + check.replace("-", "_"))()
        return baseline, tuple(results[c] for c in self.selected)

    async def baseline(self, first: _Flow, readability: Readability, *, complete: bool) -> Baseline:
        keys = {
            str(k): str(r.get("method")) if isinstance(r, dict) else "?"
            for k, r in first.input_requests.items()
        }

        def made(rounds: int, completed: bool, result: str) -> Baseline:
            return Baseline(rounds, keys, len(first.state), readability.name, completed, result)

        if not complete:
            return made(1, False, "not completed: only the readable check ran")
        state: Any = first.state
        responses, rounds = first.responses, 1
        while True:
            reply = await self.main.call(self.s.tool, self.s.arguments, state=state, responses=responses)
            if reply.outcome is not Outcome.INPUT_REQUIRED:
                break
            rounds += 1
            if rounds > MAX_ROUNDS:
                raise ProbeError(f"the flow did not complete within {MAX_ROUNDS} input_required rounds")
            if not reply.input_requests:
                await anyio.sleep(STATE_ONLY_PAUSE)
            state = reply.state if isinstance(reply.state, str) else NO_STATE
            responses = self.answers(reply.input_requests)
        if reply.outcome is not Outcome.COMPLETED:
            raise ProbeError(
                f"the legitimate flow did not complete (round {rounds}: {reply.detail}), so no verdict "
                "would mean anything; check --arguments and --answers"
            )
        return made(rounds, True, reply.detail)

    # ------------------------------------------------------------ checks
    async def check_forge(self) -> CheckResult:
        edited = await self.fresh_attack(
            "edited",
            lambda s: mutate.forge_edited(s, mutate.analyse(s)),
            why="nothing readable to edit (encrypted or opaque)",
        )
        invented = await self.fresh_attack("invented", lambda s: mutate.forge_invented(s, mutate.analyse(s)))
        return CheckResult("forge", (edited, invented))

    async def check_tamper(self) -> CheckResult:
        one = await self.fresh_attack("one character changed", mutate.one_char_changed)
        cut = await self.fresh_attack("truncated", mutate.truncated)
        a, b = await self.round_one(), await self.round_one()
        if not isinstance(a, _Flow) or not isinstance(b, _Flow):
            swapped = _no_flow("payload swapped", a if not isinstance(a, _Flow) else b)  # type: ignore[arg-type]
        elif (made := mutate.payload_swapped(a.state, b.state, mutate.analyse(a.state))) is None:
            swapped = Attempt(
                "payload swapped",
                Verdict.SKIP,
                "nothing",
                note="not a signed format with a payload part (encrypted, plaintext or opaque)",
            )
        else:
            swapped = await self.attack("payload swapped", made[1], made[0], a)
        return CheckResult("tamper", (one, cut, swapped))

    async def check_replay(self) -> CheckResult:
        attempt = await self.attack(
            "replayed",
            "the baseline's round-1 state again, with the same answers, after the flow completed",
            self.first.state,
            self.first,
        )
        return CheckResult("replay", (attempt,))

    async def check_arguments(self) -> CheckResult:
        changed = mutate.changed_arguments(self.s.arguments)
        if changed is None:
            return skipped(
                "arguments", "the call has no argument value the probe can change (pass --arguments)"
            )
        other, path = changed
        control = await self.round_one(arguments=other)
        if not isinstance(control, _Flow) and control.outcome is not Outcome.COMPLETED:
            return _control_failed("arguments", f"the tool with argument {path} changed", control)
        attempt = await self.fresh_attack(
            "other arguments",
            lambda s: (s, f"the state of a flow, with argument {path} changed in the retry"),
            arguments=other,
        )
        return CheckResult("arguments", (attempt,))

    async def check_cross_tool(self) -> CheckResult:
        other_tool = self.s.other_tool
        if other_tool is None:
            others = [t for t in self.tools or () if t != self.s.tool]
            why = (
                "name the tool to send the state to with --other-tool "
                f"(this server also lists: {', '.join(clip(t, 60) for t in others[:10])})"
                if others
                else "the server lists no other tool"
                if self.tools is not None
                else "pass --other-tool NAME"
            )
            return skipped("cross-tool", why)
        if self.tools is not None and other_tool not in self.tools:
            return skipped("cross-tool", f"the server lists no tool {other_tool!r}")
        arguments = self.s.arguments if self.s.other_arguments is None else self.s.other_arguments
        control = await self.round_one(tool=other_tool, arguments=arguments)
        if not isinstance(control, _Flow) and control.outcome is not Outcome.COMPLETED:
            return _control_failed("cross-tool", f"{other_tool} with these arguments", control)
        attempt = await self.fresh_attack(
            f"sent to {clip(other_tool, 60)}",
            lambda s: (s, f"a state issued by {self.s.tool}, in a retry of {other_tool}"),
            tool=other_tool,
            arguments=arguments,
        )
        return CheckResult("cross-tool", (attempt,))

    async def check_cross_user(self) -> CheckResult:
        if self.s.other_headers is None:
            return skipped("cross-user", "pass --other-header with a second user's credentials")
        try:
            async with connect(self.s.url, self.s.other_headers, self.s.timeout) as other:
                control = await self.round_one(conn=other)
                if not isinstance(control, _Flow) and control.outcome is not Outcome.COMPLETED:
                    return _control_failed("cross-user", "the second user's own call", control)
                attempt = await self.fresh_attack(
                    "presented by another user",
                    lambda s: (
                        s,
                        "the first user's state, with the first user's answers, sent by the second user",
                    ),
                    conn=other,
                )
        except ProbeError as exc:
            return skipped("cross-user", f"the second user could not connect: {exc.message}")
        return CheckResult("cross-user", (attempt,))

    async def check_garbage(self) -> CheckResult:
        attempts = (
            await self.fresh_attack("1 MiB state", mutate.oversize),
            await self.fresh_attack("non-ASCII state", mutate.non_ascii),
            await self.fresh_attack("JSON object", mutate.json_object),
        )
        return CheckResult("garbage", attempts)

    async def check_expiry(self, flow: _Flow | Reply | None) -> CheckResult:
        if self.s.wait is None or flow is None:
            return skipped("expiry", "pass --wait DURATION, longer than the state's lifetime")
        if not isinstance(flow, _Flow):
            return CheckResult("expiry", (_no_flow("after --wait", flow),))
        await anyio.sleep(max(0.0, flow.started + self.s.wait - time.time()))
        expires = mutate.analyse(flow.state).expires_at
        waited = time.time() - flow.started
        if expires is not None and expires >= time.time():
            return skipped(
                "expiry",
                f"the state says it is valid for {expires - time.time():.0f}s more after "
                f"a {waited:.0f}s wait: "
                "wait longer than its lifetime",
            )
        attempt = await self.attack(
            "after --wait", f"a state issued {waited:.0f}s earlier, with its answers", flow.state, flow
        )
        if attempt.verdict is Verdict.FAIL:
            note = f"still accepted {waited:.0f}s after it was issued: its lifetime is longer than --wait"
            if expires is not None and mutate.analyse(flow.state).format == "sc1" and time.time() >= expires:
                note += (
                    " (a statecodec server with expiry_grace set accepts a state that long after it "
                    "expires: wait longer than the lifetime plus the grace to tell)"
                )
            attempt = replace(attempt, note=note)
        return CheckResult("expiry", (attempt,), {"waited_seconds": round(waited, 1)})


def _readable(readability: Readability) -> CheckResult:
    if readability.readable:
        note = f"{readability.name}: the client reads {', '.join(readability.fields[:8])}"
        if len(readability.fields) > 8:
            note += f" and {len(readability.fields) - 8} more"
        verdict = Verdict.FAIL
    else:
        note = f"{readability.name}: nothing readable"
        verdict = Verdict.PASS
    attempt = Attempt(
        "read without keys", verdict, "nothing: the round-1 state was decoded offline", note=note
    )
    return CheckResult("readable", (attempt,), readability.facts())


def _note(reply: Reply) -> str | None:
    if reply.outcome is not Outcome.REJECTED or reply.error is None:
        return None
    if reply.error.get("code") == WIRE_ERROR_CODE and reply.error.get("message") == WIRE_ERROR_MESSAGE:
        return None
    if reply.http_status is not None and reply.http_status >= 400:
        return f"refused at the HTTP layer (HTTP {reply.http_status})"
    return f"rejected, though not with the uniform {WIRE_ERROR_CODE} {WIRE_ERROR_MESSAGE!r} of the SDKs"


def _no_flow(name: str, reply: Reply) -> Attempt:
    return Attempt(
        name, Verdict.SKIP, "nothing", reply, note=f"round 1 of a fresh flow gave no state: {reply.detail}"
    )


def _control_failed(check: str, what: str, reply: Reply) -> CheckResult:
    why = (
        f"{what} was refused without any state ({reply.summary}): a refusal of the state would prove nothing"
    )
    return CheckResult(
        check, (Attempt("control", Verdict.SKIP, "the call without a state", reply, note=why),)
    )


def _no_mrtr(tool: str, reply: Reply) -> str:
    if reply.outcome is Outcome.INPUT_REQUIRED:
        return (
            f"{tool} asked for input without a requestState string: the server keeps the flow's state "
            "itself, "
            "so there is nothing for a client to forge, tamper with or replay"
        )
    if reply.outcome is Outcome.COMPLETED:
        return (
            f"{tool} completed at once ({reply.detail}): it did not ask for input, "
            "so there is no requestState to probe"
        )
    return f"{tool} did not start a multi-round-trip flow: {reply.detail}"
