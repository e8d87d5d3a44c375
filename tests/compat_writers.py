"""Tokens as the Python SDK and rmcp mint them, for the tests of ``statecodec.compat``.

statecodec only reads and verifies these formats; the tests need to mint them. Each
writer is held against its SDK: ``tests/compat/test_compat_mcp_py_v1.py`` has the real ``mcp``
package open what :func:`mcp_py_v1_seal` mints, and ``tests/compat/test_compat_rs1.py`` pins
:func:`rs1_token` to a known-answer vector spelled out from rmcp's layout. (TypeScript
tokens come from :func:`statecodec.compat.ts_v1.seal`, checked against the SDK under Node.)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from statecodec._format import b64encode
from statecodec.compat import mcp_py_v1

RS1_DOMAIN = b"rmcp/mrtr/request-state/v1"


# ------------------------------------------------------------------ Python SDK (mcp 2.3)
def mcp_py_v1_cipher_seal(secrets: Sequence[bytes | str], plaintext: bytes) -> str:
    """``AESGCMRequestStateCodec(secrets).seal(plaintext)``: ``secrets[0]`` seals."""
    aes_key = mcp_py_v1.derive_key(secrets[0])
    kid, nonce = mcp_py_v1.key_id(aes_key), os.urandom(mcp_py_v1.NONCE_LEN)
    sealed = AESGCM(aes_key).encrypt(nonce, plaintext, mcp_py_v1.PREFIX.encode("ascii") + kid)
    return mcp_py_v1.PREFIX + b64encode(kid + nonce + sealed)


def mcp_py_v1_seal(
    secrets: Sequence[bytes | str],
    state: str,
    *,
    method: str,
    target: str,
    arguments: Mapping[str, Any] | None = None,
    principal: str | None = None,
    audience: str | None = None,
    ttl: float = 600.0,
    clock: Callable[[], float] = time.time,
) -> str:
    """The claims envelope ``RequestStateBoundary`` seals at ``clock()``, keys in the SDK's order."""
    now = clock()
    claims: dict[str, Any] = {
        "v": mcp_py_v1.ENVELOPE_VERSION,
        "iat": now,
        "exp": now + ttl,
        "m": method,
        "t": target,
        "a": mcp_py_v1.arguments_digest(arguments),
        "s": state,
    }
    if audience is not None:
        claims["aud"] = audience
    if principal is not None:
        claims["p"] = principal_claim(principal)
    return mcp_py_v1_cipher_seal(secrets, compact_json(claims).encode())


def compact_json(value: Any) -> str:
    """The SDK's ``compact_json``: ASCII, compact separators."""
    return json.dumps(value, separators=(",", ":"))


def principal_claim(principal: str, *, salt: bytes | None = None) -> str:
    """The ``p`` claim: a salted, UNKEYED SHA-256 of the principal (the SDK's construction)."""
    salt = os.urandom(8) if salt is None else salt
    material = mcp_py_v1.PRINCIPAL_LABEL + salt + principal.encode("utf-8", "surrogatepass")
    return b64encode(salt + hashlib.sha256(material).digest()[:16])


# ------------------------------------------------------------------------------ rmcp
def rs1_seal(key: bytes, payload: bytes, associated_data: bytes, expiry_ms: int) -> str:
    """rmcp's ``rs1.`` layout written out by hand, independently of statecodec.compat.rs1."""
    body = struct.pack(">q", expiry_ms) + payload
    mac_input = RS1_DOMAIN + struct.pack(">Q", len(associated_data)) + associated_data + body
    return "rs1." + b64encode(body) + "." + b64encode(hmac.new(key, mac_input, hashlib.sha256).digest())


def rs1_token(
    key: bytes,
    payload: bytes,
    associated_data: bytes = b"",
    *,
    ttl: float | None = 600,
    clock: Callable[[], float] = time.time,
) -> str:
    """What rmcp seals at ``clock()``: ``now_ms + ttl_ms``, or 0 (never expires) without a TTL."""
    expiry = 0 if ttl is None else min(math.floor(clock() * 1000) + int(ttl * 1000), 2**63 - 1)
    return rs1_seal(key, payload, associated_data, expiry)
