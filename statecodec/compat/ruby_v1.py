"""The Ruby SDK's ``requestState`` format (``mcp`` gem 1.3, ``MCP::Server::RequestStateSecurity``).

Read from ``lib/mcp/server/request_state_security.rb`` and the digest helpers of
``lib/mcp/server.rb`` (modelcontextprotocol/ruby-sdk, release 1.3.0); opt-in, passed as
``Server.new(request_state_security:)``::

    "v1." + b64url(iv[12] || AES-256-GCM(key, iv, plaintext, aad="v1.") || tag[16])
    key       = the 32 raw bytes given (no derivation, exactly 32)
    plaintext = JSON.generate({"v":1, "exp", "m", "t", "a", "aud"?, "s"})  # aud omitted when nil
    exp       = Time.now.to_i + ttl  (default ttl 300 s); valid while floor(now) <= exp
    t         = params "name", else "uri", else ""
    a         = SHA-256 hex of canonical_json(arguments || {}): keys stringified and sorted
                recursively, every scalar as Ruby's ``to_json`` writes it

The prefix is the Python SDK's (``v1.`` and one base64url section), so without the key the
two cannot be told apart (:mod:`.mcp_py_v1` derives its key with HKDF and puts a 4-byte
key fingerprint first; Ruby puts the IV first). What the format lacks: a key id, key
rotation, a principal binding (``aud`` names a server, not a user), single use, and any
allowance for clock skew. Its AAD is the constant ``"v1."``, so the GCM tag authenticates
nothing about which key was meant.

The SDK verifies in this order, mapped to statecodec reasons: prefix and base64url and
length (``malformed token`` -> ``malformed``), GCM (``authentication failed`` ->
``tampered``), JSON (``malformed``), ``v == 1`` (``malformed``), ``exp`` an Integer and
``now <= exp`` (``expired``), then ``m``, ``t``, ``a``, ``aud`` (``binding_mismatch``) and
``s`` a string (``malformed``). This reader is stricter than the SDK only where the SDK
mints nothing else: a size cap first, canonical unpadded base64url (the SDK's decoder
adds padding and accepts non-zero trailing bits), and a claims object.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, NamedTuple

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .._errors import InvalidState
from . import _common
from ._common import DEFAULT_MAX_TOKEN_BYTES, UNCHECKED, ago, fail_closed, gcm_open, gcm_sections, loads

NAME: Final = "Ruby SDK v1"
# What the Python and Ruby SDKs' v1 share has its home in ._common; these are the names callers know.
PREFIX: Final = _common.V1_PREFIX
IV_LEN: Final = _common.GCM_NONCE_LEN
TAG_LEN: Final = _common.GCM_TAG_LEN
#: The SDK binds its version prefix as GCM associated data (``cipher.auth_data = VERSION_PREFIX``).
AAD: Final = PREFIX.encode("ascii")
KEY_LEN: Final = 32
ENVELOPE_VERSION: Final = 1
DEFAULT_TTL: Final = 300


class ParsedRubyV1(NamedTuple):
    """A Ruby SDK v1 token split into its parts. Nothing here has been verified."""

    iv: bytes
    sealed: bytes  # ciphertext || GCM tag


@dataclass(frozen=True, slots=True)
class OpenedRubyV1:
    """A verified token: the handler's state string and the claims."""

    state: str
    expires_at: int
    claims: Mapping[str, Any]


class Expected(NamedTuple):
    """What the claims must say; :data:`UNCHECKED` means "not compared".

    ``audience`` ``None`` is a server without an audience: a token carrying one fails, as
    in the SDK (``claims[:aud] == @audience``).
    """

    method: str = UNCHECKED
    target: str = UNCHECKED
    args_digest: str = UNCHECKED
    audience: str | None = UNCHECKED

    def check(self, claims: Mapping[str, Any]) -> None:
        for field, claim in (("method", "m"), ("target", "t"), ("args_digest", "a"), ("audience", "aud")):
            want = getattr(self, field)
            if want is not UNCHECKED and not _same(claims.get(claim), want):
                name = "arguments" if field == "args_digest" else field
                raise InvalidState("binding_mismatch", f"{name} mismatch: sealed for another {name}")


def _same(claim: object, want: str | None) -> bool:
    # Ruby's ==: nil only equals nil, a String only an equal String (these claims are no secrets).
    return claim is None if want is None else isinstance(claim, str) and claim == want


def parse(token: str, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> ParsedRubyV1:
    """Split ``token`` strictly, without keys, or raise ``InvalidState("malformed"|"too_large")``."""
    _, iv, sealed = gcm_sections(token, max_token_bytes, PREFIX, NAME, 0)
    return ParsedRubyV1(iv, sealed)


def ruby_key(secret: bytes | bytearray | str) -> bytes:
    """The SDK's key: exactly 32 bytes, used raw (a str is taken as its UTF-8 bytes)."""
    if isinstance(secret, str):
        material = secret.encode("utf-8")
    elif isinstance(secret, bytes | bytearray):
        material = bytes(secret)
    else:
        raise TypeError(f"key must be bytes or str, not {type(secret).__name__}")
    if len(material) != KEY_LEN:
        raise ValueError(f"a Ruby SDK key is exactly {KEY_LEN} bytes, this one is {len(material)}")
    return material


# ---------------------------------------------------------------- Ruby's digest of the arguments
def arguments_digest(arguments: Any) -> str:
    """The ``a`` claim: SHA-256 hex of the SDK's ``canonical_json(arguments || {})``.

    ``ValueError`` for what Ruby's JSON cannot write (NaN, Infinity, a lone surrogate).
    """
    value = {} if arguments is None or arguments is False else arguments
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def canonical_json(value: Any) -> str:
    """The SDK's ``canonical_json``: sorted keys, no spaces, raw UTF-8, ``/`` unescaped, Ruby floats."""
    if isinstance(value, Mapping):
        pairs = sorted((str(k), v) for k, v in value.items())
        return "{" + ",".join(f"{_string(k)}:{canonical_json(v)}" for k, v in pairs) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, str):
        return _string(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ruby_float(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _string(text: str) -> str:
    # Ruby's generator escapes '"', '\\' and the C0 controls (\b \f \n \r \t, else \u00xx),
    # exactly as json.dumps with ensure_ascii=False; a lone surrogate is no UTF-8 and fails.
    out = json.dumps(text, ensure_ascii=False)
    out.encode("utf-8")  # UnicodeEncodeError (a ValueError) for a lone surrogate
    return out


def ruby_float(number: float) -> str:
    """``Float#to_s``: the shortest round-trip digits, fixed for 1e-4 <= |x| < 1e16, else ``1.0e+20``."""
    if not math.isfinite(number):
        raise ValueError(f"{number!r} is not JSON (Ruby's generator refuses it)")
    sign = "-" if math.copysign(1.0, number) < 0 else ""
    if number == 0:
        return sign + "0.0"
    _, digits_tuple, exponent = Decimal(repr(abs(number))).normalize().as_tuple()
    digits = "".join(map(str, digits_tuple))
    decpt = len(digits) + int(exponent)  # value = 0.DIGITS x 10**decpt
    if 0 < decpt <= 16:
        if len(digits) <= decpt:
            return f"{sign}{digits}{'0' * (decpt - len(digits))}.0"
        return f"{sign}{digits[:decpt]}.{digits[decpt:]}"
    if -4 < decpt <= 0:
        return f"{sign}0.{'0' * -decpt}{digits}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}e{decpt - 1:+03d}"


# ---------------------------------------------------------------- verifying
def decrypt(token: str, key: bytes | str, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> bytes:
    """The plaintext as ``RequestStateSecurity#unseal`` decrypts it, or :class:`InvalidState`."""
    return _decrypt(token, ruby_key(key), max_token_bytes)


def _decrypt(token: str, key: bytes, max_token_bytes: int) -> bytes:
    parsed = parse(token, max_token_bytes)
    detail = "AES-GCM authentication failed: modified, forged or sealed with another key"
    return gcm_open(AESGCM(key), parsed.iv, parsed.sealed, AAD, detail)


def unseal(
    token: str,
    key: bytes | str,
    *,
    expect: Expected,
    clock: Callable[[], float] = time.time,
    max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
) -> OpenedRubyV1:
    """Decrypt, check ``v`` and ``exp``, then each field of ``expect`` that is not :data:`UNCHECKED`.

    Expiry is judged at ``clock()`` as the SDK does (``Time.now.to_i <= exp``).
    ``TypeError``/``ValueError`` for a key that is not 32 bytes.
    """
    return _unseal(token, ruby_key(key), clock, expect, max_token_bytes)


@fail_closed(NAME)
def _unseal(
    token: str, key: bytes, clock: Callable[[], float], expect: Expected, max_token_bytes: int
) -> OpenedRubyV1:
    claims = loads(_decrypt(token, key, max_token_bytes), "claims")
    if not isinstance(claims, dict):
        raise InvalidState("malformed", f"claims are a JSON {type(claims).__name__}, not an object")
    if claims.get("v") != ENVELOPE_VERSION or isinstance(claims.get("v"), bool):  # Ruby: 1.0 == 1
        raise InvalidState("malformed", f"unsupported claims version {claims.get('v')!r}")
    exp = claims.get("exp")
    now = math.floor(clock())  # inside fail_closed: a NaN clock is an internal_error
    if not (isinstance(exp, int) and not isinstance(exp, bool)):
        raise InvalidState("expired", "exp is not an integer (the SDK refuses it as expired)")
    if not now <= exp:
        raise InvalidState("expired", f"expired {ago(now - exp)} ago (valid while now <= exp)")
    expect.check(claims)
    state = claims.get("s")
    if not isinstance(state, str):
        raise InvalidState("malformed", "missing state: 's' is not a string")
    return OpenedRubyV1(state, exp, claims)
