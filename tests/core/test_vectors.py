"""The published test vectors (tests/vectors/*.json) against the implementation and the spec.

Three checks:
1. ``StateCodec`` opens every positive vector to the expected payload and rejects every
   negative one with exactly the expected reason.
2. A small reference opener written from docs/format.md alone (hashlib, hmac, PyNaCl,
   rfc8785; nothing from ``statecodec``) reproduces every positive vector, its subkeys,
   binding encoding, tag and header: the document is precise enough to implement.
3. ``generate.py`` rebuilds the files byte for byte, so the vectors are reproducible and
   any format change shows up as a diff.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.util
import json
import math
import re
import struct
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import rfc8785
from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_decrypt

import statecodec as sc

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
FILES = ("sign.json", "encrypt.json", "negative.json")


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("statecodec_vector_generator", VECTORS / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DOCS = {name: json.loads((VECTORS / name).read_text(encoding="utf-8")) for name in FILES}
CASES = [(name, case) for name, doc in DOCS.items() for case in doc["cases"]]


def _binding(doc: dict[str, Any] | None) -> sc.Binding | None:
    if doc is None:
        return None
    digest = doc["argument_digest"]
    return sc.Binding(
        doc["principal"],
        doc["audience"],
        doc["method"],
        doc["target"],
        argument_digest=None if digest is None else bytes.fromhex(digest),
        extra=doc["extra"],
    )


def _codec(doc: dict[str, Any], case: dict[str, Any]) -> sc.StateCodec:
    return sc.StateCodec(
        sc.KeyRing.from_dict(doc["keyrings"][case["keyring"]]),
        mode=case["mode"],
        ttl=case["ttl"],
        max_skew=case["max_skew"],
        expiry_grace=case["expiry_grace"],
        max_token_bytes=case["max_token_bytes"],
        max_rounds=case.get("max_rounds", 10),
        max_flow_age=case.get("max_flow_age", 3600),
        clock=lambda: case["now"],
    )


# ------------------------------------------------------------------ coverage of the set
def test_the_set_is_big_and_covers_every_reason() -> None:
    assert len(CASES) >= 30
    positives = [c for _, c in CASES if "payload_hex" in c["expected"]]
    reasons = {c["expected"]["reason"] for _, c in CASES if "reason" in c["expected"]}
    # Every reason but those only a replay store can give (replayed, store_unavailable) and internal_error,
    # which no token earns.
    assert reasons == set(sc.REASONS) - {"replayed", "store_unavailable", "internal_error"}
    assert {c["mode"] for c in positives} == {"sign", "encrypt"}
    assert len({c["name"] for _, c in CASES}) == len(CASES), "case names are unique"


# ------------------------------------------------------------------ the implementation
@pytest.mark.parametrize(("file", "case"), CASES, ids=[c["name"] for _, c in CASES])
def test_vector(file: str, case: dict[str, Any]) -> None:
    codec = _codec(DOCS[file], case)
    binding = _binding(case["binding"])
    expected = case["expected"]
    if "reason" in expected:
        with pytest.raises(sc.InvalidState) as info:
            codec.unseal(case["token"], binding)
        assert info.value.reason == expected["reason"], info.value.detail
        return
    opened = codec.unseal(case["token"], binding)
    assert opened.payload == bytes.fromhex(expected["payload_hex"])
    assert opened.kid == expected["kid"]
    assert (opened.issued_at, opened.expires_at) == (expected["issued_at"], expected["expires_at"])
    assert opened.token_id == expected["token_id"]
    assert opened.mode.value == case["mode"]
    if "round" in expected:  # a flow case
        assert (opened.flow_id, opened.round, opened.flow_started_at) == (
            expected["flow_id"],
            expected["round"],
            expected["flow_started_at"],
        )
        assert opened.not_before == expected["not_before"]
    else:  # a first round is a flow of one
        assert (opened.flow_id, opened.round, opened.flow_started_at) == (
            opened.token_id,
            1,
            opened.issued_at,
        )


def test_vector_arguments_match_their_digests() -> None:
    checked = 0
    for _, case in CASES:
        b = case["binding"]
        if b is not None and "arguments" in b:
            assert sc.argument_digest(b["arguments"]).hex() == b["argument_digest"]
            checked += 1
    assert checked > 10


# ------------------------------------------------------------------ an opener from the spec alone
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _ref_b64decode(text: str) -> bytes:
    assert re.fullmatch(r"[A-Za-z0-9_-]*", text) and len(text) % 4 != 1
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    assert base64.urlsafe_b64encode(raw).decode().rstrip("=") == text, "canonical"
    return raw


def _ref_hkdf(secret: bytes, label: str) -> bytes:
    prk = hmac.digest(b"\x00" * 32, secret, "sha256")
    return hmac.digest(prk, label.encode() + b"\x01", "sha256")


def _ref_field(value: str | bytes | None) -> bytes:
    if value is None:
        return b"\x00"
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return b"\x01" + struct.pack(">I", len(raw)) + raw


def _ref_binding_encoded(doc: dict[str, Any] | None) -> bytes:
    out = b"statecodec/v1/binding\x00"
    if doc is None:
        return out + b"\x00" * 5 + struct.pack(">I", 0)
    for name in ("principal", "audience", "method", "target"):
        out += _ref_field(doc[name])
    digest = doc["argument_digest"]
    out += _ref_field(None if digest is None else bytes.fromhex(digest))
    extra = doc["extra"]
    out += struct.pack(">I", len(extra))
    for key in sorted(extra, key=lambda k: k.encode("utf-8")):
        out += _ref_field(key) + _ref_field(extra[key])
    return out


def _ref_times_valid(iat: int, exp: int, case: dict[str, Any]) -> bool:
    """Steps 10-11 of docs/format.md: whole seconds, compared with floor(now).

    ``floor(now) < exp + expiry_grace`` is ``now < exp + expiry_grace`` (both sides of the
    latter are whole seconds on the right): a TTL is at most its TTL.
    """
    second = math.floor(case["now"])
    return iat - case["max_skew"] <= second < exp + case["expiry_grace"]


def _ref_header_times(token: str) -> tuple[int, int]:
    raw = _ref_b64decode(token[5:])
    kid_len = raw[0] & 0x3F
    iat, exp = struct.unpack(">II", raw[1 + kid_len : 9 + kid_len])
    return iat, exp


def _ref_open(token: str, ring: dict[str, Any], mode: str, binding: dict[str, Any] | None) -> dict[str, Any]:
    """Open a *valid* token the way docs/format.md describes; assert at every step."""
    prefix = {"sign": "sc1s.", "encrypt": "sc1e."}[mode]
    assert token.startswith(prefix)
    raw = _ref_b64decode(token[len(prefix) :])
    chained, paced, kid_len = raw[0] & 0x80, raw[0] & 0x40, raw[0] & 0x3F
    kid = raw[1 : 1 + kid_len].decode("ascii")
    iat, exp = struct.unpack(">II", raw[1 + kid_len : 9 + kid_len])
    tid = raw[9 + kid_len : 25 + kid_len]
    btag = raw[25 + kid_len : 41 + kid_len]
    at = 41 + kid_len
    flow, round_, start, not_before = tid, 1, iat, None
    if chained:
        flow, (round_, start) = raw[at : at + 16], struct.unpack(">BI", raw[at + 16 : at + 21])
        assert round_ >= 2 and start <= iat
        at += 21
    if paced:
        (wait_ms,) = struct.unpack(">I", raw[at : at + 4])
        assert wait_ms > 0
        not_before, at = iat + wait_ms / 1000, at + 4
    header = raw[:at]
    (entry,) = [k for k in ring["keys"] if k["kid"] == kid]
    secret = _ref_b64decode(entry["secret"])
    if mode == "sign":
        payload, mac = raw[len(header) : -32], raw[-32:]
        mac_key = _ref_hkdf(secret, "statecodec/v1/sign/hmac-sha256")
        expected_mac = hmac.digest(mac_key, prefix.encode() + header + payload, "sha256")
        assert hmac.compare_digest(mac, expected_mac)
    else:
        # The 24-byte nonce is the token id followed by the 8 bytes after the header.
        nonce, sealed = tid + raw[len(header) : len(header) + 8], raw[len(header) + 8 :]
        aead_key = _ref_hkdf(secret, "statecodec/v1/encrypt/xchacha20-poly1305")
        payload = crypto_aead_xchacha20poly1305_ietf_decrypt(
            sealed, prefix.encode() + header, nonce, aead_key
        )
    bind_key = _ref_hkdf(secret, "statecodec/v1/binding/hmac-sha256")
    encoded = _ref_binding_encoded(binding)
    tag = hmac.digest(bind_key, encoded, "sha256")[:16]
    assert hmac.compare_digest(tag, btag)
    return {
        "payload": payload,
        "kid": kid,
        "iat": iat,
        "exp": exp,
        "tid": tid,
        "header": header,
        "encoded": encoded,
        "tag": tag,
        "flow": (flow, round_, start, not_before),
    }


POSITIVE = [(f, c) for f, c in CASES if "payload_hex" in c["expected"]]


@pytest.mark.parametrize(("file", "case"), POSITIVE, ids=[c["name"] for _, c in POSITIVE])
def test_reference_opener_from_the_spec(file: str, case: dict[str, Any]) -> None:
    doc = DOCS[file]
    got = _ref_open(case["token"], doc["keyrings"][case["keyring"]], case["mode"], case["binding"])
    expected, inter = case["expected"], case["intermediate"]
    assert got["payload"].hex() == expected["payload_hex"]
    assert (got["kid"], got["iat"], got["exp"]) == (
        expected["kid"],
        expected["issued_at"],
        expected["expires_at"],
    )
    assert got["tid"].hex() == expected["token_id"]
    flow, round_, start, not_before = got["flow"]
    if "round" in expected:
        assert (flow.hex(), round_, start, not_before) == (
            expected["flow_id"],
            expected["round"],
            expected["flow_started_at"],
            expected["not_before"],
        )
        assert round_ <= case.get("max_rounds", 10)
        assert math.floor(case["now"]) <= start + case.get("max_flow_age", 3600) + case["expiry_grace"]
        assert not_before is None or case["now"] >= not_before
    assert got["header"].hex() == inter["header"]
    assert got["encoded"].hex() == inter["binding_encoded"]
    assert got["tag"].hex() == inter["binding_tag"]
    assert len(case["token"]) <= case["max_token_bytes"]
    # Time rules of the spec, in whole seconds: iat - max_skew <= floor(now) < exp + expiry_grace.
    assert _ref_times_valid(got["iat"], got["exp"], case)
    if "canonical_arguments" in inter:
        arguments = case["binding"]["arguments"]
        assert inter["canonical_arguments"].encode() == rfc8785.dumps(arguments)
        assert hashlib.sha256(rfc8785.dumps(arguments)).hexdigest() == case["binding"]["argument_digest"]
    if case["mode"] == "encrypt":
        suffix = _ref_b64decode(case["token"][5:])[len(got["header"]) :][:8]
        assert bytes.fromhex(inter["nonce"]) == got["tid"] + suffix


TIME_NEGATIVE = [(f, c) for f, c in CASES if c["expected"].get("reason") in {"expired", "not_yet_valid"}]


@pytest.mark.parametrize(("file", "case"), TIME_NEGATIVE, ids=[c["name"] for _, c in TIME_NEGATIVE])
def test_reference_time_rule_rejects_the_time_negatives(file: str, case: dict[str, Any]) -> None:
    iat, exp = _ref_header_times(case["token"])
    assert not _ref_times_valid(iat, exp, case)
    too_late = case["now"] >= exp + case["expiry_grace"]
    assert case["expected"]["reason"] == ("expired" if too_late else "not_yet_valid")


def test_the_time_edges_are_in_the_set() -> None:
    # ttl 600, expiry_grace 0: 599.999 s after iat accepted, 600 s (= exp) and 600.5 s
    # rejected (a TTL is at most its TTL); max_skew 60: issued 60 s in the future accepted,
    # 61 s rejected; and a fractional now on each side.
    edges = {
        (c["mode"], round(c["now"] - c["expected"]["issued_at"], 3))
        for _, c in POSITIVE
        if c["expiry_grace"] == 0
    }
    assert {("sign", 599.999), ("encrypt", 599.999), ("sign", 599), ("sign", -60), ("encrypt", -60)} <= edges
    late = {
        (c["mode"], c["now"] - _ref_header_times(c["token"])[0])
        for _, c in TIME_NEGATIVE
        if c["expiry_grace"] == 0
    }
    assert {("sign", 600), ("encrypt", 600), ("sign", 600.5), ("sign", -61), ("sign", -60.25)} <= late
    # expiry_grace 30: exp + 29.5 accepted, exp + 30 rejected.
    graced = {c["now"] - c["expected"]["issued_at"] for _, c in POSITIVE if c["expiry_grace"] == 30}
    assert 629.5 in graced
    graced_late = {
        c["now"] - _ref_header_times(c["token"])[0] for _, c in TIME_NEGATIVE if c["expiry_grace"] == 30
    }
    assert {630, 631} <= graced_late


def test_derived_subkeys_follow_the_spec() -> None:
    doc = DOCS["sign.json"]
    for ring_name, ring in doc["keyrings"].items():
        for entry in ring["keys"]:
            secret = _ref_b64decode(entry["secret"])
            derived = doc["derived_subkeys"][ring_name][entry["kid"]]
            assert derived == {
                "mac_key": _ref_hkdf(secret, "statecodec/v1/sign/hmac-sha256").hex(),
                "aead_key": _ref_hkdf(secret, "statecodec/v1/encrypt/xchacha20-poly1305").hex(),
                "bind_key": _ref_hkdf(secret, "statecodec/v1/binding/hmac-sha256").hex(),
            }


# ------------------------------------------------------------------ reproducibility
def test_generator_reproduces_the_committed_files() -> None:
    built = _load_generator().build()
    assert sorted(built) == sorted(FILES)
    for name, text in built.items():
        on_disk = (VECTORS / name).read_bytes()
        assert text.encode("utf-8") == on_disk, f"{name} is stale: run python tests/vectors/generate.py"


def test_generator_check_mode(capsys: pytest.CaptureFixture[str]) -> None:
    assert _load_generator().main(["--check"]) == 0
