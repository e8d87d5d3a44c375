"""``statecodec verify``: full verification with the precise reason when a token fails.

Without binding options the command can only check the tag and the times, and it says so
in the verdict: "VALID" alone would tempt an operator to conclude the token is fine for a
user it was never issued to. It never consumes a token unless ``--consume`` is given, and
``--consume`` demands a full check, so debugging can never burn a user's pending round.
``--replay URL`` alone asks the store whether the token was redeemed, reading only
(:meth:`~statecodec.replay.ReplayStore.is_consumed`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from .._codec import (
    DEFAULT_EXPIRY_GRACE,
    DEFAULT_MAX_SKEW,
    DEFAULT_NAMESPACE,
    StateCodec,
)
from .._errors import InvalidState, ReplayCheckUnsupported
from .._keys import KeyProvider
from ..compat import FORMATS as COMPAT_FORMATS
from ..compat import VerifyOptions, detect, format_for, mode_of, verify_detected
from ..compat import verify as compat_verify
from ..replay._url import redact
from ..replay.base import ReplayStore
from . import _sources
from ._describe import expiry_phrase, moment, payload_fields, table, token_fields, token_rows
from ._output import Outcome, Output, command, invalid_state_error
from ._params import (
    ABSENT,
    TIME,
    BindingOptions,
    binding_options,
    clock_at,
    duration_option,
    flow_budget_options,
    keys_option,
    max_token_bytes_option,
    mode_option,
    read_token,
    require_keys,
)

#: The pseudo-format of a token whose bytes fit several formats: the keys decide.
_CANDIDATES = "candidates"
#: The command line's name of each compat option (what each format binds is compat's).
_FLAGS = {
    "principal": "--principal",
    "audience": "--audience",
    "method": "--method",
    "target": "--target",
    "arguments": "--arguments",
    "bind": "--bind-value",
    "associated_data": "--associated-data",
}


@dataclass(frozen=True)
class _Sc1Options:
    """The sc1-only options; ``codec``: the server's codec settings, as the codec's own arguments."""

    mode: str | None
    unbound: bool
    replay_url: str | None
    consume: bool
    codec: dict[str, Any]

    @classmethod
    def of(cls, options: dict[str, Any]) -> _Sc1Options:
        """Out of the parsed options: all but these four are the codec's (--max-skew, --namespace...)."""
        mode, unbound, replay_url, consume = (
            options.pop(n) for n in ("mode", "unbound", "replay_url", "consume")
        )
        return cls(mode, unbound, replay_url, consume, codec=options)


def _check_sc1_flags(binding: BindingOptions, opts: _Sc1Options, at: float | None) -> None:
    if opts.unbound and binding.given:
        raise click.UsageError(
            "--unbound says the token carries no binding; do not combine it with binding options"
        )
    if opts.consume and opts.replay_url is None:
        raise click.UsageError("--consume needs --replay URL, the store to redeem the token in")
    if opts.consume and at is not None:
        # Redeeming burns the token for real, now: judging it "as of" another time could
        # burn a token the server would still accept (or redeem one it already rejects).
        raise click.UsageError("--consume redeems the token now; do not combine it with --at")
    if opts.consume and not binding.given and not opts.unbound:
        raise click.UsageError(
            "--consume redeems the token only after a full check: give the binding options, "
            "or --unbound for a token minted without binding"
        )


def _check_foreign_flags(tokens: str, binding: BindingOptions, opts: _Sc1Options) -> None:
    sc1_only = {
        "--mode": opts.mode,
        "--replay": opts.replay_url,
        "--consume": opts.consume or None,
        "--unbound": opts.unbound or None,
        "--extra": binding.extra or None,
    }
    if given := [name for name, value in sc1_only.items() if value is not None]:
        raise click.UsageError(f"not applicable to {tokens}: {', '.join(given)}")


def _check_applicable(
    tokens: str, formats: tuple[str, ...], binding: BindingOptions, **more: str | None
) -> None:
    """Options none of ``formats`` binds (compat says what each binds): a usage error, before any key.

    ``more``: ``bind`` and ``associated_data`` as given. ``--arguments null`` counts as given
    (an explicit "no arguments", which a format without arguments cannot check either).
    """
    given = [*binding.names(), *(option for option, value in more.items() if value is not None)]
    binds = {option for f in formats for option in COMPAT_FORMATS[f].binds}
    if misplaced := [
        f"{_FLAGS[o]} ({', '.join(_binders(o))} only)" for o in _FLAGS if o in given and o not in binds
    ]:
        takes = "/".join(flag for option, flag in _FLAGS.items() if option in binds) or "no binding option"
        raise click.UsageError(f"not applicable to {tokens}: {', '.join(misplaced)}; they take {takes}")


def _binders(option: str) -> list[str]:
    return [fmt.id for fmt in COMPAT_FORMATS.values() if option in fmt.binds]


@click.command("verify")
@click.argument("token", metavar="TOKEN|-")
@keys_option
@mode_option(None, "sc1 mode [default: from the token prefix].")
@binding_options
@click.option("--unbound", is_flag=True, help="Check that the token was minted without any binding.")
@click.option(
    "--replay",
    "replay_url",
    metavar="URL",
    help="Replay store (memory:, sqlite:PATH, redis://HOST:PORT/DB, redis+cluster://..., "
    "redis+sentinel://..., postgresql://USER@HOST/DB): say whether the token was already redeemed there, "
    "without consuming it.",
)
@click.option("--consume", is_flag=True, help="Redeem the token in the --replay store (single use).")
@click.option(
    "--namespace", default=DEFAULT_NAMESPACE, show_default=True, help="Replay namespace of the server."
)
@click.option("--at", type=TIME, metavar="TIME", help="Verify as of TIME (ISO 8601, Unix, +10m, -3m).")
@duration_option(
    "--max-skew",
    DEFAULT_MAX_SKEW,
    "Accept a token issued up to this far in the future (a server whose clock runs ahead).",
)
@duration_option(
    "--expiry-grace", DEFAULT_EXPIRY_GRACE, "Accept a token this long past its expiry (0: the TTL is exact)."
)
@max_token_bytes_option("The server's size limit.")
@flow_budget_options(
    "The server's round budget: a token of a later round of its flow is refused.",
    "The server's flow budget: a token of a flow that started longer ago is refused.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", *COMPAT_FORMATS]),
    default="auto",
    show_default=True,
    help="Token format: statecodec sc1, TypeScript SDK ts-v1, Python SDK mcp-py-v1, Ruby SDK ruby-v1, "
    "PHP SDK php-v1, rmcp rs1, rmcp rs2 (proposed). auto: from the token; a 'v1.<blob>' token "
    "(Python or Ruby SDK) is verified as the one whose key opens it.",
)
@click.option("--bind-value", metavar="TEXT", help="ts-v1: the string the server's bind(ctx) returns.")
@click.option(
    "--associated-data",
    metavar="TEXT",
    help="rs1, rs2: the associated data (UTF-8) the token was sealed with.",
)
@command("verify")
def verify_command(
    out: Output,
    *,
    token: str,
    keys_spec: str | None,
    binding: BindingOptions,
    fmt: str,
    at: float | None,
    bind_value: str | None,
    associated_data: str | None,
    **sc1: Any,
) -> Outcome:
    """Verify TOKEN (or stdin with '-'): VALID with its claims, or the precise reason it fails.

    Without binding options only the tag and the times are checked, and the output says
    that the binding was NOT checked. Never consumes the token unless --consume is given.
    Tokens of the other SDKs (--format, detected by default) are checked with every key of
    the ring; they have no token id, so --replay/--consume apply to sc1 tokens only.
    """
    opts = _Sc1Options.of(sc1)
    text = read_token(token)
    if fmt == "auto":
        fmt = format_for(text) or _CANDIDATES
    formats = detect(text).candidates if fmt == _CANDIDATES else (fmt,)
    tokens = f"{' or '.join(formats)} tokens"
    if fmt == "sc1":
        _check_sc1_flags(binding, opts, at)
    else:
        _check_foreign_flags(tokens, binding, opts)
    _check_applicable(tokens, formats, binding, bind=bind_value, associated_data=associated_data)
    clock = clock_at(at)
    with _sources.key_manager(require_keys(keys_spec), clock=clock) as keys:
        if fmt == "sc1":
            return _verify_sc1(out, text, keys, binding, opts, clock=clock)
        ad = None if associated_data is None else associated_data.encode("utf-8", "surrogateescape")
        options = _compat_options(binding, bind=bind_value, associated_data=ad)
        return _verify_foreign(out, fmt, text, keys, options, clock=clock)


# ---------------------------------------------------------------------------- sc1
def _verify_sc1(
    out: Output,
    token: str,
    keys: KeyProvider,
    binding: BindingOptions,
    opts: _Sc1Options,
    *,
    clock: Callable[[], float],
) -> Outcome:
    now = clock()
    mode = opts.mode or mode_of("sc1", token)
    bound = binding.to_binding()
    check_binding = bound is not None or opts.unbound
    base: dict[str, Any] = {
        "format": "sc1",
        "mode": mode,
        "at": moment(now, now),
        "binding_checked": check_binding,
        "binding": bound.describe() if bound else None,
    }
    store = _sources.open_store(opts.replay_url, check=opts.consume) if opts.replay_url else None
    replay = "consumed" if opts.consume else "not_checked"
    try:
        codec = StateCodec(keys, mode=mode, replay=store, clock=clock, **opts.codec)
        if check_binding:
            opened = codec.unseal(token, bound, consume=opts.consume)
        else:
            opened = codec.verify_unbound(token)
        if store is not None and not opts.consume:
            replay = _redeemed(store, f"{codec.namespace}:{opened.token_id}")
    except InvalidState as exc:
        return _invalid(out, base, exc)
    finally:
        if store is not None:
            store.close()
    fields = {
        **base,
        "valid": True,
        "replay": replay,
        "claims": {**token_fields(opened, now, opened._asdict()), "payload": payload_fields(opened.payload)},
    }
    names = ", ".join(binding.names()) or "the token carries no binding"
    checked = f"checked ({names})" if check_binding else None
    summary = f"statecodec sc1 {opened.mode.value.upper()} token, key {opened.kid}"
    return _valid(out, fields, summary, now, "sc1", checked=checked, replay=_replay_line(opts, replay))


def _redeemed(store: ReplayStore, key: str) -> str:
    """``"not_redeemed"``, ``"unsupported"``, or InvalidState (replayed, store_unavailable): read only."""
    try:
        consumed = store.is_consumed(key)
    except ReplayCheckUnsupported:
        return "unsupported"
    except Exception as exc:  # whatever a store raises: no answer
        raise InvalidState("store_unavailable", f"the replay store could not answer: {exc}") from None
    if consumed:
        raise InvalidState("replayed", "already redeemed (checked without consuming anything)")
    return "not_redeemed"


def _replay_line(opts: _Sc1Options, replay: str) -> str:
    where = redact(opts.replay_url or "")
    if replay == "consumed":
        return f"consumed now in {where} (a second redemption fails)"
    if replay == "not_redeemed":
        return f"not yet redeemed in {where} (checked without consuming; --consume redeems it)"
    if replay == "unsupported":
        return "not checked: this store cannot answer without consuming; add --consume to redeem it"
    return "not checked (add --replay URL to ask the store, --consume to redeem the token)"


# ------------------------------------------------------------------- other SDKs
def _compat_options(
    binding: BindingOptions, *, bind: str | None, associated_data: bytes | None
) -> VerifyOptions:
    return VerifyOptions(
        principal=binding.principal,
        audience=binding.audience,
        method=binding.method,
        target=binding.target,
        arguments=None if binding.arguments is ABSENT else binding.arguments,
        bind=bind,
        associated_data=associated_data,
    )


def _verify_foreign(
    out: Output,
    fmt: str,
    token: str,
    keys: KeyProvider,
    options: VerifyOptions,
    *,
    clock: Callable[[], float],
) -> Outcome:
    now = clock()
    # The candidates (Python or Ruby SDK v1) are both AES-GCM.
    mode = "encrypt" if fmt == _CANDIDATES else mode_of(fmt, token)
    base: dict[str, Any] = {
        "format": None if fmt == _CANDIDATES else fmt,
        "mode": mode,
        "at": moment(now, now),
    }
    try:
        if fmt == _CANDIDATES:
            verified = verify_detected(token, keys, options, clock=clock)
            base["format"] = verified.format
        else:
            verified = compat_verify(fmt, token, keys, options, clock=clock)
    except InvalidState as exc:
        return _invalid(out, {**base, "binding_checked": False, "binding": None}, exc)
    except (TypeError, ValueError) as exc:  # arguments or keys unusable for this format
        raise click.UsageError(f"{fmt}: {exc}") from None
    fields = {
        **base,
        "binding_checked": bool(verified.checked),
        "binding": {name: _option_value(options, name) for name in verified.checked} or None,
        "valid": True,
        "replay": "not_checked",
        # The other SDKs' formats have no token id and no flow.
        "claims": {
            **token_fields(verified, now),
            "payload": payload_fields(verified.payload),
            "extra": dict(verified.claims),
        },
    }
    note = f"; not checked: {', '.join(verified.unchecked)}" if verified.unchecked else ""
    checked = f"checked ({', '.join(verified.checked)}){note}" if verified.checked else None
    replay = f"not available: {verified.name} tokens have no token id and can be replayed until they expire"
    return _valid(out, fields, f"{verified.name} token", now, verified.format, checked=checked, replay=replay)


def _hint(fmt: str) -> str:
    """How to check what the format binds; or that its tokens bind nothing (php-v1)."""
    flags = [_FLAGS[f] for f in COMPAT_FORMATS[fmt].binds if f in _FLAGS]
    if flags:
        extra = ["--extra"] if fmt == "sc1" else []  # statecodec's own binding entries, not compat's
        return f"add {'/'.join(flags + extra)} exactly as the server binds them"
    return f"a {COMPAT_FORMATS[fmt].name} token binds nothing: any request of any user can redeem it"


def _option_value(options: VerifyOptions, name: str) -> Any:
    value = getattr(options, name, None)
    if name == "arguments":
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if value is not None else ""


# ------------------------------------------------------------------- verdicts
def _invalid(out: Output, base: dict[str, Any], exc: InvalidState) -> Outcome:
    error = invalid_state_error(exc)
    fields = {**base, "valid": False, "replay": "not_checked", **exc.ids}
    verdict = out.style("INVALID", fg="red", bold=True)
    return Outcome(fields, [f"{verdict}  {exc.reason}: {exc.detail or exc.reason}"], error.code, error)


def _valid(
    out: Output,
    fields: dict[str, Any],
    summary: str,
    now: float,
    fmt: str,
    *,
    checked: str | None,
    replay: str,
) -> Outcome:
    """VALID, what of the binding was ``checked`` (None: nothing, and how to check it) and of replay."""
    if checked is not None:
        binding = out.style(checked, fg="green")
    else:
        given = "no binding options given; " if fmt == "sc1" else ""
        binding = out.style(f"NOT CHECKED - {given}{_hint(fmt)}", fg="yellow", bold=True)
    claims = fields["claims"]
    head = out.style("VALID", fg="green", bold=True)
    expires = claims["expires_at"]
    when = expiry_phrase(expires["unix"], now) if expires else "never expires"
    rows = [r for r in token_rows(claims, now) if r[0] != "format"]
    return Outcome(
        fields, [f"{head}  {summary}, {when}", *table([("binding", binding), ("replay", replay), *rows])]
    )
