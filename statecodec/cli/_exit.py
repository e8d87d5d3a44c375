"""Exit codes, one per failure class, and the error every command raises on purpose.

Schedulers and scripts branch on the exit code, so each class of failure has its own:
"the token is bad" (1) needs a different reaction from "the key source is misconfigured"
(3) or "Redis is down, retry later" (4). The table is part of the public contract: it is
printed by ``statecodec --help`` and docs/cli.md, both generated from :data:`EXIT_CODES`.
"""

from __future__ import annotations

import enum
from typing import IO, Any, Final

import click

from .._extras import missing_extra
from .._humanize import one_line


class ExitCode(enum.IntEnum):
    OK = 0
    INVALID = 1
    USAGE = 2
    KEYS = 3
    STORE = 4
    REPLAYED = 5
    IO = 6
    KEY_SOURCE_DOWN = 7
    SERVER = 8
    INTERNAL = 70  # EX_SOFTWARE from sysexits.h
    OUTPUT_CLOSED = 141  # 128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe

    @property
    def slug(self) -> str:
        """The stable name used in ``--json`` output (``error.class``)."""
        return self.name.lower()


EXIT_CODES: Final[dict[ExitCode, str]] = {
    ExitCode.OK: "success: the token is valid, or the command did its job",
    ExitCode.INVALID: "token rejected or unreadable (the reason says why: expired, tampered...); "
    "probe: a check failed",
    ExitCode.USAGE: "usage error: bad option or value (printed by click, never as JSON)",
    ExitCode.KEYS: "key or configuration error: no --keys, bad key ring, no primary, missing setting "
    "or extra (the message names the pip install)",
    ExitCode.STORE: "replay store unavailable or bad store URL; the token was NOT consumed",
    ExitCode.REPLAYED: "token authentic but already redeemed (single use)",
    ExitCode.IO: "file or input error: output exists (use --force), unwritable, input too large",
    ExitCode.KEY_SOURCE_DOWN: "key source (Vault/OpenBao) unreachable, sealed or refusing; retry later",
    ExitCode.SERVER: "probe could not run: server unreachable, not MCP, not 2026-07-28, or no flow completed",
    ExitCode.INTERNAL: "internal error: a bug in statecodec, please report it",
    ExitCode.OUTPUT_CLOSED: "stdout was closed (its reader, such as head -1, went away) before the command "
    "knew its result; once it knows, it exits with that code, closed stdout or not",
}


class CliError(Exception):
    """A failure with a one-line message that names the fix, and its exit code.

    ``reason`` carries the codec's stable reason (``expired``, ``tampered``...) when the
    failure is about a token, so ``--json`` consumers can switch on it.
    """

    def __init__(self, code: ExitCode, message: str, *, reason: str | None = None) -> None:
        # One line wherever it goes (the terminal, --json, a JSON log record), whatever
        # the dependency it quotes put in its own text; never clipped.
        self.message = one_line(message, limit=None)
        super().__init__(self.message)
        self.code = code
        self.reason = reason


def explain_missing_extra(exc: ModuleNotFoundError, command: str, extra: str | None = "mcp") -> None:
    """Raise the one-line "install the extra" error (exit 3) if ``exc`` is a module ``extra`` brings.

    ``exc`` comes from importing the command's code, whose every import ``scripts/deps``
    holds to the extra's packages in pyproject.toml: a missing module that is neither
    statecodec's own nor the standard library's is one of them, or one they need.
    """
    if (error := missing_extra_error(exc, command, extra)) is not None:
        raise error from None


def missing_extra_error(exc: ImportError, command: str, extra: str | None = None) -> CliError | None:
    """The "install the extra" error for ``exc`` (exit 3), or ``None`` when no extra brings the module.

    ``extra=None``: the extra that lists the missing module (:mod:`statecodec._extras`).
    """
    missing = missing_extra(exc, extra, f"statecodec {command}".rstrip())
    return None if missing is None else CliError(ExitCode.KEYS, str(missing))


class ExtraMissingWhileParsing(click.ClickException):
    """A missing extra found while click parses a command's options: one line, exit 3.

    Commands report their errors themselves; an option callback that must import the
    command's code can only hand click an exception it prints and exits with.
    """

    exit_code = int(ExitCode.KEYS)

    def __init__(self, error: CliError) -> None:
        super().__init__(error.message)

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"statecodec: error: {self.message}", err=True, file=file)
