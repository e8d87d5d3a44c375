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

ROOT = Path(__file__).resolve().parents[2]
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
    dumb = _run_in_pty(["verify", token], {**env, "TERM": "dumb"})
    assert b"VALID" in dumb and b"\x1b[" not in dumb
    piped = sc("verify", token, env=env)
    assert piped.returncode == 0 and b"\x1b[" not in piped.stdout


# ------------------------------------------------------------------ a closed stdout
#: ``statecodec verify TOKEN [ARGS] | head -1``, exiting with statecodec's own code.
HEAD_ONE = 'set -u; "$0" verify "$1" "${@:2}" | head -1 >/dev/null; exit "${PIPESTATUS[0]}"'


def _closed_reader(args: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Run with stdout a pipe whose reader is gone before the first write: every write fails."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        proc = subprocess.run(
            [script(), *args], stdout=writer, stderr=subprocess.PIPE, env=env, timeout=TIMEOUT, check=False
        )
    finally:
        os.close(writer)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("json_mode", [[], ["--json"]])
def test_a_closed_stdout_never_changes_the_exit_code(env: dict[str, str], json_mode: list[str]) -> None:
    """Click turned EPIPE into exit 1 ("token rejected"): a valid token read by `| head -1` now exits 0."""
    token = sc("mint", "x", env=env).stdout.decode().strip()
    tampered = token[:-6] + ("A" if token[-6] != "A" else "B") + token[-5:]
    expected = {token: 0, tampered: 1}
    for candidate, code in expected.items():  # deterministic: the reader is gone before any write
        returncode, stderr = _closed_reader(["verify", candidate, *json_mode], env)
        assert returncode == code and stderr == b""  # no "Broken pipe", no "Exception ignored"
    script_path = script()
    runs = 0
    for _ in range(15):  # a real `| head -1`, racing the writes
        for candidate, code in expected.items():
            proc = subprocess.run(
                ["bash", "-c", HEAD_ONE, script_path, candidate, *json_mode],
                capture_output=True, env=env, timeout=TIMEOUT, check=False,
            )  # fmt: skip
            assert (proc.returncode, proc.stderr) == (code, b""), proc.stderr.decode()
            runs += 1
    assert runs == 30


def test_a_closed_stdout_before_any_result_exits_141(env: dict[str, str]) -> None:
    returncode, stderr = _closed_reader(["--help"], env)
    assert (returncode, stderr) == (141, b"")
    returncode, stderr = _closed_reader(["keys", "list", "--help"], env)
    assert (returncode, stderr) == (141, b"")


# ------------------------------------------------------------------ JSON logs of the rotation job
def test_keys_rotate_log_format_json_prints_one_object_per_line(tmp_path: Path, env: dict[str, str]) -> None:
    keys = tmp_path / "rotated.json"
    keys.write_text(KeyRing.generate("old").to_json())
    keys.chmod(0o644)  # readable by others: the library warns, as a JSON record too
    args = ["keys", "rotate", "--keys", f"file:{keys}", "--min-age", "0s", "--retire-after", "30d"]
    proc = sc(*args, "--log-format", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    (outcome,) = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert (outcome["event"], outcome["level"], outcome["exit_code"]) == ("keys_rotate", "INFO", 0)
    assert outcome["rotated"] is True and outcome["new_kid"] not in (None, "old")
    assert outcome["source"] == f"file:{keys}" and "create" in outcome["message"]
    warnings = [json.loads(line) for line in proc.stderr.decode().splitlines()]
    assert [w["event"] for w in warnings] == ["key_file_exposed"]
    assert warnings[0]["level"] == "WARNING" and warnings[0]["logger"] == "statecodec.kms"
    assert b"\x1b[" not in proc.stdout + proc.stderr

    refused = sc(*args[:-1], "10s", "--log-format", "json", env=env)
    assert refused.returncode == 3 and refused.stdout == b""
    (error,) = [json.loads(line) for line in refused.stderr.decode().splitlines()]
    assert (error["event"], error["level"], error["exit_code"], error["error_class"]) == (
        "keys_rotate",
        "ERROR",
        3,
        "keys",
    )
    assert error["message"].startswith("rotation refused: retire_after=10s is too short")
