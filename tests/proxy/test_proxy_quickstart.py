"""The proxy quick starts (docs/proxy.md, README.md) run on a laptop as written.

The commands of each quick start's first ``console`` block are run as they are written,
from an empty directory, with two changes only: fixed ports become free ones (port 0, or
the one the example server picked) and ``python`` / ``statecodec`` are this environment's.
No Vault, no Redis, no identity provider, nothing under /var/lib. Then the official ``mcp``
client runs the deploy flow through the proxy, and a replayed token is refused. Every
process is stopped by its PID.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
from fixtures_mcp import ANSWERS, answer_elicitation
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from processes import ROOT, await_line, spawn, stop

BIN = Path(sys.executable).parent
UPSTREAM = "http://127.0.0.1:9000/mcp"


def quick_start(page: Path, heading: str) -> list[list[str]]:
    """The commands (``$ `` lines, ``\\`` continued) of the first console block after HEADING."""
    text = page.read_text(encoding="utf-8")
    block = re.search(r"```console\n(.*?)```", text[text.index(heading) :], re.S)
    assert block, f"{page.name}: no console block after {heading!r}"
    joined = block.group(1).replace("\\\n", " ")
    return [shlex.split(line[2:]) for line in joined.splitlines() if line.startswith("$ ")]


def as_run_here(argv: list[str], upstream: str) -> list[str]:
    """ARGV with this environment's programs, free ports and the example server's real URL."""
    tools = {"python": sys.executable, "statecodec": str(BIN / "statecodec")}
    out = [tools.get(argv[0], argv[0])]
    for arg in argv[1:]:
        arg = {"9000": "0", "127.0.0.1:8000": "127.0.0.1:0", UPSTREAM: upstream}.get(arg, arg)
        out.append(str(ROOT / arg) if arg.startswith("examples/") else arg)
    return out


@contextmanager
def started(argv: list[str], cwd: Path, ready: str) -> Iterator[str]:
    log = cwd / f"{Path(argv[1]).name}.log"
    proc = spawn(argv, log, cwd=cwd)
    try:
        yield await_line(proc, ready, log)
    finally:
        stop(proc)


async def deploy_through(url: str) -> None:
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        Client(
            streamable_http_client(url, http_client=http), elicitation_callback=answer_elicitation, cache=None
        ) as client,
    ):
        first = await client.session.call_tool(
            "deploy_production", {"version": "1.2.3"}, allow_input_required=True
        )
        assert isinstance(first, types.InputRequiredResult), first
        token = first.request_state
        assert token and token.startswith("sc1e.") and "plan_id" not in token, token
        again = {"input_responses": ANSWERS, "request_state": token, "allow_input_required": True}
        done = await client.session.call_tool("deploy_production", {"version": "1.2.3"}, **again)
        assert isinstance(done, types.CallToolResult) and not done.is_error, done
        assert (done.structured_content or {}).get("deployed") == "1.2.3", done
        with pytest.raises(MCPError) as replayed:
            await client.session.call_tool("deploy_production", {"version": "1.2.3"}, **again)
        assert replayed.value.code == -32602


@pytest.mark.parametrize(
    ("page", "heading"), [("docs/proxy.md", "## Quick start"), ("README.md", "by deployment alone")]
)
async def test_quick_start_runs_as_written(page: str, heading: str, tmp_path: Path) -> None:
    commands = quick_start(ROOT / page, heading)
    proxy = next(c for c in commands if c[:2] == ["statecodec", "proxy"])
    assert not [a for a in proxy if a.startswith(("/var", "/etc", "https://"))], proxy  # a laptop's
    server = next(
        (c for c in commands if c[0] == "python"),
        ["python", "examples/unprotected_server.py", "--port", "9000"],
    )  # README: "any server"
    with started(as_run_here(server, UPSTREAM), tmp_path, "READY ") as upstream:
        for command in commands:
            if command[0] == "statecodec" and command is not proxy:
                subprocess.run(as_run_here(command, upstream), cwd=tmp_path, check=True, capture_output=True)
        with started(as_run_here(proxy, upstream), tmp_path, "listening on ") as url:
            await deploy_through(url + "/mcp")
    assert (tmp_path / "keys.json").exists() and (tmp_path / "replay.db").exists()
