"""``statecodec demo``, the story: one deploy across two instances, then six bad tokens.

An official ``mcp`` Client drives the flow one round at a time, so each round can be
shown: round 1 lands on A and returns ``input_required`` with two questions and a
token; the user answers; round 2, a new request, lands on B and deploys the plan the
token carries. Then the attacks, each sent with the user's real answers so that a token
wrongly accepted would really deploy: replayed, tampered, expired, another user's, other
arguments', another service's.

Every statement the demo prints is an expectation checked here; a deviation is reported,
never papered over. The precise reason of each rejection is read from the fields of the
server log records :mod:`._cluster` captures (never from their text), and must come from
the instance the router chose.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import mcp_types as types
from mcp.shared.exceptions import MCPError

from .. import _format, boundary
from .._codec import Mode
from .._errors import InvalidState
from ._client import Answer, Router, User, connect
from ._cluster import (
    PRODUCTION,
    STAGING,
    STAGING_SERVICE,
    Capture,
    Cluster,
    Deviation,
    Logged,
    Settings,
    Setup,
    cluster,
)
from ._scenario import CLIENT_ID, CONFIRM, ISSUER, SERVER_NAME, TICKET, TOOL, user_answers

__all__ = [
    "Answered",
    "Deviation",
    "Event",
    "Mode",
    "Rejection",
    "RoundOne",
    "RoundTwo",
    "Settings",
    "Setup",
    "run",
    "tamper",
]

VERSION: Final = "1.2.3"
OTHER_VERSION: Final = "6.6.6"
EXPIRED_AGE: Final = 2 * 3600

#: The ``event`` field of the record logged for each rejected token.
REJECTED: Final = "token_rejected"


@dataclass(frozen=True)
class RoundOne:
    instance: str
    request_id: Any
    arguments: dict[str, Any]
    questions: dict[str, str]  # input request key -> the question asked
    token: str
    kid: str
    issued_at: int
    expires_at: int


@dataclass(frozen=True)
class Answered:
    answers: dict[str, dict[str, Any]]  # input request key -> the content given


@dataclass(frozen=True)
class RoundTwo:
    instance: str
    request_id: Any
    outcome: dict[str, Any]
    plan_readable: bool  # does the token show the plan to the client?


@dataclass(frozen=True)
class Rejection:
    """One bad token: what was sent, where it went, and what the server did."""

    attack: str
    label: str
    instance: str
    expected: str
    error: dict[str, Any] | None  # the JSON-RPC error the client got; None if accepted
    reason: str | None  # from the server log
    detail: str | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


Event = Setup | RoundOne | Answered | RoundTwo | Rejection


# ----------------------------------------------------------------- the story
def tamper(token: str) -> str:
    """One base64url character in the middle changed: still well-formed, no longer authentic."""
    prefix, body = token.split(".", 1)
    middle = len(body) // 2
    flipped = "B" if body[middle] == "A" else "A"
    return f"{prefix}.{body[:middle]}{flipped}{body[middle + 1 :]}"


def _describe(answer: Answer) -> str:
    if isinstance(answer, MCPError):
        return f"answered error {answer.code} {answer.message!r}"
    if isinstance(answer, types.InputRequiredResult):
        return "answered input_required (it opened the token and asked again)"
    if answer.is_error:
        return "answered a tool error (it opened the token)"
    outcome = answer.structured_content or {}
    return f"deployed {outcome.get('deployed')} (plan {outcome.get('plan_id')})"


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise Deviation(message)


def _header(token: str) -> _format.ParsedToken:
    """What anyone can read from a token without keys: kid, times, size (and a SIGN payload)."""
    try:
        return _format.parse(token, len(token))
    except InvalidState as exc:
        raise Deviation(f"the server returned an unreadable token: {exc.reason}: {exc.detail}") from None


async def round_one(
    user: User, settings: Settings, expected_on: str | None
) -> tuple[RoundOne, dict[str, types.ElicitRequest]]:
    """Call the tool without state; check it asks both questions and returns a token of our mode."""
    answer = await user.call(VERSION)
    routed = user.routed() if user.router else None
    where = routed.instance if routed else STAGING
    _expect(expected_on is None or where == expected_on, f"round 1 went to {where}, not {expected_on}")
    if not isinstance(answer, types.InputRequiredResult):
        raise Deviation(f"round 1 on {where} {_describe(answer)}")
    requests = answer.input_requests or {}
    _expect(
        set(requests) == {CONFIRM, TICKET},
        f"round 1 asked {sorted(requests)}, not [{CONFIRM!r}, {TICKET!r}]",
    )
    elicitations = {key: r for key, r in requests.items() if isinstance(r, types.ElicitRequest)}
    _expect(len(elicitations) == len(requests), f"round 1 asked {requests}, not two elicitations")
    token = answer.request_state
    prefix = _format.PREFIX_SIGN if settings.mode is Mode.SIGN else _format.PREFIX_ENCRYPT
    if token is None or not token.startswith(prefix):
        raise Deviation(f"round 1 on {where} returned requestState {str(token)[:24]!r}, not a {prefix} token")
    header = _header(token)
    lifetime = header.expires_at - header.issued_at
    _expect(lifetime == settings.ttl, f"the token lives {lifetime}s, not the configured {settings.ttl}s")
    questions = {key: str(getattr(request.params, "message", "")) for key, request in elicitations.items()}
    request_id = routed.body.get("id") if routed else None
    first = RoundOne(
        where,
        request_id,
        {"version": VERSION},
        questions,
        token,
        header.kid,
        header.issued_at,
        header.expires_at,
    )
    return first, elicitations


async def happy_path(
    alice: User, settings: Settings, log: Capture, report: Callable[[Event], None]
) -> tuple[str, types.InputResponses]:
    """Round 1 on A, both answers, round 2 on B with a new request id.

    Returns the redeemed token and alice's answers, which every attack sends again, so
    that a token the server wrongly accepted would really deploy.
    """
    first, elicitations = await round_one(alice, settings, "A")
    report(first)
    # The user answers what the server asked (the client's elicitation callback would do this).
    answers = {key: user_answers(request.params) for key, request in elicitations.items()}
    report(Answered({key: dict(value.content or {}) for key, value in answers.items()}))
    responses: types.InputResponses = dict(answers)
    seen = len(log.records)
    answer = await alice.call(VERSION, state=first.token, answers=responses)
    routed = alice.routed()
    _expect(routed.instance == "B", f"round 2 went to {routed.instance}, not B")
    _expect(
        routed.body.get("id") != first.request_id,
        f"round 2 reused request id {first.request_id!r}: a retry must be a new request",
    )
    if not isinstance(answer, types.CallToolResult) or answer.is_error:
        raise Deviation(f"round 2 on B {_describe(answer)}{_server_said(log.records[seen:])}")
    outcome = dict(answer.structured_content or {})
    expected = {"deployed": VERSION, "ticket": "CHG-1234", "planned_on": "A", "deployed_on": "B"}
    got = {key: outcome.get(key) for key in expected}
    _expect(got == expected, f"round 2 on B returned {got}, expected {expected}")
    readable = str(outcome.get("plan_id")).encode() in _header(first.token).body
    _expect(
        readable is (settings.mode is Mode.SIGN),
        "the plan is readable in an ENCRYPT token"
        if readable
        else "the plan is not in the SIGN token's payload",
    )
    report(RoundTwo("B", routed.body.get("id"), outcome, readable))
    return first.token, responses


@dataclass(frozen=True)
class Attack:
    attack: str
    label: str
    expected: str  # the reason the server must log
    user: User
    token: str
    answers: types.InputResponses
    version: str = VERSION
    on: str | None = None  # the instance it must reach, when that is the point


async def attempt(attack: Attack, log: Capture) -> Rejection:
    """Send one bad token; check the wire error and the server's log line."""
    seen = len(log.records)
    answer = await attack.user.call(attack.version, state=attack.token, answers=attack.answers)
    instance = attack.user.routed().instance
    problems: list[str] = []
    if attack.on is not None and instance != attack.on:
        problems.append(f"the router sent it to {instance}, not {attack.on}")
    error: dict[str, Any] | None = None
    if isinstance(answer, MCPError):
        error = {"code": answer.code, "message": answer.message, "data": answer.data}
        wire = boundary.WireError.invalid_state().error()
        if error != wire:
            problems.append(f"the client got {error}, not the uniform {wire}")
    else:
        problems.append(f"ACCEPTED by {instance}, which {_describe(answer)}")
    logged = log.records[seen:]
    rejections = [record for record in logged if record.event == REJECTED]
    reason = detail = None
    if any(attack.token in record.text for record in logged):
        problems.append("the server log contains the token itself")
    if error is not None and len(rejections) != 1:
        problems.append(f"{len(rejections)} rejection records in the server log for one request, not 1")
    if rejections:
        record = rejections[-1]
        reason, detail = record.reason, record.detail
        if record.instance != instance:
            problems.append(
                f"the rejection was logged by {record.instance}, but the request went to {instance}"
            )
        if reason != attack.expected:
            problems.append(f"the server logged reason={reason}, expected {attack.expected}")
    return Rejection(
        attack.attack,
        attack.label,
        instance,
        attack.expected,
        error,
        reason,
        detail,
        tuple(problems),
    )


def _server_said(records: list[Logged]) -> str:
    """The reason in the last rejection record, to explain an unexpected error."""
    for record in reversed(records):
        if record.event == REJECTED:
            return f"; the server log says reason={record.reason}: {record.detail}"
    return ""


async def expired_token(running: Cluster, settings: Settings) -> str:
    """Alice's token as the service sealed it two hours ago: authentic, bound right, long expired."""
    codec = await running.codec(SERVER_NAME, clock=lambda: time.time() - EXPIRED_AGE)
    binding = boundary.binding_for(
        "tools/call",
        {"name": TOOL, "arguments": {"version": VERSION}},
        principal=boundary.principal_string(CLIENT_ID, ISSUER, "alice"),
        audience=SERVER_NAME,
    )
    plan = {"version": VERSION, "plan_id": "0ld0ld00", "planned_on": "A", "steps": []}
    return codec.seal(json.dumps(plan).encode(), binding, ttl=settings.ttl)


async def run(settings: Settings, report: Callable[[Event], None]) -> list[str]:
    """Run the whole demo, reporting each event as it happens; return the deviations (none: all as stated)."""
    try:
        async with cluster(settings) as running:
            report(running.setup())
            story = _Story(running, settings, report)
            await story.tell()
            return story.problems
    except Deviation as exc:  # the servers did not start
        return [str(exc)]


@dataclass
class _Story:
    running: Cluster
    settings: Settings
    report: Callable[[Event], None]
    problems: list[str] = field(default_factory=list)
    answers: types.InputResponses = field(default_factory=dict)

    async def tell(self) -> None:
        router = Router({name: self.running.url(name) for name in PRODUCTION})
        async with (
            connect("alice", "alice-token", router=router) as alice,
            connect("bob", "bob-token", router=router) as bob,
            connect("alice", "alice-token", url=self.running.url(STAGING)) as alice_staging,
        ):
            try:
                await self._episodes(alice, bob, alice_staging)
            except Deviation as exc:  # caught inside: the clients' task groups would wrap it in a group
                self.problems.append(str(exc))

    async def _episodes(self, alice: User, bob: User, alice_staging: User) -> None:
        redeemed, self.answers = await happy_path(alice, self.settings, self.running.log, self.report)
        # Straight after round 2, so the router sends it to A: the instance that did not redeem it.
        await self._attack("replayed", "replayed token (redeemed on B)", "replayed", alice, redeemed, on="A")
        fresh = (await round_one(alice, self.settings, None))[0].token  # alice's next deploy, unredeemed
        staged = (await round_one(alice_staging, self.settings, None))[0].token
        expired = await expired_token(self.running, self.settings)
        mismatch = "binding_mismatch"
        await self._attack("tampered", "tampered token (1 char changed)", "tampered", alice, tamper(fresh))
        await self._attack(
            "expired", f"expired token (sealed {EXPIRED_AGE // 3600}h ago)", "expired", alice, expired
        )
        await self._attack("other_user", "alice's token sent by bob", mismatch, bob, fresh)
        await self._attack(
            "other_arguments",
            f"token for version {OTHER_VERSION}",
            mismatch,
            alice,
            fresh,
            version=OTHER_VERSION,
        )
        await self._attack("other_service", f"token from {STAGING_SERVICE}", mismatch, alice, staged)

    async def _attack(self, name: str, label: str, expected: str, user: User, token: str, **kw: Any) -> None:
        # Every bad token goes with the user's real answers, as a real retry would.
        attack = Attack(name, label, expected, user, token, self.answers, **kw)
        rejection = await attempt(attack, self.running.log)
        self.report(rejection)
        self.problems.extend(f"{rejection.label}: {p}" for p in rejection.problems)
