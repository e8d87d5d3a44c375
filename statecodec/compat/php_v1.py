"""The PHP SDK's ``requestState`` format (``mcp/sdk``, ``Mcp\\Server\\Stateless\\RequestStateCodec``).

Read from ``src/Server/Stateless/RequestStateCodec.php`` (modelcontextprotocol/php-sdk);
opt-in, the server builds one with its key::

    b64url(body) + "." + b64url(HMAC-SHA256(key, b64url(body)))     # no version prefix
    body = json_encode({"exp": now + ttl, "data": payload})          # default ttl 600 s
    key  = the raw bytes given (at least 32, any length, no derivation)

The MAC covers the base64url *text* of the body and is checked before the body is
decoded. ``data`` is a PHP array: any JSON object or array (PHP reads ``{}`` back as
``[]``). The token is signed, not encrypted, and binds nothing: no method, target,
arguments, audience or principal, so a token minted for one request is accepted for any
other request of any user of any server holding the key, as often as it is sent until
``exp``. There is no key id, no issued-at and no single use.

The SDK verifies in this order, mapped to statecodec reasons: two sections
(``malformed``), MAC (``mac`` -> ``tampered``), base64 and JSON of the body, an integer
``exp`` and an array ``data`` (``malformed``), ``exp < now`` (``expired``; valid at
``exp`` itself). This reader is stricter where the SDK mints nothing else: a size cap
first, canonical unpadded base64url in both sections (PHP's decoder also takes padding),
and a 32-byte MAC, so a MAC section of the wrong length is ``malformed`` where the SDK
says ``mac``.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from .._errors import InvalidState
from ._common import DEFAULT_MAX_TOKEN_BYTES, ago, b64decode, check_token, fail_closed, loads, secret_bytes

MAC_LEN: Final = 32
DEFAULT_TTL: Final = 600
#: PHP's integers are 64-bit: a larger ``exp`` decodes as a float, which the SDK refuses.
_INT64: Final = 2**63


class ParsedPhpV1(NamedTuple):
    """A PHP SDK token split into its parts. Nothing here has been verified."""

    signed: bytes  # the MAC input: the body's base64url text
    body: bytes  # the decoded JSON
    mac: bytes


@dataclass(frozen=True, slots=True)
class OpenedPhpV1:
    """A verified token: its payload (a JSON object or array) and its expiry."""

    payload: Any
    expires_at: int


def parse(token: str, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> ParsedPhpV1:
    """Split ``token`` strictly, without keys, or raise ``InvalidState("malformed"|"too_large")``."""
    check_token(token, max_token_bytes)
    parts = token.split(".")
    if len(parts) != 2 or not parts[0]:
        raise InvalidState("malformed", "not a PHP SDK token (expected '<body>.<mac>', no prefix)")
    body_text, mac_text = parts
    mac = b64decode(mac_text, "MAC")
    if len(mac) != MAC_LEN:
        raise InvalidState("malformed", f"MAC is {len(mac)} bytes, HMAC-SHA256 gives {MAC_LEN}")
    return ParsedPhpV1(body_text.encode("ascii"), b64decode(body_text, "body"), mac)


def read_body(body: bytes) -> tuple[int, Any]:
    """``(exp, data)`` of a body as the SDK requires it, or ``InvalidState("malformed")``."""
    claims = loads(body, "body")
    if not isinstance(claims, dict):
        raise InvalidState("malformed", f"body is a JSON {type(claims).__name__}, not an object")
    exp, data = claims.get("exp"), claims.get("data")
    if not isinstance(exp, int) or isinstance(exp, bool) or not -_INT64 <= exp < _INT64:
        raise InvalidState("malformed", "body has no integer 'exp'")
    if not isinstance(data, dict | list):
        raise InvalidState("malformed", "body's 'data' is not a JSON object or array")
    return exp, data


def unseal(
    token: str,
    key: bytes | str,
    *,
    clock: Callable[[], float] = time.time,
    max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
) -> OpenedPhpV1:
    """Verify ``token`` (MAC, then expiry) as the SDK does, or raise :class:`InvalidState`.

    Expiry is judged at ``clock()`` (``time.time``). ``TypeError``/``ValueError`` for a bad key.
    """
    return _unseal(token, secret_bytes(key), clock, max_token_bytes)


@fail_closed("PHP SDK v1")
def _unseal(token: str, key: bytes, clock: Callable[[], float], max_token_bytes: int) -> OpenedPhpV1:
    parsed = parse(token, max_token_bytes)
    if not hmac.compare_digest(hmac.digest(key, parsed.signed, hashlib.sha256), parsed.mac):
        raise InvalidState(
            "tampered", "MAC does not match: the token was modified or minted with another key"
        )
    exp, data = read_body(parsed.body)
    now = math.floor(clock())  # PHP's time(); inside fail_closed: a NaN clock is an internal_error
    if exp < now:
        raise InvalidState("expired", f"expired {ago(now - exp)} ago (valid while exp >= now)")
    return OpenedPhpV1(data, exp)
