"""``statecodec keys``: generate a ring, list key states, create, rotate and retire keys at a source.

Only ``keys generate`` ever prints a secret, and only when asked to (without ``-o``);
``keys list`` shows ids and times, read from metadata only where the source keeps them
apart (transit), so the rotation job's policy suffices. A ring written with ``-o`` is
created mode 0600 atomically: no window in which another user could open it, and never a
half-written ring for a server to load.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Final

import click

from .._keys import KeyRing
from ..kms import (
    DEFAULT_KEY_TYPE,
    TRANSIT_KEY_TYPES,
    Timeline,
    init_keys,
    retire,
    rotate,
    source_from_url,
)
from ..kms._local import write_key_file
from ._describe import moment
from ._exit import CliError, ExitCode
from ._output import Outcome, Output, command
from ._params import (
    TIME,
    TIMELINE_HELP,
    OrderedGroup,
    clock_at,
    duration_option,
    grouped,
    keys_option,
    require_keys,
    timeline_option,
)


@click.group("keys", cls=OrderedGroup)
def keys_group() -> None:
    """Generate key rings, list key states, create, rotate and retire keys at a key source."""


# ---------------------------------------------------------------- generate
@keys_group.command("generate")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the ring here (mode 0600)."
)
@click.option("--force", is_flag=True, help="Replace an existing --output file (its keys are lost).")
@click.option("--kid", help="Key id, 1-32 of [A-Za-z0-9._:-] [default: random].")
@command("keys generate")
def generate_command(out: Output, *, output: Path | None, force: bool, kid: str | None) -> Outcome:
    """Generate a new key ring of one fresh 32-byte key and print it, or write it with -o.

    The ring JSON holds the secret: store it as a secret (file mode 0600, a secret manager).
    """
    try:
        ring = KeyRing.generate(kid)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--kid'") from None
    key = ring.primary
    fields: dict[str, Any] = {"kid": key.kid, "created_at": moment(key.created_at, time.time())}
    if output is None:
        return Outcome({**fields, "path": None, "keyring": ring.to_dict()}, [ring.to_json()])
    _write_secret(output, ring.to_json() + "\n", force=force)
    line = f"wrote a key ring with key {key.kid} (primary) to {output} (mode 600)"
    return Outcome({**fields, "path": str(output)}, [line])


def _write_secret(path: Path, text: str, *, force: bool) -> None:
    try:
        write_key_file(path, text, replace=force)
    except FileExistsError:
        message = f"{path} exists; pass --force to replace it (its keys are lost)"
        raise CliError(ExitCode.IO, message) from None


# --------------------------------------------------------------- timeline
def _timeline(**timeline: float) -> Timeline:
    try:
        return Timeline(**timeline)
    except ValueError as exc:
        raise click.UsageError(f"timeline: {exc}") from None


#: The services' rotation timing, handed on as one :class:`~statecodec.kms.Timeline`,
#: validated once. Every instance and the rotation job must agree on it; the defaults are
#: the library's.
timeline_options: Final = grouped(
    "timeline", _timeline, *(timeline_option(name) for name in TIMELINE_HELP), names=tuple(TIMELINE_HELP)
)


# ------------------------------------------------------------------- list
@keys_group.command("list")
@keys_option
@click.option("--at", type=TIME, metavar="TIME", help="Show the states as of TIME (ISO 8601, Unix, +2d).")
@timeline_options
@command("keys list")
def list_command(out: Output, *, keys_spec: str | None, at: float | None, timeline: Timeline) -> Outcome:
    """List the keys at a source with their state: primary, verify-only, pending or retired.

    The primary is the key services mint with now; a pending key mints (becomes primary)
    from the time shown. Shows each key's id, state, creation, minting and retirement
    times, never a secret (--json adds each key's promotion time).
    From transit it reads only the key's metadata, so the rotation job's policy suffices.
    """
    now = clock_at(at)()
    with source_from_url(require_keys(keys_spec)) as source:
        ring = source.metadata()
    plan = timeline.plan(ring, now)
    keys = [_key_fields(k.to_dict(), now) for k in plan.states]
    fields = {
        "source": source.describe(),
        "at": moment(now, now),
        "primary": plan.ring.primary_kid,
        "keys": keys,
        "timeline": timeline.describe(),
    }
    return Outcome(fields, _list_lines(out, fields))


def _key_fields(key: dict[str, Any], now: float) -> dict[str, Any]:
    """A key's fields as the library names them (``KeyState.to_dict``), its times as moments."""
    return {name: moment(v, now) if name in _TIMES and v is not None else v for name, v in key.items()}


_TIMES: Final = frozenset({"created_at", "promotes_at", "primary_from", "retires_at"})


_STATE_STYLE: dict[str, dict[str, Any]] = {
    "primary": {"fg": "green", "bold": True},
    "pending": {"fg": "yellow"},
    "retired": {"dim": True},
}


def _list_lines(out: Output, fields: dict[str, Any]) -> list[str]:
    """One line per key; MINTS says when each mints: the primary now, a pending key from its promotion."""
    keys = fields["keys"]
    width = max([3, *(len(k["kid"]) for k in keys)]) + 2
    rows = [(k, _mints(k)) for k in keys]
    mints_width = max([5, *(len(text) for _, text in rows)]) + 2
    head = f"  {'KID':<{width}}{'STATE':<13}{'CREATED':<22}{'MINTS':<{mints_width}}RETIRES AT"
    summary = f"{len(keys)} key(s), minting with {fields['primary']}, as of {fields['at']['iso']}"
    lines = [f"{fields['source']}: {summary}", out.style(head, bold=True)]
    for k, mints in rows:
        state = out.style(f"{k['state']:<13}", **_STATE_STYLE.get(k["state"], {}))
        retires = k["retires_at"]
        retire_text = f"{retires['iso']} ({retires['relative']})" if retires else "-"
        lines.append(
            f"  {k['kid']:<{width}}{state}{k['created_at']['iso']:<22}{mints:<{mints_width}}{retire_text}"
        )
    return lines


def _mints(key: dict[str, Any]) -> str:
    if key["state"] == "primary":
        return "now"
    start = key["primary_from"]
    return f"from {start['iso']} ({start['relative']})" if start else "-"


# ------------------------------------------------------------------- init
@keys_group.command("init")
@keys_option
@click.option(
    "--key-type",
    type=click.Choice(TRANSIT_KEY_TYPES),
    default=DEFAULT_KEY_TYPE,
    show_default=True,
    help="Transit key type (vault-transit only).",
)
@command("keys init")
def init_command(out: Output, *, keys_spec: str | None, key_type: str) -> Outcome:
    """Create the keys at the source if absent (a key file, a KV document, a transit key).

    Never overwrites: running it again reports what exists. env: sources cannot be created.
    """
    with source_from_url(require_keys(keys_spec)) as source:
        message = init_keys(source, key_type=key_type)
    return Outcome({"source": source.describe(), "message": message}, [message])


# ----------------------------------------------------------------- rotate
@keys_group.command("rotate")
@keys_option
@duration_option("--min-age", None, "Rotate when the newest key is this old (e.g. 24h).", required=True)
@duration_option(
    "--retire-after", None, "Retire a key once its successor is this old (e.g. 2h).", required=True
)
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option(
    "--force", is_flag=True, help="Add a key even while the key of an earlier rotation is still pending."
)
@timeline_options
@command("keys rotate", log_format=True)
def rotate_command(
    out: Output,
    *,
    keys_spec: str | None,
    min_age: int,
    retire_after: int,
    dry_run: bool,
    force: bool,
    timeline: Timeline,
) -> Outcome:
    """Add a key when the newest is older than --min-age; retire keys past their window.

    Idempotent and safe to run from a scheduler (every hour with --min-age 24h rotates
    daily); concurrent runs do not double-rotate file or KV sources. While the key of an
    earlier rotation is still pending (not primary yet), it adds none and says which key
    is pending and when it becomes primary (exit 0), unless --force.
    """
    try:
        report = rotate(
            require_keys(keys_spec),
            min_age=min_age,
            retire_after=retire_after,
            dry_run=dry_run,
            timeline=timeline,
            force=force,
        )
    except ValueError as exc:  # retire_after shorter than the timeline allows
        raise CliError(ExitCode.KEYS, f"rotation refused: {exc}") from None
    return Outcome({**report.to_dict(), "changed": report.changed}, str(report).splitlines())


# ----------------------------------------------------------------- retire
@keys_group.command("retire")
@click.argument("kid")
@keys_option
@click.option("--dry-run", is_flag=True, help="Say what would happen; change nothing.")
@click.option("--yes", is_flag=True, help="Retire without asking for confirmation (for scripts).")
@click.option(
    "--now",
    "at_once",
    is_flag=True,
    help="Cut at once, without waiting for a new primary to spread (after a leak): honest rounds "
    "minted with KID meanwhile fail.",
)
@timeline_options
@command("keys retire")
def retire_command(
    out: Output,
    *,
    kid: str,
    keys_spec: str | None,
    dry_run: bool,
    yes: bool,
    at_once: bool,
    timeline: Timeline,
) -> Outcome:
    """Retire KID now, after a leak: every instance stops accepting it within one refresh interval.

    If KID is the primary, a new key is made first (or a pending key takes over) and the
    command waits until every instance mints with it (promotion delay + clock skew) before
    the cut, so no other token fails. Transit can only cut from the bottom: KID and every
    older version are retired, and the plan says so before anything changes. File and KV
    sources lose exactly KID. Shows the plan and asks for confirmation unless --yes.
    With --now the cut does not wait for the new primary: the exposure is one refresh
    interval instead of the wait plus one, at the price the plan states.
    """
    with source_from_url(require_keys(keys_spec)) as source:
        plan = retire(source, kid, timeline=timeline, dry_run=True, at_once=at_once)
        if dry_run:
            return Outcome({**plan.to_dict(), "changed": False}, str(plan).splitlines())
        if not yes:
            _confirm(plan.retired, str(plan))
        report = retire(
            source,
            kid,
            timeline=timeline,
            at_once=at_once,
            expect=plan.retired,
            progress=lambda line: click.echo(f"statecodec: {line}", err=True),
        )
    return Outcome({**report.to_dict(), "changed": report.changed}, str(report).splitlines())


def _confirm(kids: tuple[str, ...], plan: str) -> None:
    click.echo(plan, err=True)
    try:
        confirmed = click.confirm(f"Retire {', '.join(kids)}?", default=False, err=True)
    except click.exceptions.Abort:  # no answer (end of input, Ctrl-C)
        confirmed = False
    if not confirmed:
        raise click.UsageError("not confirmed: nothing was retired (pass --yes to retire without asking)")
