"""The Python SDK's built-in ``requestState`` format (``mcp`` 2.3, ``mcp.server.request_state``).

Two layers, both reproduced here without importing ``mcp``:

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
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

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
KDF_INFO: Final = b"mcp/request-state/v1/aes-256-gcm"
KID_INFO: Final = b"mcp/request-state/v1/kid:"
PRINCIPAL_LABEL: Final = b"mcp/request-state/principal:"
KID_LEN: Final = 4
NONCE_LEN: Final = 12
TAG_LEN: Final = 16
ENVELOPE_VERSION: Final = 1
FUTURE_SKEW: Final = 60.0
DEFAULT_TTL: Final = 600.0


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


def parse(token: str, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> ParsedMcpPyV1:
    """Split ``token`` strictly, without keys, or raise ``InvalidState("malformed"|"too_large")``."""
    check_token(token, max_token_bytes)
    if not token.startswith(PREFIX):
        raise InvalidState("malformed", "not a Python SDK v1 token (no 'v1.' prefix)")
    raw = b64decode(token[len(PREFIX) :], "token body")
    if len(raw) < KID_LEN + NONCE_LEN + TAG_LEN:
        raise InvalidState(
            "malformed", f"token body is {len(raw)} bytes, at least {KID_LEN + NONCE_LEN + TAG_LEN}"
        )
    return ParsedMcpPyV1(raw[:KID_LEN], raw[KID_LEN : KID_LEN + NONCE_LEN], raw[KID_LEN + NONCE_LEN :])


def derive_key(secret: bytes | str) -> bytes:
    """The AES-256 key the SDK derives from an operator secret."""
    return HKDF(algorithm=SHA256(), length=32, salt=None, info=KDF_INFO).derive(secret_bytes(secret))


def key_id(aes_key: bytes) -> bytes:
    """The SDK's 4-byte key fingerprint (public: it travels in every token)."""
    return hashlib.sha256(KID_INFO + aes_key).digest()[:KID_LEN]


def compact_json(value: Any, *, sort_keys: bool = False) -> str:
    """The SDK's ``compact_json``: ASCII, compact separators."""
    return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"))


def arguments_digest(arguments: Mapping[str, Any] | None) -> str:
    """The ``a`` claim: ``arguments or {}`` digested exactly as the SDK does."""
    canonical = compact_json(arguments or {}, sort_keys=True).encode()
    return b64encode(hashlib.sha256(canonical).digest()[:16])


def request_identity(method: str, params: Mapping[str, Any] | None) -> tuple[str, str]:
    """``(target, args_digest)`` of a request's JSON-RPC params, as the SDK's boundary computes it."""
    p: Mapping[str, Any] = params or {}
    if method == "resources/read":
        return str(p.get("uri", "")), arguments_digest(None)
    return str(p.get("name", "")), arguments_digest(p.get("arguments"))


def sdk_principal(client_id: str | None, issuer: str | None = None, subject: str | None = None) -> str:
    """The principal string the SDK's default ``bind_principal`` derives from an access token.

    ``authenticated_principal`` is ``compact_json(principal_components(token))``, i.e. the
    JSON array ``[client_id, issuer, subject]``; pass the same values to match it.
    """
    return compact_json([client_id, issuer, subject])


def _principal_bytes(principal: str) -> bytes:
    return principal.encode("utf-8", "surrogatepass")


def principal_claim(principal: str, *, salt: bytes | None = None) -> str:
    """The ``p`` claim: a salted, UNKEYED SHA-256 of the principal (the SDK's construction)."""
    salt = os.urandom(8) if salt is None else salt
    tag = hashlib.sha256(PRINCIPAL_LABEL + salt + _principal_bytes(principal)).digest()[:16]
    return b64encode(salt + tag)


def principal_matches(claim: str, principal: str) -> bool:
    try:
        raw = b64decode(claim, "principal claim")
    except InvalidState:
        return False
    expected = hashlib.sha256(PRINCIPAL_LABEL + raw[:8] + _principal_bytes(principal)).digest()[:16]
    return hmac.compare_digest(raw[8:], expected)


class McpPyV1Cipher:
    """The SDK's ``AESGCMRequestStateCodec``: AES-256-GCM over opaque bytes.

    ``keys[0]`` seals; every key unseals, selected by its fingerprint (no trial decryption).
    """

    def __init__(
        self, keys: Sequence[bytes | str], *, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES
    ) -> None:
        if isinstance(keys, bytes | bytearray | str):
            raise TypeError("keys must be a sequence of secrets, e.g. [secret]")
        if not keys:
            raise ValueError("at least one key is needed")
        self._ring: dict[bytes, AESGCM] = {}
        for i, secret in enumerate(keys):
            kid = key_id(aes_key := derive_key(secret))
            if kid in self._ring:
                raise ValueError(f"keys[{i}] duplicates an earlier key")
            self._ring[kid] = AESGCM(aes_key)
        self._mint_kid = next(iter(self._ring))
        self.max_token_bytes = max_token_bytes

    @property
    def kids(self) -> tuple[str, ...]:
        """The key fingerprints in hex, sealing key first."""
        return tuple(kid.hex() for kid in self._ring)

    def __repr__(self) -> str:
        return f"McpPyV1Cipher(kids={list(self.kids)})"

    def seal(self, plaintext: bytes) -> str:
        kid, nonce = self._mint_kid, os.urandom(NONCE_LEN)
        sealed = self._ring[kid].encrypt(nonce, plaintext, PREFIX.encode("ascii") + kid)
        return PREFIX + b64encode(kid + nonce + sealed)

    def unseal(self, token: str) -> tuple[str, bytes]:
        """``(kid_hex, plaintext)``, or :class:`InvalidState`."""
        parsed = parse(token, self.max_token_bytes)
        kid = parsed.kid.hex()
        aead = self._ring.get(parsed.kid)
        if aead is None:
            raise InvalidState(
                "unknown_key", f"unknown key fingerprint {kid} - the ring has {', '.join(self.kids)}", kid=kid
            )
        try:
            return kid, aead.decrypt(parsed.nonce, parsed.sealed, PREFIX.encode("ascii") + parsed.kid)
        except InvalidTag:
            raise InvalidState(
                "tampered", "AES-GCM tag does not verify: modified or forged", kid=kid
            ) from None


class McpPyV1Codec:
    """Seal and unseal the Python SDK's claims envelope, as its ``RequestStateBoundary`` does.

    Tokens from :meth:`seal` are accepted by an SDK server configured with
    ``RequestStateSecurity(keys=keys, ttl=..., audience=audience)``, and tokens that server
    mints open here. ``principal`` is the string the server's ``bind_principal`` returns
    (see :func:`sdk_principal` for the SDK default), ``None`` when it returns ``None``.

    :param keys: the SDK's key ring: ``keys[0]`` seals, all unseal.
    :param audience: the ``aud`` claim; an SDK server uses its ``audience`` or its name.
    """

    def __init__(
        self,
        keys: Sequence[bytes | str],
        *,
        ttl: float = DEFAULT_TTL,
        audience: str | None = None,
        clock: Callable[[], float] = time.time,
        max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES,
    ) -> None:
        self.cipher = McpPyV1Cipher(keys, max_token_bytes=max_token_bytes)
        self.ttl = positive_seconds(ttl, "ttl")
        self.audience = audience
        self.clock = clock

    def __repr__(self) -> str:
        return f"McpPyV1Codec(kids={list(self.cipher.kids)}, ttl={self.ttl}, audience={self.audience!r})"

    # ------------------------------------------------------------------ sealing
    def seal(
        self,
        state: str,
        *,
        method: str,
        target: str,
        arguments: Mapping[str, Any] | None = None,
        principal: str | None = None,
    ) -> str:
        now = self.clock()
        if not isinstance(state, str):
            raise TypeError(
                f"state must be str (the SDK seals the handler's string), not {type(state).__name__}"
            )
        claims: dict[str, Any] = {
            "v": ENVELOPE_VERSION,
            "iat": now,
            "exp": now + self.ttl,
            "m": method,
            "t": target,
            "a": arguments_digest(arguments),
            "s": state,
        }
        if self.audience is not None:
            claims["aud"] = self.audience
        if principal is not None:
            claims["p"] = principal_claim(principal)
        return self.cipher.seal(compact_json(claims).encode())

    # ---------------------------------------------------------------- unsealing
    def unseal(
        self,
        token: str,
        *,
        method: str,
        target: str,
        arguments: Mapping[str, Any] | None = None,
        principal: str | None = None,
    ) -> OpenedMcpPyV1:
        """Verify everything the SDK boundary verifies, or raise :class:`InvalidState`."""
        expect = Expected(method, target, arguments_digest(arguments), self.audience, principal)
        return self.open(token, expect=expect)

    def verify_unbound(self, token: str) -> OpenedMcpPyV1:
        """Decrypt and check version and times but NOT the binding (for ``statecodec verify``)."""
        return self.open(token, expect=None)

    def open(self, token: str, *, expect: Expected | None) -> OpenedMcpPyV1:
        """Decrypt, check times, then each field of ``expect`` that is not :data:`UNCHECKED`."""
        return self._open(token, self.clock(), expect)

    @fail_closed("Python SDK v1")
    def _open(self, token: str, now: float, expect: Expected | None) -> OpenedMcpPyV1:
        kid, plaintext = self.cipher.unseal(token)
        claims = loads(plaintext, "claims envelope")
        if not isinstance(claims, dict) or not {"v", "iat", "exp", "s"} <= claims.keys():
            raise InvalidState("malformed", "claims envelope lacks v, iat, exp or s", kid=kid)
        iat, exp, state = claims["iat"], claims["exp"], claims["s"]
        if claims["v"] != ENVELOPE_VERSION or not isinstance(state, str):
            raise InvalidState("malformed", f"claims envelope version {claims['v']!r} or state type", kid=kid)
        # Stated positively, as in the SDK, so NaN-like surprises fail the comparison.
        if not (is_number(iat) and iat <= now + FUTURE_SKEW):
            raise InvalidState(
                "not_yet_valid", f"minted in the future (beyond the {FUTURE_SKEW:.0f}s skew)", kid=kid
            )
        if not (is_number(exp) and now < exp):
            detail = f"expired {duration(now - exp)} ago" if is_number(exp) else "exp is not a number"
            raise InvalidState("expired", detail, kid=kid)
        if expect is not None:
            expect.check(claims, kid)
        return OpenedMcpPyV1(state, kid, iat, exp, claims)


class _Unchecked:
    def __repr__(self) -> str:
        return "UNCHECKED"


#: In :class:`Expected`, a field that is not compared (``statecodec verify`` without that option).
UNCHECKED: Final[Any] = _Unchecked()


class Expected(NamedTuple):
    """What the claims must say. ``None`` means "absent", :data:`UNCHECKED` means "not compared"."""

    method: str | None
    target: str | None
    args_digest: str | None
    audience: str | None
    principal: str | None

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
            raise InvalidState(
                "binding_mismatch",
                "principal drift: "
                + ("sealed anonymously" if p_claim is None else "sealed for an authenticated user"),
                kid=kid,
            )
        if (
            p_claim is not None
            and self.principal is not None
            and (not isinstance(p_claim, str) or not principal_matches(p_claim, self.principal))
        ):
            raise InvalidState("binding_mismatch", "sealed for another principal", kid=kid)
