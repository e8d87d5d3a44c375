"""Option types and shared options: durations, times, token input, keys, bindings.

Values are validated while click parses them, so a bad ``--ttl`` or ``--arguments`` is a
usage error (exit 2) that names the option, before any key is loaded or store opened.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Final, TypeVar, cast

import click

from .._binding import Binding
from .._codec import (
    DEFAULT_MAX_FLOW_AGE,
    DEFAULT_MAX_ROUNDS,
    DEFAULT_MAX_TOKEN_BYTES,
    MAX_SECONDS,
    MIN_TOKEN_BYTES,
    Mode,
)
from .._format import LAST_TIME, MAX_ROUND, MAX_TIME
from .._humanize import duration
from ._exit import CliError, ExitCode
from ._output import reader_gone_exits

#: Reading stops here: a requestState token is a few KiB, so anything bigger is not one,
#: and a runaway pipe must not fill memory.
MAX_INPUT_BYTES: Final = 1024 * 1024

_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION_RE: Final = re.compile(r"(?:\d+[smhdw])+|\d+")
_PART_RE: Final = re.compile(r"(\d+)([smhdw])")
_UNIX_RE: Final = re.compile(r"\d{1,12}(?:\.\d+)?")

F = TypeVar("F", bound=Callable[..., Any])


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: ``--arguments`` not given (distinct from ``--arguments null``).
ABSENT: Final[Any] = _Absent()


def parse_duration(text: str) -> int:
    """``"90s"``, ``"10m"``, ``"24h"``, ``"2d"``, ``"1h30m"`` or bare seconds -> seconds.

    At most the codec's :data:`~statecodec._codec.MAX_SECONDS`: anything longer is a usage
    error, not a codec failure.
    """
    text = text.strip().lower()
    if not _DURATION_RE.fullmatch(text):
        raise ValueError(f"{text!r} is not a duration; use e.g. 90s, 10m, 24h, 2d or 1h30m")
    parts = [(text, "s")] if text.isdigit() else _PART_RE.findall(text)
    # Checked digit by digit first: int() of a huge string is slow, then refused.
    if any(len(number) > len(str(MAX_SECONDS)) for number, _ in parts):
        raise ValueError(_too_long(text))
    seconds = sum(int(number) * _UNITS[unit] for number, unit in parts)
    if seconds > MAX_SECONDS:
        raise ValueError(_too_long(text))
    return seconds


def _too_long(text: str) -> str:
    return f"{text[:40]!r} is out of range; the longest duration is {duration(MAX_SECONDS)} (68 years)"


def parse_time(text: str, clock: Callable[[], float] = time.time) -> float:
    """``now``, Unix seconds, ISO 8601 (naive means UTC) or ``+10m`` / ``-3m`` from ``clock()``.

    Between 1970 and 2106, the times a token can carry; anything else is a usage error.
    """
    moment = _parse_time(text.strip(), clock())
    if not 0 <= moment <= MAX_TIME:
        raise ValueError(
            f"{text.strip()[:40]!r} is out of range; a time is between 1970-01-01 and {LAST_TIME}"
        )
    return moment


def _parse_time(text: str, current: float) -> float:
    if text == "now":
        return current
    if text[:1] in "+-" and len(text) > 1:
        offset = parse_duration(text[1:])
        return current + offset if text[0] == "+" else current - offset
    if _UNIX_RE.fullmatch(text):
        return float(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time; use ISO 8601 (2026-07-28T12:00:00Z), Unix seconds, now, +10m or -3m"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def clock_at(at: float | None) -> Callable[[], float]:
    """The clock of a command with ``--at``: stopped at that instant, else the real one.

    Everything the command builds (key manager, codec, compat readers) takes this one
    clock, the way statecodec passes time everywhere.
    """
    if at is None:
        return time.time
    return lambda: at


class Duration(click.ParamType[int]):
    """A duration in seconds; ``positive``: zero is refused (a lifetime, a deadline)."""

    name = "duration"

    def __init__(self, *, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            seconds = value
        else:
            try:
                seconds = parse_duration(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if self.positive and seconds <= 0:
            self.fail("must be positive", param, ctx)
        return seconds


class Moment(click.ParamType[float]):
    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_time(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class HostPort(click.ParamType[tuple[str, int]]):
    """``HOST:PORT`` (``[::1]:8000`` for IPv6) -> ``(host, port)``; port 0: any free port."""

    name = "HOST:PORT"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        host, sep, port = str(value).rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            self.fail(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8000, [::1]:8000)", param, ctx)
        return host.strip("[]"), int(port)


DURATION: Final = Duration()
HOST_PORT: Final = HostPort()
POSITIVE_DURATION: Final = Duration(positive=True)
TIME: Final = Moment()


# ------------------------------------------------------------------ input
def read_input(value: str, what: str = "token") -> bytes:
    """The argument itself, or stdin when it is ``-``; at most :data:`MAX_INPUT_BYTES`."""
    if value == "-":
        data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
    else:
        # argv arrives decoded with surrogateescape; undecodable bytes come back as they were.
        data = value.encode("utf-8", "surrogateescape")
    if len(data) > MAX_INPUT_BYTES:
        raise CliError(
            ExitCode.IO, f"the {what} is over 1 MiB; requestState tokens and payloads are a few KiB"
        )
    return data


def read_token(value: str) -> str:
    """A token from the argument or stdin, trimmed, or a one-line error for anything else."""
    data = read_input(value).strip()
    if not data:
        source = "stdin was empty" if value == "-" else "the TOKEN argument is empty"
        raise CliError(
            ExitCode.INVALID,
            f"no token: {source}; pass a token or '-' to read one from stdin",
            reason="malformed",
        )
    for offset, byte in enumerate(data):
        if not 0x21 <= byte <= 0x7E:
            raise CliError(
                ExitCode.INVALID,
                f"not a token: byte 0x{byte:02x} at offset {offset} is not printable ASCII "
                "(a requestState token is base64url text)",
                reason="malformed",
            )
    return data.decode("ascii")


# ------------------------------------------------------------------ shared options
class OrderedGroup(click.Group):
    """Commands in the order they were added (the order of a workflow), not alphabetical.

    A closed stdout never becomes click's exit 1 ("token rejected"): see
    :func:`~statecodec.cli._output.reader_gone_exits`.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with reader_gone_exits():  # --help, --version
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with reader_gone_exits():
            return super().invoke(ctx)


def keys_option(fn: F) -> F:
    from ..kms import URL_FORMS  # noqa: PLC0415 - the forms are the library's, never copied

    return click.option(
        "--keys",
        "keys_spec",
        metavar="SPEC",
        envvar="STATECODEC_KEYS",
        show_envvar=True,
        help=f"Key source: {', '.join(URL_FORMS[:-1])} or {URL_FORMS[-1]}.",
    )(fn)


def replay_option(name: str, text: str) -> Callable[[F], F]:
    """``--replay URL``, required, also read from ``$STATECODEC_REPLAY`` (the services' own store).

    Only for commands that work on the store the services share; ``verify --consume`` and
    the demo never pick it up unless it is named.
    """
    return click.option(
        "--replay",
        name,
        required=True,
        metavar="URL",
        envvar="STATECODEC_REPLAY",
        show_envvar=True,
        help=text,
    )


def require_keys(spec: str | None) -> str:
    if not spec:
        raise CliError(
            ExitCode.KEYS, "no keys: pass --keys SPEC or set STATECODEC_KEYS (e.g. file:keys.json)"
        )
    return spec


@dataclass(frozen=True)
class BindingOptions:
    """The binding options as given; ``arguments`` is the parsed JSON, or :data:`ABSENT`."""

    principal: str | None = None
    audience: str | None = None
    method: str | None = None
    target: str | None = None
    arguments: Any = ABSENT
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def given(self) -> bool:
        return self != BindingOptions()

    def names(self) -> list[str]:
        """The options that were given (unlike their default), in the order the help lists them."""
        none = BindingOptions()
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(none, f.name)]

    def to_binding(self) -> Binding | None:
        """The statecodec :class:`Binding`, or None when no option was given."""
        if not self.given:
            return None
        arguments = None if self.arguments is ABSENT else self.arguments
        try:
            return Binding(
                self.principal, self.audience, self.method, self.target, arguments, extra=self.extra
            )
        except (TypeError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="'--arguments'") from None


def grouped(
    name: str, make: Callable[..., Any], *options: Callable[[F], F], names: tuple[str, ...] = ()
) -> Callable[[F], F]:
    """``options`` handed on to the command as one argument ``name``: ``make(**their values)``.

    The options' names are ``names``, by default ``make``'s parameters (one declaration of
    them); ``make`` runs before the command's body, so a bad value or combination is a
    usage error naming the option. The options stand in the help where the decorator stands.
    """
    names = names or tuple(inspect.signature(make).parameters)

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            kwargs[name] = make(**{option: kwargs.pop(option) for option in names})
            return fn(*args, **kwargs)

        decorated: Any = wrapper
        for option in reversed(options):
            decorated = option(decorated)
        return cast(F, decorated)

    return decorate


def _binding_options(
    *,
    principal: str | None,
    audience: str | None,
    method: str | None,
    target: str | None,
    arguments_json: str | None,
    extra: tuple[str, ...],
) -> BindingOptions:
    return BindingOptions(principal, audience, method, target, _arguments(arguments_json), _extra(extra))


#: --principal/--audience/--method/--target/--arguments/--extra, handed on as ``binding``
#: (a :class:`BindingOptions`): malformed --arguments JSON or --extra is a usage error.
binding_options: Final = grouped(
    "binding",
    _binding_options,
    click.option(
        "--principal",
        metavar="TEXT",
        help=(
            "Authenticated principal the token is bound to, byte for byte as the server binds it. "
            "protect() and the proxy's --principal-from jwt-sub bind an access token as the compact "
            "JSON [client_id, issuer, subject], no spaces: "
            '\'["app","https://idp.example","alice"]\' (null for a missing field); '
            "--principal-from header:NAME binds the header's value as is."
        ),
    ),
    click.option("--audience", help="Audience (this server's identifier)."),
    click.option("--method", help="MCP method, e.g. tools/call."),
    click.option("--target", help="Tool or prompt name, or resource URI."),
    click.option(
        "--arguments",
        "arguments_json",
        metavar="JSON",
        help="Request arguments as JSON; their canonical digest is bound (null = no digest).",
    ),
    click.option("--extra", multiple=True, metavar="K=V", help="Extra binding entry (repeatable)."),
)


def json_value(text: str, param_hint: str | None = None) -> Any:
    """An option's value parsed as JSON, or a usage error (naming ``param_hint`` outside a callback)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=param_hint) from None


def _arguments(text: str | None) -> Any:
    return ABSENT if text is None else json_value(text, "'--arguments'")


def _extra(items: tuple[str, ...]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="'--extra'")
        pairs[key] = val
    return pairs


def duration_option(
    flag: str, default: float | str | None, text: str, *, positive: bool = False, **attrs: Any
) -> Callable[[F], F]:
    """``--flag DURATION`` (90s, 10m, 1h30m), its default (seconds or text) shown as one.

    ``positive``: 0 is a usage error naming the option (a lifetime or a deadline of none).
    """
    if default is not None:  # an explicit default=None would satisfy required=True in click 8.3
        shown = duration(default) if isinstance(default, int | float) else default
        attrs.update(default=shown, show_default=True)
    return click.option(flag, type=POSITIVE_DURATION if positive else DURATION, help=text, **attrs)


#: The key timeline's options, with their help: `keys rotate`/`retire`/`list` take them all,
#: the proxy the two that are its own (how often it reloads, how long it mints unrefreshed).
TIMELINE_HELP: Final = {
    "refresh_interval": "How often services reload keys.",
    "max_skew": "Clock difference tolerated between instances (the codecs' max_skew).",
    "max_ttl": "Longest token lifetime any service mints.",
    "expiry_grace": "Time the codecs accept a token past its expiry (their expiry_grace).",
    "staleness_limit": "How long services mint with a ring they cannot refresh.",
}


def timeline_option(name: str, more: str = "") -> Callable[[F], F]:
    """``--refresh-interval`` and the other timeline options: the library's default, one help text."""
    from ..kms import Timeline  # noqa: PLC0415 - the defaults are the library's, never copied

    text = f"{TIMELINE_HELP[name]} {more}".strip()
    return duration_option(f"--{name.replace('_', '-')}", getattr(Timeline(), name), text)


def count_option(flag: str, default: int | None, text: str) -> Callable[[F], F]:
    """``--flag N``, a count of one or more; its default shown (``None``: not given, no count)."""
    return click.option(
        flag, type=click.IntRange(1), default=default, show_default=default is not None, help=text
    )


def max_token_bytes_option(text: str) -> Callable[[F], F]:
    """``--max-token-bytes N``: the codec's size limit."""
    return click.option(
        "--max-token-bytes",
        type=click.IntRange(MIN_TOKEN_BYTES),
        default=DEFAULT_MAX_TOKEN_BYTES,
        show_default=True,
        help=text,
    )


def flow_budget_options(rounds_text: str, age_text: str) -> Callable[[F], F]:
    """``--max-rounds N`` and ``--max-flow-age DURATION``: the codec's flow budgets."""
    rounds = click.option(
        "--max-rounds",
        type=click.IntRange(1, MAX_ROUND),
        default=DEFAULT_MAX_ROUNDS,
        show_default=True,
        help=rounds_text,
    )
    age = duration_option("--max-flow-age", DEFAULT_MAX_FLOW_AGE, age_text)
    return lambda fn: rounds(age(fn))


def mode_option(default: str | None, text: str) -> Callable[[F], F]:
    """``--mode sign|encrypt``, the codec's modes; ``None``: no default (the token's prefix says)."""
    modes = click.Choice([mode.value for mode in Mode])
    return click.option("--mode", type=modes, default=default, show_default=default is not None, help=text)
