"""One verify entry point per format, for ``statecodec verify --format ID``.

The keys come either from a statecodec key provider (``--keys``: every key the ring would
verify with at that time; sc1 and rs2 select by kid, the other formats have no usable kid
and try each secret), from a list of raw secrets, or (rs2) from a mapping kid -> secret.
Trying several secrets is safe for the HMAC formats (HMAC-SHA256 is committing: one tag
verifies under one key only), and the Python SDK format selects its key by fingerprint.
The Ruby SDK format has no key id at all: its AES-GCM tag is tried under each 32-byte
key given, which is why a verifier should hold only the one key the Ruby servers use.

Nothing here consumes a token: this is for looking, not for accepting.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from .. import _format
from .._binding import Binding
from .._codec import Mode, StateCodec
from .._errors import InvalidState, Reason
from .._keys import KeyProvider
from . import mcp_py_v1, php_v1, rs1, rs2, ruby_v1, ts_v1
from ._common import UNCHECKED, displayable_time
from ._detect import MCP_PY_V1, PHP_V1, RS1, RS2, RUBY_V1, SC1, TS_V1, detect, ts_v1_facts

#: What to verify with: a statecodec key provider (``KeyRing``, ``KeyManager``) or raw
#: secrets. (Not a :class:`statecodec.kms.KeySource`, which is where a ring comes from.)
VerifyKeys = KeyProvider | Sequence[bytes | str] | Mapping[str, bytes | str]
#: Returns the current Unix time, as every ``clock`` in statecodec.
Clock = Callable[[], float]

_BINDING_FIELDS: Final = ("principal", "audience", "method", "target", "arguments")
_OPTION_FIELDS: Final = (*_BINDING_FIELDS, "bind", "associated_data", "arguments_digest")
_AD: Final = ("associated_data",)


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    """What the token is expected to be bound to. ``None`` means "not given, not checked".

    ``bind`` is the TypeScript SDK's: the string the server's ``bind(ctx)`` returns.
    ``associated_data`` is rmcp's AD; rs1 and rs2 always authenticate it (``None`` means
    ``b""``). ``arguments_digest`` is the Ruby SDK's ``a`` claim as it is (a server may
    pass any string), instead of ``arguments``. For sc1 the five binding fields are one
    keyed tag: giving any of them compares all, an omitted field counting as absent.
    """

    principal: str | None = None
    audience: str | None = None
    method: str | None = None
    target: str | None = None
    arguments: Any = None
    bind: str | None = None
    associated_data: bytes | None = None
    arguments_digest: str | None = None


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
    """A format of the registry: its id, its name, how to verify it, its mode, what it binds.

    ``mode`` is ``"sign"`` (anyone can read the payload) or ``"encrypt"``; ``None`` for sc1,
    whose tokens name theirs in their prefix (:func:`mode_of`). ``binds``: the
    :class:`VerifyOptions` fields a token of the format can be checked against; any other
    field given is refused (:meth:`refused`), since a check the format cannot make would
    otherwise pass in silence, and the caller believe it made.
    """

    id: str
    name: str
    verify: Callable[[str, VerifyKeys, VerifyOptions, Clock], Verified]
    mode: str | None = None
    binds: tuple[str, ...] = ()

    def refused(self, options: VerifyOptions) -> tuple[str, ...]:
        """The fields ``options`` gives that a token of this format does not bind."""
        return tuple(f for f in _OPTION_FIELDS if getattr(options, f) is not None and f not in self.binds)


def mode_of(format_id: str, token: str) -> str:
    """``"sign"`` or ``"encrypt"``: the format's mode, or the one an sc1 token's prefix names.

    A token of neither sc1 prefix is judged as SIGN, whose reader says what is wrong with it.
    """
    mode = FORMATS[format_id].mode
    if mode is None:
        return Mode.ENCRYPT.value if token.startswith(_format.PREFIX_ENCRYPT) else Mode.SIGN.value
    return mode


def format_for(token: str) -> str | None:
    """The format id to verify ``token`` as; ``None`` when its bytes fit several formats.

    ``None`` (a ``v1.<blob>`` of the Python or the Ruby SDK) is for :func:`verify_detected`,
    which lets the keys decide. A token of no known format is verified as sc1: statecodec's
    own reader then names precisely what is wrong with it.
    """
    info = detect(token)
    if info.format is None and info.candidates:
        return None
    return info.format or "sc1"


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
    ``TypeError``/``ValueError`` for unusable keys, and ``ValueError`` for options the
    format does not bind (:meth:`CompatFormat.refused`).
    """
    fmt, options = FORMATS[format_id], options or VerifyOptions()
    if refused := fmt.refused(options):
        binds = f"only {', '.join(fmt.binds)}" if fmt.binds else "nothing"
        raise ValueError(f"a {fmt.id} token binds {binds}; drop {', '.join(refused)}")
    return fmt.verify(token, keys, options, clock)


def _secrets(keys: VerifyKeys, now: float) -> list[bytes | str]:
    if isinstance(keys, KeyProvider):
        return [k.secret for k in keys.keyring().keys if k.verifies_at(now)]
    if isinstance(keys, bytes | bytearray | str | Mapping):
        raise TypeError("keys must be a key provider or a sequence of secrets, e.g. [secret]")
    return list(keys)


def _ring(keys: VerifyKeys, now: float) -> dict[str, bytes | str]:
    """kid -> secret, for the formats whose token names its key (rs2)."""
    if isinstance(keys, KeyProvider):
        return {k.kid: k.secret for k in keys.keyring().keys if k.verifies_at(now)}
    if isinstance(keys, Mapping):
        return dict(keys)
    raise TypeError("rs2 tokens name their key by kid: pass a key ring or a mapping kid -> secret")


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
    codec = StateCodec(keys, mode=mode_of("sc1", token), clock=clock)
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


def _verify_ruby_v1(token: str, keys: VerifyKeys, options: VerifyOptions, clock: Clock) -> Verified:
    if options.arguments is not None and options.arguments_digest is not None:
        raise ValueError("give the arguments or their digest, not both")
    u = UNCHECKED
    digest = options.arguments_digest
    if options.arguments is not None:
        digest = ruby_v1.arguments_digest(options.arguments)
    expect = ruby_v1.Expected(
        u if options.method is None else options.method,
        u if options.target is None else options.target,
        u if digest is None else digest,
        u if options.audience is None else options.audience,
    )
    secrets = _ruby_keys(keys, clock())

    def open_one(key: bytes | str) -> Verified:
        opened = ruby_v1.unseal(token, key, expect=expect, clock=clock)
        names = ("method", "target", "arguments", "audience")
        compared = tuple(n for n, want in zip(names, expect, strict=True) if want is not u)
        claims = {k: v for k, v in opened.claims.items() if k != "s"}
        return Verified(
            "ruby-v1",
            RUBY_V1,
            opened.state.encode("utf-8", "surrogatepass"),
            displayable_time(opened.expires_at),
            claims=claims,
            checked=compared,
            unchecked=tuple(n for n in names if n not in compared),
        )

    return _try_each(secrets, open_one, "the AES-GCM tag")


def _ruby_keys(keys: VerifyKeys, now: float) -> list[bytes | str]:
    """The secrets a Ruby server could hold: exactly 32 bytes (of a ring, the others are skipped)."""
    secrets = _secrets(keys, now)
    if isinstance(keys, KeyProvider):
        secrets = [s for s in secrets if len(s) == ruby_v1.KEY_LEN]
        if not secrets:
            raise ValueError(
                f"no key of the ring is {ruby_v1.KEY_LEN} bytes, the only size the Ruby SDK takes"
            )
    for secret in secrets:
        ruby_v1.ruby_key(secret)  # TypeError/ValueError before any token is read
    return secrets


def _verify_php_v1(token: str, keys: VerifyKeys, options: VerifyOptions, clock: Clock) -> Verified:
    def open_one(secret: bytes | str) -> Verified:
        opened = php_v1.unseal(token, secret, clock=clock)
        payload = json.dumps(opened.payload, ensure_ascii=False).encode("utf-8", "surrogatepass")
        return Verified(
            "php-v1", PHP_V1, payload, displayable_time(opened.expires_at), claims={"exp": opened.expires_at}
        )

    return _try_each(_secrets(keys, clock()), open_one, "the MAC")


def _verify_rs2(token: str, keys: VerifyKeys, options: VerifyOptions, clock: Clock) -> Verified:
    ad = options.associated_data or b""
    try:
        opened = rs2.unseal(token, _ring(keys, clock()), ad, clock=clock)
    except InvalidState as exc:
        if exc.reason == "tampered" and options.associated_data is None:
            raise InvalidState(
                exc.reason, exc.detail + " (if it was sealed with associated data, give it)", kid=exc.kid
            ) from None
        raise
    return Verified(
        "rs2",
        RS2,
        opened.payload,
        displayable_time(opened.expires_at),
        kid=opened.kid,
        claims={"status": "proposed (rmcp PR #1128), not released"},
        checked=("associated_data",),
    )


def verify_detected(
    token: str, keys: VerifyKeys, options: VerifyOptions | None = None, *, clock: Clock = time.time
) -> Verified:
    """Verify ``token`` as the format :func:`detect` names, or as the candidate whose key opens it.

    For a token whose bytes fit several formats (a ``v1.<blob>`` of the Python or the Ruby
    SDK), each candidate is tried with ``keys``: the first that verifies wins, and one whose
    key opened the token but whose claims fail (expired, another binding) decides the
    reason. When no key opens it under any candidate, the error names every candidate and
    what it said. ``InvalidState("malformed")`` for a token of no known format.
    """
    options = options or VerifyOptions()
    info = detect(token)
    if info.format is not None:
        return verify(info.format, token, keys, options, clock=clock)
    if not info.candidates and (refusal := info.refusal()) is not None:  # a token of no known format
        raise refusal
    failures: list[str] = []
    unusable: list[str] = []
    reasons: set[Reason] = set()
    for fmt in info.candidates:
        try:
            verified = verify(fmt, token, keys, options, clock=clock)
        except (TypeError, ValueError) as exc:
            unusable.append(f"{fmt}: {exc}")
            continue
        except InvalidState as exc:
            if exc.reason not in {"tampered", "unknown_key"}:  # its key opened the token: it is this format
                raise InvalidState(exc.reason, f"as {fmt}: {exc.detail}", kid=exc.kid) from None
            failures.append(f"{fmt}: {exc.reason} ({exc.detail})")
            reasons.add(exc.reason)
            continue
        ruled_out = "; ".join(failures + unusable) or "none tried before it"
        return replace(verified, claims={**verified.claims, "candidates": ", ".join(info.candidates),
                                         "ruled_out": ruled_out})  # fmt: skip
    if not failures:
        raise ValueError("; ".join(unusable))
    reason: Reason = "unknown_key" if reasons == {"unknown_key"} else "tampered"
    raise InvalidState(
        reason, "no candidate format verifies with these keys: " + "; ".join(failures + unusable)
    )


FORMATS: Final[Mapping[str, CompatFormat]] = {
    "sc1": CompatFormat("sc1", SC1, _verify_sc1, binds=_BINDING_FIELDS),
    "ts-v1": CompatFormat("ts-v1", TS_V1, _verify_ts_v1, "sign", ("bind",)),
    "mcp-py-v1": CompatFormat("mcp-py-v1", MCP_PY_V1, _verify_mcp_py_v1, "encrypt", _BINDING_FIELDS),
    # The Ruby SDK binds no principal; a server may give its arguments' digest as it is.
    "ruby-v1": CompatFormat(
        "ruby-v1",
        RUBY_V1,
        _verify_ruby_v1,
        "encrypt",
        ("audience", "method", "target", "arguments", "arguments_digest"),
    ),
    # The PHP SDK binds nothing: any request of any user can redeem its token.
    "php-v1": CompatFormat("php-v1", PHP_V1, _verify_php_v1, "sign"),
    "rs1": CompatFormat("rs1", RS1, _verify_rs1, "sign", _AD),
    "rs2": CompatFormat("rs2", RS2, _verify_rs2, "sign", _AD),
}
