"""One verify entry point per format, for ``statecodec verify --format ID``.

The keys come either from a statecodec key provider (``--keys``: every key the ring would
verify with at that time; sc1 selects by kid, the foreign formats have no usable kid and
try each secret) or from a list of raw secrets. Trying several secrets is safe for the
HMAC formats (HMAC-SHA256 is committing: one tag verifies under one key only) and the
Python SDK format selects its key by fingerprint, so there is no trial decryption.

Nothing here consumes a token: this is for looking, not for accepting.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .._binding import Binding
from .._codec import Mode, StateCodec
from .._errors import InvalidState
from .._keys import KeyProvider
from . import mcp_py_v1, rs1, ts_v1
from ._common import UNCHECKED, displayable_time
from ._detect import MCP_PY_V1, RS1, SC1, TS_V1, ts_v1_facts

#: What to verify with: a statecodec key provider (``KeyRing``, ``KeyManager``) or raw
#: secrets. (Not a :class:`statecodec.kms.KeySource`, which is where a ring comes from.)
VerifyKeys = KeyProvider | Sequence[bytes | str]
#: Returns the current Unix time, as every ``clock`` in statecodec.
Clock = Callable[[], float]

_BINDING_FIELDS: Final = ("principal", "audience", "method", "target", "arguments")


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    """What the token is expected to be bound to. ``None`` means "not given, not checked".

    ``bind`` is the TypeScript SDK's: the string the server's ``bind(ctx)`` returns.
    ``associated_data`` is rmcp's AD; rs1 always authenticates it (``None`` means ``b""``).
    For sc1 the five binding fields are one keyed tag: giving any of them compares all,
    an omitted field counting as absent.
    """

    principal: str | None = None
    audience: str | None = None
    method: str | None = None
    target: str | None = None
    arguments: Any = None
    bind: str | None = None
    associated_data: bytes | None = None


@dataclass(frozen=True, slots=True)
class Verified:
    """A token that passed verification, and what exactly was checked."""

    format: str
    name: str
    payload: bytes | None  # for mcp-py-v1 the handler state (UTF-8); for ts-v1 the JSON of "p"
    expires_at: float | None  # None: never, or beyond what a datetime shows (raw value in claims)
    issued_at: float | None = None
    kid: str | None = None
    claims: Mapping[str, Any] = field(default_factory=dict)  # JSON-serialisable facts
    checked: tuple[str, ...] = ()  # binding fields compared
    unchecked: tuple[str, ...] = ()  # binding fields the format has but nobody gave


@dataclass(frozen=True, slots=True)
class CompatFormat:
    id: str
    name: str
    verify: Callable[[str, VerifyKeys, VerifyOptions, Clock], Verified]


def verify(
    format_id: str,
    token: str,
    keys: VerifyKeys,
    options: VerifyOptions | None = None,
    *,
    clock: Clock = time.time,
) -> Verified:
    """Verify ``token`` as format ``format_id`` or raise :class:`InvalidState`.

    ``clock`` gives the time to judge expiry and key retirement at (``time.time``; a
    fixed instant for ``statecodec verify --at``). ``KeyError`` for an unknown format id;
    ``TypeError``/``ValueError`` for unusable keys.
    """
    fmt = FORMATS[format_id]
    return fmt.verify(token, keys, options or VerifyOptions(), clock)


def _secrets(keys: VerifyKeys, now: float) -> list[bytes | str]:
    if isinstance(keys, KeyProvider):
        return [k.secret for k in keys.keyring().keys if k.verifies_at(now)]
    if isinstance(keys, bytes | bytearray | str):
        raise TypeError("keys must be a key provider or a sequence of secrets, e.g. [secret]")
    return list(keys)


def _try_each(
    secrets: Sequence[bytes | str], open_one: Callable[[bytes | str], Verified], what: str
) -> Verified:
    """The first secret whose MAC matches decides; only a MAC failure moves on to the next."""
    if not secrets:
        raise InvalidState("unknown_key", "no key to verify with")
    for secret in secrets:
        try:
            return open_one(secret)
        except InvalidState as exc:
            if exc.reason != "tampered":
                raise
    raise InvalidState("tampered", f"{what} does not verify under any of the {len(secrets)} key(s)")


def _verify_sc1(token: str, keys: VerifyKeys, options: VerifyOptions, clock: Clock) -> Verified:
    if not isinstance(keys, KeyProvider):
        raise TypeError("sc1 tokens name their key by kid: pass a key ring, not raw secrets")
    mode = Mode.ENCRYPT if token.startswith("sc1e.") else Mode.SIGN
    codec = StateCodec(keys, mode=mode, clock=clock)
    given = {f: getattr(options, f) for f in _BINDING_FIELDS if getattr(options, f) is not None}
    opened = codec.unseal(token, Binding(**given), consume=False) if given else codec.verify_unbound(token)
    return Verified(
        "sc1",
        SC1,
        opened.payload,
        opened.expires_at,
        opened.issued_at,
        opened.kid,
        {"mode": str(opened.mode), "token_id": opened.token_id},
        checked=_BINDING_FIELDS if given else (),
        unchecked=() if given else _BINDING_FIELDS,
    )


def _verify_ts_v1(token: str, keys: VerifyKeys, options: VerifyOptions, clock: Clock) -> Verified:
    bind = UNCHECKED if options.bind is None else options.bind

    def open_one(secret: bytes | str) -> Verified:
        opened = ts_v1.unseal(token, secret, bind=bind, clock=clock)
        payload, exp, claims = ts_v1_facts(opened.payload, opened.expires_at, opened.bound)
        checked = () if bind is UNCHECKED else ("bind",)
        unchecked = ("bind",) if bind is UNCHECKED and opened.bound else ()
        return Verified("ts-v1", TS_V1, payload, exp, claims=claims, checked=checked, unchecked=unchecked)

    return _try_each(_secrets(keys, clock()), open_one, "the MAC")


def _verify_mcp_py_v1(token: str, keys: VerifyKeys, options: VerifyOptions, clock: Clock) -> Verified:
    u = UNCHECKED
    expect = mcp_py_v1.Expected(
        u if options.method is None else options.method,
        u if options.target is None else options.target,
        u if options.arguments is None else mcp_py_v1.arguments_digest(options.arguments),
        u if options.audience is None else options.audience,
        u if options.principal is None else options.principal,
    )
    opened = mcp_py_v1.unseal(token, _secrets(keys, clock()), expect=expect, clock=clock)
    # Non-finite numbers (a key holder can write 1e999) are not JSON: show them as text.
    claims = {
        k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in opened.claims.items()
        if k != "s"
    }
    names = ("method", "target", "arguments", "audience", "principal")
    compared = tuple(n for n, want in zip(names, expect, strict=True) if want is not u)
    return Verified(
        "mcp-py-v1",
        MCP_PY_V1,
        opened.state.encode("utf-8", "surrogatepass"),
        displayable_time(opened.expires_at),
        displayable_time(opened.issued_at),
        opened.kid,
        claims,
        checked=compared,
        unchecked=tuple(n for n in names if n not in compared),
    )


def _verify_rs1(token: str, keys: VerifyKeys, options: VerifyOptions, clock: Clock) -> Verified:
    ad = options.associated_data or b""

    def open_one(secret: bytes | str) -> Verified:
        opened = rs1.unseal(token, secret, ad, clock=clock)
        return Verified(
            "rs1", RS1, opened.payload, displayable_time(opened.expires_at), checked=("associated_data",)
        )

    try:
        return _try_each(_secrets(keys, clock()), open_one, "the tag")
    except InvalidState as exc:
        if exc.reason == "tampered" and options.associated_data is None:
            raise InvalidState(
                exc.reason, exc.detail + " (if it was sealed with associated data, give it)"
            ) from None
        raise


FORMATS: Final[Mapping[str, CompatFormat]] = {
    "sc1": CompatFormat("sc1", SC1, _verify_sc1),
    "ts-v1": CompatFormat("ts-v1", TS_V1, _verify_ts_v1),
    "mcp-py-v1": CompatFormat("mcp-py-v1", MCP_PY_V1, _verify_mcp_py_v1),
    "rs1": CompatFormat("rs1", RS1, _verify_rs1),
}
