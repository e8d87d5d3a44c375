"""docs/serving.md as a reader runs it: served by `uvicorn server:app`, driven by the official client.

The page's Python blocks are written to ``server.py`` in an empty directory (exactly what
tests/docs/test_docs.py runs), and uvicorn serves ``server:app`` as the page's command does, on
a free loopback port. The official ``mcp`` client then runs the flow over Streamable HTTP:
round 1 gets a sealed token that does not show the plan, round 2 with it deploys, the same
token again gets the uniform -32602, and a token presented with other arguments is refused
without being burnt. The server is stopped by its PID.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
from doc_pages import ROOT, page_program
from fixtures_valkey import wait_until
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from processes import spawn, stop

from statecodec.boundary import WIRE_ERROR_CODE, WIRE_ERROR_MESSAGE

PAGE = ROOT / "docs" / "serving.md"
CONFIRM = {"confirm": types.ElicitResult(action="accept", content={"confirm": True})}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "server.py").write_text(page_program(PAGE), encoding="utf-8")
    log = tmp_path / "uvicorn.log"
    proc = spawn(  # port 0: uvicorn binds a free port and logs the one it got
        [sys.executable, "-m", "uvicorn", "server:app", "--host", "127.0.0.1", "--port", "0"],
        log,
        cwd=tmp_path,
    )
    try:
        wait_until(lambda: "Uvicorn running on" in log.read_text() or proc.poll() is not None, "uvicorn")
        assert proc.poll() is None, log.read_text()
        running = re.search(r"Uvicorn running on (http://127\.0\.0\.1:[1-9]\d*)", log.read_text())
        assert running, log.read_text()
        yield f"{running.group(1)}/mcp"
    finally:
        stop(proc)
    assert (tmp_path / "keys.json").stat().st_mode & 0o077 == 0  # the page's key file, mode 600


async def test_the_page_serves_a_protected_flow_over_http(served: str) -> None:
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        Client(streamable_http_client(served, http_client=http), cache=None) as client,
    ):
        first = await client.session.call_tool("deploy", {"version": "1.2.3"}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult), first
        token = first.request_state
        assert token and token.startswith("sc1") and "canary" not in token, (
            token
        )  # ENCRYPT: the plan is hidden
        done = await client.session.call_tool(
            "deploy",
            {"version": "1.2.3"},
            input_responses=CONFIRM,
            request_state=token,
            allow_input_required=True,
        )
        assert isinstance(done, types.CallToolResult) and not done.is_error, done
        assert [c.text for c in done.content if isinstance(c, types.TextContent)] == ["deployed 1.2.3"]
        with pytest.raises(MCPError) as replayed:
            await client.session.call_tool(
                "deploy",
                {"version": "1.2.3"},
                input_responses=CONFIRM,
                request_state=token,
                allow_input_required=True,
            )
        assert (replayed.value.code, replayed.value.message) == (WIRE_ERROR_CODE, WIRE_ERROR_MESSAGE)
        other = await client.session.call_tool("deploy", {"version": "9.9.9"}, allow_input_required=True)
        assert isinstance(other, types.InputRequiredResult)
        with pytest.raises(MCPError) as rebound:  # bound to its arguments: refused before it is consumed
            await client.session.call_tool(
                "deploy",
                {"version": "1.2.3"},
                input_responses=CONFIRM,
                request_state=other.request_state,
                allow_input_required=True,
            )
        assert rebound.value.code == WIRE_ERROR_CODE
        honest = await client.session.call_tool(
            "deploy",
            {"version": "9.9.9"},
            input_responses=CONFIRM,
            request_state=other.request_state,
            allow_input_required=True,
        )
        assert isinstance(honest, types.CallToolResult) and not honest.is_error, honest


def test_the_page_stops_at_start_when_its_store_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_port: int
) -> None:
    # The page checks its replay store before it serves: a dead Redis shows at start-up,
    # not at the first round 2.
    (tmp_path / "server.py").write_text(page_program(PAGE), encoding="utf-8")
    monkeypatch.setenv("STATECODEC_REPLAY", f"redis://127.0.0.1:{refused_port}/0")
    log = tmp_path / "uvicorn.log"
    proc = spawn(
        [sys.executable, "-m", "uvicorn", "server:app", "--host", "127.0.0.1", "--port", "0"],
        log,
        cwd=tmp_path,
    )
    try:
        proc.wait(timeout=120)
    finally:
        stop(proc)
    text = log.read_text()
    assert proc.returncode not in (0, None), text
    assert "Uvicorn running on" not in text and f"127.0.0.1:{refused_port}" in text, text
