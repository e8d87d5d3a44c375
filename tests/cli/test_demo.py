"""``statecodec demo``: the real command, end to end, and its honesty.

The demo runs three real MCP servers (uvicorn on loopback) and the official ``mcp``
client; nothing is mocked. Every test gives it a temporary data directory (and a
temporary HOME and XDG_DATA_HOME besides), so no test touches the user's real files.
The demo's own checks are what make its exit code meaningful, so one test forces a real
misconfiguration (a replay store per instance) and expects the demo to catch it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jsonschema
from click.testing import CliRunner
from processes import lines_until

from statecodec import KeyRing
from statecodec._demo._cluster import Instance, Setup
from statecodec._demo._narration import Narrator
from statecodec._demo._run import Answered, Mode, Rejection, RoundOne, RoundTwo
from statecodec.cli import main
from statecodec.replay import SQLiteReplayStore

VALIDATOR = jsonschema.Draft202012Validator(
    json.loads((Path(__file__).resolve().parents[2] / "docs" / "cli-schema.json").read_text())
)

SCRIPT = Path(sys.executable).parent / "statecodec"
TIMEOUT = 120

#: label in the trace -> (instance it must reach, the reason the server must log)
REJECTIONS = {
    "replayed token (redeemed on B)": ("A", "replayed"),
    "tampered token (1 char changed)": ("A", "tampered"),
    "expired token (sealed 2h ago)": ("B", "expired"),
    "alice's token sent by bob": ("A", "binding_mismatch"),
    "token for version 6.6.6": ("B", "binding_mismatch"),
    "token from deploy-staging": ("A", "binding_mismatch"),
}
DETAILS = {
    "replayed": "this token was already redeemed (single use)",
    "expired": "expired 1h50m ago (expiry grace 0s)",
    "binding_mismatch": "the token was sealed for a different principal, audience, method, target",
}


def isolated_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user whose home is ``tmp_path``: the real one is never touched."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NO_COLOR", "STATECODEC_DEBUG", "STATECODEC_KEYS", "STATECODEC_DATA_DIR")
    }
    return {**clean, "HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "xdg")}


def run_demo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(SCRIPT), "demo", *args], capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc


def assert_trace(stdout: str, mode: str) -> None:
    """Round 1 on A with two questions and a token, the answers, round 2 on B, six rejections."""
    prefix = {"sign": "sc1s.", "encrypt": "sc1e."}[mode]
    assert f"{mode.upper()} mode" in stdout
    first = re.search(
        r"alice -> A  tools/call deploy_production \{\"version\": \"1.2.3\"\}  \(JSON-RPC request id (\d+)\)",
        stdout,
    )
    assert first, stdout
    assert "A answers input_required with 2 input requests:" in stdout
    assert "confirm_deploy  elicitation: 'Deploy 1.2.3 to production?'" in stdout
    assert "change_ticket   elicitation: 'Change ticket for the deployment'" in stdout
    token = re.search(
        rf"requestState {re.escape(prefix)}\S*\.\.\.  (\d+) chars, key (\S+), expires in 9m\d\ds", stdout
    )
    assert token, stdout
    assert (
        'alice answers both: confirm_deploy {"confirm": true}, change_ticket {"ticket": "CHG-1234"}' in stdout
    )
    second = re.search(
        r"alice -> B  tools/call again .* \(JSON-RPC request id (\d+): a new request\)", stdout
    )
    assert second and second[1] != first[1], stdout
    assert re.search(r"deployed 1\.2\.3, plan [0-9a-f]{8} \(planned on A, deployed on B\)", stdout), stdout
    seen = "SIGN: the client could read the plan" if mode == "sign" else "ENCRYPT: the plan was opaque"
    assert seen in stdout
    for label, (instance, reason) in REJECTIONS.items():
        line = re.search(
            rf"^\s+ok\s+{re.escape(label)}\s+-> {instance}  -32602  {reason}: (.+)$", stdout, re.M
        )
        assert line, f"{label!r} is not reported as rejected on {instance} with {reason}:\n{stdout}"
        if reason in DETAILS:
            assert DETAILS[reason] in line[1]
    tampered = "MAC does not match" if mode == "sign" else "AEAD tag does not verify"
    assert f"tampered: {tampered}" in stdout
    assert "Every step behaved as stated: 6 bad tokens stopped" in stdout


def test_sign_mode_on_embedded_defaults_from_a_first_run(tmp_path: Path) -> None:
    """An empty data directory: the demo creates a private key ring and a SQLite store, and passes."""
    data = tmp_path / "data"
    proc = run_demo("--mode", "sign", env={**isolated_env(tmp_path), "STATECODEC_DATA_DIR": str(data)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    assert_trace(proc.stdout, "sign")
    keys = data / "demo-keys.json"
    assert f"keys     file:{keys} (created now, mode 600)" in proc.stdout
    assert f"replay   sqlite:{data / 'demo-replay.sqlite3'}" in proc.stdout
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert (data / "demo-replay.sqlite3").is_file()
    ring = KeyRing.from_json(keys.read_text())
    assert f"primary key {ring.primary_kid}" in proc.stdout
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()


def test_encrypt_mode_reuses_the_key_ring_of_an_earlier_run(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    keys = data / "demo-keys.json"
    ring = KeyRing.generate()
    keys.write_text(ring.to_json())
    keys.chmod(0o600)
    before = keys.read_bytes()
    proc = run_demo("--mode", "encrypt", "--data-dir", str(data), env=isolated_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_trace(proc.stdout, "encrypt")
    assert f"(reused from an earlier run), primary key {ring.primary_kid}" in proc.stdout
    assert f"key {ring.primary_kid}, expires in" in proc.stdout  # round 1's token was sealed with it
    assert keys.read_bytes() == before


def test_a_replay_store_per_instance_is_caught(tmp_path: Path) -> None:
    """``--replay memory:`` gives each instance its own store: B's redemption is unknown to A.

    A real misconfiguration, not a simulated one: instance A accepts the replay and deploys
    again. The demo must say so and exit non-zero, with the other five checks still passing.
    """
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate().to_json())
    keys.chmod(0o600)
    args = [
        "demo",
        "--replay",
        "memory:",
        "--keys",
        f"file:{keys}",
        "--data-dir",
        str(tmp_path / "d"),
        "--json",
    ]
    result = CliRunner().invoke(main, args, env=isolated_env(tmp_path), catch_exceptions=False)
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    VALIDATOR.validate(doc)  # the documented --json schema covers demo too
    assert (doc["command"], doc["ok"], doc["exit_code"]) == ("demo", False, 1)
    assert doc["replay"] == "memory:" and doc["round_two"]["outcome"]["deployed_on"] == "B"
    assert doc["round_one"]["request_state"]["lifetime"] == "10m"
    by_attack = {r["attack"]: r for r in doc["rejections"]}
    replay = by_attack.pop("replayed")
    assert replay["ok"] is False and replay["instance"] == "A" and replay["error"] is None
    assert replay["problems"][0].startswith("ACCEPTED by A, which deployed 1.2.3")
    assert len(by_attack) == 5 and all(r["ok"] and r["error"]["code"] == -32602 for r in by_attack.values())
    assert [r["reason"] for r in by_attack.values()] == ["tampered", "expired"] + ["binding_mismatch"] * 3
    assert doc["error"]["class"] == "invalid" and doc["error"]["reason"] is None
    assert "Hint: memory: gives every instance a replay store of its own" in doc["error"]["message"]
    assert not (tmp_path / "d").exists()  # explicit --keys and --replay: nothing created


class _Reworded(logging.Filter):
    """Every statecodec record says something else: a message format the demo must not rely on."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = "reworded", ()
        return True


def test_the_demo_reads_record_fields_never_log_text(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate().to_json())
    keys.chmod(0o600)
    replay = f"sqlite:{tmp_path / 'r.sqlite3'}"
    args = ["demo", "--mode", "sign", "--replay", replay, "--keys", f"file:{keys}", "--json"]
    lib, reworded = logging.getLogger("statecodec"), _Reworded()
    lib.addFilter(reworded)
    try:
        result = CliRunner().invoke(main, args, env=isolated_env(tmp_path), catch_exceptions=False)
    finally:
        lib.removeFilter(reworded)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [(r["attack"], r["reason"]) for r in doc["rejections"]] == [
        ("replayed", "replayed"),
        ("tampered", "tampered"),
        ("expired", "expired"),
        ("other_user", "binding_mismatch"),
        ("other_arguments", "binding_mismatch"),
        ("other_service", "binding_mismatch"),
    ]
    assert doc["rejections"][0]["detail"] == DETAILS["replayed"]


def test_without_the_mcp_extra_it_says_what_to_install(tmp_path: Path) -> None:
    # The mcp SDK is installed here; hiding it (None in sys.modules makes its import fail
    # exactly as if it were absent) is the only way to see what a user without it sees.
    code = (
        "import sys; sys.modules.update(mcp=None, mcp_types=None);"
        "from statecodec.cli import main; main(['demo'])"
    )
    env = isolated_env(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=TIMEOUT, check=False
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().endswith("pip install 'statecodec[mcp]'")
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "xdg").exists()  # it stopped before creating anything


def test_ctrl_c_stops_everything_and_exits_130(tmp_path: Path) -> None:
    """SIGINT while the demo waits on its replay store, which the test holds locked.

    The demo cannot finish before the signal: the test holds the SQLite store's write lock
    from the start, so round 2's consume waits (busy_timeout, minutes) until the test lets
    go, which it does only once the signal is sent. The marker, round 1, comes before any
    consume; by then the servers are up and the client is connected.
    """
    env = {**isolated_env(tmp_path), "STATECODEC_DATA_DIR": str(tmp_path / "data")}
    store = tmp_path / "replay.sqlite3"
    SQLiteReplayStore(store).close()  # the file in WAL mode and its table: opening it needs no lock
    lock = sqlite3.connect(store, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # the write lock every consume needs
    with _sigint_reaches_children():
        proc = subprocess.Popen(
            [str(SCRIPT), "demo", "--replay", f"sqlite:///{store}?busy_timeout=300"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
    try:
        lines = _read_until(proc, "alice -> A")
        proc.send_signal(signal.SIGINT)  # mid-flow: round 2 is yet to come, or waits for the lock
        lock.rollback()  # the waiting consume ends, and the demo can shut its servers down
        out, err = proc.communicate(timeout=60)
    finally:
        lock.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "statecodec: demo interrupted; every server it started is stopped"
    assert "Every step behaved as stated" not in "".join(lines) + out
    # The servers lived in that process, which is gone: nothing it started is left running.


@contextlib.contextmanager
def _sigint_reaches_children() -> Iterator[None]:
    """Children started inside see SIGINT as Ctrl-C, even when this process ignores it.

    A shell without job control starts a background command (``&``, nohup) with SIGINT
    ignored, and an ignored signal stays ignored across exec: the demo would never get the
    signal, run to its end and exit 0. A handled signal is reset to the default on exec.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _read_until(proc: subprocess.Popen[str], marker: str) -> list[str]:
    lines, found = lines_until(proc, marker, TIMEOUT)
    assert found, f"the demo never printed {marker!r}:\n{''.join(lines)}"
    return lines


def test_the_narration_tells_each_event_and_leaves_styling_to_the_caller() -> None:
    # The engine's events, made by hand: the lines the command prints for each, without a run.
    def marked(text: str, **attributes: object) -> str:
        return f"<{','.join(sorted(attributes))}>{text}</>"

    now = int(time.time())
    setup = Setup(
        Mode.SIGN,
        "file:k.json",
        "sqlite:r.db",
        "k1",
        (
            Instance("A", "deploy", "http://127.0.0.1:1/mcp"),
            Instance("staging", "deploy-staging", "http://x"),
        ),
    )
    lines = Narrator(marked, "created now, mode 600").lines(setup)
    assert (
        lines[0]
        == "<bold>statecodec demo: deploy_production on two instances of one MCP service, SIGN mode</>"
    )
    assert lines[1] == "  keys     file:k.json (created now, mode 600), primary key k1"
    assert lines[3].endswith("service 'deploy', behind the router")
    assert lines[4].endswith("service 'deploy-staging', another service on the same keys")
    assert lines[5].startswith("<dim>") and lines[-1] == ""
    plain = Narrator()
    round_one = RoundOne(
        "A", 7, {"version": "1.2.3"}, {"confirm": "Go?"}, "sc1.s." + "x" * 40, "k1", now, now + 600
    )
    assert (
        plain.lines(round_one)[0]
        == 'alice -> A  tools/call deploy_production {"version": "1.2.3"}  (JSON-RPC request id 7)'
    )
    assert "expires in 9m" in plain.lines(round_one)[-1] or "expires in 10m" in plain.lines(round_one)[-1]
    assert plain.lines(Answered({"confirm": {"confirm": True}})) == [
        'alice answers both: confirm {"confirm": true}'
    ]
    outcome = {"deployed": "1.2.3", "plan_id": "ab12cd34", "planned_on": "A", "deployed_on": "B"}
    told = plain.lines(RoundTwo("B", 8, outcome, plan_readable=False))
    assert "ENCRYPT: the plan was opaque to the client" in told[2]
    assert "-32602 'Invalid or expired requestState'" in told[-1]
    refused = Rejection(
        "replayed", "replayed token", "A", "replayed", {"code": -32602}, "replayed", "again", ()
    )
    assert Narrator(marked).lines(refused) == [
        "  <bold,fg> ok </> replayed token" + " " * 18 + " -> A  -32602  replayed: again"
    ]
    accepted = Rejection("replayed", "replayed token", "A", "replayed", None, None, None, ("ACCEPTED by A",))
    assert plain.lines(accepted) == [
        "  FAIL replayed token" + " " * 18 + " -> A  accepted  nothing logged",
        "       ACCEPTED by A",
    ]
