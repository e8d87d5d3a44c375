"""``statecodec proxy --admin-listen`` as an operator watches it: metrics, readiness, JSON logs, start-up.

Real processes only: the unprotected low-level Python server (examples/unprotected_server.py)
behind a real ``statecodec proxy`` whose replay store is a real Valkey that the tests kill
and restart. ``/metrics`` is read with prometheus-client's own parser, the logs with
``json.loads`` line by line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures_proxy import (
    ANSWERS,
    AUDIENCE,
    TOOL,
    messages,
    modern_request,
    proxy_command,
    running_upstream,
)
from fixtures_valkey import ValkeyServer, running
from processes import await_line, spawn, stop
from prometheus_client.parser import text_string_to_metric_families
from replicas import keys_file

from statecodec import _telemetry

pytestmark = pytest.mark.slow


@dataclass
class Watched:
    """One proxy with its admin listener, its upstream and its (killable) Valkey."""

    url: str
    admin: str
    proc: subprocess.Popen[str]
    log_path: Path
    valkey: ValkeyServer

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = httpx.get(f"{self.admin}/metrics", timeout=30).text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def records(self) -> list[dict[str, Any]]:
        """The proxy's stderr, every line parsed as JSON (a line that is not fails the test)."""
        lines = self.log_path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    tmp = tmp_path_factory.mktemp("watched")
    with running_upstream("python", tmp) as upstream, running(ValkeyServer) as valkey:
        log_path = tmp / "proxy.log"
        args = proxy_command(
            upstream.url, keys=keys_file(tmp), replay=valkey.url, mode="encrypt", jwks=None,
            extra=["--admin-listen", "127.0.0.1:0", "--log-format", "json"],
        )  # fmt: skip
        proc = spawn(args, log_path)
        try:
            admin = await_line(proc, "admin on ", log_path)  # printed before "listening on"
            url = await_line(proc, "listening on ", log_path) + "/mcp"
            yield Watched(url, admin, proc, log_path, valkey)
        finally:
            stop(proc)


def call(url: str, params: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    body, headers = modern_request("tools/call", {"name": TOOL, "arguments": {"version": "1.2.3"}, **params},
                                   request_id)  # fmt: skip
    response = httpx.post(url, content=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    (message,) = messages(response)
    return message


def tamper(token: str) -> str:
    prefix, body = token.split(".", 1)
    middle = len(body) // 2
    return f"{prefix}.{body[:middle]}{'B' if body[middle] == 'A' else 'A'}{body[middle + 1 :]}"


def delta(after: dict[Any, float], before: dict[Any, float], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_counters_move_for_an_accepted_round_a_replay_and_a_tamper(watched: Watched) -> None:
    before = watched.metrics()
    token = call(watched.url, {})["result"]["requestState"]  # round 1: sealed
    answer = call(watched.url, {"inputResponses": ANSWERS, "requestState": token}, 2)  # round 2: accepted
    assert answer["result"]["structuredContent"]["deployed"] == "1.2.3"
    replayed = call(watched.url, {"inputResponses": ANSWERS, "requestState": token}, 3)
    fresh = call(watched.url, {})["result"]["requestState"]
    tampered = call(watched.url, {"inputResponses": ANSWERS, "requestState": tamper(fresh)}, 4)
    for refused in (replayed, tampered):
        assert refused["error"]["code"] == -32602
    after = watched.metrics()

    unseals = "statecodec_unseals_total"
    assert delta(after, before, unseals, outcome="ok") == 1
    assert delta(after, before, unseals, outcome="replayed") == 1
    assert delta(after, before, unseals, outcome="tampered") == 1
    assert delta(after, before, "statecodec_seals_total", mode="encrypt") == 2
    assert delta(after, before, "statecodec_token_size_bytes_count") == 5  # 2 sealed, 3 unsealed
    # One flow ended (round 2 answered without a state) after one token; the tampered one never began.
    assert delta(after, before, "statecodec_flow_rounds_count") == 1
    assert delta(after, before, "statecodec_flow_rounds_sum") == 1
    assert delta(after, before, "statecodec_proxy_requests_total", code="200") == 5
    assert delta(after, before, "statecodec_proxy_request_duration_seconds_count") == 5
    assert delta(after, before, "statecodec_replay_store_errors_total") == 0
    assert after[("statecodec_minting", ())] == 1
    assert 0 <= after[("statecodec_key_ring_age_seconds", ())] < 120
    assert after[("statecodec_key_refresh_interval_seconds", ())] == 60  # the KeyManager's default
    # Every documented family is there, with its documented labels only, and nothing else.
    exported = {name for name, _ in after if name.startswith("statecodec_")}
    families = {name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for name in exported}
    assert families == set(_telemetry.PROMETHEUS)  # no *_created series either
    for name, labels in after:
        family = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
        if family in _telemetry.PROMETHEUS:
            assert {label for label, _ in labels} - {"le"} <= set(_telemetry.PROMETHEUS[family])

    # The tamper's log record carries the facts as fields, and no token.
    records = watched.records()
    rejected = [r for r in records if r.get("event") == "token_rejected" and r.get("reason") == "tampered"]
    assert len(rejected) == 1
    (record,) = rejected
    assert record["logger"] == "statecodec" and record["level"] == "WARNING"
    assert (record["method"], record["target"], record["audience"]) == ("tools/call", TOOL, AUDIENCE)
    assert record["mode"] == "encrypt" and record["kid"] and len(record["size"] * "x") > 100
    replay_records = [
        r for r in records if r.get("event") == "token_rejected" and r.get("reason") == "replayed"
    ]
    assert len(replay_records) == 1 and len(replay_records[0]["token_id"]) == 8
    assert int(replay_records[0]["token_id"], 16) >= 0
    log_text = watched.log_path.read_text(encoding="utf-8")
    assert token not in log_text and fresh not in log_text and tamper(fresh) not in log_text
    assert not log_text.count("statecodec: ")  # messages no longer repeat the logger name
    assert {r["event"] for r in records} >= {"proxy_started", "admin_started", "token_rejected"}


def test_readyz_turns_503_when_valkey_dies_and_200_when_it_is_back(watched: Watched) -> None:
    def readyz() -> httpx.Response:
        return httpx.get(f"{watched.admin}/readyz", timeout=30)

    until(lambda: readyz().status_code == 200, "the proxy is ready")
    before = watched.metrics()
    watched.valkey.kill()  # SIGKILL by PID: the store is gone without a word
    try:
        # The first probe once the readiness interval (1 s) has passed since the last check
        # asks the store, which refuses the connection: not ready at once, not after the
        # 5 s of silence allowed to a store that hangs (while saying "answered 2.7s ago").
        time.sleep(1.1)
        first = readyz()
        assert first.status_code == 503, first.text
        document = first.json()
        assert document["ready"] is False and document["failing"] == ["replay_store"]
        assert document["checks"]["keys"]["ok"] is True
        detail = document["checks"]["replay_store"]["detail"]
        assert "redis replay store failed its last check" in detail and "last answer" in detail, detail
        assert httpx.get(f"{watched.admin}/livez", timeout=30).status_code == 200  # alive, not ready
        # Meanwhile a second round is refused unconsumed, and counted.
        token = call(watched.url, {})["result"]["requestState"]
        refused = call(watched.url, {"inputResponses": ANSWERS, "requestState": token}, 2)
        # Not the -32602 of a forgery: -32603, asking for the same request again.
        assert refused["error"] == {
            "code": -32603,
            "message": "Temporarily unavailable: retry the same request (its requestState was not consumed)",
            "data": {"reason": "temporarily_unavailable"},
        }
        after = watched.metrics()
        assert delta(after, before, "statecodec_replay_store_errors_total") == 1
        assert delta(after, before, "statecodec_unseals_total", outcome="store_unavailable") == 1
    finally:
        watched.valkey.start()  # the same port
    until(lambda: readyz().status_code == 200, "/readyz sees the store again")
    assert readyz().json()["failing"] == []
    # The refused token was not burnt: it redeems now.
    answer = call(watched.url, {"inputResponses": ANSWERS, "requestState": token}, 3)
    assert answer["result"]["structuredContent"]["deployed"] == "1.2.3"


# ------------------------------------------------------------------ start-up
def _start(args: list[str], tmp: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "statecodec.cli", "proxy", "--upstream", "http://127.0.0.1:9/mcp",
         "--audience", "svc", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}, cwd=tmp,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_it_exits_before_listening_when_it_cannot_start(
    tmp_path: Path, log_format: str, refused_port: int
) -> None:
    keys = f"file:{keys_file(tmp_path)}"
    unreachable_store = f"redis://127.0.0.1:{refused_port}/0"
    vault_down = {"VAULT_ADDR": f"http://127.0.0.1:{refused_port}", "VAULT_TOKEN": "s.test"}
    cases = [
        (3, ["--keys", f"file:{tmp_path / 'missing.json'}", "--replay", "memory:"], None, "keys init"),
        (3, ["--keys", f"file:{tmp_path}", "--replay", "memory:"], None, "is a directory"),
        (4, ["--keys", keys, "--replay", unreachable_store], None, "is the --replay URL right?"),
        (7, ["--keys", "vault-transit:transit/statecodec", "--replay", "memory:"], vault_down, "VAULT_ADDR"),
    ]
    for code, args, env, fix in cases:
        exit_code, out, err = _start([*args, "--log-format", log_format], tmp_path, env)
        assert exit_code == code, err
        assert out == ""  # neither "admin on" nor "listening on": it never listened
        assert "Traceback" not in err
        (line,) = [line for line in err.splitlines() if "error" in line.lower() or "CRITICAL" in line]
        if log_format == "json":
            record = json.loads(line)
            assert record["event"] == "proxy_failed" and record["exit_code"] == code
            assert fix in record["message"]
            assert all(json.loads(each) for each in err.splitlines())  # every stderr line is JSON
        else:
            assert line.startswith("statecodec: error: ") and fix in line


# ------------------------------------------------------------------ timeline, shutdown, workers
def _json_records(log_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_proxy_takes_the_key_timeline_and_logs_its_shutdown_on_sigterm(tmp_path: Path) -> None:
    # docs/keys.md tells operators to shorten the refresh interval in an emergency: the
    # proxy takes it (and the staleness limit) as `keys rotate` does; and a SIGTERM it
    # obeys says so in the log, so a stop is not mistaken for a crash.
    log_path = tmp_path / "proxy.log"
    command = proxy_command(
        "http://127.0.0.1:9/mcp", keys=keys_file(tmp_path), replay="memory:", mode="sign", jwks=None,
        extra=["--admin-listen", "127.0.0.1:0", "--log-format", "json",
               "--refresh-interval", "7s", "--staleness-limit", "30s"],
    )  # fmt: skip
    proc = spawn(command, log_path)
    try:
        admin = await_line(proc, "admin on ", log_path)
        await_line(proc, "listening on ", log_path)
        text = httpx.get(f"{admin}/metrics", timeout=30).text
        gauges = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert gauges["statecodec_key_refresh_interval_seconds"] == 7
    finally:
        code = stop(proc)  # SIGTERM by PID
    assert code == 0
    (stopped,) = [r for r in _json_records(log_path) if r.get("event") == "proxy_stopped"]
    assert stopped["signal"] == "SIGTERM" and stopped["level"] == "INFO" and stopped["workers"] == 1
    assert "proxy stopped on SIGTERM" in stopped["message"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--refresh-interval", "0s"], "key timeline"),
        (["--staleness-limit", "0s"], "key timeline"),
    ],
)
def test_an_impossible_key_timeline_is_a_usage_error(
    tmp_path: Path, options: list[str], message: str
) -> None:
    code, out, err = _start(
        ["--keys", f"file:{keys_file(tmp_path)}", "--replay", "memory:", *options], tmp_path
    )
    assert code == 2 and out == "" and message in err, err


def test_two_workers_print_each_start_up_warning_once(tmp_path: Path) -> None:
    # The supervisor and each worker load the keys; the key file's mode warning (and the
    # key-minting note) came three times with --workers 2. Now once, from the supervisor.
    keys = keys_file(tmp_path)
    keys.chmod(0o644)  # readable by others: the start-up warning under test
    log_path = tmp_path / "proxy.log"
    command = proxy_command(
        "http://127.0.0.1:9/mcp", keys=keys, replay=f"sqlite:{tmp_path / 'replay.db'}", mode="sign",
        jwks=None, extra=["--workers", "2", "--log-format", "json"],
    )  # fmt: skip
    proc = spawn(command, log_path)
    try:
        await_line(proc, "listening on ", log_path)
    finally:
        code = stop(proc)
    assert code == 0
    records = _json_records(log_path)
    events = [r.get("event") for r in records]
    assert events.count("key_file_exposed") == 1, events
    started = [r for r in records if r.get("event") == "keys_loaded"]
    assert len(started) == 1, started
    assert events.count("proxy_started") == 1
    (stopped,) = [r for r in records if r.get("event") == "proxy_stopped"]
    assert stopped["signal"] == "SIGTERM" and stopped["workers"] == 2
