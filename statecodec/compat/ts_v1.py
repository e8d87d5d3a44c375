"""The TypeScript SDK's ``createRequestStateCodec`` format (``@modelcontextprotocol/server`` 2.4.0).

Wire form, as the SDK mints it::

    "v1." + b64url(JSON {"p": <payload>, "exp": <unix seconds>, "b": <bindTag>?}) + "." + b64url(mac)
    mac     = HMAC-SHA256(key, utf8("v1." + body))         # body: the base64url text
    bindTag = b64url(HMAC-SHA256(key, utf8("mcp.requestState.bind:" + bind(ctx)))[:16])

``p`` is any JSON value (the SDK runs ``JSON.stringify`` over the envelope), ``exp`` is
``floor(now) + ttlSeconds``. The token is signed, not encrypted: anyone can read ``p``.
The raw key signs both the MAC and the bind tag (no subkeys), the token has no key id,
no issued-at and no token id, and nothing stops it being replayed until ``exp``.

The SDK verifies in this order, and :func:`unseal` maps each failure to a statecodec
reason: prefix/segments (``malformed``) -> MAC (``"mac"`` -> ``tampered``) -> JSON
(``malformed``) -> ``exp < floor(now)`` (``expired``) -> bind tag (``"bind"`` ->
``binding_mismatch``; a tag present when no ``bind`` is configured fails too).

Where this reader is stricter than the SDK (every case below is something the SDK never
mints, so real tokens read the same): a size cap comes first; both segments must be
canonical unpadded base64url and are decoded before the MAC is checked (the SDK's
``atob`` also accepts padding, whitespace and non-zero trailing bits in the MAC segment,
so one TS token has several spellings); the MAC must be 32 bytes; the envelope must be a
JSON object with a numeric ``exp``.

:func:`seal` mints what the SDK mints, byte for byte (``tests/compat/test_compat_ts_v1.py`` holds
both directions against the SDK under Node); ``benchmarks/bench_codec.py`` times the pair.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from .._errors import InvalidState
from .._format import b64encode
from . import _common
from ._common import (
    DEFAULT_MAX_TOKEN_BYTES,
    UNCHECKED,
    after_prefix,
    ago,
    b64decode,
    fail_closed,
    is_number,
    loads,
    secret_bytes,
)

NAME: Final = "TypeScript SDK v1"
PREFIX: Final = _common.V1_PREFIX  # the Python and Ruby SDKs' too (._common)
BIND_LABEL: Final = b"mcp.requestState.bind:"
MAC_LEN: Final = 32
BIND_TAG_LEN: Final = 16
DEFAULT_TTL: Final = 600
_ABSENT: Final[Any] = object()


class ParsedTsV1(NamedTuple):
    """A TS v1 token split into its parts. Nothing here has been verified."""

    signed: bytes  # the MAC input: b"v1." + the body text
    body: bytes  # the decoded envelope JSON
    mac: bytes


@dataclass(frozen=True, slots=True)
class OpenedTsV1:
    """A verified TS v1 token: its payload (any JSON value) and the envelope's facts."""

    payload: Any  # ``None`` also when the SDK minted ``undefined`` (JSON.stringify drops it)
    expires_at: float
    bound: bool  # whether the envelope carries a bind tag


def parse(token: str, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> ParsedTsV1:
    """Split ``token`` strictly, without keys, or raise ``InvalidState("malformed"|"too_large")``."""
    # The SDK splits at the last dot; the body itself can never hold one.
    body_text, dot, mac_text = after_prefix(token, max_token_bytes, PREFIX, NAME).rpartition(".")
    if not dot or not body_text:
        raise InvalidState("malformed", "expected 'v1.<body>.<mac>'")
    body = b64decode(body_text, "envelope")
    mac = b64decode(mac_text, "MAC")
    if len(mac) != MAC_LEN:
        raise InvalidState("malformed", f"MAC is {len(mac)} bytes, HMAC-SHA256 gives {MAC_LEN}")
    return ParsedTsV1((PREFIX + body_text).encode("ascii"), body, mac)


def read_envelope(body: bytes) -> dict[str, Any]:
    """The envelope object with a numeric ``exp``, or ``InvalidState("malformed")``."""
    envelope = loads(body, "envelope")
    if not isinstance(envelope, dict):
        raise InvalidState("malformed", f"envelope is a JSON {type(envelope).__name__}, not an object")
    if not is_number(envelope.get("exp")):
        raise InvalidState("malformed", "envelope has no numeric 'exp'")
    return envelope


def seal(
    key: bytes | str,
    payload: Any,
    *,
    ttl_seconds: float = DEFAULT_TTL,
    bind: str | None = None,
    clock: Callable[[], float] = time.time,
) -> str:
    """The token the SDK mints at ``clock()`` for ``payload`` (any JSON value).

    ``bind`` is what the SDK's ``bind(ctx)`` returns; ``None`` when no ``bind`` is configured.
    ``clock`` returns the current Unix time (``time.time``), as everywhere in statecodec:
    to mint "as of" another instant, give a clock that returns it.
    """
    material = secret_bytes(key)
    if not is_number(ttl_seconds) or not math.isfinite(ttl_seconds) or ttl_seconds <= 0:
        raise ValueError(f"ttl_seconds must be a positive finite number of seconds, got {ttl_seconds!r}")
    ttl = int(ttl_seconds) if float(ttl_seconds).is_integer() else ttl_seconds  # 600, not 600.0, like JS
    envelope: dict[str, Any] = {"p": payload, "exp": math.floor(clock()) + ttl}
    if bind is not None:
        envelope["b"] = bind_tag(material, bind)
    body = b64encode(_dumps(envelope))
    mac = hmac.digest(material, (PREFIX + body).encode("ascii"), hashlib.sha256)
    return f"{PREFIX}{body}.{b64encode(mac)}"


def unseal(
    token: str,
    key: bytes | str,
    *,
    bind: str | None = UNCHECKED,
    clock: Callable[[], float] = time.time,
    max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
) -> OpenedTsV1:
    """Verify ``token`` (MAC, expiry, bind tag) as the SDK does, or raise :class:`InvalidState`.

    ``bind``: what the server's ``bind(ctx)`` returns; ``None`` for a server without
    ``bind`` (a tag in the token then fails); :data:`UNCHECKED` leaves the tag unchecked,
    which only ``statecodec verify`` may do. Expiry is judged at ``clock()`` (``time.time``).
    ``TypeError``/``ValueError`` for a bad key.
    """
    return _unseal(token, secret_bytes(key), clock, bind, max_token_bytes)


@fail_closed(NAME)
def _unseal(
    token: str, key: bytes, clock: Callable[[], float], bind: str | None, max_token_bytes: int
) -> OpenedTsV1:
    parsed = parse(token, max_token_bytes)
    if not hmac.compare_digest(hmac.digest(key, parsed.signed, hashlib.sha256), parsed.mac):
        raise InvalidState(
            "tampered", "MAC does not match: the token was modified or minted with another key"
        )
    envelope = read_envelope(parsed.body)
    exp = envelope["exp"]
    # Read inside fail_closed: a clock that raises or returns NaN is an internal_error.
    now = math.floor(clock())
    if exp < now:
        raise InvalidState("expired", f"expired {ago(now - exp)} ago (TS v1 has no expiry grace)")
    tag = envelope.get("b", _ABSENT)
    if bind is not UNCHECKED:
        _check_bind_tag(key, tag, bind)
    return OpenedTsV1(envelope.get("p"), exp, tag is not _ABSENT)


def _check_bind_tag(key: bytes, tag: object, bind: str | None) -> None:
    if bind is None:
        if tag is not _ABSENT:
            raise InvalidState("binding_mismatch", "token carries a bind tag but no bind value is configured")
        return
    if tag is _ABSENT:
        raise InvalidState("binding_mismatch", "token has no bind tag but a bind value is configured")
    expected = bind_tag(key, bind).encode()
    if not isinstance(tag, str) or not hmac.compare_digest(tag.encode("utf-8", "replace"), expected):
        raise InvalidState("binding_mismatch", "bind tag does not match: bound to another context")


def bind_tag(key: bytes, value: str) -> str:
    """The envelope's ``b``: a truncated HMAC of what ``bind(ctx)`` returned."""
    mac = hmac.digest(key, BIND_LABEL + _utf8_like_js(value), hashlib.sha256)
    return b64encode(mac[:BIND_TAG_LEN])


def _utf8_like_js(text: str) -> bytes:
    """UTF-8 as ``TextEncoder`` makes it: a lone surrogate becomes U+FFFD instead of failing."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode("utf-8")


def _dumps(envelope: dict[str, Any]) -> bytes:
    # JSON.stringify's output for the same value: compact, non-ASCII kept as UTF-8. A lone
    # surrogate cannot be UTF-8: JSON.stringify escapes it, and the fallback escapes it too
    # (with all other non-ASCII, which JSON.parse reads back identically).
    try:
        text = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(envelope, separators=(",", ":"), allow_nan=False).encode("ascii")
