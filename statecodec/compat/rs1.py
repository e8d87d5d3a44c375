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
least 8 bytes (``malformed``), ``expiry != 0 and now_ms > expiry`` (``expired``). rmcp
accepts a token sealed without a TTL (expiry 0) forever; :func:`unseal` refuses it as
``expired``, since such a token can be replayed for ever (``detect`` still reads it).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, NamedTuple

from .._errors import InvalidState
from . import _rmcp
from ._common import DEFAULT_MAX_TOKEN_BYTES, b64decode, fail_closed, secret_bytes

VERSION: Final = "rs1"
PREFIX: Final = "rs1."
DOMAIN: Final = b"rmcp/mrtr/request-state/v1"
EXPIRY_LEN: Final = _rmcp.EXPIRY_LEN  # public as before; the layout lives in _rmcp
LAYOUT: Final = "rs1.<body>.<tag>"


class ParsedRs1(NamedTuple):
    """An rs1 token split into its parts. Nothing here has been verified."""

    body: bytes
    tag: bytes

    @property
    def expiry_ms(self) -> int | None:
        """The expiry in Unix milliseconds, 0 for "never", ``None`` when the body is too short."""
        return _rmcp.expiry_ms(self.body)


@dataclass(frozen=True, slots=True)
class OpenedRs1:
    """A verified rs1 token."""

    payload: bytes
    expires_at: float  # Unix seconds


def parse(token: str, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> ParsedRs1:
    """Split ``token`` strictly, without keys, or raise ``InvalidState("malformed"|"too_large")``."""
    _, body_text, tag_text = _rmcp.sections(token, max_token_bytes, LAYOUT)
    return ParsedRs1(b64decode(body_text, "body"), b64decode(tag_text, "tag"))


def mac(key: bytes, associated_data: bytes, body: bytes) -> bytes:
    """rmcp's ``mac_for``: the domain label and a length prefix keep AD and body apart."""
    return hmac.digest(key, DOMAIN + _rmcp.length_prefixed(associated_data) + body, hashlib.sha256)


def unseal(
    token: str,
    key: bytes | str,
    associated_data: bytes,
    *,
    clock: Callable[[], float] = time.time,
    max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
) -> OpenedRs1:
    """Verify ``token`` against ``associated_data`` (``b""`` for none) or raise :class:`InvalidState`.

    Expiry is judged at ``clock()`` (``time.time``). ``TypeError``/``ValueError`` for a bad key.
    """
    ad = _rmcp.check_associated_data(associated_data)  # first, as before: its TypeError wins
    return _unseal(token, secret_bytes(key), ad, clock, max_token_bytes)


@fail_closed("rmcp rs1")
def _unseal(
    token: str, key: bytes, associated_data: bytes, clock: Callable[[], float], max_token_bytes: int
) -> OpenedRs1:
    parsed = parse(token, max_token_bytes)
    # compare_digest also rejects a tag of the wrong length, as rmcp's verify_slice does.
    if not hmac.compare_digest(mac(key, associated_data, parsed.body), parsed.tag):
        raise InvalidState(
            "tampered",
            "HMAC tag does not match: modified, minted with another key, or sealed with other "
            "associated data",
        )
    expiry, payload = _rmcp.split_body(parsed.body)
    _rmcp.check_expiry(expiry, clock)
    return OpenedRs1(payload, expiry / 1000)
