"""The installed `statecodec` console script, run as a real process (pipes, stdin, a pty)."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from statecodec import KeyRing

ROOT = Path(__file__).resolve().parent.parent
VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "docs" / "cli-schema.json").read_text()))
SCRIPT = Path(sys.executable).parent / "statecodec"
TIMEOUT = 60


def script() -> str:
    found = str(SCRIPT) if SCRIPT.exists() else shutil.which("statecodec")
    assert found, "the statecodec console script is not installed: pip install -e ."
    return found


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "keys.json"
    path.write_text(KeyRing.generate("sub1").to_json())
    path.chmod(0o600)
    clean = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "STATECODEC_DEBUG")}
    return {**clean, "STATECODEC_KEYS": f"file:{path}"}


def sc(*args: str, env: dict[str, str], stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(
        [script(), *args], input=stdin, capture_output=True, env=env, timeout=TIMEOUT, check=False
    )
    assert b"Traceback" not in proc.stderr + proc.stdout, proc.stderr.decode()
    return proc


def test_version_and_help(env: dict[str, str]) -> None:
    version = sc("--version", env=env)
    assert version.returncode == 0 and b"statecodec, version 0.1.0" in version.stdout
    assert b"Exit codes:" in sc("--help", env=env).stdout


def test_mint_then_verify_through_a_pipe(env: dict[str, str]) -> None:
    minted = sc("mint", "--principal", "alice", "-", env=env, stdin=b'{"step": 1}')
    assert minted.returncode == 0 and minted.stderr == b""
    verified = sc("verify", "-", "--principal", "alice", "--json", env=env, stdin=minted.stdout)
    assert verified.returncode == 0, verified.stderr
    doc = json.loads(verified.stdout)
    VALIDATOR.validate(doc)
    assert doc["valid"] and doc["claims"]["payload"]["value"] == {"step": 1}
    wrong = sc("verify", "-", "--principal", "bob", env=env, stdin=minted.stdout)
    assert wrong.returncode == 1 and wrong.stdout.startswith(b"INVALID  binding_mismatch")


@pytest.mark.parametrize(
    ("stdin", "code"),
    [(bytes(range(256)), 1), (b"", 1), (b"A" * (1024 * 1024 + 1), 6), (b"\x89PNG\r\n\x1a\n" * 1000, 1)],
)
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_garbage_on_stdin(env: dict[str, str], command: str, stdin: bytes, code: int) -> None:
    proc = sc(command, "-", env=env, stdin=stdin)
    assert proc.returncode == code
    assert proc.stdout == b""
    assert proc.stderr.startswith(b"statecodec: error: ") and proc.stderr.count(b"\n") == 1
    doc = json.loads(sc(command, "-", "--json", env=env, stdin=stdin).stdout)
    VALIDATOR.validate(doc)
    assert doc["exit_code"] == code


def test_keys_generate_to_a_file(tmp_path: Path, env: dict[str, str]) -> None:
    path = tmp_path / "new.json"
    assert sc("keys", "generate", "-o", str(path), env=env).returncode == 0
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert sc("keys", "generate", "-o", str(path), env=env).returncode == 6


def test_python_dash_m(env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "statecodec.cli", "keys", "--help"],
        capture_output=True,
        env=env,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0 and b"Usage: statecodec keys" in proc.stdout


def _run_in_pty(args: list[str], env: dict[str, str]) -> bytes:
    """Output of the script with a pseudo-terminal as stdout and stderr."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [script(), *args], stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env
    )
    os.close(terminal)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([controller], [], [], TIMEOUT)
            if not ready:
                break
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(controller)
        proc.wait(timeout=TIMEOUT)
    return out


def test_colour_only_on_a_terminal_and_never_with_no_color(env: dict[str, str]) -> None:
    token = sc("mint", "x", env=env).stdout.decode().strip()
    coloured = _run_in_pty(["verify", token], env)
    assert b"VALID" in coloured and b"\x1b[" in coloured
    plain = _run_in_pty(["verify", token], {**env, "NO_COLOR": "1"})
    assert b"VALID" in plain and b"\x1b[" not in plain
    piped = sc("verify", token, env=env)
    assert piped.returncode == 0 and b"\x1b[" not in piped.stdout
