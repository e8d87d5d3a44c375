"""The Python SDK's built-in ``requestState`` format (``mcp`` 2.3, ``mcp.server.request_state``).

Two layers, both read here without importing ``mcp``:

The cipher (``AESGCMRequestStateCodec``)::

    "v1." + b64url(kid[4] || nonce[12] || AES-256-GCM(key, nonce, plaintext, aad="v1." + kid))
    key = HKDF-SHA256(secret, salt=None, info=b"mcp/request-state/v1/aes-256-gcm")
    kid = SHA-256(b"mcp/request-state/v1/kid:" + key)[:4]

The claims envelope ``RequestStateBoundary`` seals as the plaintext (compact JSON, keys in
this order)::

    {"v": 1, "iat": now, "exp": now + ttl, "m": method, "t": target, "a": args_digest,
     "s": handler_state, "aud": audience?, "p": principal_claim?}
    target      = params["uri"] for resources/read, else params["name"]
    args_digest = b64url(SHA-256(json.dumps(arguments or {}, sort_keys=True, compact))[:16])
    p           = b64url(salt[8] || SHA-256(b"mcp/request-state/principal:" + salt + principal)[:16])

The principal is the string the server's ``bind_principal`` returns; the SDK's default is
the compact JSON array ``[client_id, issuer, subject]`` of the access token.

The boundary accepts a token when ``iat <= now + 60`` and ``now < exp`` and ``m``, ``t``,
``a``, ``aud`` and the principal all match. What the format lacks: single use (a token
opens again and again until ``exp``), a key id chosen by policy (the kid is a fingerprint
of the key), and a keyed principal tag: ``p`` is an *unkeyed* salted hash, hidden only
because the whole envelope is encrypted.

Reasons: ``unknown key`` -> ``unknown_key``, GCM tag failure -> ``tampered``, bad framing or
claims -> ``malformed``, "minted in the future" -> ``not_yet_valid``, ``expired`` ->
``expired``, request/audience/principal mismatch -> ``binding_mismatch``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .._errors import InvalidState
from .._format import b64encode
from . import _common
from ._common import (
    DEFAULT_MAX_TOKEN_BYTES,
    UNCHECKED,
    ago,
    b64decode,
    fail_closed,
    gcm_open,
    gcm_sections,
    is_number,
    loads,
    secret_bytes,
)

NAME: Final = "Python SDK v1"
# What the Python and Ruby SDKs' v1 share has its home in ._common; these are the names callers know.
PREFIX: Final = _common.V1_PREFIX
NONCE_LEN: Final = _common.GCM_NONCE_LEN
TAG_LEN: Final = _common.GCM_TAG_LEN
KDF_INFO: Final = b"mcp/request-state/v1/aes-256-gcm"
KID_INFO: Final = b"mcp/request-state/v1/kid:"
PRINCIPAL_LABEL: Final = b"mcp/request-state/principal:"
KID_LEN: Final = 4
ENVELOPE_VERSION: Final = 1
FUTURE_SKEW: Final = 60.0


class ParsedMcpPyV1(NamedTuple):
    """A Python SDK v1 token split into its parts. Nothing here has been verified."""

    kid: bytes
    nonce: bytes
    sealed: bytes  # ciphertext || GCM tag


@dataclass(frozen=True, slots=True)
class OpenedMcpPyV1:
    """A verified token: the handler's state string and the envelope's claims."""

    state: str
    kid: str  # 8 hex digits
    issued_at: float
    expires_at: float
    claims: Mapping[str, Any]


class Expected(NamedTuple):
    """What the claims must say. ``None`` means "absent", :data:`UNCHECKED` means "not compared"."""

    method: str | None = UNCHECKED
    target: str | None = UNCHECKED
    args_digest: str | None = UNCHECKED
    audience: str | None = UNCHECKED
    principal: str | None = UNCHECKED

    def check(self, claims: Mapping[str, Any], kid: str) -> None:
        for field, claim in (("method", "m"), ("target", "t"), ("args_digest", "a")):
            want = getattr(self, field)
            if want is not UNCHECKED and claims.get(claim) != want:
                raise InvalidState(
                    "binding_mismatch", f"request binding: sealed for another {field}", kid=kid
                )
        if self.audience is not UNCHECKED and claims.get("aud") != self.audience:
            raise InvalidState("binding_mismatch", f"audience: sealed for {claims.get('aud')!r}", kid=kid)
        if self.principal is UNCHECKED:
            return
        p_claim = claims.get("p")
        if (p_claim is None) != (self.principal is None):
            drift = "sealed anonymously" if p_claim is None else "sealed for an authenticated user"
            raise InvalidState("binding_mismatch", f"principal drift: {drift}", kid=kid)
        if (
            p_claim is not None
            and self.principal is not None
            and (not isinstance(p_claim, str) or not principal_matches(p_claim, self.principal))
        ):
            raise InvalidState("binding_mismatch", "sealed for another principal", kid=kid)


def parse(token: str, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> ParsedMcpPyV1:
    """Split ``token`` strictly, without keys, or raise ``InvalidState("malformed"|"too_large")``."""
    return ParsedMcpPyV1(*gcm_sections(token, max_token_bytes, PREFIX, NAME, KID_LEN))


def derive_key(secret: bytes | str) -> bytes:
    """The AES-256 key the SDK derives from an operator secret."""
    return HKDF(algorithm=SHA256(), length=32, salt=None, info=KDF_INFO).derive(secret_bytes(secret))


def key_id(aes_key: bytes) -> bytes:
    """The SDK's 4-byte key fingerprint (public: it travels in every token)."""
    return hashlib.sha256(KID_INFO + aes_key).digest()[:KID_LEN]


def arguments_digest(arguments: Mapping[str, Any] | None) -> str:
    """The ``a`` claim: ``arguments or {}`` digested exactly as the SDK does."""
    canonical = json.dumps(arguments or {}, sort_keys=True, separators=(",", ":")).encode()
    return b64encode(hashlib.sha256(canonical).digest()[:16])


def principal_matches(claim: str, principal: str) -> bool:
    """Whether the ``p`` claim is the SDK's salted hash of ``principal``."""
    try:
        raw = b64decode(claim, "principal claim")
    except InvalidState:
        return False
    expected = hashlib.sha256(PRINCIPAL_LABEL + raw[:8] + principal.encode("utf-8", "surrogatepass")).digest()
    return hmac.compare_digest(raw[8:], expected[:16])


def decrypt(
    token: str, secrets: Sequence[bytes | str], max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES
) -> tuple[str, bytes]:
    """``(kid_hex, plaintext)`` as ``AESGCMRequestStateCodec.unseal`` opens it, or :class:`InvalidState`.

    ``TypeError``/``ValueError`` for unusable secrets.
    """
    return _decrypt(token, _ring(secrets), max_token_bytes)


def unseal(
    token: str,
    secrets: Sequence[bytes | str],
    *,
    expect: Expected,
    clock: Callable[[], float] = time.time,
    max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
) -> OpenedMcpPyV1:
    """Decrypt, check the times, then each field of ``expect`` that is not :data:`UNCHECKED`.

    Times are judged at ``clock()`` (``time.time``). ``TypeError``/``ValueError`` for
    unusable secrets.
    """
    return _unseal(token, _ring(secrets), clock, expect, max_token_bytes)


def _ring(secrets: Sequence[bytes | str]) -> dict[bytes, AESGCM]:
    """The SDK's key ring, by fingerprint: a token names its key, so no trial decryption."""
    if isinstance(secrets, bytes | bytearray | str):
        raise TypeError("keys must be a sequence of secrets, e.g. [secret]")
    if not secrets:
        raise ValueError("at least one key is needed")
    ring: dict[bytes, AESGCM] = {}
    for i, secret in enumerate(secrets):
        kid = key_id(aes_key := derive_key(secret))
        if kid in ring:
            raise ValueError(f"keys[{i}] duplicates an earlier key")
        ring[kid] = AESGCM(aes_key)
    return ring


def _decrypt(token: str, ring: Mapping[bytes, AESGCM], max_token_bytes: int) -> tuple[str, bytes]:
    parsed = parse(token, max_token_bytes)
    kid = parsed.kid.hex()
    aead = ring.get(parsed.kid)
    if aead is None:
        known = ", ".join(k.hex() for k in ring)
        raise InvalidState("unknown_key", f"unknown key fingerprint {kid} - the ring has {known}", kid=kid)
    aad, detail = PREFIX.encode("ascii") + parsed.kid, "AES-GCM tag does not verify: modified or forged"
    return kid, gcm_open(aead, parsed.nonce, parsed.sealed, aad, detail, kid=kid)


@fail_closed(NAME)
def _unseal(
    token: str,
    ring: Mapping[bytes, AESGCM],
    clock: Callable[[], float],
    expect: Expected,
    max_token_bytes: int,
) -> OpenedMcpPyV1:
    kid, plaintext = _decrypt(token, ring, max_token_bytes)
    claims = loads(plaintext, "claims envelope")
    if not isinstance(claims, dict) or not {"v", "iat", "exp", "s"} <= claims.keys():
        raise InvalidState("malformed", "claims envelope lacks v, iat, exp or s", kid=kid)
    iat, exp, state = claims["iat"], claims["exp"], claims["s"]
    if claims["v"] != ENVELOPE_VERSION or not isinstance(state, str):
        raise InvalidState("malformed", f"claims envelope version {claims['v']!r} or state type", kid=kid)
    # Stated positively, as in the SDK, so NaN-like surprises (a NaN clock too) fail the comparison.
    now = clock()
    if not (is_number(iat) and iat <= now + FUTURE_SKEW):
        raise InvalidState(
            "not_yet_valid", f"minted in the future (beyond the {FUTURE_SKEW:.0f}s skew)", kid=kid
        )
    if not (is_number(exp) and now < exp):
        detail = f"expired {ago(now - exp)} ago" if is_number(exp) else "exp is not a number"
        raise InvalidState("expired", detail, kid=kid)
    expect.check(claims, kid)
    return OpenedMcpPyV1(state, kid, iat, exp, claims)
