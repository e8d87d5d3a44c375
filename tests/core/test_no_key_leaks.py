"""No key material in logs, reprs, exception messages or CLI output.

Keys here have recognisable secrets (an ASCII marker and a binary one). Every way to
use or break a codec is exercised with every logger at DEBUG, and everything a person
or a log pipeline could see is scanned for any 8-byte window of the secrets or of their
derived subkeys, raw, escaped as in a bytes repr, in hex, base64 and base64url.
"""

from __future__ import annotations

import base64
import hmac
import logging
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from statecodec import Binding, InvalidState, Key, KeyRing, Mode, StateCodec
from statecodec.replay.memory import MemoryReplayStore

ASCII_MARKER = b"<<Zq7#SECRET~MARKER~Kp2@Wv5$Lm8>>"  # 33 bytes, nothing a log says by chance
BINARY_MARKER = bytes.fromhex("5ec7e7000102fffe80c0ffee0badf00ddeadbeefcafebabe0123456789abcdef")
NOW = 1_760_000_000
WINDOW = 8


def _material(key: Key) -> list[bytes]:
    return [key.secret, key.mac_key, key.aead_key, key.bind_key]


KEY_A = Key("marker-a", ASCII_MARKER, created_at=NOW - 100)
KEY_B = Key("marker-b", BINARY_MARKER, created_at=NOW - 200)
RING = KeyRing([KEY_A, KEY_B], "marker-a")
SECRETS = [m for k in (KEY_A, KEY_B) for m in _material(k)]


def _forms(secret: bytes) -> Iterator[str]:
    """Every WINDOW-byte slice of ``secret`` in every textual encoding a leak could take."""
    for i in range(len(secret) - WINDOW + 1):
        part = secret[i : i + WINDOW]
        yield part.decode("latin-1")
        yield repr(part)[2:-1]  # as inside b'...'
        yield part.hex()
        yield part.hex().upper()
        yield part.hex(":")
    for i in range(len(secret) - 9 + 1):  # 9 bytes = 12 base64 characters, no padding
        part = secret[i : i + 9]
        yield base64.b64encode(part).decode()
        yield base64.urlsafe_b64encode(part).decode()


FORMS = {form: secret.hex()[:8] for secret in SECRETS for form in _forms(secret)}


def leaks(text: str) -> list[str]:
    return sorted({f"{FORMS[f]}.. as {f!r}" for f in FORMS if f in text})


def test_the_scanner_finds_each_encoding() -> None:
    # The scan must be able to fail, for every encoding of every secret it claims to cover.
    for secret in SECRETS:
        for encoded in (
            secret.decode("latin-1"),
            repr(secret),
            secret.hex(),
            secret[5:20].hex(),
            base64.b64encode(secret).decode(),
            base64.urlsafe_b64encode(secret[1:]).decode().rstrip("="),
            base64.b64encode(secret[2:]).decode(),
        ):
            assert leaks(f"log line: {encoded} end"), encoded
    assert leaks("nothing to see here, kid=marker-a token=sc1s.AAAA") == []


class Seen:
    """Everything an operator could see: log records (formatted, with tracebacks) and text."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.texts: list[str] = []

    def add(self, *objects: object) -> None:
        for obj in objects:
            self.texts += [repr(obj), str(obj)]
            if isinstance(obj, BaseException):
                self.texts.append("".join(traceback.format_exception(obj)))
                self.texts += [repr(v) for v in vars(obj).values()]

    def expect_invalid(self, call: Callable[[], Any], reason: str) -> InvalidState:
        with pytest.raises(InvalidState) as info:
            call()
        assert info.value.reason == reason, info.value
        self.add(info.value)
        return info.value

    def all_text(self) -> str:
        formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
        records = [formatter.format(r) for r in self.caplog.records]
        return "\n".join(self.texts + records + [self.caplog.text])


@pytest.fixture
def seen(caplog: pytest.LogCaptureFixture) -> Iterator[Seen]:
    caplog.set_level(logging.DEBUG)
    observed = Seen(caplog)
    yield observed
    assert observed.all_text(), "nothing was captured: the scan would prove nothing"
    assert leaks(observed.all_text()) == []


@pytest.mark.parametrize("mode", [Mode.SIGN, Mode.ENCRYPT], ids=str)
def test_codec_errors_reprs_and_logs_carry_no_key_material(seen: Seen, mode: Mode) -> None:
    clock = [float(NOW)]
    store = MemoryReplayStore(max_entries=2, clock=lambda: clock[0])
    codec = StateCodec(RING, mode=mode, ttl=60, replay=store, clock=lambda: clock[0])
    binding = Binding(principal="alice", audience="aud", method="tools/call", target="t", arguments={"q": 1})
    token = codec.seal(b"payload", binding)
    opened = codec.unseal(token, binding)
    seen.add(codec, RING, KEY_A, KEY_B, binding, opened, store, RING.keys, KEY_A.public_dict())

    seen.expect_invalid(lambda: codec.unseal(token, binding), "replayed")
    tampered = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    seen.expect_invalid(lambda: codec.unseal(tampered, binding), "tampered")
    other = StateCodec(KeyRing.generate("stranger"), mode=mode).seal(b"x", binding)
    seen.expect_invalid(lambda: codec.unseal(other, binding), "unknown_key")
    wrong_mode = StateCodec(RING, mode=Mode.ENCRYPT if mode is Mode.SIGN else Mode.SIGN).seal(b"x")
    seen.expect_invalid(lambda: codec.unseal(wrong_mode, binding), "wrong_mode")
    fresh = codec.seal(b"p", binding)
    seen.expect_invalid(lambda: codec.unseal(fresh, binding.replace(principal="bob")), "binding_mismatch")
    clock[0] += 3600
    seen.expect_invalid(lambda: codec.unseal(fresh, binding), "expired")
    clock[0] -= 3600

    # store down: a real memory store that is full of live entries refuses to answer
    assert codec.unseal(codec.seal(b"fill", binding), binding)
    seen.expect_invalid(lambda: codec.unseal(codec.seal(b"more", binding), binding), "store_unavailable")

    retired = StateCodec(RING.retire("marker-b", NOW - 1), mode=mode, clock=lambda: clock[0])
    by_b = StateCodec(RING.with_primary("marker-b"), mode=mode, clock=lambda: clock[0]).seal(b"x")
    seen.expect_invalid(lambda: retired.unseal(by_b), "unknown_key")


def test_internal_errors_from_the_crypto_library_do_not_echo_keys(
    seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Make the REAL hmac module fail on real key material (handed over as text, as a
    # refactoring slip would) and check that neither its message nor the traceback the
    # codec logs shows the key. (libsodium errors are CryptoError: they read as tampered.)
    def slipped_mac(self: Key, data: bytes) -> bytes:
        return hmac.digest(self.mac_key.decode("latin-1"), data, "sha256")  # type: ignore[arg-type]

    codec = StateCodec(RING, mode=Mode.SIGN)
    token = codec.seal(b"x")
    monkeypatch.setattr(Key, "sign_mac", slipped_mac)
    exc = seen.expect_invalid(lambda: codec.unseal(token), "internal_error")
    assert "unexpected TypeError" in exc.detail
    assert any(r.exc_info for r in seen.caplog.records), "the traceback should be logged server-side"


def test_key_ring_loading_errors_do_not_echo_secrets(seen: Seen) -> None:
    good = RING.to_dict()
    for mutate in (
        lambda d: d["keys"][0].update(retires_at="tomorrow"),
        lambda d: d["keys"][0].update(created_at=[1]),
        lambda d: d["keys"][0].update(kid="bad kid!"),
        lambda d: d["keys"][1].update(secret=d["keys"][1]["secret"] + "="),
        lambda d: d["keys"][1].update(secret=d["keys"][1]["secret"][:-8]),
        lambda d: d.update(primary="missing"),
        lambda d: d["keys"].append(d["keys"][0]),
    ):
        doc = {**good, "keys": [dict(k) for k in good["keys"]]}
        mutate(doc)
        with pytest.raises((ValueError, TypeError)) as info:
            KeyRing.from_dict(doc)
        seen.add(info.value)
    with pytest.raises(ValueError) as info:
        KeyRing.from_json(RING.to_json()[:-5])
    seen.add(info.value)
    with pytest.raises(ValueError) as info:
        Key("short", ASCII_MARKER[:31])
    seen.add(info.value)


def test_cli_output_carries_no_key_material(seen: Seen, tmp_path: Path) -> None:
    cli = pytest.importorskip("statecodec.cli")
    ring_file = tmp_path / "ring.json"
    ring_file.write_text(RING.to_json())
    ring_file.chmod(0o600)
    keys = f"file:{ring_file}"
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli.main, list(args), catch_exceptions=False)
        seen.add(result.output)
        if result.stderr_bytes is not None:
            seen.add(result.stderr)
        return result.stdout

    binding = ["--principal", "alice", "--method", "tools/call", "--target", "t"]
    for mode in ("sign", "encrypt"):
        token = run("mint", "hello", "--keys", keys, "--mode", mode, *binding).strip()
        assert token.startswith("sc1"), token
        tampered = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
        for extra in ([], ["--json"]):
            run("verify", token, "--keys", keys, *binding, *extra)
            run("verify", token, "--keys", keys, "--principal", "bob", *extra)
            run("verify", tampered, "--keys", keys, *extra)
            run("verify", token, "--keys", keys, "--at", "+2h", *extra)
            run("inspect", token, *extra)
            run("inspect", tampered, *extra)
        run("mint", "x" * 10_000, "--keys", keys, "--mode", mode)  # too large
    broken = tmp_path / "broken.json"
    broken.write_text(RING.to_json().replace('"primary": "marker-a"', '"primary": 7'))
    run("verify", "sc1s.AAAA", "--keys", f"file:{broken}")
    run("mint", "x", "--keys", f"file:{tmp_path / 'missing.json'}")
