"""``statecodec proxy`` as an operator runs it: options, exit codes, upstream failures, shutdown."""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from fixtures_proxy import await_line, spawn, stop

from statecodec import KeyRing
from statecodec.cli import main

BASE = ["proxy", "--upstream", "http://127.0.0.1:9/mcp", "--replay", "memory:", "--audience", "svc"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--principal-from", "jwt-sub"], "exactly one of --jwks URL or --introspection"),
        (["--principal-from", "jwt-sub", "--jwks", "https://idp/jwks"], "--issuer and --jwt-audience"),
        (["--issuer", "https://idp"], "need --principal-from jwt-sub"),
        (["--principal-from", "cookie"], "none, header:NAME or jwt-sub"),
        (["--principal-from", "header:"], "none, header:NAME or jwt-sub"),
        (["--listen", "8000"], "is not HOST:PORT"),
        (["--ttl", "99999999999d"], "out of range"),  # was exit 70, "a bug in statecodec"
        (["--read-timeout", "99999999999999d"], "out of range"),
    ],
)
def test_usage_errors(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(main, [*BASE, "--keys", "file:/nonexistent", *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_required_options_and_help() -> None:
    result = CliRunner().invoke(main, ["proxy", "--upstream", "http://127.0.0.1:9/mcp"])
    assert result.exit_code == 2 and "--replay" in result.output
    assert "proxy" in CliRunner().invoke(main, ["--help"]).output


def _run(args: list[str], tmp_path: Path) -> tuple[int, str]:
    log = tmp_path / "proxy.log"
    proc = spawn([sys.executable, "-m", "statecodec.cli", *args], log)
    try:
        code = proc.wait(timeout=60)
    finally:
        stop(proc)
    return code, log.read_text(encoding="utf-8")


def _keys(tmp_path: Path) -> str:
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate().to_json(), encoding="utf-8")
    keys.chmod(0o600)
    return f"file:{keys}"


def test_exit_codes_when_it_cannot_start(tmp_path: Path) -> None:
    code, err = _run([*BASE, "--keys", f"file:{tmp_path / 'missing.json'}"], tmp_path)
    assert code == 3 and "statecodec: error:" in err and "Traceback" not in err

    args = [*BASE, "--keys", _keys(tmp_path)]
    args[args.index("memory:")] = "gopher://nowhere"
    code, err = _run(args, tmp_path)
    assert code == 4 and "replay store" in err

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = _run([*BASE, "--keys", _keys(tmp_path), "--listen", f"127.0.0.1:{port}"], tmp_path)
    assert code == 6 and "cannot listen" in err

    hook = ["--principal-from", "jwt-sub", "--introspection", "nope:fn"]
    code, err = _run([*BASE, "--keys", _keys(tmp_path), *hook], tmp_path)
    assert code == 2 and "--introspection nope:fn" in err


async def test_upstream_failures_and_graceful_shutdown(tmp_path: Path, refused_port: int) -> None:
    """A closed port is a 502, a silent upstream a 504; SIGTERM ends the proxy with code 0."""
    dead = refused_port
    silent = socket.socket()  # listens, accepts into the backlog, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    procs = {}
    try:
        for name, port in (("dead", dead), ("silent", silent.getsockname()[1])):
            args = ["proxy", "--upstream", f"http://127.0.0.1:{port}/mcp", "--replay", "memory:",
                    "--audience", "svc", "--keys", _keys(tmp_path), "--listen", "127.0.0.1:0",
                    "--read-timeout", "1s", "--connect-timeout", "2s"]  # fmt: skip
            log = tmp_path / f"{name}.log"
            proc = spawn([sys.executable, "-m", "statecodec.cli", *args], log)
            procs[name] = (proc, await_line(proc, "listening on ", log), log)
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        async with httpx.AsyncClient(timeout=30) as http:
            unavailable = await http.post(procs["dead"][1] + "/mcp", json=body)
            slow = await http.post(procs["silent"][1] + "/mcp", json=body)
        assert unavailable.status_code == 502 and unavailable.json()["error"]["code"] == -32603
        assert (
            slow.status_code == 504 and json.loads(slow.content)["error"]["message"] == "Upstream timed out"
        )
        for proc, _, log in procs.values():
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, log.read_text(encoding="utf-8")
            assert "Traceback" not in log.read_text(encoding="utf-8")
    finally:
        silent.close()
        for proc, _, _ in procs.values():
            stop(proc)
