"""``statecodec inspect``: read a token without keys, and say loudly that nothing is verified."""

from __future__ import annotations

from typing import Any, Final

import click

from .._codec import DEFAULT_MAX_TOKEN_BYTES
from ..compat import FORMATS, FormatInfo, detect
from ._describe import payload_fields, table, token_fields, token_rows
from ._exit import CliError, ExitCode
from ._output import Outcome, Output, command
from ._params import MAX_INPUT_BYTES, TIME, clock_at, read_token

WARNING: Final = (
    "UNVERIFIED: decoded without keys; anyone can forge every field shown. "
    "Use 'statecodec verify' to check a token."
)


def describe(info: FormatInfo, now: float) -> dict[str, Any]:
    """The JSON form of what :func:`statecodec.compat.detect` read (never verified)."""
    payload = {"encoding": "encrypted"} if info.mode == "encrypt" else payload_fields(info.payload)
    fields = dict(info.fields)
    candidates = [{"format": c, "format_name": FORMATS[c].name} for c in info.candidates]
    return {
        "format": info.format,
        "format_name": info.name,
        "candidates": candidates or None,
        "ambiguity": info.ambiguity,
        "version": fields.pop("version", None),
        "mode": info.mode,
        **token_fields(info, now, info.flow),
        # sc1: the limit every StateCodec applies unless configured otherwise (bigger ones are flagged).
        "size": {"chars": info.size, **({"limit": DEFAULT_MAX_TOKEN_BYTES} if info.format == "sc1" else {})},
        "fields": fields,
        "payload": payload,
    }


@click.command("inspect")
@click.argument("token", metavar="TOKEN|-")
@click.option(
    "--at", type=TIME, metavar="TIME", help="Show relative times as of TIME (ISO 8601, Unix, +10m)."
)
@command("inspect")
def inspect_command(out: Output, *, token: str, at: float | None) -> Outcome:
    """Decode TOKEN (or stdin with '-') WITHOUT verifying it.

    Shows format, mode, kid, issued/expires, token id, size and (SIGN mode) the payload.
    Needs no keys. Recognises statecodec tokens and the TypeScript SDK v1, Python SDK v1,
    Ruby SDK v1, PHP SDK v1, rmcp rs1 and rmcp rs2 (proposed) formats. Where the bytes fit
    two formats (Python and Ruby SDK v1), it names both and says why; 'statecodec verify'
    with the keys tells them apart.
    """
    now = clock_at(at)()
    info = detect(read_token(token), max_token_bytes=MAX_INPUT_BYTES)
    if (refusal := info.refusal()) is not None:  # rejected, whatever the reason (internal_error too)
        raise CliError(ExitCode.INVALID, refusal.detail, reason=refusal.reason)
    doc = describe(info, now)
    banner = out.style(WARNING, fg="yellow", bold=True)
    return Outcome(
        {"verified": False, "warning": WARNING, "token": doc}, [banner, *table(token_rows(doc, now))]
    )
