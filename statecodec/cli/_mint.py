"""``statecodec mint``: make a token for tests and for reproducing a server's behaviour."""

from __future__ import annotations

import click

from .. import _format
from .._codec import DEFAULT_TTL, StateCodec
from . import _sources
from ._describe import moment
from ._exit import CliError, ExitCode
from ._output import Outcome, Output, command
from ._params import (
    TIME,
    BindingOptions,
    binding_options,
    clock_at,
    duration_option,
    keys_option,
    max_token_bytes_option,
    mode_option,
    read_input,
    require_keys,
)


@click.command("mint")
@click.argument("payload", metavar="PAYLOAD|-")
@keys_option
@mode_option("sign", "SIGN: readable payload; ENCRYPT: confidential payload.")
@duration_option("--ttl", DEFAULT_TTL, "Lifetime, e.g. 90s, 10m, 1h.", positive=True)
@binding_options
@click.option(
    "--at", type=TIME, metavar="TIME", help="Issue as of TIME (ISO 8601, Unix, -1h) to test expiry."
)
@max_token_bytes_option("Refuse a token longer than this.")
@command("mint")
def mint_command(
    out: Output,
    *,
    payload: str,
    keys_spec: str | None,
    mode: str,
    ttl: int,
    binding: BindingOptions,
    at: float | None,
    max_token_bytes: int,
) -> Outcome:
    """Mint a token carrying PAYLOAD (or stdin with '-'), for tests and reproductions.

    Uses the key a server would mint with at that time (the newest promoted key).

    Prints only the token, so `$(statecodec mint ...)` works in scripts.
    """
    clock = clock_at(at)
    now = clock()
    bound = binding.to_binding()
    data = read_input(payload, "payload")
    with _sources.key_manager(require_keys(keys_spec), clock=clock) as keys:
        # A minted token starts no flow the CLI could continue: its --ttl is not cut to a flow budget.
        codec = StateCodec(keys, mode=mode, max_token_bytes=max_token_bytes, max_flow_age=None, clock=clock)
        try:
            token = codec.seal(data, bound, ttl=ttl)
        except _format.TimeRangeError as exc:  # --at is in range: the --ttl is too long for it
            raise click.BadParameter(str(exc), param_hint="'--ttl'") from None
        except ValueError as exc:  # payload too large for a token
            raise CliError(ExitCode.IO, str(exc)) from None
    parsed = _format.parse(token, max_token_bytes)
    fields = {
        "token": token,
        "mode": mode,
        "kid": parsed.kid,
        "issued_at": moment(parsed.issued_at, now),
        "expires_at": moment(parsed.expires_at, now),
        "token_id": parsed.token_id.hex(),
        "binding": bound.describe() if bound else None,
    }
    return Outcome(fields, [token])
