"""XChaCha20-Poly1305 (IETF) from libsodium, through PyNaCl's public bindings.

The checks that matter for every caller come first and raise the same errors whatever
PyNaCl's own wrappers say: exact key and nonce sizes, bytes only, and a ciphertext at
least one tag long. Calling PyNaCl's cffi handle (``nacl._sodium``) directly, to skip the
wrappers' per-call validation, saves far less than the 1% a private seam must earn
(benchmarks/seam_instructions.py, docs/performance.md).
"""

from __future__ import annotations

from typing import Final

from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_decrypt as _decrypt
from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_encrypt as _encrypt
from nacl.exceptions import CryptoError

KEY_BYTES: Final = 32
NONCE_BYTES: Final = 24
TAG_BYTES: Final = 16


def _check(nonce: bytes, key: bytes) -> None:
    if type(nonce) is not bytes or len(nonce) != NONCE_BYTES:
        raise ValueError(f"XChaCha20-Poly1305 nonce must be {NONCE_BYTES} bytes")
    if type(key) is not bytes or len(key) != KEY_BYTES:
        raise ValueError(f"XChaCha20-Poly1305 key must be {KEY_BYTES} bytes")


def encrypt(message: bytes, aad: bytes, nonce: bytes, key: bytes) -> bytes:
    """``ciphertext || tag`` of ``message``, authenticating ``aad`` too."""
    _check(nonce, key)
    if type(message) is not bytes or type(aad) is not bytes:
        raise TypeError("message and associated data must be bytes")
    return _encrypt(message, aad, nonce, key)


def decrypt(sealed: bytes, aad: bytes, nonce: bytes, key: bytes) -> bytes:
    """The plaintext of ``ciphertext || tag``, or :class:`nacl.exceptions.CryptoError`."""
    _check(nonce, key)
    if type(sealed) is not bytes or type(aad) is not bytes:
        raise TypeError("ciphertext and associated data must be bytes")
    if len(sealed) < TAG_BYTES:
        raise CryptoError("ciphertext is shorter than the tag")
    return _decrypt(sealed, aad, nonce, key)
