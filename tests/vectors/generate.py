"""Deterministic generator of the statecodec v1 test vectors (docs/format.md).

Run ``python tests/vectors/generate.py`` to rewrite ``sign.json``, ``encrypt.json`` and
``negative.json`` next to this file; ``--check`` only compares. ``tests/core/test_vectors.py``
calls :func:`build` and asserts that the committed files are byte-identical, so any change
to the format shows up as a diff of the vectors, never silently.

Everything random in a real token is fixed here: key secrets, token ids and nonce suffixes
are SHA-256 of a label, and every case names its own clock. Tokens are minted through the
codec's private ``StateCodec._seal``, which takes the token id and the 8-byte nonce suffix
(the XChaCha20 nonce is ``tid || suffix``) as arguments precisely so that this file can
pin them (the public API always draws them from ``os.urandom``). Negative cases are
mutations of valid tokens; the few that must carry an *authentic* but impossible header
(expiry before issue) are MACed here by hand.

Why the vectors come from the code they check: made by ``statecodec``, they prove on their
own only that the format has not changed (any change is a diff to review). What shows them
right is independent of this file and of the package: the reference opener in
``tests/core/test_vectors.py``, written from docs/format.md alone (hashlib, hmac, PyNaCl,
rfc8785), reproduces every positive vector down to its subkeys, binding encoding, tag and
header, and the TypeScript package (``ts/``), a second implementation, is held to every
vector. A minter re-written here would be one more copy of the format to keep in step, not
more evidence: the one call that looks like the codec's own (``_seal`` with every field,
the random ones pinned) is deliberately a call of it.

Vector file layout (see also docs/format.md, "Test vectors")::

    {"format": ..., "keyrings": {NAME: <key ring JSON>}, "derived_subkeys": {...},
     "cases": [{"name", "description", "keyring", "mode", "ttl", "max_skew",
                "expiry_grace", "max_token_bytes", "now", "binding", "token", "expected",
                ...}]}

``now`` is a number of Unix seconds and may have a fraction: the verifier compares the
token's whole-second times with ``floor(now)`` (docs/format.md, step 10-11).

``binding`` is null for "no binding" or an object with ``principal``, ``audience``,
``method``, ``target`` (string or null), ``argument_digest`` (hex or null), ``extra``
(string to string) and, when the digest was computed from JSON arguments, ``arguments``.
``expected`` is either ``{"payload_hex", "kid", "issued_at", "expires_at", "token_id"}``
or ``{"reason"}``. Positive cases also carry ``intermediate`` values (binding encoding and
tag, header, canonical arguments, nonce) so an independent implementation can find which
step it gets wrong.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
if __name__ == "__main__":  # run as a script from a checkout without an installed package
    sys.path.insert(0, str(HERE.parent.parent))

from statecodec import Binding, KeyRing, StateCodec, argument_digest, canonical_json  # noqa: E402
from statecodec._keys import Key  # noqa: E402

FILES = ("sign.json", "encrypt.json", "negative.json")

NOW = 1_750_000_000  # 2025-06-15T15:06:40Z
RETIRE_AT = NOW + 3600  # when key "k2024a" of ring "main" stops verifying
LONG_KID = "vault:transit.statecodec-v1_0042"  # 32 characters, the maximum
MAX_U32 = 2**32 - 1
IAT = NOW - 100  # when a case's token was issued, unless it says otherwise
assert len(LONG_KID) == 32


def _fixed(label: str, n: int) -> bytes:
    """``n`` (<= 32) reproducible bytes standing in for randomness."""
    return hashlib.sha256(b"statecodec/test-vectors/" + label.encode()).digest()[:n]


def _key(kid: str, label: str, *, retires_at: int | None = None) -> Key:
    return Key(kid, _fixed("key/" + label, 32), NOW - 86_400 * 30, retires_at)


def _rings() -> dict[str, KeyRing]:
    main = KeyRing(
        [
            _key("k2024a", "k2024a", retires_at=RETIRE_AT),
            _key("k2025b", "k2025b"),
            _key("a", "a"),
            _key(LONG_KID, "long"),
        ],
        primary="k2025b",
    )
    # Same kid as main's primary but another secret, plus a kid main does not know.
    other = KeyRing([_key("k2025b", "other-k2025b"), _key("k9999", "k9999")], primary="k2025b")
    return {"main": main, "other": other}


RINGS = _rings()

FULL: dict[str, Any] = {
    "principal": "alice@example.com",
    "audience": "deploy-svc",
    "method": "tools/call",
    "target": "deploy_production",
    "arguments": {"version": "v2.1.0", "force": False, "replicas": 3},
    "extra": {"tenant": "acme", "session": "s-42"},
}
UNBOUND_SPEC: None = None


# ------------------------------------------------------------------ bindings
def _binding_json(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The vector's description of a binding: every field explicit, digest in hex."""
    if spec is None:
        return None
    out: dict[str, Any] = {k: spec.get(k) for k in ("principal", "audience", "method", "target")}
    if "arguments" in spec:
        out["arguments"] = spec["arguments"]
        out["argument_digest"] = argument_digest(spec["arguments"]).hex()
    else:
        out["argument_digest"] = None
    out["extra"] = dict(spec.get("extra", {}))
    return out


def binding_from_json(doc: dict[str, Any] | None) -> Binding | None:
    """Build the Binding a vector describes (``None`` means unbound)."""
    if doc is None:
        return None
    digest = doc.get("argument_digest")
    return Binding(
        doc.get("principal"),
        doc.get("audience"),
        doc.get("method"),
        doc.get("target"),
        argument_digest=None if digest is None else bytes.fromhex(digest),
        extra=doc.get("extra") or None,
    )


def _with(spec: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = dict(spec)
    for name, value in changes.items():
        if value is _DROP:
            out.pop(name, None)
        else:
            out[name] = value
    return out


_DROP = object()


# ------------------------------------------------------------------ token surgery
def _split(token: str) -> tuple[str, bytes]:
    prefix, body = token[:5], token[5:]
    return prefix, base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def _join(prefix: str, raw: bytes) -> str:
    return prefix + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _flip(token: str, index: int, mask: int = 0x01) -> str:
    """Flip bits of decoded byte ``index`` (negative counts from the end), re-encode canonically."""
    prefix, raw = _split(token)
    buf = bytearray(raw)
    buf[index] ^= mask
    return _join(prefix, bytes(buf))


def _replace_raw(token: str, start: int, end: int, new: bytes) -> str:
    prefix, raw = _split(token)
    return _join(prefix, raw[:start] + new + raw[end:])


def _header_len(kid: str, flow: tuple[bytes, int, int] | None = None, not_before_ms: int = 0) -> int:
    return 1 + len(kid) + 8 + 16 + 16 + (21 if flow else 0) + (4 if not_before_ms else 0)


def _first_tid(label: str) -> bytes:
    """The flow id of a chained case: the token id its (unpublished) first round had."""
    return _fixed("tid/" + label + "/first", 16)


# ------------------------------------------------------------------ the generator
class _Mint(NamedTuple):
    """What a vector's token is minted from: the codec's settings and ``_seal``'s every field.

    A case names only what sets it apart: by default its token is issued at ``IAT``, bound
    to ``FULL`` and minted by ring "main"'s primary key.
    """

    mode: str
    payload: bytes
    binding: dict[str, Any] | None = FULL
    iat: int = IAT
    ttl: int = 600
    ring: str = "main"
    kid: str = "k2025b"
    max_token_bytes: int = 8192
    flow: tuple[int, int] | None = None  # (round, flow start) of a later round of a flow
    not_before_ms: int = 0

    def key(self) -> Key:
        return RINGS[self.ring].require(self.kid)

    def chained(self, label: str) -> tuple[bytes, int, int] | None:
        """The flow fields as ``_seal`` takes them, the flow id that of the case ``label``."""
        return None if self.flow is None else (_first_tid(label), *self.flow)


class _Builder:
    def __init__(self) -> None:
        self.files: dict[str, list[dict[str, Any]]] = {name: [] for name in FILES}

    def seal(self, label: str, **mint: Any) -> str:
        """The token of a :class:`_Mint` (``mint`` its fields), its randomness fixed by ``label``."""
        return self._seal(label, _Mint(**mint))

    @staticmethod
    def _seal(label: str, m: _Mint) -> str:
        codec = StateCodec(RINGS[m.ring], mode=m.mode, ttl=m.ttl, max_token_bytes=m.max_token_bytes)
        # ENCRYPT's nonce is tid || an 8-byte suffix; only the suffix is drawn separately.
        nonce_suffix = _fixed("nonce/" + label, 8) if m.mode == "encrypt" else b""
        b = binding_from_json(_binding_json(m.binding)) or Binding()
        token_id = _fixed("tid/" + label, 16)
        return codec._seal(
            m.payload,
            b,
            m.key(),
            m.iat,
            m.ttl,
            token_id=token_id,
            nonce_suffix=nonce_suffix,
            flow=m.chained(label),
            not_before_ms=m.not_before_ms,
        )

    def positive(
        self,
        name: str,
        description: str,
        payload: bytes,
        mode: str = "sign",
        *,
        now: float = NOW,
        max_skew: int = 60,
        expiry_grace: int = 0,
        budgets: dict[str, int | None] | None = None,
        **mint: Any,
    ) -> None:
        """A case that opens: the token of ``mint`` (:class:`_Mint`'s fields) verified at ``now``."""
        m = _Mint(mode, payload, **mint)
        token = self._seal(name, m)
        flow = m.chained(name)
        bjson = _binding_json(m.binding)
        b = binding_from_json(bjson) or Binding()
        _, raw = _split(token)
        intermediate: dict[str, Any] = {
            "binding_encoded": b.encoded.hex(),
            "binding_tag": b.tag(m.key()).hex(),
            "header": raw[: _header_len(m.kid, flow, m.not_before_ms)].hex(),
        }
        if m.binding is not None and "arguments" in m.binding:
            intermediate["canonical_arguments"] = canonical_json(m.binding["arguments"]).decode("utf-8")
        if m.mode == "encrypt":
            intermediate["nonce"] = (_fixed("tid/" + name, 16) + _fixed("nonce/" + name, 8)).hex()
        times = (m.ttl, max_skew, expiry_grace, now)
        case = self._case(name, description, m.mode, m.ring, times, m.max_token_bytes, bjson, token)
        case["expected"] = {
            "payload_hex": m.payload.hex(),
            "kid": m.kid,
            "issued_at": m.iat,
            "expires_at": m.iat + m.ttl,
            "token_id": _fixed("tid/" + name, 16).hex(),
        }
        if flow is not None or m.not_before_ms:
            # Flow cases only: the cases of before flows keep their exact text.
            flow_id, round_, started = flow or (_fixed("tid/" + name, 16), 1, m.iat)
            case.update(budgets or {})
            case["expected"].update(flow_id=flow_id.hex(), round=round_, flow_started_at=started)
            case["expected"]["not_before"] = m.iat + m.not_before_ms / 1000 if m.not_before_ms else None
        case["intermediate"] = intermediate
        self.files["sign.json" if m.mode == "sign" else "encrypt.json"].append(case)

    def negative(
        self,
        name: str,
        description: str,
        reason: str,
        token: str,
        mode: str = "sign",
        *,
        binding: dict[str, Any] | None = FULL,
        now: float = NOW,
        ttl: int = 600,
        max_skew: int = 60,
        expiry_grace: int = 0,
        ring: str = "main",
        max_token_bytes: int = 8192,
        budgets: dict[str, int | None] | None = None,
    ) -> None:
        times = (ttl, max_skew, expiry_grace, now)
        case = self._case(
            name, description, mode, ring, times, max_token_bytes, _binding_json(binding), token
        )
        case.update(budgets or {})
        case["expected"] = {"reason": reason}
        self.files["negative.json"].append(case)

    def refusing(self, reason: str, **options: Any) -> Callable[..., None]:
        """Cases that fail with ``reason``: ``case(name, description, token, mode="sign", **options)``.

        ``options`` given here hold for every case of the group, a case's own win.
        """

        def case(name: str, description: str, token: str, mode: str = "sign", **more: Any) -> None:
            self.negative(name, description, reason, token, mode, **{**options, **more})

        return case

    @staticmethod
    def _case(
        name: str,
        description: str,
        mode: str,
        ring: str,
        times: tuple[int, int, int, float],
        max_token_bytes: int,
        binding: dict[str, Any] | None,
        token: str,
    ) -> dict[str, Any]:
        ttl, max_skew, expiry_grace, now = times
        return {
            "name": name,
            "description": description,
            "keyring": ring,
            "mode": mode,
            "ttl": ttl,
            "max_skew": max_skew,
            "expiry_grace": expiry_grace,
            "max_token_bytes": max_token_bytes,
            "now": now,
            "binding": binding,
            "token": token,
        }


def _positives(g: _Builder) -> None:
    jcs_args = {
        "tiny": 1e-7,
        "round": 100.0,
        "huge": 1e21,
        "\ue000": "private use area key (sorts after the astral key in UTF-16)",
        "\U0001f600": "astral key",
        "nested": {"b": [1, 2.5, None, True, "caf\u00e9"], "a": "\u0007 control"},
    }
    for mode in ("sign", "encrypt"):
        m = mode[0]
        g.positive(f"{m}-empty-unbound", "empty payload, no binding", b"", mode, binding=UNBOUND_SPEC)
        g.positive(
            f"{m}-full-binding",
            "text payload bound to every field and two extra pairs",
            b'{"step":2,"answers":{"confirm":true}}',
            mode,
        )
        g.positive(
            f"{m}-binary-payload",
            "all 256 byte values, bound to a principal only",
            bytes(range(256)),
            mode,
            binding={"principal": "bob"},
        )
        g.positive(
            f"{m}-jcs-arguments",
            "arguments that need RFC 8785 (floats, UTF-16 key order)",
            "\u00e9tat \u2713".encode(),
            mode,
            binding={"method": "tools/call", "arguments": jcs_args},
        )
        g.positive(f"{m}-kid-1", "one-character kid", b"x", mode, kid="a")
        g.positive(f"{m}-kid-32", "32-character kid, the maximum", b"x", mode, kid=LONG_KID)
        g.positive(
            f"{m}-verify-only-key",
            "a non-primary key one second before it retires",
            b"old key",
            mode,
            iat=RETIRE_AT - 100,
            now=RETIRE_AT - 1,
            kid="k2024a",
        )
        g.positive(
            f"{m}-just-before-exp",
            "ttl 600, expiry_grace 0: now = exp - 0.001 is accepted (valid while now < exp)",
            b"edge",
            mode,
            now=IAT + 599.999,
        )
        g.positive(
            f"{m}-iat-at-max-skew",
            "max_skew 60: iat = now + 60, issued 60 s in the future, is accepted",
            b"skew",
            mode,
            iat=NOW + 60,
        )
    g.positive(
        "s-empty-strings",
        "present-but-empty fields differ from absent ones",
        b"e",
        binding={
            "principal": "",
            "audience": "",
            "method": "",
            "target": "",
            "arguments": {},
            "extra": {"": ""},
        },
    )
    g.positive(
        "s-extra-only",
        "only extra pairs (sorted by key), non-ASCII text",
        b"e",
        binding={"extra": {"z\u00fcrich": "\u2603", "a": "1", "B": "2"}},
    )
    g.positive(
        "s-null-arguments",
        "arguments = JSON null is bound (digest of 'null'), unlike no arguments",
        b"n",
        binding={"arguments": None},
    )
    g.positive(
        "s-last-whole-second",
        "now = exp - 1: floor(now) = exp - 1, the last whole second accepted",
        b"e",
        now=IAT + 599,
    )
    g.positive(
        "s-within-max-skew-fraction",
        "now = iat - 59.5: issued 59.5 s in the future, within max_skew 60",
        b"e",
        now=IAT - 59.5,
    )
    g.positive(
        "s-expiry-grace-last-second",
        "expiry_grace 30: now = exp + 29.5 is accepted (valid while now < exp + 30)",
        b"e",
        now=IAT + 629.5,
        expiry_grace=30,
    )
    g.positive("s-ttl-1", "ttl of one second", b"t", iat=NOW, ttl=1, max_skew=0)
    g.positive(
        "s-max-time",
        "exp = 2**32 - 1, the last representable second (2106-02-07)",
        b"2106",
        iat=MAX_U32 - 600,
        now=MAX_U32 - 300,
    )
    g.positive(
        "s-at-size-cap",
        "token exactly max_token_bytes (128) characters long",
        b"q" * 18,
        binding=UNBOUND_SPEC,
        kid="a",
        max_token_bytes=128,
    )
    g.positive(
        "e-at-size-cap",
        "token exactly max_token_bytes (128) characters long",
        b"q" * 26,
        "encrypt",
        binding=UNBOUND_SPEC,
        kid="a",
        max_token_bytes=128,
    )


def _negatives(g: _Builder) -> None:
    base = {
        m: g.seal(f"base-{m}", mode=m, payload=p) for m, p in (("sign", b"state:1"), ("encrypt", b"state:12"))
    }
    s, e = base["sign"], base["encrypt"]
    # Body lengths 3 and 2 (mod 4): both kinds of unused trailing bits get a case.
    assert (len(s) - 5) % 4 == 3 and (len(e) - 5) % 4 == 2
    hl = _header_len("k2025b")

    # Shape and encoding, rejected before any key is looked up.
    malformed = g.refusing("malformed")
    malformed("empty-string", "the empty string", "")
    malformed("no-prefix", "no sc1 prefix", s[5:])
    malformed("prefix-uppercase", "prefixes are case-sensitive", "SC1S." + s[5:])
    malformed("prefix-only", "prefix with an empty body", "sc1s.")
    malformed("b64-padding", "standard '=' padding", s + "=")
    malformed("b64-padding-encrypt", "standard '==' padding", e + "==", "encrypt")
    malformed("b64-trailing-newline", "trailing newline", s + "\n")
    malformed("b64-inner-space", "a space inside the body", s[:40] + " " + s[40:])
    malformed("b64-std-alphabet", "'+' from the standard alphabet", s[:30] + "+" + s[31:])
    malformed("b64-impossible-length", "body length = 1 (mod 4)", _trim_to_rem(s, 1))
    unused_bits = "non-zero unused bits in the last character"
    malformed("b64-trailing-bits", unused_bits, _set_trailing_bits(s))
    malformed("b64-trailing-bits-encrypt", unused_bits, _set_trailing_bits(e), "encrypt")
    malformed("truncated-header", "cut inside the header", s[: 5 + 40])
    malformed(
        "truncated-encrypt",
        "shorter than header + nonce suffix + tag",
        _replace_raw(e, hl + 20, 10_000, b""),
        "encrypt",
    )
    malformed("kid-length-0", "kid_len = 0", _replace_raw(s, 0, 1, b"\x00"))
    malformed("kid-length-33", "kid_len = 33", _replace_raw(s, 0, 1, b"\x21"))
    malformed("kid-bad-char", "kid byte '/' outside [A-Za-z0-9._:-]", _replace_raw(s, 1, 2, b"/"))
    malformed(
        "exp-before-iat",
        "authentic header (valid MAC) with exp < iat",
        _forge_sign(IAT, IAT - 1, b"state", FULL),
        now=IAT,
    )

    # Judged first, on the text length, before anything else.
    too_large = g.refusing("too_large", max_token_bytes=128)
    big = g.seal("big", mode="sign", payload=b"q" * 19, binding=None, kid="a", max_token_bytes=8192)
    too_large("too-large", "a valid token one character over max_token_bytes", big, binding=None)
    too_large("too-large-garbage", "size is judged before the prefix", "!" * 129)

    unsupported = g.refusing("unsupported_version")
    unsupported("version-2", "format version 2 is unknown", "sc2s." + s[5:])
    unsupported("version-10", "format version 10 is unknown", "sc10e." + e[5:], "encrypt")
    unsupported("mode-x", "unknown mode letter in version 1", "sc1x." + s[5:])

    def foreign(label: str, mode: str) -> str:
        """A token of ring "other"'s key k9999, a kid ring "main" does not know."""
        return g.seal(label, mode=mode, payload=b"x", ring="other", kid="k9999")

    wrong_mode = g.refusing("wrong_mode")
    wrong_mode("encrypt-token-to-sign", "an ENCRYPT token given to a SIGN verifier", e)
    wrong_mode("sign-token-to-encrypt", "a SIGN token given to an ENCRYPT verifier", s, "encrypt")
    wrong_mode("wrong-mode-before-kid", "wrong mode is judged before the kid", foreign("other-e", "encrypt"))

    unknown_key = g.refusing("unknown_key")
    unknown_key("unknown-kid", "kid k9999 is not in the ring", foreign("other-s", "sign"))
    unknown_key(
        "unknown-kid-encrypt", "kid k9999 is not in the ring", foreign("other-e2", "encrypt"), "encrypt"
    )
    for label, mode in (("retired", "sign"), ("retired-e", "encrypt")):
        retired = g.seal(label, mode=mode, payload=b"x", iat=RETIRE_AT - 100, kid="k2024a")
        name = "retired-key" + ("" if mode == "sign" else "-encrypt")
        unknown_key(name, "now = retires_at: the key no longer verifies", retired, mode, now=RETIRE_AT)

    # Authentication fails.
    tampered = g.refusing("tampered")
    for m, t in (("sign", s), ("encrypt", e)):
        tampered(
            f"{m}-flip-header-iat",
            "flipped bit in the issued-at field (a header byte)",
            _flip(t, 1 + 6 + 3),
            m,
        )
        tampered(f"{m}-flip-token-id", "flipped bit in the token id", _flip(t, 1 + 6 + 8), m)
        tampered(f"{m}-flip-binding-tag", "flipped bit in the binding tag", _flip(t, hl - 1, 0x80), m)
        tampered(f"{m}-flip-last-byte", "flipped bit in the MAC / AEAD tag", _flip(t, -1), m)
        cross = g.seal(f"cross-{m}", mode=m, payload=b"state", ring="other")
        tampered(f"{m}-cross-key-same-kid", "same kid, another secret", cross, m)
        tampered(
            f"{m}-truncated-3-bytes",
            "last 3 bytes cut off, re-encoded canonically",
            _replace_raw(t, -3, 10_000, b""),
            m,
        )
        tampered(
            f"{m}-appended-bytes",
            "3 zero bytes appended, re-encoded canonically",
            _replace_raw(t, 10_000, 10_000, b"\0\0\0"),
            m,
        )
        tampered(
            f"{m}-kid-swapped",
            "kid changed to another key of the ring (same length)",
            _replace_raw(t, 0, 7, b"\x06k2024a"),
            m,
        )
    tampered("sign-flip-payload", "flipped bit in the readable payload", _flip(s, hl))
    tampered(
        "encrypt-flip-nonce",
        "flipped bit in the nonce suffix (the nonce's other 16 bytes are the token id)",
        _flip(e, hl + 5),
        "encrypt",
    )
    tampered("encrypt-flip-ciphertext", "flipped bit in the ciphertext", _flip(e, hl + 8), "encrypt")
    relabel = g.seal("relabel", mode="sign", payload=b"long enough to parse as nonce+tag")
    tampered(
        "sign-body-relabelled-encrypt",
        "a SIGN token's body under the sc1e. prefix",
        "sc1e." + relabel[5:],
        "encrypt",
    )
    tampered(
        "tampered-beats-expired",
        "tampered and expired: authentication is judged first",
        _flip(s, -1),
        now=NOW + 10_000,
    )

    expired = g.refusing("expired")
    for mode, token in (("sign", s), ("encrypt", e)):
        expired(
            f"expired-at-exp{'' if mode == 'sign' else '-encrypt'}",
            "ttl 600, expiry_grace 0: now = exp, 600 s after iat, is expired (a TTL is at most its TTL)",
            token,
            mode,
            now=IAT + 600,
        )
    expired(
        "expired-at-exp-plus-fraction",
        "ttl 600, expiry_grace 0: now = exp + 0.5, 600.5 s after iat",
        s,
        now=IAT + 600.5,
    )
    expired(
        "expired-at-expiry-grace",
        "expiry_grace 30: now = exp + 30 is expired",
        s,
        now=IAT + 630,
        expiry_grace=30,
    )
    plus_1 = "ttl 600, expiry_grace 0: now = exp + 1, 601 s after iat"
    expired("expired-at-exp-plus-1", plus_1, s, now=IAT + 601)
    expired("expired-at-exp-plus-1-encrypt", plus_1, e, "encrypt", now=IAT + 601)
    expired(
        "expired-beyond-expiry-grace", "expiry_grace 30: now = exp + 31", s, now=IAT + 631, expiry_grace=30
    )
    expired(
        "expired-max-skew-does-not-extend-expiry",
        "max_skew 3600, expiry_grace 0: now = exp is expired",
        s,
        now=IAT + 600,
        max_skew=3600,
    )
    expired("expired-encrypt", "a day later", e, "encrypt", now=NOW + 86_400)
    expired(
        "expired-beats-binding",
        "expired and mis-bound: times are judged before the binding",
        s,
        now=NOW + 86_400,
        binding=_with(FULL, principal="mallory"),
    )

    not_yet_valid = g.refusing("not_yet_valid")
    ahead_61 = "max_skew 60: iat = now + 61, issued 61 s in the future"
    not_yet_valid("not-yet-valid", ahead_61, s, now=IAT - 61)
    not_yet_valid(
        "not-yet-valid-fraction",
        "max_skew 60: now = iat - 60.25, issued 60.25 s in the future",
        s,
        now=IAT - 60.25,
    )
    not_yet_valid(
        "not-yet-valid-expiry-grace-does-not-extend-skew",
        "max_skew 0, expiry_grace 3600: iat = now + 1",
        s,
        now=IAT - 1,
        max_skew=0,
        expiry_grace=3600,
    )
    not_yet_valid("not-yet-valid-encrypt", ahead_61, e, "encrypt", now=IAT - 61)

    mismatch = g.refusing("binding_mismatch")
    for field, value in (
        ("principal", "mallory@example.com"),
        ("audience", "billing-svc"),
        ("method", "prompts/get"),
        ("target", "deploy_staging"),
    ):
        mismatch(f"binding-{field}", f"another {field}", s, binding=_with(FULL, **{field: value}))
    other_arguments = _with(FULL, arguments={"version": "v2.1.1", "force": False, "replicas": 3})
    mismatch("binding-arguments", "another argument value", e, "encrypt", binding=other_arguments)
    mismatch(
        "binding-arguments-absent",
        "arguments bound at seal, absent at unseal",
        s,
        binding=_with(FULL, arguments=_DROP),
    )
    no_principal = g.seal("no-principal", mode="sign", payload=b"x", binding=_with(FULL, principal=_DROP))
    mismatch(
        "binding-principal-empty-vs-absent",
        "principal '' at unseal, absent at seal",
        no_principal,
        binding=_with(FULL, principal=""),
    )
    more_extra = _with(FULL, extra={**FULL["extra"], "region": "eu"})
    mismatch("binding-extra-added", "an extra pair more at unseal", s, binding=more_extra)
    other_extra = _with(FULL, extra={"tenant": "evil", "session": "s-42"})
    mismatch("binding-extra-value", "an extra value differs", e, "encrypt", binding=other_extra)
    mismatch("binding-none-at-unseal", "bound token, no binding at unseal", s, binding=None)
    unbound = g.seal("unbound", mode="sign", payload=b"x", binding=None)
    mismatch("binding-unbound-token", "unbound token, a binding at unseal", unbound)


def _trim_to_rem(token: str, rem: int) -> str:
    body = token[5:]
    while len(body) % 4 != rem:
        body = body[:-1]
    return token[:5] + body


_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _set_trailing_bits(token: str) -> str:
    """Set the lowest (unused) bit of the last character: decodes to the same bytes, but is not canonical."""
    body = token[5:]
    assert len(body) % 4 in (2, 3), "needs a body with unused trailing bits"
    last = _ALPHABET[_ALPHABET.index(body[-1]) | 1]
    return token[:5] + body[:-1] + last


def _forge_sign(iat: int, exp: int, payload: bytes, binding: dict[str, Any]) -> str:
    """A SIGN token with an authentic MAC over a header pack_header() refuses to make."""
    key = RINGS["main"].require("k2025b")
    b = binding_from_json(_binding_json(binding))
    assert b is not None
    header = b"\x06k2025b" + struct.pack(">II", iat, exp) + _fixed("tid/forged", 16) + b.tag(key)
    mac = hmac.digest(key.mac_key, b"sc1s." + header + payload, "sha256")
    return _join("sc1s.", header + payload + mac)


def _flows(g: _Builder) -> None:
    """Chained (later rounds of a flow) and paced tokens: the CHAINED and PACED flags."""
    hl = _header_len("k2025b")
    for mode in ("sign", "encrypt"):
        m = mode[0]
        g.positive(
            f"{m}-chained-round-2",
            "the second round of a flow that started 30 s before it",
            b'{"asked":["region"]}',
            mode,
            flow=(2, IAT - 30),
        )
        g.positive(
            f"{m}-chained-paced",
            "round 3, paced: redeemable 1.5 s after iat; now is 2 s after iat",
            b'{"waiting":"approval"}',
            mode,
            now=IAT + 2,
            flow=(3, IAT - 60),
            not_before_ms=1500,
        )
        g.positive(
            f"{m}-paced-first-round-edge",
            "a first round paced 250 ms, redeemed exactly at its not-before time",
            b"",
            mode,
            binding=UNBOUND_SPEC,
            now=IAT + 0.25,
            not_before_ms=250,
        )
        g.positive(
            f"{m}-round-at-limit",
            "round 10 of a flow, max_rounds 10: the last one allowed",
            b"r10",
            mode,
            flow=(10, IAT - 300),
            budgets={"max_rounds": 10},
        )
        chained = g.seal(f"{m}-flow-base", mode=mode, payload=b"r2", flow=(2, IAT - 30))
        over = g.seal(f"{m}-round-11", mode=mode, payload=b"r11", flow=(11, IAT - 300))
        g.negative(
            f"{m}-round-limit",
            "round 11 of a flow (minted by a looser instance), max_rounds 10",
            "round_limit",
            over,
            mode,
            budgets={"max_rounds": 10},
        )
        old = g.seal(f"{m}-old-flow", mode=mode, payload=b"r4", flow=(4, NOW - 3601))
        g.negative(
            f"{m}-flow-expired",
            "a fresh token (issued 100 s ago) of a flow started 3601 s ago, max_flow_age 3600",
            "flow_expired",
            old,
            mode,
            budgets={"max_flow_age": 3600},
        )
        paced = g.seal(f"{m}-paced", mode=mode, payload=b"", not_before_ms=1500)
        g.negative(
            f"{m}-too-early",
            "paced 1.5 s, retried 1.499 s after iat: too early (not consumed)",
            "too_early",
            paced,
            mode,
            now=IAT + 1.499,
        )
        g.negative(
            f"{m}-too-early-wrong-binding",
            "too early AND bound to another principal: the binding is judged first",
            "binding_mismatch",
            paced,
            mode,
            binding=_with(FULL, principal="mallory@example.com"),
            now=IAT + 1.0,
        )
        for what, at in (("flow-id", hl), ("round", hl + 16), ("flow-start", hl + 17)):
            g.negative(
                f"{m}-flip-{what}",
                f"flipped bit in the {what.replace('-', ' ')}: a state grafted onto another flow",
                "tampered",
                _flip(chained, at),
                mode,
            )
        g.negative(
            f"{m}-unchained-flag-cleared",
            "the CHAINED flag cleared and the flow fields cut out: tampered",
            "tampered",
            _unchain(chained),
            mode,
        )
    key = RINGS["main"].require("k2025b")
    round_2 = g.seal("s-r1", mode="sign", payload=b"", flow=(2, IAT))
    g.negative(
        "s-chained-round-1",
        "a CHAINED token claiming round 1 (round 1 is spelled unchained): malformed before the MAC",
        "malformed",
        _replace_raw(round_2, hl + 16, hl + 17, b"\x01"),
    )
    paced_7 = g.seal("s-p0", mode="sign", payload=b"", not_before_ms=7)
    g.negative(
        "s-paced-zero-wait",
        "a PACED token with a wait of 0 ms: malformed before the MAC",
        "malformed",
        _replace_raw(paced_7, hl, hl + 4, bytes(4)),
    )
    # An authentic MAC over a flow that starts after the token was issued.
    b = binding_from_json(_binding_json(FULL))
    assert b is not None
    header = b"".join(
        (
            bytes((0x80 | 6,)) + b"k2025b",
            struct.pack(">II", IAT, IAT + 600),
            _fixed("tid/late-flow", 16),
            b.tag(key),
            _first_tid("late-flow") + b"\x02" + struct.pack(">I", IAT + 1),
        )
    )
    mac = hmac.digest(key.mac_key, b"sc1s." + header + b"x", "sha256")
    g.negative(
        "s-flow-starts-after-iat",
        "authentic, but its flow starts a second after the token was issued: malformed",
        "malformed",
        _join("sc1s.", header + b"x" + mac),
    )


def _unchain(token: str) -> str:
    prefix, raw = _split(token)
    hl = _header_len("k2025b")
    return _join(prefix, bytes((raw[0] & 0x3F,)) + raw[1:hl] + raw[hl + 21 :])


def build() -> dict[str, str]:
    """Every vector file's exact text, keyed by file name."""
    g = _Builder()
    _positives(g)
    _negatives(g)
    _flows(g)
    rings = {name: ring.to_dict() for name, ring in RINGS.items()}
    derived = {
        name: {
            k.kid: {"mac_key": k.mac_key.hex(), "aead_key": k.aead_key.hex(), "bind_key": k.bind_key.hex()}
            for k in ring.keys
        }
        for name, ring in RINGS.items()
    }
    out = {}
    for fname, cases in g.files.items():
        doc = {
            "format": "statecodec token format v1 (sc1s. / sc1e.), see docs/format.md",
            "generator": "tests/vectors/generate.py",
            "keyrings": rings,
            "derived_subkeys": derived,
            "cases": cases,
        }
        out[fname] = json.dumps(doc, indent=2, ensure_ascii=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the files on disk, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for fname, text in build().items():
        path = HERE / fname
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(fname)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({text.count(chr(10))} lines)")
    if stale:
        print("stale vector files: " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
