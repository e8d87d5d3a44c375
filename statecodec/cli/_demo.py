"""``statecodec demo``: the deploy scenario end to end, and every attack statecodec stops.

The engine lives in :mod:`statecodec._demo` and needs the ``mcp`` extra; it is imported
only when the command runs, so ``statecodec --help`` and the other commands work without
it. The embedded defaults (a key ring file and a SQLite replay store in the user's data
directory, created on first run) and the JSON record of a run are the engine's
(:mod:`statecodec._demo._journal`), and so is the text of each event
(:mod:`statecodec._demo._narration`); this module prints the events as they happen and
turns the findings into the exit code: 0 only when every step behaved as the trace says.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

import click

from ._exit import CliError, ExitCode, explain_missing_extra
from ._output import Outcome, Output, command, echo
from ._params import mode_option
from ._sources import open_store

if TYPE_CHECKING:
    from .._demo._journal import Journal
    from .._demo._run import Event

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
        from .._demo._narration import Narrator  # noqa: PLC0415 - loaded by now: the engine is imported

        self.out = out
        self.journal = journal
        self.narrator = Narrator(out.style, keys_note)

    def __call__(self, event: Event) -> None:
        self.journal.record(event)
        if not self.out.json:
            for line in self.narrator.lines(event):
                echo(line, color=self.out.color)

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
