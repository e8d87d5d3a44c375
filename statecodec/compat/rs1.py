"""The Rust SDK's (``rmcp``) ``rs1.`` ``requestState`` format.

Layout, as ``RequestStateCodec`` in rmcp's ``crates/rmcp/src/model/request_state.rs``
writes it (read from the source; no Rust toolchain runs in these tests)::

    "rs1." + b64url(body) + "." + b64url(tag)
    body = expiry_ms (i64 big-endian; 0 = never expires) || payload
    tag  = HMAC-SHA256(key, b"rmcp/mrtr/request-state/v1" || u64be(len(AD)) || AD || body)

``AD`` (associated data) is context the caller supplies on both sides (say, principal and
request digest); it is authenticated but not stored, so a wrong AD looks exactly like a
forged tag. The key is used raw, without derivation. There is no key id (``rs2.`` adds
one), no issued-at, no token id and no replay protection; the payload is readable.

rmcp opens in this order, mapped to statecodec reasons: three dot-separated sections with
version ``rs1`` (``malformed``), base64url (``malformed``), tag (``tampered``), body of at
least 8 bytes (``malformed``), ``expiry != 0 and now_ms > expiry`` (``expired``).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NamedTuple

from .._errors import InvalidState
from .._humanize import duration
from ._common import (
    DEFAULT_MAX_TOKEN_BYTES,
    b64decode,
    b64encode,
    check_token,
    fail_closed,
    positive_seconds,
    secret_bytes,
)

VERSION: Final = "rs1"
PREFIX: Final = "rs1."
DOMAIN: Final = b"rmcp/mrtr/request-state/v1"
EXPIRY_LEN: Final = 8
TAG_LEN: Final = 32
DEFAULT_TTL: Final = 600
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_I64_MAX: Final = 2**63 - 1


class ParsedRs1(NamedTuple):
    """An rs1 token split into its parts. Nothing here has been verified."""

    body: bytes
    tag: bytes

    @property
    def expiry_ms(self) -> int | None:
        """The expiry in Unix milliseconds, 0 for "never", ``None`` when the body is too short."""
        return _I64.unpack_from(self.body)[0] if len(self.body) >= EXPIRY_LEN else None


@dataclass(frozen=True, slots=True)
class OpenedRs1:
    """A verified rs1 token."""

    payload: bytes
    expires_at: float | None  # Unix seconds; None when sealed without a TTL


def parse(token: str, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> ParsedRs1:
    """Split ``token`` strictly, without keys, or raise ``InvalidState("malformed"|"too_large")``."""
    check_token(token, max_token_bytes)
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != VERSION:
        raise InvalidState("malformed", "not an rmcp rs1 token (expected 'rs1.<body>.<tag>')")
    return ParsedRs1(b64decode(parts[1], "body"), b64decode(parts[2], "tag"))


def mac(key: bytes, associated_data: bytes, body: bytes) -> bytes:
    """rmcp's ``mac_for``: the domain label and a length prefix keep AD and body apart."""
    return hmac.digest(key, DOMAIN + _U64.pack(len(associated_data)) + associated_data + body, hashlib.sha256)


class Rs1Codec:
    """Read and write rmcp ``rs1.`` tokens.

    :param key: the rmcp server's key (``RequestStateCodec::try_new``), at least 32 bytes.
    :param ttl_seconds: lifetime of minted tokens; ``None`` mints tokens that never expire,
        which rmcp does when no TTL is set. Prefer a TTL.
    :param require_expiry: reject tokens sealed without a TTL (expiry 0). On by default:
        a token that never expires can be replayed forever. Turn it off only to read tokens
        an rmcp server minted without ``SealOptions::ttl``.
    """

    def __init__(
        self,
        key: bytes | str,
        *,
        ttl_seconds: float | None = DEFAULT_TTL,
        require_expiry: bool = True,
        clock: Callable[[], float] = time.time,
        max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
    ) -> None:
        self._key = secret_bytes(key)
        self.ttl_seconds = None if ttl_seconds is None else positive_seconds(ttl_seconds, "ttl_seconds")
        self.require_expiry = require_expiry
        self.clock = clock
        self.max_token_bytes = max_token_bytes

    def __repr__(self) -> str:
        return f"Rs1Codec(ttl_seconds={self.ttl_seconds}, require_expiry={self.require_expiry})"

    def seal(self, payload: bytes, associated_data: bytes = b"") -> str:
        now = self.clock()
        if not isinstance(payload, bytes) or not isinstance(associated_data, bytes):
            raise TypeError("payload and associated_data must be bytes")
        # rmcp: 0 without a TTL, else now_ms.saturating_add(ttl_ms)
        ttl = self.ttl_seconds
        expiry = 0 if ttl is None else min(_now_ms(now) + int(ttl * 1000), _I64_MAX)
        body = _I64.pack(expiry) + payload
        return f"{PREFIX}{b64encode(body)}.{b64encode(mac(self._key, associated_data, body))}"

    def unseal(self, token: str, associated_data: bytes = b"") -> OpenedRs1:
        """Verify ``token`` against ``associated_data`` (``b""`` for none) or raise :class:`InvalidState`."""
        return self._open(token, associated_data, self.clock())

    @fail_closed("rmcp rs1")
    def _open(self, token: str, associated_data: bytes, now: float) -> OpenedRs1:
        parsed = parse(token, self.max_token_bytes)
        # compare_digest also rejects a tag of the wrong length, as rmcp's verify_slice does.
        if not hmac.compare_digest(mac(self._key, associated_data, parsed.body), parsed.tag):
            raise InvalidState(
                "tampered",
                "HMAC tag does not match: modified, minted with another key, or sealed with other "
                "associated data",
            )
        expiry = parsed.expiry_ms
        if expiry is None:
            raise InvalidState(
                "malformed", f"body is {len(parsed.body)} bytes, shorter than its expiry field"
            )
        now_ms = _now_ms(now)
        if expiry == 0:
            if self.require_expiry:
                raise InvalidState(
                    "expired", "token never expires (sealed without a TTL) and require_expiry is on"
                )
            return OpenedRs1(parsed.body[EXPIRY_LEN:], None)
        if now_ms > expiry:
            raise InvalidState("expired", f"expired {duration((now_ms - expiry) / 1000)} ago")
        return OpenedRs1(parsed.body[EXPIRY_LEN:], expiry / 1000)


def _now_ms(now: float) -> int:
    return math.floor(now * 1000)
