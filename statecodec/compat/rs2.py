"""rmcp's proposed ``rs2.`` ``requestState`` format: rs1 with a key id and a key ring.

PROPOSED, NOT RELEASED: ``rs2`` exists only in rmcp pull request #1128
(modelcontextprotocol/rust-sdk, ``refs/pull/1128/head`` at ``ec5f121269fb``,
``crates/rmcp/src/model/request_state.rs``, ``RequestStateCodec::new_with_keyring``);
rmcp's released 3.1.4 reads and writes ``rs1`` only. The layout may still change before it
is merged; this reader follows that commit (read, not executed: no Rust toolchain runs
in these tests)::

    "rs2." + b64url(kid) + "." + b64url(body) + "." + b64url(tag)
    body = expiry_ms (i64 big-endian; 0 = never expires) || payload
    tag  = HMAC-SHA256(key[kid], b"rmcp/mrtr/request-state/v2" || u64be(len(kid)) || kid
                                  || u64be(len(AD)) || AD || body)

The kid (1 to 255 bytes of UTF-8, case-sensitive; at most 340 characters encoded) selects
exactly one key of the ring: no trial of several keys. It is inside the MAC, so a token
moved to another kid that holds the same key bytes fails, and the ``.../v2`` domain
keeps an rs1 tag from verifying under an rs2 header. Associated data (``AD``) is
authenticated, not stored. Keys are raw (at least 32 bytes, no derivation). The payload
is readable; there is no issued-at, no token id and no single use.

rmcp opens in this order, mapped to statecodec reasons: four sections with version
``rs2`` (``MalformedFormat`` -> ``malformed``), encoded kid length, kid base64url, kid
non-empty UTF-8 (``InvalidKeyId``/``InvalidEncoding`` -> ``malformed``), kid in the ring
(``UnknownKeyId`` -> ``unknown_key``), body and tag base64url (``malformed``), tag
(``IntegrityCheckFailed`` -> ``tampered``), body of at least 8 bytes (``malformed``),
``expiry != 0 and now_ms > expiry`` (``Expired`` -> ``expired``). As for rs1, rmcp accepts
a token sealed without a TTL (expiry 0) forever; :func:`unseal` refuses it as
``expired`` (it can be replayed for ever), and ``detect`` still reads it.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, NamedTuple

from .._errors import InvalidState
from . import _rmcp
from ._common import DEFAULT_MAX_TOKEN_BYTES, b64decode, fail_closed, secret_bytes

VERSION: Final = "rs2"
PREFIX: Final = "rs2."
DOMAIN: Final = b"rmcp/mrtr/request-state/v2"
EXPIRY_LEN: Final = _rmcp.EXPIRY_LEN  # public as before; the layout lives in _rmcp
expiry_ms = _rmcp.expiry_ms  # public as before; the rule lives in _rmcp
LAYOUT: Final = "rs2.<kid>.<body>.<tag>"
MAX_KID_LEN: Final = 255
MAX_ENCODED_KID_LEN: Final = 340

#: A key ring as rmcp configures one: kid -> raw key.
Ring = Mapping[str, bytes | str]


class ParsedRs2(NamedTuple):
    """An rs2 token split into its parts. Nothing here has been verified."""

    kid: str
    body_text: str
    tag_text: str

    def body(self) -> bytes:
        return b64decode(self.body_text, "body")

    def tag(self) -> bytes:
        return b64decode(self.tag_text, "tag")


@dataclass(frozen=True, slots=True)
class OpenedRs2:
    """A verified rs2 token."""

    kid: str
    payload: bytes
    expires_at: float  # Unix seconds


def parse(token: str, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> ParsedRs2:
    """Split ``token`` and read its kid strictly, without keys, or raise ``InvalidState``."""
    _, kid_text, body_text, tag_text = _rmcp.sections(token, max_token_bytes, LAYOUT)
    if len(kid_text) > MAX_ENCODED_KID_LEN:
        raise InvalidState(
            "malformed", f"key id is {len(kid_text)} characters, at most {MAX_ENCODED_KID_LEN}"
        )
    raw = b64decode(kid_text, "key id")
    if not 1 <= len(raw) <= MAX_KID_LEN:
        raise InvalidState("malformed", f"key id is {len(raw)} bytes, 1 to {MAX_KID_LEN}")
    try:
        kid = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidState("malformed", "key id is not UTF-8") from None
    return ParsedRs2(kid, body_text, tag_text)


def mac(key: bytes, kid: str, associated_data: bytes, body: bytes) -> bytes:
    """rmcp's ``mac_v2``: the domain, then kid and AD each length-prefixed, then the body."""
    signed = DOMAIN + _rmcp.length_prefixed(kid.encode("utf-8")) + _rmcp.length_prefixed(associated_data)
    return hmac.digest(key, signed + body, hashlib.sha256)


def unseal(
    token: str,
    ring: Ring,
    associated_data: bytes,
    *,
    clock: Callable[[], float] = time.time,
    max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
) -> OpenedRs2:
    """Verify ``token`` with the key its kid names and ``associated_data`` (``b""`` for none).

    Expiry is judged at ``clock()`` (``time.time``). ``TypeError``/``ValueError`` for a
    ring that is not a mapping of kid -> key of at least 32 bytes, or for ``associated_data``
    that is not bytes.
    """
    ad = _rmcp.check_associated_data(associated_data)  # first, as before: its TypeError wins
    return _unseal(token, _keys(ring), ad, clock, max_token_bytes)


def _keys(ring: Ring) -> dict[str, bytes]:
    if not isinstance(ring, Mapping):
        raise TypeError("an rs2 key ring is a mapping of kid -> key, e.g. {'k-2026-12': secret}")
    if not ring:
        raise ValueError("the key ring is empty")
    keys: dict[str, bytes] = {}
    for kid, key in ring.items():
        if not isinstance(kid, str) or not 1 <= len(kid.encode("utf-8", "surrogatepass")) <= MAX_KID_LEN:
            raise ValueError(f"an rs2 kid is 1 to {MAX_KID_LEN} bytes of UTF-8, not {kid!r}")
        keys[kid] = secret_bytes(key, f"key {kid!r}")
    return keys


@fail_closed("rmcp rs2")
def _unseal(
    token: str,
    ring: Mapping[str, bytes],
    associated_data: bytes,
    clock: Callable[[], float],
    max_token_bytes: int,
) -> OpenedRs2:
    parsed = parse(token, max_token_bytes)
    key = ring.get(parsed.kid)
    if key is None:
        raise InvalidState("unknown_key", f"unknown key id {parsed.kid[:64]!r}", kid=parsed.kid[:64])
    body, tag = parsed.body(), parsed.tag()
    # compare_digest also rejects a tag of the wrong length, as rmcp's verify_slice does.
    if not hmac.compare_digest(mac(key, parsed.kid, associated_data, body), tag):
        raise InvalidState(
            "tampered",
            "HMAC tag does not match: modified, minted with another key, moved to another kid, "
            "or sealed with other associated data",
            kid=parsed.kid[:64],
        )
    expiry, payload = _rmcp.split_body(body)
    _rmcp.check_expiry(expiry, clock)
    return OpenedRs2(parsed.kid, payload, expiry / 1000)
