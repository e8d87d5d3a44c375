"""``protect()`` over Streamable HTTP: a client that leaves during its hold releases it (issue 25).

The real ``mcp`` SDK server (tests/adapters/holds_server.py, a process on a free loopback port,
stopped by its PID) with one paced tool, answering in JSON (``json_response=True``) or
SSE. A raw HTTP client sends an early retry and closes the connection during its hold:
nothing may be consumed and the handler may not run, so the client's on-time retry
succeeds. With JSON answers the SDK runs the request in the HTTP task and never watches
for the client leaving: ``protect()`` does, during the hold. With SSE answers the SDK
cancels the request itself when the client leaves.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastmcp import FastMCP
from fixtures_proxy import messages, modern_request
from mcp.server.mcpserver import MCPServer
from processes import await_line, spawn, stop, wait_for_log

from statecodec import KeyRing, StateCodec
from statecodec.adapters import fastmcp, mcp

SERVER = Path(__file__).resolve().parent / "holds_server.py"
TOOL = "slow_report"
# The early retry must reach the server before the state is redeemable: seconds to spare, on a
# loaded machine too.
RETRY_AFTER = 5.0
HELD = "round 1 held for "
ABANDONED = "abandoned by its client during the hold; token not consumed"


@dataclass
class Server:
    url: str
    record: Path
    log_path: Path

    def runs(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text(encoding="utf-8").splitlines()]

    def wait_for_log(self, needle: str) -> str:
        return wait_for_log(self.log_path, needle)


@pytest.fixture(params=["json", "sse"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    record, log_path = tmp_path / "runs.jsonl", tmp_path / "server.log"
    command = [sys.executable, str(SERVER), "--record", str(record), "--retry-after", str(RETRY_AFTER)]
    if request.param == "json":
        command.append("--json-response")
    proc = spawn(command, log_path)
    try:
        yield Server(await_line(proc, "READY ", log_path), record, log_path)
    finally:
        stop(proc)


def _call(url: str, state: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": TOOL, "arguments": {}}
    if state is not None:
        params["requestState"] = state
    body, headers = modern_request("tools/call", params)
    response = httpx.post(url, content=body, headers=headers, timeout=15)
    assert response.status_code == 200, response.text
    return messages(response)[-1]


def _send_and_leave(url: str, state: str, held: Callable[[], None]) -> None:
    """The early retry on a raw connection, closed without reading once ``held()`` returns."""
    body, headers = modern_request("tools/call", {"name": TOOL, "arguments": {}, "requestState": state})
    host, port = url.removeprefix("http://").split("/", 1)[0].rsplit(":", 1)
    head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        held()


def _assert_logged(server: Server, needle: str) -> None:
    assert needle in server.wait_for_log(needle), f"no {needle!r} in the server's log within 60 s"


def test_a_client_leaving_its_early_retry_releases_the_hold(server: Server) -> None:
    first = _call(server.url)["result"]
    issued = time.monotonic()
    assert first["resultType"] == "input_required" and "inputRequests" not in first
    state = first["requestState"]
    _send_and_leave(server.url, state, lambda: _assert_logged(server, HELD))
    _assert_logged(server, ABANDONED)
    time.sleep(max(0.0, issued + RETRY_AFTER + 0.5 - time.monotonic()))  # past the pacing time
    assert [run["step"] for run in server.runs()] == [0]  # nothing ran for nobody
    answer = _call(server.url, state)  # the on-time retry: the token was never consumed
    assert answer.get("result", {}).get("content") == [{"type": "text", "text": "ready"}], answer
    assert [run["step"] for run in server.runs()] == [0, 1]
    log = server.log_path.read_text(encoding="utf-8", errors="replace")
    assert "rejected requestState" not in log and "Traceback" not in log


def test_every_protect_takes_the_hold_bounds() -> None:
    """The keywords are declared once (``adapters.mcp.Settings``): FastMCP's protect() takes them too."""
    codec = StateCodec(KeyRing.generate())
    for middleware in (
        mcp.protect(MCPServer("holds"), codec, max_holds=3, max_holds_per_token=1),
        fastmcp.protect(FastMCP("holds"), codec, max_holds=3, max_holds_per_token=1),
    ):
        assert (middleware.holds.total, middleware.holds.per_token) == (3, 1)
    assert fastmcp.protect(FastMCP("holds"), codec).principal is fastmcp.authenticated_principal
    assert mcp.protect(MCPServer("holds"), codec).principal is mcp.authenticated_principal
    with pytest.raises(TypeError, match="max_hold_s"):
        mcp.protect(MCPServer("holds"), codec, max_hold_s=3)  # type: ignore[call-arg]
