"""``statecodec probe``: audit an MCP server's requestState from the outside, in any language.

The engine is :mod:`statecodec.probe` (the ``mcp`` extra), imported only when the command
runs. This module parses the options, refuses the checks with side effects without consent
(which they are is the engine's model's to say, loaded without ``mcp``), and renders the
report: a table for people, one JSON document with ``--json``. Every string the server
chose is escaped before it reaches a terminal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import click

from ..probe._model import CHECKS, with_side_effects  # the model only: no mcp import
from ._describe import printable
from ._exit import CliError, ExitCode, explain_missing_extra
from ._output import Outcome, Output, command
from ._params import F, duration_option, json_value

if TYPE_CHECKING:
    from ..probe import CheckResult, Report

SIDE_EFFECTS: Final = (
    "the probe completes real flows and may trigger the tool's side effects (a deployment, a payment, an "
    "e-mail): point it at a staging server and pass --i-understand-side-effects, or run --only readable"
)
_VERDICT_STYLE: Final[dict[str, dict[str, Any]]] = {
    "PASS": {"fg": "green", "bold": True},
    "FAIL": {"fg": "red", "bold": True},
    "SKIP": {"fg": "yellow"},
}


def _json_object(what: str) -> Any:
    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        parsed = json_value(value)
        if not isinstance(parsed, dict):
            raise click.BadParameter(f"must be a JSON object ({what})")
        return parsed

    return convert


def _answers(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    answers = _json_object('{"input request name": {full response}, ...}')(ctx, param, value) or {}
    for key, response in answers.items():
        if not isinstance(response, dict):
            raise click.BadParameter(
                f"the answer to {key!r} must be the full response object, e.g. "
                '{"action": "accept", "content": {"confirm": true}}'
            )
    return answers


def _headers(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise click.BadParameter(f"{item!r} is not 'Name: value'")
        headers[name.strip()] = value.strip()
    return headers


def _only(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    if value is None:
        return CHECKS
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise click.BadParameter(
            f"unknown check {', '.join(unknown) or '(none)'}; choose from {', '.join(CHECKS)}"
        )
    return tuple(n for n in CHECKS if n in names)


def _url(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise click.BadParameter(f"{value!r} is not an http(s) URL of a streamable HTTP MCP endpoint")
    return value


def _header_option(flag: str, text: str) -> Callable[[F], F]:
    dest = flag.removeprefix("--").replace("-", "_") + "s"
    return click.option(flag, dest, multiple=True, metavar="'NAME: VALUE'", callback=_headers, help=text)


def _json_option(flag: str, callback: Callable[..., Any], text: str) -> Callable[[F], F]:
    return click.option(flag, metavar="JSON", callback=callback, help=text)


@click.command("probe")
@click.argument("url", callback=_url)
@click.option(
    "--tool", required=True, help="The tool to probe: one that asks for input (returns input_required)."
)
@_json_option(
    "--arguments",
    _json_object("the tool's arguments"),
    "The tool's arguments as a JSON object [default: {}].",
)
@_json_option(
    "--answers",
    _answers,
    'Full responses by input request name, e.g. {"confirm": {"action": "accept", "content": '
    '{"ok": true}}}; others get defaults from their schema.',
)
@_header_option("--header", "An HTTP header on every request, e.g. the user's credentials (repeatable).")
@_header_option("--other-header", "A second user's headers (repeatable); enables the cross-user check.")
@click.option(
    "--other-tool", metavar="NAME", help="Another tool of the server; enables the cross-tool check."
)
@_json_option(
    "--other-arguments",
    _json_object("the other tool's arguments"),
    "The other tool's arguments [default: --arguments].",
)
@click.option(
    "--only",
    "checks",
    metavar="CHECK,...",
    callback=_only,
    help=f"Run only these checks: {', '.join(CHECKS)}.",
)
@duration_option(
    "--wait",
    None,
    "Expiry check: present a state this long after it was issued (longer than its lifetime).",
    metavar="DURATION",
)
@duration_option(
    "--timeout", "30s", "Longest wait for any one answer of the server.", positive=True, metavar="DURATION"
)
@click.option(
    "--i-understand-side-effects",
    "side_effects",
    is_flag=True,
    help="Required unless --only readable: the probe runs the tool for real, repeatedly.",
)
@command("probe")
def probe_command(
    out: Output,
    *,
    url: str,
    tool: str,
    arguments: dict[str, Any] | None,
    answers: dict[str, Any],
    headers: dict[str, str],
    other_headers: dict[str, str],
    other_tool: str | None,
    other_arguments: dict[str, Any] | None,
    checks: tuple[str, ...],
    wait: int | None,
    timeout: int,
    side_effects: bool,
) -> Outcome:
    """Try what an attacker would do with URL's requestState, and say what the server stops.

    Speaks streamable HTTP at MCP 2026-07-28 with the official mcp client, runs TOOL once to the
    end (answering its input requests), then, each on a fresh flow, presents states that are
    readable, forged, tampered with, replayed, sent with other arguments, to another tool, by
    another user, oversized or garbage, and expired (--wait). PASS: rejected with an error, as
    the spec asks. FAIL: not rejected (the tool ran on it). SKIP: not tried, and why. Exit 0 only
    when no check fails.

    \b
    It completes real flows and may trigger TOOL's side effects: point it at a STAGING server.
    Needs the mcp extra: pip install 'statecodec[mcp]'.
    """
    if with_side_effects(checks) and not side_effects:
        raise click.UsageError(SIDE_EFFECTS)
    try:
        from ..probe import ProbeError, Settings, probe  # noqa: PLC0415 - the mcp extra, only for this command
    except ModuleNotFoundError as exc:
        explain_missing_extra(exc, "probe")
        raise
    settings = Settings(
        url,
        tool,
        arguments or {},
        answers,
        headers,
        other_headers or None,
        other_tool,
        other_arguments,
        checks,
        None if wait is None else float(wait),
        float(timeout),
    )
    try:
        report = asyncio.run(probe(settings))
    except ProbeError as exc:
        raise CliError(ExitCode.SERVER, exc.message) from None
    lines = [] if out.json else _render(out, report)
    failed = report.failed
    if not failed:
        return Outcome(report.to_json(), lines)
    names = ", ".join(c.check for c in failed)
    error = CliError(ExitCode.INVALID, f"{len(failed)} of {len(report.checks)} checks failed: {names}")
    return Outcome(report.to_json(), lines, exit_code=ExitCode.INVALID, error=error)


# ------------------------------------------------------------------ rendering
def _render(out: Output, report: Report) -> list[str]:
    server = report.server
    where = f", server {printable(server['name'])} {printable(server['version'])}" if server else ""
    b = report.baseline
    asked = ", ".join(printable(k) for k in b.input_requests) or "nothing"
    rounds = f"{b.rounds} input_required round{'s' if b.rounds != 1 else ''}"
    lines = [
        out.style(f"statecodec probe {printable(report.url)}  tool {printable(report.tool)}", bold=True)
        + f"  (MCP {printable(report.protocol_version)}{where})",
        f"  baseline  {rounds} asking {asked}; {'completed: ' if b.completed else ''}{printable(b.result)}",
        f"  state     {b.state_chars} characters, {printable(b.state_format)}",
        "",
    ]
    for check in report.checks:
        lines += _check_lines(out, check)
    counts = report.counts()
    summary = f"{counts['fail']} FAIL, {counts['pass']} PASS, {counts['skip']} SKIP in {report.elapsed:.1f}s"
    lines += ["", out.style(summary, **_VERDICT_STYLE["FAIL" if counts["fail"] else "PASS"])]
    return lines


def _verdict(out: Output, verdict: str) -> str:
    return out.style(f"{verdict:<4}", **_VERDICT_STYLE[verdict])


def _check_lines(out: Output, check: CheckResult) -> Iterable[str]:
    from ..probe import CHECK_TITLES  # noqa: PLC0415

    name = out.style(f"{check.check:<11}", bold=True)
    yield f"{name} {_verdict(out, check.verdict.value)}  {CHECK_TITLES[check.check]}"
    for attempt in check.attempts:
        evidence = (
            attempt.reply.summary if attempt.reply is not None and attempt.verdict.value != "SKIP" else ""
        )
        parts = [
            p
            for p in (attempt.sent if attempt.verdict.value != "SKIP" else "", evidence, attempt.note or "")
            if p
        ]
        text = printable(" -> ".join(parts))
        yield f"  {printable(attempt.name):<26} {_verdict(out, attempt.verdict.value)}  {text}"
