"""How every command reports: human lines or one JSON document, and errors as one line.

Commands return an :class:`Outcome` (JSON fields, human lines, exit code) or raise; the
:func:`command` decorator turns both into output. Keeping that in one place is what makes
the guarantees hold for every command alike: ``--json`` always prints exactly one JSON
object matching docs/cli-schema.json, colour appears only on a terminal without
``NO_COLOR`` or ``TERM=dumb``, an error is one line, no exception ever reaches the user
as a traceback, and a reader that goes away (``| head -1``) never changes the exit code:
the rest of the output goes nowhere and the command ends with its own result.
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
from .._humanize import one_line
from ._exit import CliError, ExitCode, missing_extra_error

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
    """Colour only for a person at a terminal: never with NO_COLOR (no-color.org) or TERM=dumb."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or exotic streams
        return False


def echo(message: str, *, color: bool | None = None) -> None:
    """``click.echo`` to stdout; if its reader has gone away, the output goes nowhere from now on.

    The command then goes on and exits with its own result: ``statecodec verify T | head -1``
    exits 0 for a valid token and 1 for a rejected one, whenever ``head`` closes the pipe.
    """
    try:
        click.echo(message, color=color)
    except BrokenPipeError:
        discard_stdout()


def discard_stdout() -> None:
    """Point stdout at /dev/null, so that no later write (nor the flush at exit) fails again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file descriptor (a test runner's stream)
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


@contextlib.contextmanager
def reader_gone_exits() -> Iterator[None]:
    """A write to a closed stdout that no :func:`echo` caught (click's own ``--help``) exits 141.

    Without this, click turns the broken pipe into exit 1, which means "token rejected".
    """
    try:
        yield
    except BrokenPipeError:
        discard_stdout()
        raise click.exceptions.Exit(int(ExitCode.OUTPUT_CLOSED)) from None


class Output:
    """Styling for one command run; plain text whenever colour is not wanted.

    ``log_format="json"`` (``--log-format json``, for commands run by schedulers) prints
    the outcome as one JSON log record instead of lines, and the library's records as
    JSON too: every line the command prints is then one JSON object.
    """

    def __init__(self, json_mode: bool, log_format: str = "text") -> None:
        self.json = json_mode
        self.log_format = log_format
        self.color = wants_color(sys.stdout) and log_format == "text"
        self.err_color = wants_color(sys.stderr) and log_format == "text"

    def style(self, text: str, **styles: Any) -> str:
        return click.style(text, **styles) if self.color else text

    def emit(self, command: str, outcome: Outcome) -> None:
        if self.json:
            # ASCII only: a token's payload is unverified input, and raw C1 or bidi
            # control characters must not reach a terminal or a log viewer.
            echo(json.dumps(envelope(command, outcome), indent=2, ensure_ascii=True))
            return
        if self.log_format == "json":
            self._emit_record(command, outcome)
            return
        for line in outcome.lines:
            echo(line, color=self.color)
        if outcome.error is not None and not outcome.lines:
            prefix = "statecodec: error:"
            if self.err_color:
                prefix = click.style(prefix, fg="red", bold=True)
            click.echo(f"{prefix} {outcome.error.message}", err=True, color=self.err_color)

    @staticmethod
    def _emit_record(command: str, outcome: Outcome) -> None:
        """The outcome as one JSON log record: on stdout when it succeeded, on stderr otherwise."""
        from ..ops import json_formatter  # noqa: PLC0415 - python-json-logger only when asked for

        error = outcome.error
        message = one_line(
            error.message if error is not None and not outcome.lines else "; ".join(outcome.lines), limit=None
        )
        level = logging.INFO if outcome.exit_code is ExitCode.OK else logging.ERROR
        record = logging.LogRecord("statecodec.cli", level, __file__, 0, message, (), None)
        facts: dict[str, Any] = {
            "event": command.replace(" ", "_"),
            "exit_code": int(outcome.exit_code),
            **outcome.fields,
        }
        if error is not None:
            facts.update(error_class=error.code.slug, reason=error.reason)
        for name, value in facts.items():
            setattr(record, f"{name}_" if name in _RECORD_ATTRIBUTES else name, value)
        line = json_formatter().format(record)
        if outcome.exit_code is ExitCode.OK:
            echo(line)
        else:
            click.echo(line, err=True)


#: What a LogRecord already holds: a field of that name is written with a trailing ``_``.
_RECORD_ATTRIBUTES: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


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


def classify(exc: Exception, command: str = "") -> CliError:
    """Map any exception to its failure class; unknown ones are internal errors (fail closed).

    A missing optional module is a configuration error naming the extra that brings it.
    """
    if isinstance(exc, CliError):
        return exc
    if isinstance(exc, ModuleNotFoundError) and (missing := missing_extra_error(exc, command)) is not None:
        return missing
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


def reported(exc: Exception, classify: Callable[[Exception], CliError] = classify) -> CliError:
    """The failure a command reports for ``exc`` (one line and an exit code), by ``classify``.

    Raised again instead when click reports it itself (a usage error: click prints it and
    exits 2; ``--help``; an abort), and when ``STATECODEC_DEBUG=1`` asks for the traceback.
    """
    if isinstance(exc, _CLICK_EXITS) or os.environ.get("STATECODEC_DEBUG"):
        raise exc
    return classify(exc)


#: What click reports itself: never a command's failure to classify.
_CLICK_EXITS: Final = (click.exceptions.Exit, click.exceptions.Abort, click.ClickException)


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

    def __init__(self, log_format: str = "text") -> None:
        super().__init__()
        if log_format == "json":
            from ..ops import json_formatter  # noqa: PLC0415 - python-json-logger only when asked for

            self.setFormatter(json_formatter())
        self.json = log_format == "json"

    def emit(self, record: logging.LogRecord) -> None:
        debug = bool(os.environ.get("STATECODEC_DEBUG"))
        if self.json:  # a scheduler's log pipeline: every record from INFO on, as it is
            if debug or record.levelno >= logging.INFO:
                click.echo(self.format(record), err=True)
            return
        if not debug and not (record.name.startswith("statecodec.kms") and record.levelno >= logging.WARNING):
            return
        message = one_line(record.getMessage())
        level = record.levelname.lower()
        # click.echo looks up the current stderr, which tests and pipes may have replaced.
        click.echo(f"statecodec: {level}: {message}", err=True)


@contextlib.contextmanager
def _library_logs(log_format: str) -> Iterator[None]:
    """The handler is attached for one command run only, so embedding code is unaffected."""
    lib, handler = logging.getLogger("statecodec"), _LibraryLogs(log_format)
    lib.addHandler(handler)
    saved = lib.level
    if log_format == "json" and lib.getEffectiveLevel() > logging.INFO:
        lib.setLevel(logging.INFO)
    try:
        yield
    finally:
        lib.removeHandler(handler)
        lib.setLevel(saved)


def command(name: str, *, log_format: bool = False) -> Callable[[F], F]:
    """Wrap a command body ``fn(out, **params) -> Outcome`` with ``--json`` and error handling.

    ``log_format=True`` adds ``--log-format text|json`` (commands that schedulers run).
    """

    def decorate(fn: F) -> F:
        @click.option(
            "--json",
            "json_mode",
            is_flag=True,
            help="Print one JSON document (its schema: statecodec/data/cli-schema.json in the package).",
        )
        @functools.wraps(fn)
        def wrapper(*, json_mode: bool, **params: Any) -> None:
            out = Output(json_mode, params.pop("log_format", "text"))
            try:
                with _library_logs(out.log_format):
                    outcome = fn(out, **params)
            except Exception as exc:
                error = reported(exc, functools.partial(classify, command=name))
                outcome = Outcome({}, exit_code=error.code, error=error)
                if out.log_format == "json" and not _json_logs_work():
                    out.log_format = "text"  # the missing extra is JSON logging's: say so in plain text
            out.emit(name, outcome)
            click.get_current_context().exit(int(outcome.exit_code))

        if log_format:
            wrapper = log_format_option(
                "json: the outcome and the library's log records as one JSON object per line."
            )(wrapper)
        return wrapper  # type: ignore[return-value]

    return decorate


def _json_logs_work() -> bool:
    from ..ops import json_formatter  # noqa: PLC0415 - python-json-logger only when asked for

    try:
        json_formatter()
    except ModuleNotFoundError:
        return False
    return True


def log_format_option(text: str) -> Callable[[F], F]:
    """``--log-format text|json``: how a command run by a scheduler or a supervisor logs."""
    return click.option(
        "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True, help=text
    )
