"""``statecodec demo``: the deploy scenario end to end, and every attack statecodec stops.

The engine lives in :mod:`statecodec._demo` and needs the ``mcp`` extra; it is imported
only when the command runs, so ``statecodec --help`` and the other commands work without
it. The embedded defaults (a key ring file and a SQLite replay store in the user's data
directory, created on first run) and the JSON record of a run are the engine's
(:mod:`statecodec._demo._journal`); this module narrates the events as they happen and
turns the findings into the exit code: 0 only when every step behaved as the trace says.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final, assert_never

import click

from .._humanize import relative
from ..boundary import WIRE_ERROR_CODE, WIRE_ERROR_MESSAGE
from ._exit import CliError, ExitCode, explain_missing_extra
from ._output import Outcome, Output, command, echo
from ._params import mode_option
from ._sources import open_store

if TYPE_CHECKING:
    from .._demo._journal import Journal
    from .._demo._run import Answered, Event, Rejection, RoundOne, RoundTwo, Setup

_EXIT_INTERRUPTED: Final = 130  # 128 + SIGINT, what shells expect after Ctrl-C


@click.command("demo")
@mode_option("encrypt", "SIGN: the client can read the state; ENCRYPT: it cannot. Both are tamper-proof.")
@click.option(
    "--keys",
    "keys_spec",
    metavar="SPEC",
    help="Key source (file:, env:, vault-transit:, vault-kv:) [default: a key ring file in --data-dir, "
    "created on first run]. $STATECODEC_KEYS is not read: the demo never picks up your services' keys "
    "unless you name them.",
)
@click.option(
    "--replay",
    metavar="URL",
    help="Replay store shared by the instances (sqlite:PATH, redis://...) [default: a SQLite file in "
    "--data-dir].",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    envvar="STATECODEC_DATA_DIR",
    show_envvar=True,
    help="Where the default key ring and replay store live [default: the user data directory].",
)
@command("demo")
def demo_command(
    out: Output, *, mode: str, keys_spec: str | None, replay: str | None, data_dir: Path | None
) -> Outcome:
    """Run two instances of an MCP deploy server and a real MCP client, and show what statecodec stops.

    Round 1 lands on instance A and asks two questions; round 2, with a new request id, lands
    on instance B and deploys the plan carried in requestState. Then six bad tokens: replayed,
    tampered, expired, another user's, other arguments', another service's; each must get the
    JSON-RPC error -32602 with the precise reason in the server log. Exit 0 only when every
    step behaved as stated, 1 otherwise. Needs the mcp extra: pip install 'statecodec[mcp]'.
    """
    started = time.monotonic()
    try:
        from .._demo import _journal, _run  # noqa: PLC0415 - the mcp extra, loaded only for this command
    except ModuleNotFoundError as exc:
        explain_missing_extra(exc, "demo")
        raise
    try:
        sources = _journal.Sources.of(keys_spec, replay, data_dir)
    except _journal.DataDirError as exc:
        raise CliError(ExitCode.IO, str(exc)) from None
    settings = _run.Settings(_run.Mode(mode), sources.keys, sources.replay, open_store=open_store)
    trace = _Trace(out, sources.keys_note, _journal.Journal())
    try:
        problems = asyncio.run(_run.run(settings, trace))
    except KeyboardInterrupt:
        click.echo("statecodec: demo interrupted; every server it started is stopped", err=True)
        raise click.exceptions.Exit(_EXIT_INTERRUPTED) from None
    return trace.outcome(problems, time.monotonic() - started)


# --------------------------------------------------------------------- trace
class _Trace:
    """Prints each event as it happens (people); the journal keeps them for one JSON document (--json)."""

    def __init__(self, out: Output, keys_note: str, journal: Journal) -> None:
        self.out = out
        self.keys_note = keys_note
        self.journal = journal

    def __call__(self, event: Event) -> None:
        from .._demo import _run  # noqa: PLC0415 - loaded by now: the engine is running

        self.journal.record(event)
        match event:
            case _run.Setup():
                lines = self._setup(event)
            case _run.RoundOne():
                lines = self._round_one(event)
            case _run.Answered():
                lines = self._answered(event)
            case _run.RoundTwo():
                lines = self._round_two(event)
            case _run.Rejection():
                lines = self._rejection(event)
            case _:
                assert_never(event)
        if not self.out.json:
            for line in lines:
                echo(line, color=self.out.color)

    def _dim(self, text: str) -> str:
        return self.out.style(text, dim=True)

    def _setup(self, event: Setup) -> list[str]:
        from .._demo._scenario import SERVER_NAME, TOOL  # noqa: PLC0415 - loaded by now

        mode = event.mode.value.upper()
        title = f"statecodec demo: {TOOL} on two instances of one MCP service, {mode} mode"
        note = f" ({self.keys_note})" if self.keys_note else ""
        lines = [
            self.out.style(title, bold=True),
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
        from .._demo._scenario import TOOL  # noqa: PLC0415 - loaded by now

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
            self.out.style(" ok ", fg="green", bold=True)
            if event.ok
            else self.out.style("FAIL", fg="red", bold=True)
        )
        code = event.error["code"] if event.error else "accepted"
        logged = f"{event.reason}: {event.detail}" if event.reason else "nothing logged"
        lines = [f"  {mark} {event.label:<32} -> {event.instance}  {code}  {logged}"]
        lines += [self.out.style(f"       {problem}", fg="red") for problem in event.problems]
        return lines

    def outcome(self, problems: list[str], elapsed: float) -> Outcome:
        fields = self.journal.finish(problems, elapsed)
        if not problems:
            line = (
                f"Every step behaved as stated: {len(fields['rejections'])} bad tokens stopped, "
                f"{elapsed:.1f}s in all."
            )
            if not self.out.json:
                echo("")
                echo(self.out.style(line, fg="green", bold=True), color=self.out.color)
            return Outcome(fields)
        message = f"the demo deviated from what it states ({len(problems)}): " + "; ".join(problems)
        if hint := self.journal.hint():
            message += f". Hint: {hint}"
        error = CliError(ExitCode.INVALID, message)  # no codec reason: a deviation is not one token
        return Outcome(fields, exit_code=ExitCode.INVALID, error=error)
