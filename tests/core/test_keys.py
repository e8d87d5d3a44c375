"""Keys, key rings, subkey derivation and the key ring JSON form."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re

import pytest

import statecodec as sc
from statecodec._keys import derive_subkey

SECRET = bytes(range(32))


def _hkdf_sha256(ikm: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869 written out by hand, to check _keys against the spec rather than itself."""
    prk = hmac.digest(b"\x00" * 32, ikm, "sha256")  # salt absent = HashLen zero bytes
    okm, block = b"", b""
    for counter in range(1, -(-length // 32) + 1):
        block = hmac.digest(prk, block + info + bytes([counter]), "sha256")
        okm += block
    return okm[:length]


# ------------------------------------------------------------------ subkeys
@pytest.mark.parametrize(
    ("attr", "label"),
    [
        ("mac_key", b"statecodec/v1/sign/hmac-sha256"),
        ("aead_key", b"statecodec/v1/encrypt/xchacha20-poly1305"),
        ("bind_key", b"statecodec/v1/binding/hmac-sha256"),
    ],
)
def test_subkeys_are_hkdf_with_the_documented_labels(attr: str, label: bytes) -> None:
    key = sc.Key("k", SECRET)
    assert getattr(key, attr) == _hkdf_sha256(SECRET, label)
    assert derive_subkey(SECRET, label.decode().removeprefix("statecodec/v1/")) == getattr(key, attr)


def test_subkeys_are_independent_of_each_other_and_of_the_secret() -> None:
    key = sc.Key("k", SECRET)
    derived = {key.mac_key, key.aead_key, key.bind_key, key.secret}
    assert len(derived) == 4
    other = sc.Key("k", bytes(31) + b"\x01")
    assert other.mac_key != key.mac_key


def test_the_kid_does_not_enter_the_derivation() -> None:
    # A renamed key keeps its subkeys: the kid is a public label, not key material.
    assert sc.Key("a", SECRET).mac_key == sc.Key("b", SECRET).mac_key


def test_longer_secrets_are_accepted() -> None:
    key = sc.Key("k", bytes(64))
    assert key.mac_key == _hkdf_sha256(bytes(64), b"statecodec/v1/sign/hmac-sha256")


# ------------------------------------------------------------------ kid rules
@pytest.mark.parametrize(
    "kid",
    ["a", "k2025", "x" * 32, "vault:transit.statecodec-v1_0042", "A.Z-a_z:0", "9", "-", "..", ":"],
)
def test_valid_kids(kid: str) -> None:
    assert sc.Key(kid, SECRET).kid == kid


@pytest.mark.parametrize(
    "kid",
    ["", "x" * 33, "k/1", "k 1", "k\n", "k=", "k+1", "k@1", "ключ", "k\u00e9", "k\u0661", "k\x00"],
)
def test_invalid_kids(kid: str) -> None:
    with pytest.raises(ValueError, match="invalid kid"):
        sc.Key(kid, SECRET)


@pytest.mark.parametrize("secret", [b"", bytes(31), "x" * 40, bytearray(32)])
def test_short_or_non_bytes_secrets_are_refused(secret: object) -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        sc.Key("k", secret)  # type: ignore[arg-type]


def test_generate_makes_fresh_random_keys() -> None:
    a, b = sc.Key.generate(created_at=5), sc.Key.generate(created_at=5)
    assert len(a.secret) == 32
    assert a.secret != b.secret
    assert a.kid != b.kid
    assert re.fullmatch(r"k[0-9a-f]{8}", a.kid)
    assert a.created_at == 5
    assert sc.Key.generate("mine").kid == "mine"


def test_verifies_until_retirement() -> None:
    key = sc.Key("k", SECRET, 0, retires_at=100)
    assert key.verifies_at(99)
    assert key.verifies_at(99.999)
    assert not key.verifies_at(100)
    assert sc.Key("k", SECRET).verifies_at(2**40)


def test_key_equality_ignores_nothing_but_derived_fields() -> None:
    assert sc.Key("k", SECRET, 1) == sc.Key("k", SECRET, 1)
    assert sc.Key("k", SECRET, 1) != sc.Key("k", SECRET, 2)
    assert sc.Key("k", SECRET) != sc.Key("k", bytes(32))


def test_public_dict_has_no_secret() -> None:
    assert sc.Key("k", SECRET, 3, 9).public_dict() == {"kid": "k", "created_at": 3, "retires_at": 9}


# ------------------------------------------------------------------ rings
def _ring() -> sc.KeyRing:
    return sc.KeyRing([sc.Key("old", bytes(32), 1), sc.Key("new", SECRET, 2)], primary="new")


def test_generate_ring() -> None:
    ring = sc.KeyRing.generate(created_at=7)
    assert len(ring) == 1
    assert ring.primary is ring.keys[0]
    assert ring.primary_kid == ring.primary.kid
    assert ring.signing_key() is ring.primary
    assert ring.keyring() is ring
    assert isinstance(ring, sc.KeyProvider)
    assert sc.KeyRing.generate().primary.secret != ring.primary.secret


def test_ring_lookup() -> None:
    ring = _ring()
    assert ring.kids == ("old", "new")
    assert ring.get("old") is ring.keys[0]
    assert ring.get("nope") is None
    assert ring.require("new").secret == SECRET
    with pytest.raises(KeyError, match="nope"):
        ring.require("nope")


def test_ring_construction_errors() -> None:
    with pytest.raises(ValueError, match="duplicate kid"):
        sc.KeyRing([sc.Key("a", SECRET), sc.Key("a", bytes(32))])
    with pytest.raises(ValueError, match="not in the ring"):
        sc.KeyRing([sc.Key("a", SECRET)], primary="b")


def test_ring_without_primary_verifies_but_cannot_mint() -> None:
    ring = sc.KeyRing([sc.Key("a", SECRET)])
    assert ring.primary_kid is None
    with pytest.raises(sc.KeyUnavailable):
        _ = ring.primary
    with pytest.raises(sc.KeyUnavailable):
        sc.StateCodec(ring).seal(b"x")
    token = sc.StateCodec(ring.with_primary("a")).seal(b"x")
    assert sc.StateCodec(ring).unseal(token).payload == b"x"


def test_with_key_adds_or_replaces() -> None:
    ring = _ring()
    added = ring.with_key(sc.Key("third", bytes(range(1, 33))))
    assert added.kids == ("old", "new", "third")
    assert added.primary_kid == "new"
    promoted = ring.with_key(sc.Key("third", bytes(range(1, 33))), primary=True)
    assert promoted.primary_kid == "third"
    replaced = ring.with_key(sc.Key("old", bytes(range(2, 34))))
    assert len(replaced) == 2
    assert replaced.require("old").secret == bytes(range(2, 34))
    assert ring.require("old").secret == bytes(32)  # the original ring never changes


def test_with_primary_and_retire_and_without() -> None:
    ring = _ring()
    assert ring.with_primary("old").primary_kid == "old"
    with pytest.raises(ValueError, match="not in the ring"):
        ring.with_primary("nope")
    retired = ring.retire("old", 500)
    assert retired.require("old").retires_at == 500
    assert retired.require("old").secret == bytes(32)
    assert ring.require("old").retires_at is None
    with pytest.raises(ValueError, match="cannot retire the primary"):
        ring.retire("new", 500)
    with pytest.raises(KeyError):
        ring.retire("nope", 500)
    assert ring.without("old").kids == ("new",)
    with pytest.raises(ValueError, match="cannot remove the primary"):
        ring.without("new")


def test_rotation_in_three_phases() -> None:
    """Publish a new key, promote it, retire the old one after the longest token lifetime."""
    ring = _ring()
    old_token = sc.StateCodec(ring, clock=lambda: 1000).seal(b"before", None)
    published = ring.with_key(sc.Key("next", bytes(range(3, 35))))
    promoted = published.with_primary("next")
    new_token = sc.StateCodec(promoted, clock=lambda: 1000).seal(b"after", None)
    assert sc.StateCodec(published, clock=lambda: 1000).unseal(new_token, None).kid == "next"
    assert sc.StateCodec(promoted, clock=lambda: 1000).unseal(old_token, None).kid == "new"
    # Accepted while now < exp (grace 0): retire from exp on.
    retired = promoted.retire("new", 1000 + 600)
    now = [1000 + 599.5]
    codec = sc.StateCodec(retired, clock=lambda: now[0])
    assert codec.unseal(old_token, None).payload == b"before"
    now[0] = 1000 + 600
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(old_token, None)
    assert info.value.reason == "unknown_key"  # the kid is judged before the times


def test_ring_equality_and_hash() -> None:
    assert _ring() == _ring()
    assert hash(_ring()) == hash(_ring())
    assert _ring() != _ring().with_primary("old")
    assert _ring() != "ring"


# ------------------------------------------------------------------ JSON
def test_json_round_trip() -> None:
    ring = _ring().retire("old", 12345)
    text = ring.to_json()
    again = sc.KeyRing.from_json(text)
    assert again == ring
    assert again.require("old").retires_at == 12345
    assert sc.KeyRing.from_json(text.encode()) == ring
    assert sc.KeyRing.from_dict(ring.to_dict()) == ring


def test_json_shape_is_documented_one() -> None:
    doc = json.loads(sc.KeyRing([sc.Key("k", SECRET, 7)], primary="k").to_json())
    assert doc == {
        "statecodec_keyring": 1,
        "primary": "k",
        "keys": [
            {
                "kid": "k",
                "secret": base64.urlsafe_b64encode(SECRET).decode().rstrip("="),
                "created_at": 7,
                "retires_at": None,
            }
        ],
    }


def _doc(**entry_changes: object) -> dict[str, object]:
    entry: dict[str, object] = {"kid": "k", "secret": base64.urlsafe_b64encode(SECRET).decode().rstrip("=")}
    entry.update(entry_changes)
    return {"statecodec_keyring": 1, "primary": "k", "keys": [entry]}


def test_json_minimal_form_defaults() -> None:
    ring = sc.KeyRing.from_dict(_doc())
    assert ring.primary.created_at == 0
    assert ring.primary.retires_at is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be an object"),
        ('{"keys": []}', "not a statecodec key ring"),
        ('{"statecodec_keyring": 2, "keys": []}', "not a statecodec key ring"),
        ('{"statecodec_keyring": 1, "keys": {"k": 1}}', "must be a list"),
        ('{"statecodec_keyring": 1, "keys": ["k"]}', 'string "kid"'),
        ('{"statecodec_keyring": 1, "keys": [{"secret": "AAAA"}]}', 'string "kid"'),
        ('{"statecodec_keyring": 1, "keys": [{"kid": 5, "secret": "AAAA"}]}', 'string "kid"'),
        ('{"statecodec_keyring": 1, "keys": [{"kid": "k"}]}', "not canonical base64url"),
        ('{"statecodec_keyring": 1, "keys": [{"kid": "k", "secret": 5}]}', "not canonical base64url"),
    ],
)
def test_json_errors_are_value_errors(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sc.KeyRing.from_json(text)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"secret": base64.urlsafe_b64encode(SECRET).decode()}, "not canonical"),  # padded
        ({"secret": base64.b64encode(b"\xfb" * 32).decode().rstrip("=")}, "not canonical"),  # '+' and '/'
        ({"secret": "AAAA"}, "at least 32 bytes"),
        ({"kid": "bad kid"}, "invalid kid"),
        ({"retires_at": "2026-01-01"}, "must be integers"),
        ({"retires_at": 1.5}, "must be integers"),
        ({"created_at": "12"}, "must be integers"),
        ({"created_at": None}, "must be integers"),
        ({"created_at": True}, "must be integers"),
    ],
)
def test_json_key_fields_are_strict(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sc.KeyRing.from_dict(_doc(**changes))


def test_json_primary_must_exist() -> None:
    doc = _doc()
    doc["primary"] = "other"
    with pytest.raises(ValueError, match="not in the ring"):
        sc.KeyRing.from_dict(doc)


# ------------------------------------------------------------------ no secrets in repr
def _spellings(secret: bytes) -> list[str]:
    return [
        repr(secret),
        secret.hex(),
        base64.urlsafe_b64encode(secret).decode().rstrip("="),
        base64.b64encode(secret).decode().rstrip("="),
        str(list(secret)),
    ]


def test_reprs_never_show_secret_bytes() -> None:
    secret = hashlib.sha256(b"repr test").digest()
    key = sc.Key("k", secret, 1, 2)
    ring = sc.KeyRing([key], primary="k")
    codec = sc.StateCodec(ring, mode=sc.Mode.ENCRYPT)
    token = codec.seal(b"payload", sc.Binding(principal="p"))
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(token, sc.Binding(principal="q"))
    texts = [
        repr(key),
        str(key),
        repr(ring),
        str(ring),
        repr(codec),
        str(codec),
        repr(info.value),
        str(info.value),
        info.value.detail,
    ]
    material = [secret, key.mac_key, key.aead_key, key.bind_key]
    for text in texts:
        for m in material:
            for spelling in _spellings(m):
                assert spelling not in text, text
    assert "k" in repr(key) and "k" in repr(ring)
