"""The TypeScript SDK's ``createRequestStateCodec`` format (``@modelcontextprotocol/server`` 2.4.0).

Wire form, as the SDK mints it::

    "v1." + b64url(JSON {"p": <payload>, "exp": <unix seconds>, "b": <bindTag>?}) + "." + b64url(mac)
    mac     = HMAC-SHA256(key, utf8("v1." + body))         # body: the base64url text
    bindTag = b64url(HMAC-SHA256(key, utf8("mcp.requestState.bind:" + bind(ctx)))[:16])

``p`` is any JSON value (the SDK runs ``JSON.stringify`` over the envelope), ``exp`` is
``floor(now) + ttlSeconds``. The token is signed, not encrypted: anyone can read ``p``.
The raw key signs both the MAC and the bind tag (no subkeys), the token has no key id,
no issued-at and no token id, and nothing stops it being replayed until ``exp``.

The SDK verifies in this order, and :class:`TsV1Codec` maps each failure to a statecodec
reason: prefix/segments (``malformed``) -> MAC (``"mac"`` -> ``tampered``) -> JSON
(``malformed``) -> ``exp < floor(now)`` (``expired``) -> bind tag (``"bind"`` ->
``binding_mismatch``; a tag present when no ``bind`` is configured fails too).

Where this reader is stricter than the SDK (every case below is something the SDK never
mints, so real tokens read the same): a size cap comes first; both segments must be
canonical unpadded base64url and are decoded before the MAC is checked (the SDK's
``atob`` also accepts padding, whitespace and non-zero trailing bits in the MAC segment,
so one TS token has several spellings); the MAC must be 32 bytes; the envelope must be a
JSON object with a numeric ``exp`` (the SDK calls a missing ``exp`` "expired").
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
from .._humanize import duration
from ._common import (
    DEFAULT_MAX_TOKEN_BYTES,
    b64decode,
    b64encode,
    check_token,
    fail_closed,
    is_number,
    loads,
    positive_seconds,
    secret_bytes,
)

PREFIX: Final = "v1."
BIND_LABEL: Final = b"mcp.requestState.bind:"
MAC_LEN: Final = 32
BIND_TAG_LEN: Final = 16
DEFAULT_TTL: Final = 600

#: ``bind(ctx) -> str``, as in the SDK's ``createRequestStateCodec({bind})``.
BindFunction = Callable[[Any], str]


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
    check_token(token, max_token_bytes)
    if not token.startswith(PREFIX):
        raise InvalidState("malformed", "not a TypeScript SDK v1 token (no 'v1.' prefix)")
    # The SDK splits at the last dot; the body itself can never hold one.
    body_text, dot, mac_text = token[len(PREFIX) :].rpartition(".")
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


def _dumps(envelope: dict[str, Any]) -> bytes:
    # JSON.stringify's output for the same value: compact, non-ASCII kept as UTF-8. A lone
    # surrogate cannot be UTF-8: JSON.stringify escapes it, and the fallback escapes it too
    # (with all other non-ASCII, which JSON.parse reads back identically).
    try:
        text = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(envelope, separators=(",", ":"), allow_nan=False).encode("ascii")


class TsV1Codec:
    """Read and write the TypeScript SDK's v1 ``requestState`` tokens.

    :param key: the same key the TypeScript servers pass to ``createRequestStateCodec``
        (bytes, or a str taken as UTF-8 like ``TextEncoder``), at least 32 bytes.
    :param ttl_seconds: lifetime of minted tokens (the SDK's ``ttlSeconds``, default 600).
    :param bind: ``bind(ctx) -> str``, the SDK's ``bind`` option: the string it returns is
        tagged into the token at seal time and compared at unseal time. ``ctx`` is whatever
        you pass to :meth:`seal` / :meth:`unseal` (the TS SDK passes its request context).
        Without ``bind``, tokens carrying a bind tag are rejected, as in the SDK.
    :param clock: returns the current Unix time (``time.time``); the one way time enters,
        as in :class:`~statecodec.StateCodec`.
    """

    def __init__(
        self,
        key: bytes | str,
        *,
        ttl_seconds: float = DEFAULT_TTL,
        bind: BindFunction | None = None,
        clock: Callable[[], float] = time.time,
        max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
    ) -> None:
        if bind is not None and not callable(bind):
            raise TypeError("bind must be a callable bind(ctx) -> str")
        self._key = secret_bytes(key)
        self.ttl_seconds = positive_seconds(ttl_seconds, "ttl_seconds")
        self.bind = bind
        self.clock = clock
        self.max_token_bytes = max_token_bytes

    def __repr__(self) -> str:
        return f"TsV1Codec(ttl_seconds={self.ttl_seconds}, bind={self.bind is not None})"

    # ------------------------------------------------------------------ sealing
    def seal(self, payload: Any, ctx: Any = None) -> str:
        """Mint a token the TypeScript SDK's ``verify`` accepts. ``payload`` is any JSON value."""
        now = self.clock()
        ttl = self.ttl_seconds
        ttl_json = int(ttl) if float(ttl).is_integer() else ttl  # 600, not 600.0, like JS
        envelope: dict[str, Any] = {"p": payload, "exp": math.floor(now) + ttl_json}
        if self.bind is not None:
            if ctx is None:
                raise TypeError("TsV1Codec.seal() needs ctx when a bind function is configured")
            envelope["b"] = self._bind_tag(_bind_value(self.bind, ctx))
        body = b64encode(_dumps(envelope))
        signed = (PREFIX + body).encode("ascii")
        return f"{PREFIX}{body}.{b64encode(hmac.digest(self._key, signed, hashlib.sha256))}"

    # ---------------------------------------------------------------- unsealing
    def unseal(self, token: str, ctx: Any = None) -> OpenedTsV1:
        """Verify ``token`` (MAC, expiry, bind tag) or raise :class:`InvalidState`."""
        return self._open(token, ctx, self.clock(), check_binding=True)

    def verify_unbound(self, token: str) -> OpenedTsV1:
        """Check the MAC and expiry but NOT the bind tag (for ``statecodec verify``).

        Never use this to accept a token in a server: the bind tag ties it to its context.
        """
        return self._open(token, None, self.clock(), check_binding=False)

    @fail_closed("TypeScript SDK v1")
    def _open(self, token: str, ctx: Any, now: float, *, check_binding: bool) -> OpenedTsV1:
        parsed = parse(token, self.max_token_bytes)
        expected = hmac.digest(self._key, parsed.signed, hashlib.sha256)
        if not hmac.compare_digest(expected, parsed.mac):
            raise InvalidState(
                "tampered", "MAC does not match: the token was modified or minted with another key"
            )
        envelope = read_envelope(parsed.body)
        exp = envelope["exp"]
        if exp < math.floor(now):
            raise InvalidState(
                "expired", f"expired {duration(math.floor(now) - exp)} ago (TS v1 has no expiry grace)"
            )
        tag = envelope.get("b", _ABSENT)
        if check_binding:
            self._check_bind_tag(tag, ctx)
        return OpenedTsV1(envelope.get("p"), exp, tag is not _ABSENT)

    def _check_bind_tag(self, tag: object, ctx: Any) -> None:
        if self.bind is None:
            if tag is not _ABSENT:
                raise InvalidState(
                    "binding_mismatch", "token carries a bind tag but no bind function is configured"
                )
            return
        expected = self._bind_tag(_bind_value(self.bind, ctx))
        if tag is _ABSENT:
            raise InvalidState("binding_mismatch", "token has no bind tag but a bind function is configured")
        if not isinstance(tag, str) or not hmac.compare_digest(
            tag.encode("utf-8", "replace"), expected.encode()
        ):
            raise InvalidState("binding_mismatch", "bind tag does not match: bound to another context")

    def _bind_tag(self, value: str) -> str:
        mac = hmac.digest(self._key, BIND_LABEL + _utf8_like_js(value), hashlib.sha256)
        return b64encode(mac[:BIND_TAG_LEN])


_ABSENT: Final[Any] = object()


def _bind_value(bind: BindFunction, ctx: Any) -> str:
    value = bind(ctx)
    if not isinstance(value, str):
        raise TypeError(f"bind(ctx) must return str, not {type(value).__name__}")
    return value


def _utf8_like_js(text: str) -> bytes:
    """UTF-8 as ``TextEncoder`` makes it: a lone surrogate becomes U+FFFD instead of failing."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode("utf-8")
