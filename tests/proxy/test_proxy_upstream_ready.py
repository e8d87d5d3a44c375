"""A dead upstream, as an operator sees it: a warning at start, 502s that keep the request's id,
and ``/readyz``, which leaves the upstream out unless ``--ready-upstream`` asks.

Real ``statecodec proxy`` processes (JSON logs, memory: store). The dead upstream is a
socket bound on loopback and never listening, held for the whole test (connections to it
are refused, and no other process can take its port); the live one is a small threaded
HTTP server written here, closed mid-test.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures_proxy import Proxy, modern_request, proxy_command
from loopback import Loopback, Quiet
from processes import await_line, spawn, stop

from statecodec import KeyRing

pytestmark = pytest.mark.timeout(120)


class _Answering(Quiet):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.reply_json(200, {"jsonrpc": "2.0", "id": 7, "result": {}})


@pytest.fixture
def dead_upstream() -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"


@contextlib.contextmanager
def proxy(tmp: Path, upstream: str, *extra: str) -> Iterator[tuple[Proxy, str]]:
    keys = tmp / "keys.json"
    keys.write_text(KeyRing.generate().to_json(), encoding="utf-8")
    keys.chmod(0o600)
    command = proxy_command(
        upstream, keys=keys, replay="memory:", mode="sign", jwks=None,
        extra=["--log-format", "json", "--admin-listen", "127.0.0.1:0", *extra],
    )  # fmt: skip
    log_path = tmp / "proxy.log"
    proc = spawn(command, log_path)
    try:
        admin = await_line(proc, "admin on ", log_path)
        yield Proxy("P", await_line(proc, "listening on ", log_path), proc, log_path), admin
    finally:
        stop(proc)


def readyz(admin: str) -> tuple[int, dict[str, Any]]:
    answer = httpx.get(f"{admin}/readyz", timeout=30)
    return answer.status_code, answer.json()


def test_a_dead_upstream_is_warned_of_at_start_and_answered_502_with_the_requests_id(
    tmp_path: Path, dead_upstream: str
) -> None:
    with proxy(tmp_path, dead_upstream) as (started, admin):
        [warning] = [r for r in started.records() if r.get("event") == "upstream_silent"]
        assert warning["level"] == "WARNING" and warning["upstream"] == dead_upstream
        assert dead_upstream in warning["message"]
        body, headers = modern_request("tools/list", {}, request_id=7)
        answer = httpx.post(started.url, content=body, headers=headers, timeout=30)
        assert answer.status_code == 502
        assert answer.json() == {
            "jsonrpc": "2.0",
            "id": 7,
            "error": {"code": -32603, "message": "Upstream unavailable"},
        }
        failure = started.wait_for_log('"upstream_error"')
        assert dead_upstream in failure
        # By default readiness covers the keys and the replay store, not the upstream.
        status, document = readyz(admin)
        assert status == 200 and set(document["checks"]) == {"keys", "replay_store"}


def test_ready_upstream_makes_readyz_follow_the_upstream(tmp_path: Path) -> None:
    upstream = Loopback(_Answering)
    url = f"{upstream.base}/mcp"
    try:
        with proxy(tmp_path, url, "--ready-upstream") as (started, admin):
            assert not [r for r in started.records() if r.get("event") == "upstream_silent"]
            status, document = readyz(admin)
            assert status == 200, document
            assert document["checks"]["upstream"] == {"ok": True, "detail": f"the upstream {url} answers"}
            upstream.close()
            deadline = time.monotonic() + 30
            while (status := readyz(admin)[0]) == 200 and time.monotonic() < deadline:
                time.sleep(0.2)  # a probe asks the upstream at most once a second
            status, document = readyz(admin)
            assert status == 503 and document["failing"] == ["upstream"], json.dumps(document)
            assert document["checks"]["upstream"]["detail"].startswith(f"the upstream {url} does not answer")
    finally:
        upstream.close()
