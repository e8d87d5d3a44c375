"""XChaCha20-Poly1305 (IETF) from libsodium, called without PyNaCl's per-call wrapper.

PyNaCl's public ``nacl.bindings.crypto_aead_xchacha20poly1305_ietf_*`` functions
re-validate every argument and format their error messages eagerly on each call. For a
token-sized message that Python layer costs more than the cipher itself (about 3 of the
5 microseconds per call on the benchmark machine, docs/performance.md), and ENCRYPT mode
makes two calls per request. Here the same libsodium functions are called through the
cffi handle PyNaCl ships (``nacl._sodium``), after the checks that matter for memory
safety: exact key and nonce sizes, and a ciphertext at least one tag long.

If a future PyNaCl drops that handle, the public wrappers are used instead: same bytes,
only slower. The test vectors pin the output either way.
"""

from __future__ import annotations

from typing import Any, Final

from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_decrypt as _public_decrypt
from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_encrypt as _public_encrypt
from nacl.exceptions import CryptoError

KEY_BYTES: Final = 32
NONCE_BYTES: Final = 24
TAG_BYTES: Final = 16


def _libsodium() -> tuple[Any, Any, Any] | None:
    """``(ffi, encrypt, decrypt)`` through PyNaCl's private cffi handle, or ``None``.

    ``None`` when this PyNaCl has no such handle (or it lacks the two functions): the
    public wrappers then serve. tests/test_seams.py forces that case.
    """
    try:
        from nacl._sodium import ffi, lib  # noqa: PLC0415 - a private module, isolated here

        encrypt = lib.crypto_aead_xchacha20poly1305_ietf_encrypt
        decrypt = lib.crypto_aead_xchacha20poly1305_ietf_decrypt
        return ffi, encrypt, decrypt
    except (ImportError, AttributeError):
        return None


_ffi: Any
_encrypt_c: Any
_decrypt_c: Any
_ffi, _encrypt_c, _decrypt_c = _libsodium() or (None, None, None)


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
    if _ffi is None:  # no private handle (see _libsodium)
        return _public_encrypt(message, aad, nonce, key)
    out = _ffi.new("unsigned char[]", len(message) + TAG_BYTES)
    # The output length pointer may be NULL: it is always len(message) + TAG_BYTES.
    if _encrypt_c(out, _ffi.NULL, message, len(message), aad, len(aad), _ffi.NULL, nonce, key) != 0:
        raise CryptoError("encryption failed")
    return bytes(_ffi.buffer(out))


def decrypt(sealed: bytes, aad: bytes, nonce: bytes, key: bytes) -> bytes:
    """The plaintext of ``ciphertext || tag``, or :class:`nacl.exceptions.CryptoError`."""
    _check(nonce, key)
    if type(sealed) is not bytes or type(aad) is not bytes:
        raise TypeError("ciphertext and associated data must be bytes")
    if len(sealed) < TAG_BYTES:
        raise CryptoError("ciphertext is shorter than the tag")
    if _ffi is None:  # no private handle (see _libsodium)
        return _public_decrypt(sealed, aad, nonce, key)
    out = _ffi.new("unsigned char[]", max(1, len(sealed) - TAG_BYTES))
    if _decrypt_c(out, _ffi.NULL, _ffi.NULL, sealed, len(sealed), aad, len(aad), nonce, key) != 0:
        raise CryptoError("decryption failed")
    return bytes(_ffi.buffer(out, len(sealed) - TAG_BYTES))
