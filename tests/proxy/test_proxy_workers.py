"""``statecodec proxy --workers N``: one socket, N processes, one key ring and one replay store.

A real supervisor process with two real workers in front of the unprotected Python
server (examples/unprotected_server.py), a SQLite replay store and a key file: a token
redeemed through one connection is refused on every other (whichever worker takes it),
a worker that dies is replaced, and SIGTERM stops the group with exit code 0.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from fixtures_proxy import TOOL, messages, modern_request
from processes import await_line
from proxy_workers import spawned_group, until, workers_of

from statecodec import KeyRing
from statecodec.boundary import WIRE_ERROR_CODE
from statecodec.cli import main


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[Any, str, Path]]:
    with spawned_group(tmp_path) as (proxy, log):
        base = await_line(proxy, "listening on ", log)
        yield proxy, base + "/mcp", log


def call(url: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    with httpx.Client(timeout=30) as http:  # a new connection: any worker may take it
        response = http.post(url, content=body, headers=headers)
    return messages(response)[-1]


def round_one(url: str) -> str:
    body, headers = modern_request("tools/call", {"name": TOOL, "arguments": {"version": "1.2.3"}})
    return str(call(url, body, headers)["result"]["requestState"])


def round_two(url: str, token: str) -> dict[str, Any]:
    params = {
        "name": TOOL,
        "arguments": {"version": "1.2.3"},
        "inputResponses": {
            "confirm_deploy": {"action": "accept", "content": {"confirm": True}},
            "change_ticket": {"action": "accept", "content": {"ticket": "CHG-1"}},
        },
        "requestState": token,
    }
    body, headers = modern_request("tools/call", params, request_id=2)
    return call(url, body, headers)


def test_two_workers_share_single_use_survive_a_crash_and_stop_cleanly(group: tuple[Any, str, Path]) -> None:
    proxy, url, log = group
    workers = until(lambda: len(workers_of(proxy.pid)) == 2 and workers_of(proxy.pid))

    token = round_one(url)
    assert token.startswith("sc1e.")
    assert round_two(url, token)["result"]["structuredContent"]["deployed"] == "1.2.3"
    for _ in range(8):  # fresh connections, spread over both workers: every one refuses
        assert round_two(url, token)["error"]["code"] == WIRE_ERROR_CODE

    crashed = min(workers)
    os.kill(crashed, signal.SIGKILL)  # a worker this test's supervisor started
    replaced = until(lambda: (now := workers_of(proxy.pid)) and len(now) == 2 and crashed not in now and now)
    assert round_two(url, round_one(url))["result"]["structuredContent"]["deployed"] == "1.2.3"
    assert "worker" in until(lambda: "starting it again" in log.read_text() and log.read_text())

    proxy.send_signal(signal.SIGTERM)
    assert proxy.wait(timeout=60) == 0, log.read_text()
    assert not any(Path(f"/proc/{pid}").exists() for pid in replaced)
    assert "Traceback" not in log.read_text()


def test_a_memory_store_cannot_be_shared_by_workers(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate().to_json())
    keys.chmod(0o600)
    result = CliRunner().invoke(
        main,
        ["proxy", "--upstream", "http://127.0.0.1:9/mcp", "--replay", "memory:", "--audience", "svc",
         "--keys", f"file:{keys}", "--workers", "2"],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--workers N needs a replay store the workers share" in result.output


def test_a_proxy_that_does_not_start_leaves_the_callers_logging_as_it_was(tmp_path: Path) -> None:
    # The command runs in the caller's process too: its handler and level must not outlive it
    # (a later command in that process printed the proxy's INFO records on stderr).
    root, ours = logging.getLogger(), logging.getLogger("statecodec")
    handlers, level = list(root.handlers), ours.level
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate().to_json())
    keys.chmod(0o600)
    for log_format in ("text", "json"):
        result = CliRunner().invoke(
            main,
            ["proxy", "--upstream", "http://127.0.0.1:9/mcp", "--replay", "memory:", "--audience", "svc",
             "--keys", f"file:{keys}", "--workers", "2", "--log-format", log_format],
        )  # fmt: skip
        assert result.exit_code == 2, result.output
        assert "--workers N needs a replay store the workers share" in result.output
        assert list(root.handlers) == handlers
        assert ours.level == level
