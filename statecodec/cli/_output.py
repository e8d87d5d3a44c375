"""How every command reports: human lines or one JSON document, and errors as one line.

Commands return an :class:`Outcome` (JSON fields, human lines, exit code) or raise; the
:func:`command` decorator turns both into output. Keeping that in one place is what makes
the guarantees hold for every command alike: ``--json`` always prints exactly one JSON
object matching docs/cli-schema.json, colour appears only on a terminal without
``NO_COLOR``, and no exception ever reaches the user as a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Final, TypeVar

import click

from .._errors import InvalidState, KeyUnavailable, ReplayStoreError
from ._exit import CliError, ExitCode

#: Bumped only on an incompatible change to the JSON documents (docs/cli-schema.json).
SCHEMA_VERSION: Final = 1
_MAX_INTERNAL_DETAIL: Final = 200

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Outcome:
    """What a command found: fields for ``--json``, lines for people, and the exit code."""

    fields: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    exit_code: ExitCode = ExitCode.OK
    error: CliError | None = None


def wants_color(stream: IO[Any]) -> bool:
    """Colour only for a person at a terminal, and never when NO_COLOR is set (no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or exotic streams
        return False


class Output:
    """Styling for one command run; plain text whenever colour is not wanted."""

    def __init__(self, json_mode: bool) -> None:
        self.json = json_mode
        self.color = wants_color(sys.stdout)
        self.err_color = wants_color(sys.stderr)

    def style(self, text: str, **styles: Any) -> str:
        return click.style(text, **styles) if self.color else text

    def emit(self, command: str, outcome: Outcome) -> None:
        if self.json:
            # ASCII only: a token's payload is unverified input, and raw C1 or bidi
            # control characters must not reach a terminal or a log viewer.
            click.echo(json.dumps(envelope(command, outcome), indent=2, ensure_ascii=True))
            return
        for line in outcome.lines:
            click.echo(line, color=self.color)
        if outcome.error is not None and not outcome.lines:
            prefix = "statecodec: error:"
            if self.err_color:
                prefix = click.style(prefix, fg="red", bold=True)
            click.echo(f"{prefix} {outcome.error.message}", err=True, color=self.err_color)


def envelope(command: str, outcome: Outcome) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "ok": outcome.exit_code is ExitCode.OK,
        "exit_code": int(outcome.exit_code),
        **outcome.fields,
    }
    if outcome.error is not None:
        doc["error"] = {
            "class": outcome.error.code.slug,
            "reason": outcome.error.reason,
            "message": outcome.error.message,
        }
    return doc


def classify(exc: Exception) -> CliError:
    """Map any exception to its failure class; unknown ones are internal errors (fail closed)."""
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, InvalidState):
        return invalid_state_error(exc)
    if isinstance(exc, KeyUnavailable):
        return CliError(ExitCode.KEYS, str(exc))
    if isinstance(exc, ReplayStoreError):
        return CliError(ExitCode.STORE, f"replay store unavailable: {exc}")
    from ._sources import classify_kms_error  # noqa: PLC0415 - keeps kms optional

    kms_error = classify_kms_error(exc)
    if kms_error is not None:
        return kms_error
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return CliError(ExitCode.IO, f"{exc.strerror or exc}{where}")
    detail = f"{type(exc).__name__}: {exc}"[:_MAX_INTERNAL_DETAIL]
    return CliError(
        ExitCode.INTERNAL,
        f"internal error ({detail}); this is a bug in statecodec, please report it "
        "(set STATECODEC_DEBUG=1 for the traceback)",
    )


def invalid_state_error(exc: InvalidState) -> CliError:
    code = {
        "replayed": ExitCode.REPLAYED,
        "store_unavailable": ExitCode.STORE,
        "internal_error": ExitCode.INTERNAL,
    }.get(exc.reason, ExitCode.INVALID)
    return CliError(code, exc.detail or exc.reason, reason=exc.reason)


class _LibraryLogs(logging.Handler):
    """Decides which of the library's log records reach the terminal, one line each.

    The command itself reports every failure, so most records would only repeat it in other
    words (the codec's "replay store unavailable ..."); without a handler Python's
    last-resort handler would print them all. Kept: key-source warnings such as "the key
    file is readable by others: chmod 600", which nothing else reports. STATECODEC_DEBUG=1
    shows everything. Propagation is untouched, so an embedding application's logging
    still sees every record.
    """

    def emit(self, record: logging.LogRecord) -> None:
        debug = bool(os.environ.get("STATECODEC_DEBUG"))
        if not debug and not (record.name.startswith("statecodec.kms") and record.levelno >= logging.WARNING):
            return
        message = record.getMessage().splitlines()[0]
        level = record.levelname.lower()
        # click.echo looks up the current stderr, which tests and pipes may have replaced.
        click.echo(f"statecodec: {level}: {message}", err=True)


@contextlib.contextmanager
def _library_logs() -> Iterator[None]:
    """The handler is attached for one command run only, so embedding code is unaffected."""
    lib, handler = logging.getLogger("statecodec"), _LibraryLogs()
    lib.addHandler(handler)
    try:
        yield
    finally:
        lib.removeHandler(handler)


def command(name: str) -> Callable[[F], F]:
    """Wrap a command body ``fn(out, **params) -> Outcome`` with ``--json`` and error handling."""

    def decorate(fn: F) -> F:
        @click.option(
            "--json", "json_mode", is_flag=True, help="Print one JSON document (docs/cli-schema.json)."
        )
        @functools.wraps(fn)
        def wrapper(*, json_mode: bool, **params: Any) -> None:
            out = Output(json_mode)
            try:
                with _library_logs():
                    outcome = fn(out, **params)
            except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
                raise  # usage errors: click prints them and exits 2
            except Exception as exc:
                if os.environ.get("STATECODEC_DEBUG"):
                    raise
                error = classify(exc)
                outcome = Outcome({}, exit_code=error.code, error=error)
            out.emit(name, outcome)
            click.get_current_context().exit(int(outcome.exit_code))

        return wrapper  # type: ignore[return-value]

    return decorate
