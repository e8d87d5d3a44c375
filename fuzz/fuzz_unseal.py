"""Coverage-guided fuzzing of the token parser and ``StateCodec.unseal`` (atheris + libFuzzer).

Every input is treated as a candidate ``requestState`` string and pushed through
``_format.parse`` and through a SIGN and an ENCRYPT codec that share one fixed key ring
and one fixed clock. The oracle is the security contract, not "no crash":

* only :class:`InvalidState` ever escapes, and never with reason ``internal_error``
  (that reason means an unexpected exception was caught: fail-closed, but still a bug);
* a token is accepted only if it is byte-identical to one this harness minted and the
  policy (key alive, not expired, not from the future, binding equal) says it is valid;
  and every such valid token IS accepted;
* ``parse`` is canonical: whatever it accepts re-encodes to exactly the input string;
* the "re-seal" path takes any input that parses, signs or encrypts its (fuzzed) header
  and body with the ring's key, and checks the codec's post-authentication checks (times,
  binding, size) against an independent re-statement of the policy. Without it a fuzzer
  could never get past the MAC, and that code would go unexercised.

Run (the corpus directory is created and grows; seeds are read only)::

    python fuzz/build_corpus.py /tmp/sc-seeds
    python fuzz/fuzz_unseal.py -max_total_time=3600 -timeout=10 /tmp/sc-corpus /tmp/sc-seeds

A crash writes ``crash-<sha1>`` (see ``-artifact_prefix``); copy it into
``fuzz/regressions/`` so tests/core/test_unseal_fuzz.py replays it forever.

:func:`check_one` holds all the logic and needs no atheris, so the tests (and a
hypothesis fallback) run exactly the same oracle.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import sys
from collections.abc import Iterator
from typing import Final, NamedTuple

try:  # atheris is optional (the `fuzz` extra); the oracle below works without it
    import atheris
except ImportError:  # pragma: no cover - depends on the machine
    atheris = None

# Coverage instrumentation only when run as the fuzzer: importers (the tests, the corpus
# builder) get the plain modules.
_FUZZING = atheris is not None and __name__ == "__main__"
with atheris.instrument_imports(include=["statecodec"]) if _FUZZING else contextlib.nullcontext():
    from nacl.bindings import crypto_aead_xchacha20poly1305_ietf_encrypt as _xc_encrypt

    from statecodec import Binding, InvalidState, Key, KeyRing, Mode, StateCodec, _format
    from statecodec._binding import UNBOUND
    from statecodec._codec import DEFAULT_MAX_FLOW_AGE, DEFAULT_MAX_ROUNDS

NOW: Final = 1_800_000_000
TTL: Final = 600
MAX_SKEW: Final = 60
EXPIRY_GRACE: Final = 30  # not the default 0, so that the two allowances are told apart
MAX_TOKEN_BYTES: Final = 4096


def _secret(label: str) -> bytes:
    # Recognisable, reproducible secrets: the seed corpus built in another process
    # must verify under this same ring.
    return hashlib.sha256(b"statecodec fuzz key " + label.encode()).digest()


RING: Final = KeyRing(
    [
        Key("fz-a", _secret("a"), created_at=NOW - 86400),
        Key("fz-b", _secret("b"), created_at=NOW - 3 * 86400),
        Key("fz-old", _secret("old"), created_at=NOW - 9 * 86400, retires_at=NOW - 1),
    ],
    primary="fz-a",
)
BINDING: Final = Binding(
    principal="user:alice",
    audience="https://mcp.example/",
    method="tools/call",
    target="book_flight",
    arguments={"from": "AMS", "to": "SFO", "passengers": 2},
)
BINDINGS: Final = (BINDING, UNBOUND)
CODECS: Final = {
    mode: StateCodec(
        RING,
        mode=mode,
        ttl=TTL,
        max_skew=MAX_SKEW,
        expiry_grace=EXPIRY_GRACE,
        max_token_bytes=MAX_TOKEN_BYTES,
        clock=lambda: NOW,
    )
    for mode in (Mode.SIGN, Mode.ENCRYPT)
}
_BY_CHAR: Final = {"s": Mode.SIGN, "e": Mode.ENCRYPT}


class Minted(NamedTuple):
    mode: Mode
    kid: str
    case: str  # which time case: fresh, in-skew-future, future, edge-expiring, expired
    payload: bytes
    binding: Binding
    valid: bool  # what the policy says at NOW


def _minted() -> Iterator[tuple[str, Minted]]:
    """Deterministic tokens: every key x mode x binding x time case x a few payloads."""
    payloads = (b"", b"x", b'{"step":2,"cart":[1,2,3]}', bytes(range(256)), b"\x00" * 700)
    times = {
        "fresh": NOW - 10,
        "in-skew-future": NOW + MAX_SKEW,
        "future": NOW + MAX_SKEW + 1,
        "edge-expiring": NOW - TTL - EXPIRY_GRACE + 1,  # NOW = exp + grace - 1: the last second
        "expired": NOW - TTL - EXPIRY_GRACE,  # NOW = exp + grace: a TTL is at most its TTL
    }
    valid_times = ("fresh", "in-skew-future", "edge-expiring")
    n = 0
    for mode, codec in CODECS.items():
        for key in RING.keys:
            for binding in BINDINGS:
                for label, iat in times.items():
                    for payload in payloads:
                        n += 1
                        rnd = hashlib.sha256(b"fuzz nonce %d" % n).digest()
                        token_id, suffix = rnd[:16], rnd[16:24] if mode is Mode.ENCRYPT else b""
                        token = codec._seal(
                            payload, binding, key, iat, TTL, token_id=token_id, nonce_suffix=suffix
                        )
                        valid = key.verifies_at(NOW) and label in valid_times
                        yield token, Minted(mode, key.kid, label, payload, binding, valid)


MINTED: Final = dict(_minted())


class ContractViolationError(AssertionError):
    """The codec broke its security contract on this input."""


def _fail(what: str, token: str) -> ContractViolationError:
    return ContractViolationError(f"{what}; token={token[:200]!r}{'...' if len(token) > 200 else ''}")


def _unseal(codec: StateCodec, token: str, binding: Binding) -> bytes | InvalidState:
    """Unseal and return the payload or the InvalidState; anything else propagates (a crash)."""
    try:
        return codec.unseal(token, binding).payload
    except InvalidState as exc:
        if exc.reason == "internal_error":
            raise _fail(f"internal_error escaped ({exc.detail})", token) from exc
        return exc


def _check_parse(token: str) -> _format.ParsedToken | None:
    try:
        parsed = _format.parse(token, MAX_TOKEN_BYTES)
    except InvalidState as exc:
        if exc.reason == "internal_error":
            raise _fail("parse raised internal_error", token) from exc
        return None
    raw = parsed.header + parsed.body + parsed.mac
    if _format.encode(parsed.prefix, raw) != token:
        raise _fail("parse accepted a non-canonical spelling", token)
    return parsed


def _check_minted_oracle(token: str) -> None:
    known = MINTED.get(token)
    for mode, codec in CODECS.items():
        for binding in BINDINGS:
            result = _unseal(codec, token, binding)
            should_accept = (
                known is not None and known.mode is mode and known.valid and known.binding == binding
            )
            if isinstance(result, bytes):
                if not should_accept:
                    raise _fail(f"{mode} codec accepted a token it must reject", token)
                assert known is not None
                if result != known.payload:
                    raise _fail("accepted token returned a different payload", token)
            elif should_accept:
                raise _fail(f"{mode} codec rejected a valid minted token ({result.reason})", token)


def _policy(parsed: _format.ParsedToken, key: Key, binding: Binding, token_len: int) -> str | None:
    """The unseal policy restated independently: the reason to reject, or None to accept."""
    if token_len > MAX_TOKEN_BYTES:
        return "too_large"
    if not key.verifies_at(NOW):
        return "unknown_key"
    if parsed.expires_at < parsed.issued_at or parsed.flow_started_at > parsed.issued_at:
        return "malformed"
    if parsed.expires_at + EXPIRY_GRACE <= NOW:
        return "expired"
    if parsed.issued_at > NOW + MAX_SKEW:
        return "not_yet_valid"
    if parsed.round > DEFAULT_MAX_ROUNDS:
        return "round_limit"
    if parsed.flow_started_at + DEFAULT_MAX_FLOW_AGE + EXPIRY_GRACE <= NOW:
        return "flow_expired"
    if not hmac.compare_digest(binding.tag(key), parsed.bind_tag):
        return "binding_mismatch"
    if parsed.not_before_ms and parsed.issued_at * 1000 + parsed.not_before_ms > NOW * 1000:
        return "too_early"
    return None


def _reseal(parsed: _format.ParsedToken, key: Key) -> tuple[str, bytes]:
    """Authenticate the fuzzed header and body with ``key``: a token the harness 'sealed'."""
    prefix_b = parsed.prefix.encode("ascii")
    if parsed.mode == "s":
        body = parsed.body
        mac = hmac.digest(key.mac_key, prefix_b + parsed.header + body, "sha256")
        return _format.encode(parsed.prefix, parsed.header + body + mac), body
    # ENCRYPT: the nonce is the token id followed by the 8-byte suffix after the header.
    suffix, plaintext = parsed.body[: _format.NONCE_SUFFIX_LEN], parsed.body[_format.NONCE_SUFFIX_LEN :]
    nonce = parsed.token_id + suffix
    sealed = _xc_encrypt(plaintext, prefix_b + parsed.header, nonce, key.aead_key)
    return _format.encode(parsed.prefix, parsed.header + suffix + sealed), plaintext


def _check_reseal_oracle(parsed: _format.ParsedToken) -> None:
    key = RING.get(parsed.kid)
    if key is None:
        return
    token, payload = _reseal(parsed, key)
    codec = CODECS[_BY_CHAR[parsed.mode]]
    for binding in BINDINGS:
        expected = _policy(parsed, key, binding, len(token))
        result = _unseal(codec, token, binding)
        if isinstance(result, bytes):
            if expected is not None:
                raise _fail(f"re-sealed token accepted, policy says {expected}", token)
            if result != payload:
                raise _fail("re-sealed token returned a different payload", token)
        elif result.reason != expected:
            raise _fail(f"re-sealed token rejected as {result.reason}, policy says {expected}", token)


def check_one(data: bytes) -> None:
    """The whole oracle for one input; raises on any violation. Used by atheris and pytest."""
    token = data.decode("utf-8", "surrogateescape")  # ASCII tokens map to themselves
    parsed = _check_parse(token)
    _check_minted_oracle(token)
    if parsed is not None:
        _check_reseal_oracle(parsed)


def main(argv: list[str]) -> None:
    if atheris is None:
        sys.exit("atheris is not installed: pip install --group fuzz (see docs/security.md)")
    atheris.Setup(argv, check_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
