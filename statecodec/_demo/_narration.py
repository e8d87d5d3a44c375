"""The demo's story as people read it: each event, the lines ``statecodec demo`` prints for it.

The twin of :mod:`._journal`, which keeps the same events as one JSON document. Every
statement here is one :mod:`._run` checks (round 2 on the other instance, the plan read or
opaque, each bad token refused with the wire error and the reason the server logged), so
its wording sits next to those checks, not in the command line. Styling is the caller's:
``style`` has :func:`click.style`'s shape, ``(text, **attributes) -> text``, and returns the
text unchanged when colour is off.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any, assert_never

from .._humanize import relative
from ..boundary import WIRE_ERROR_CODE, WIRE_ERROR_MESSAGE
from ._cluster import Setup
from ._run import Answered, Event, Rejection, RoundOne, RoundTwo
from ._scenario import SERVER_NAME, TOOL

Style = Callable[..., str]


def plain(text: str, **attributes: Any) -> str:
    """A :data:`Style` that styles nothing (no terminal, ``NO_COLOR``)."""
    return text


class Narrator:
    """The lines for each event; ``keys_note`` says whether the ring is new (``._journal.Sources``)."""

    def __init__(self, style: Style = plain, keys_note: str = "") -> None:
        self.style = style
        self.keys_note = keys_note

    def lines(self, event: Event) -> list[str]:
        match event:
            case Setup():
                return self._setup(event)
            case RoundOne():
                return self._round_one(event)
            case Answered():
                return self._answered(event)
            case RoundTwo():
                return self._round_two(event)
            case Rejection():
                return self._rejection(event)
            case _:
                assert_never(event)

    def _dim(self, text: str) -> str:
        return self.style(text, dim=True)

    def _setup(self, event: Setup) -> list[str]:
        mode = event.mode.value.upper()
        title = f"statecodec demo: {TOOL} on two instances of one MCP service, {mode} mode"
        note = f" ({self.keys_note})" if self.keys_note else ""
        lines = [
            self.style(title, bold=True),
            f"  keys     {event.keys}{note}, primary key {event.primary_kid}",
            f"  replay   {event.replay}, opened by every instance",
        ]
        for instance in event.instances:
            routed = instance.service == SERVER_NAME  # the service the router sends the tool to
            role = "behind the router" if routed else "another service on the same keys"
            lines.append(f"  {instance.name:<8} {instance.url}  service {instance.service!r}, {role}")
        lines.append(
            self._dim(
                "  The router alternates tools/call between A and B; the client is the official mcp Client."
            )
        )
        return [*lines, ""]

    def _round_one(self, event: RoundOne) -> list[str]:
        expires = dt.datetime.fromtimestamp(event.expires_at, dt.UTC).strftime("%H:%M:%SZ")
        lines = [
            f"alice -> {event.instance}  tools/call {TOOL} {json.dumps(event.arguments)}  "
            f"(JSON-RPC request id {event.request_id})",
            f"  {event.instance} answers input_required with {len(event.questions)} input requests:",
        ]
        lines += [f"    {key:<15} elicitation: {question!r}" for key, question in event.questions.items()]
        lines.append(
            f"  and requestState {event.token[:16]}...  {len(event.token)} chars, key {event.kid}, "
            f"expires {relative(event.expires_at - time.time())} ({expires})"
        )
        return lines

    def _answered(self, event: Answered) -> list[str]:
        given = ", ".join(f"{key} {json.dumps(content)}" for key, content in event.answers.items())
        return [f"alice answers both: {given}"]

    def _round_two(self, event: RoundTwo) -> list[str]:
        outcome = event.outcome
        seen = (
            "SIGN: the client could read the plan, and could not change it"
            if event.plan_readable
            else "ENCRYPT: the plan was opaque to the client"
        )
        return [
            f"alice -> {event.instance}  tools/call again with inputResponses and the same requestState "
            f"(JSON-RPC request id {event.request_id}: a new request)",
            f"  {event.instance} verifies and consumes the token, then completes: deployed "
            f"{outcome['deployed']}, plan {outcome['plan_id']} (planned on {outcome['planned_on']}, "
            f"deployed on {outcome['deployed_on']})",
            self._dim(f"  {seen}"),
            "",
            f"What statecodec stops (the client gets {WIRE_ERROR_CODE} '{WIRE_ERROR_MESSAGE}'; the reason is "
            "from the server log):",
        ]

    def _rejection(self, event: Rejection) -> list[str]:
        mark = (
            self.style(" ok ", fg="green", bold=True) if event.ok else self.style("FAIL", fg="red", bold=True)
        )
        code = event.error["code"] if event.error else "accepted"
        logged = f"{event.reason}: {event.detail}" if event.reason else "nothing logged"
        lines = [f"  {mark} {event.label:<32} -> {event.instance}  {code}  {logged}"]
        lines += [self.style(f"       {problem}", fg="red") for problem in event.problems]
        return lines
