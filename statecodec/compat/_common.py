"""What the three foreign-format readers share: strict decoding and fail-closed guards.

Every token reaching these helpers is attacker-controlled. They cap the size before any
decoding, accept only canonical unpadded base64url (one spelling per byte string, so a
token string can key a replay store), parse JSON without ``NaN``/``Infinity`` and turn
every unexpected exception into :class:`InvalidState` rather than a traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable
from typing import Any, Final, ParamSpec, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .. import _format
from .._errors import InvalidState
from .._humanize import duration

logger = logging.getLogger("statecodec.compat")

#: Default size cap of a foreign token, in characters. The SDKs set none; the foreign
#: formats carry the whole payload in the token, so the cap is looser than sc1's.
DEFAULT_MAX_TOKEN_BYTES: Final = 65536
#: Secrets shorter than this are refused: all three SDKs ask for at least 32 bytes.
MIN_SECRET_BYTES: Final = 32
#: The prefix of the TypeScript, Python and Ruby SDKs' v1 formats alike: a token's prefix
#: alone cannot tell them apart (``._detect`` looks at the rest).
V1_PREFIX: Final = "v1."


class _Unchecked:
    def __repr__(self) -> str:
        return "UNCHECKED"


#: A binding field that is not compared (``statecodec verify`` without that option).
UNCHECKED: Final[Any] = _Unchecked()

_P = ParamSpec("_P")
_R = TypeVar("_R")


def b64decode(text: str, what: str) -> bytes:
    """Canonical unpadded base64url or ``InvalidState("malformed")`` naming ``what``."""
    try:
        return _format.b64decode(text)
    except ValueError as exc:
        raise InvalidState("malformed", f"{what}: {exc}") from None


def check_token(token: object, max_token_bytes: int) -> str:
    """The type and size checks every reader runs first, before touching the content."""
    if not isinstance(token, str):
        raise InvalidState("malformed", f"token must be str, not {type(token).__name__}")
    _format.check_size(token, max_token_bytes)
    if not token.isascii():
        # Every supported format is ASCII; rejecting early keeps .encode() total below.
        raise InvalidState("malformed", "token has non-ASCII characters")
    return token


def after_prefix(token: str, max_token_bytes: int, prefix: str, what: str) -> str:
    """:func:`check_token`, then what follows ``prefix``, or ``malformed`` naming the format ``what``."""
    check_token(token, max_token_bytes)
    if not token.startswith(prefix):
        raise InvalidState("malformed", f"not a {what} token (no {prefix!r} prefix)")
    return token[len(prefix) :]


# ---------------------------------------------------------------- AES-256-GCM behind "v1."
#: AES-GCM's 96-bit nonce and 128-bit tag, as the Python and Ruby SDKs' v1 both use them.
GCM_NONCE_LEN: Final = 12
GCM_TAG_LEN: Final = 16


def gcm_sections(
    token: str, max_token_bytes: int, prefix: str, what: str, head_len: int
) -> tuple[bytes, bytes, bytes]:
    """``(head, nonce, ciphertext || tag)`` of ``prefix + b64url(head || nonce[12] || ciphertext || tag)``.

    The Python and Ruby SDKs' v1 layout: one base64url section sealed with AES-256-GCM,
    after a ``head`` of ``head_len`` bytes (the Python SDK's key fingerprint; none in
    Ruby's). Nothing here has been verified.
    """
    raw = b64decode(after_prefix(token, max_token_bytes, prefix, what), "token body")
    least = head_len + GCM_NONCE_LEN + GCM_TAG_LEN
    if len(raw) < least:
        raise InvalidState("malformed", f"token body is {len(raw)} bytes, at least {least}")
    nonce_end = head_len + GCM_NONCE_LEN
    return raw[:head_len], raw[head_len:nonce_end], raw[nonce_end:]


def gcm_open(
    aead: AESGCM, nonce: bytes, sealed: bytes, aad: bytes, detail: str, *, kid: str | None = None
) -> bytes:
    """The plaintext, or ``InvalidState("tampered", detail)`` when the GCM tag does not verify."""
    try:
        return aead.decrypt(nonce, sealed, aad)
    except InvalidTag:
        raise InvalidState("tampered", detail, kid=kid) from None


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Made once: json.loads(..., parse_constant=...) would build a decoder per call (half its cost).
_STRICT_JSON: Final = json.JSONDecoder(parse_constant=_no_constants)


def loads(raw: bytes, what: str) -> Any:
    """Strict JSON from UTF-8 bytes: no NaN/Infinity, no BOM, bounded nesting."""
    try:
        return _STRICT_JSON.decode(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise InvalidState("malformed", f"{what} is not JSON: {type(exc).__name__}") from None


def is_number(value: object) -> bool:
    """A JSON number (a bool is not one, although Python says it is an int)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def secret_bytes(secret: bytes | bytearray | str, name: str = "key") -> bytes:
    """An operator secret as bytes (str is UTF-8, as both SDKs do), at least 32 of them."""
    if isinstance(secret, str):
        material = secret.encode("utf-8")
    elif isinstance(secret, bytes | bytearray):
        material = bytes(secret)
    else:  # never coerce: bytes(32) would be an all-zero key
        raise TypeError(f"{name} must be bytes or str, not {type(secret).__name__}")
    if len(material) < MIN_SECRET_BYTES:
        raise ValueError(f"{name} must be at least {MIN_SECRET_BYTES} bytes of secret randomness")
    return material


#: The Unix times a ``datetime`` can show (years 1 to 9999).
_MIN_TIME: Final = -62135596800
_MAX_TIME: Final = 253402300799


def displayable_time(value: object) -> float | None:
    """``value`` as a Unix time a tool can render, or ``None`` when it is absurd.

    A token's times come from whoever made it; ``exp = 1e999`` or an rs1 expiry near
    2**63 ms must not crash a ``datetime`` conversion in ``statecodec inspect``.
    """
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    if isinstance(value, int) and not _MIN_TIME <= value <= _MAX_TIME:
        return None  # checked before float(), which overflows on huge integers
    number = float(value)
    return number if _MIN_TIME <= number <= _MAX_TIME else None


def ago(seconds: float) -> str:
    """How long ago a token expired; a key holder's ``exp = -1e999`` is unbounded, not a crash."""
    return duration(seconds) if math.isfinite(seconds) else "an unbounded time"


def fail_closed(what: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Deny on error: any exception but :class:`InvalidState` becomes ``internal_error``.

    A bug or an exotic input must never let a token through nor reach a user as a
    traceback; the traceback goes to the log.
    """

    def decorate(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return fn(*args, **kwargs)
            except InvalidState:
                raise
            except Exception as exc:
                logger.exception(
                    "unexpected error while verifying a %s token",
                    what,
                    extra={"event": "compat_crashed", "format": what},
                )
                raise InvalidState(
                    "internal_error", f"unexpected {type(exc).__name__} while verifying a {what} token"
                ) from None

        return guarded

    return decorate
