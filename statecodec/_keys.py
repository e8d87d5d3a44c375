"""Keys, key rings, and per-purpose subkeys.

A :class:`Key` is 32+ secret bytes with a short public id (kid). The kid travels in the
clear token header and selects exactly one key: there is no trial decryption, because
XChaCha20-Poly1305 is not key-committing and trying several keys would open a
partitioning oracle. Kids are random or administrative labels, never derived from the
secret, so they reveal nothing about it.

Each key is never used directly: HKDF-SHA256 derives an independent subkey per purpose
(MAC, AEAD, binding tag), so a key used for SIGN tokens can never act as an ENCRYPT
key, and the binding tag can never be confused with a token MAC.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import _format
from ._errors import KeyUnavailable

MIN_SECRET_BYTES = 32
KEYRING_FORMAT = 1
_LABEL = b"statecodec/v1/"


def _keyed_hmac(key: bytes, prefix: bytes = b"") -> hmac.HMAC:
    """HMAC-SHA256 keyed with ``key`` and fed ``prefix``, to be copied once per message.

    Copying a keyed state skips the key setup that ``hmac.digest()`` repeats on every
    call. (Copying OpenSSL's object inside the wrapper, its private ``_hmac``, saves less
    than the 1% a private seam must earn: docs/performance.md.)
    """
    return hmac.new(key, prefix, digestmod="sha256")


def derive_subkey(secret: bytes, purpose: str) -> bytes:
    """HKDF-SHA256(secret, salt=none, info="statecodec/v1/" + purpose), 32 bytes."""
    return HKDF(hashes.SHA256(), 32, salt=None, info=_LABEL + purpose.encode("ascii")).derive(secret)


@dataclass(frozen=True, slots=True)
class Key:
    """One secret with its id and lifetime.

    ``created_at`` is when the key was made (rotation policy reads it); ``retires_at``,
    when set, is the Unix time from which the key no longer verifies anything.
    """

    kid: str
    secret: bytes = field(repr=False)
    created_at: int = 0
    retires_at: int | None = None
    mac_key: bytes = field(init=False, repr=False, compare=False)
    aead_key: bytes = field(init=False, repr=False, compare=False)
    bind_key: bytes = field(init=False, repr=False, compare=False)
    kid_field: bytes = field(init=False, repr=False, compare=False)
    _sign_mac: hmac.HMAC = field(init=False, repr=False, compare=False)
    _bind: hmac.HMAC = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _format.valid_kid(self.kid):
            raise ValueError(f"invalid kid {self.kid!r}: use 1-32 characters of [A-Za-z0-9._:-]")
        if not isinstance(self.secret, bytes) or len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(f"key {self.kid!r}: the secret must be at least {MIN_SECRET_BYTES} bytes")
        # Derived once here so the hot path never runs HKDF.
        object.__setattr__(self, "mac_key", derive_subkey(self.secret, "sign/hmac-sha256"))
        object.__setattr__(self, "aead_key", derive_subkey(self.secret, "encrypt/xchacha20-poly1305"))
        object.__setattr__(self, "bind_key", derive_subkey(self.secret, "binding/hmac-sha256"))
        object.__setattr__(self, "kid_field", _format.kid_field(self.kid))  # the header's kid bytes
        # Keyed once (see _keyed_hmac). The SIGN MAC always starts with the prefix, so it is
        # absorbed here too instead of being concatenated to every token.
        sign_mac = _keyed_hmac(self.mac_key, _format.PREFIX_SIGN.encode("ascii"))
        object.__setattr__(self, "_sign_mac", sign_mac)
        object.__setattr__(self, "_bind", _keyed_hmac(self.bind_key))

    @classmethod
    def generate(cls, kid: str | None = None, *, created_at: int | None = None) -> Key:
        """A fresh 32-byte key, stamped ``created_at`` (Unix seconds; default: the current time)."""
        return cls(
            kid or new_kid(),
            secrets.token_bytes(32),
            int(time.time()) if created_at is None else created_at,
        )

    def sign_mac(self, signed: bytes) -> bytes:
        """The SIGN token MAC: HMAC-SHA256(mac_key, "sc1s." || signed), signed = header || payload."""
        h = self._sign_mac.copy()
        h.update(signed)
        return h.digest()

    def binding_tag(self, encoded: bytes) -> bytes:
        """HMAC-SHA256 under the binding subkey, cut to 16 bytes (see ``Binding.tag``)."""
        h = self._bind.copy()
        h.update(encoded)
        return h.digest()[:16]

    def verifies_at(self, now: float) -> bool:
        return self.retires_at is None or now < self.retires_at

    def public_dict(self) -> dict[str, Any]:
        """Everything about the key except the secret (for listings and logs)."""
        return {"kid": self.kid, "created_at": self.created_at, "retires_at": self.retires_at}


def new_kid() -> str:
    return "k" + secrets.token_hex(4)


def _key_from_dict(entry: Any) -> Key:
    """One key of the JSON form, every field strictly typed.

    A ring file with, say, ``"retires_at": "2026-01-01"`` must fail when it is loaded, not
    later on every unseal of that kid.
    """
    if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str):
        raise ValueError('each key must be an object with a string "kid"')
    kid = entry["kid"]
    try:
        secret = _format.b64decode(entry["secret"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"key {kid!r}: secret is not canonical base64url") from exc
    created_at, retires_at = entry.get("created_at", 0), entry.get("retires_at")
    if type(created_at) is not int or not (retires_at is None or type(retires_at) is int):
        raise ValueError(f"key {kid!r}: created_at and retires_at must be integers (retires_at may be null)")
    return Key(kid, secret, created_at, retires_at)


@runtime_checkable
class KeyProvider(Protocol):
    """What a codec needs from its keys: a ring to verify with and a key to mint with.

    :class:`KeyRing` provides itself; a key manager (``statecodec.kms``) provides the
    ring it last loaded and may refuse to mint when that ring has gone stale.
    """

    def keyring(self) -> KeyRing: ...

    def signing_key(self) -> Key: ...


class KeyRing:
    """An immutable set of keys: one primary that mints, all others verify until retired."""

    __slots__ = ("_by_kid", "_keys", "_primary")

    def __init__(self, keys: Iterable[Key], primary: str | None = None) -> None:
        self._keys = tuple(keys)
        self._by_kid = {k.kid: k for k in self._keys}
        if len(self._by_kid) != len(self._keys):
            raise ValueError("duplicate kid in key ring")
        if primary is not None and primary not in self._by_kid:
            raise ValueError(f"primary kid {primary!r} is not in the ring")
        self._primary = primary

    # --- construction -------------------------------------------------------------
    @classmethod
    def generate(cls, kid: str | None = None, *, created_at: int | None = None) -> KeyRing:
        """A ring of one fresh 32-byte key, which is primary (see :meth:`Key.generate`)."""
        key = Key.generate(kid, created_at=created_at)
        return cls([key], key.kid)

    @classmethod
    def from_secret(cls, secret: bytes, kid: str = "k0", *, created_at: int = 0) -> KeyRing:
        return cls([Key(kid, secret, created_at)], kid)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> KeyRing:
        marker = doc.get("statecodec_keyring")
        if type(marker) is not int or marker != KEYRING_FORMAT:  # not True, not 1.0
            raise ValueError('not a statecodec key ring (missing "statecodec_keyring": 1)')
        entries = doc.get("keys", [])
        if not isinstance(entries, list):
            raise ValueError('"keys" must be a list of key objects')
        return cls([_key_from_dict(entry) for entry in entries], doc.get("primary"))

    @classmethod
    def from_json(cls, text: str | bytes) -> KeyRing:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"key ring is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ValueError("key ring JSON must be an object")
        return cls.from_dict(doc)

    def to_dict(self) -> dict[str, Any]:
        return {
            "statecodec_keyring": KEYRING_FORMAT,
            "primary": self._primary,
            "keys": [
                {
                    "kid": k.kid,
                    "secret": _format.b64encode(k.secret),
                    "created_at": k.created_at,
                    "retires_at": k.retires_at,
                }
                for k in self._keys
            ],
        }

    def to_json(self) -> str:
        """The ring with its secrets, for a file or a secret store. Treat it as a secret."""
        return json.dumps(self.to_dict(), indent=2)

    # --- derived rings (the ring itself never changes) -----------------------------
    def with_key(self, key: Key, *, primary: bool = False) -> KeyRing:
        keys = [k for k in self._keys if k.kid != key.kid] + [key]
        return KeyRing(keys, key.kid if primary else self._primary)

    def with_primary(self, kid: str) -> KeyRing:
        return KeyRing(self._keys, kid)

    def retire(self, kid: str, at: int) -> KeyRing:
        """A copy in which ``kid`` stops verifying at Unix time ``at``."""
        key = self.require(kid)
        if kid == self._primary:
            raise ValueError(f"cannot retire the primary key {kid!r}; promote another key first")
        replaced = Key(key.kid, key.secret, key.created_at, at)
        return KeyRing([replaced if k.kid == kid else k for k in self._keys], self._primary)

    def without(self, kid: str) -> KeyRing:
        if kid == self._primary:
            raise ValueError(f"cannot remove the primary key {kid!r}")
        return KeyRing([k for k in self._keys if k.kid != kid], self._primary)

    # --- lookup -------------------------------------------------------------------
    @property
    def keys(self) -> tuple[Key, ...]:
        return self._keys

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._by_kid)

    @property
    def primary(self) -> Key:
        if self._primary is None:
            raise KeyUnavailable("the key ring has no primary key, so it can verify but not mint")
        return self._by_kid[self._primary]

    @property
    def primary_kid(self) -> str | None:
        return self._primary

    def get(self, kid: str) -> Key | None:
        return self._by_kid.get(kid)

    def require(self, kid: str) -> Key:
        key = self._by_kid.get(kid)
        if key is None:
            raise KeyError(f"no key {kid!r} in the ring (it has {', '.join(self._by_kid) or 'none'})")
        return key

    # --- KeyProvider --------------------------------------------------------------
    def keyring(self) -> KeyRing:
        return self

    def signing_key(self) -> Key:
        return self.primary

    def __len__(self) -> int:
        return len(self._keys)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyRing):
            return NotImplemented
        return self._keys == other._keys and self._primary == other._primary

    def __hash__(self) -> int:
        return hash((self._keys, self._primary))

    def __repr__(self) -> str:
        return f"KeyRing(kids={list(self._by_kid)!r}, primary={self._primary!r})"
