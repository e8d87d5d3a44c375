"""Instructions the proxy executes per round, counted by valgrind (callgrind): repeatable on a busy machine.

    .venv/bin/python benchmarks/proxy_instructions.py [--flows 100] [--part proxy,forwarder,server]

CPU time on a shared VM moves by a third from one minute to the next; an instruction
count does not. Each part runs under ``valgrind --tool=callgrind`` with instrumentation
switched on only for ``--flows`` deploy flows (two rounds each) after 40 warm-up flows,
one flow at a time, in front of the TypeScript upstream, driven as bench_proxy drives it:

* ``proxy``: ``statecodec proxy`` as deployed (ENCRYPT, SQLite replay store);
* ``forwarder``: :class:`statecodec.proxy.UpstreamApp` alone under the same server (no
  judging, no sealing: what forwarding costs);
* ``server``: uvicorn with a trivial application answering the same bytes (no upstream).

User-space instructions only: the system calls' kernel work is not in these counts.
Needs ``valgrind`` (Debian package) and node with ``npm ci`` in tests/node.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _harness  # noqa: F401 - puts tests/ and the tree on sys.path
import httpx
from bench_proxy import flow, start, upstream_command
from processes import stop

from statecodec import KeyRing

WARM_UP = 40
PARTS = ("proxy", "forwarder", "server")
_SERVE = """
import asyncio, sys
from statecodec.proxy import UpstreamApp, bind_socket, event_loop_factory, serve
R1 = (b'{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required",'
      b'"requestState":"s","inputRequests":{}}}')
R2 = b'{"jsonrpc":"2.0","id":2,"result":{"content":[],"structuredContent":{"deployed":"1.2.3"}}}'
async def answer(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = R2 if b"inputResponses" in (await receive()).get("body", b"") else R1
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
app = UpstreamApp(sys.argv[2]) if sys.argv[1] == "forwarder" else answer
with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
    ready = lambda url: print("listening on", url, flush=True)
    runner.run(serve(app, bind_socket("127.0.0.1", 0), on_ready=ready))
"""


def command(part: str, upstream: str, tmp: Path) -> list[str]:
    if part == "proxy":
        keys = tmp / "keys.json"
        keys.write_text(KeyRing.generate().to_json())
        keys.chmod(0o600)
        return [sys.executable, "-m", "statecodec.cli", "proxy", "--upstream", upstream,
                "--listen", "127.0.0.1:0", "--keys", f"file:{keys}", "--replay", f"sqlite:{tmp / 'r.db'}",
                "--audience", "deploy", "--mode", "encrypt", "--log-level", "warning"]  # fmt: skip
    return [sys.executable, "-c", _SERVE, part, upstream]


async def drive(url: str, pid: int, flows: int) -> None:
    async with httpx.AsyncClient(timeout=300) as http:
        for n in range(WARM_UP):
            await flow(http, url, n)
        subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
        for n in range(flows):
            await flow(http, url, WARM_UP + n)
        subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True)


def count(part: str, upstream: str, flows: int, tmp: Path) -> int:
    """Instructions per round of one part."""
    out = tmp / f"callgrind.{part}"
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    proc, url = start(valgrind + command(part, upstream, tmp), "listening on ", tmp / f"{part}.log")
    try:
        asyncio.run(drive(url + "/mcp", proc.pid, flows))
    finally:
        stop(proc)  # callgrind writes its totals as the process exits
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return round(int(line.split()[1]) / (2 * flows))
    raise RuntimeError(f"no totals in {out}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flows", type=int, default=100, help="measured flows per part (two rounds each)")
    parser.add_argument("--part", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="proxy-instructions-") as tmp_dir:
        tmp = Path(tmp_dir)
        cmd, cwd = upstream_command("typescript")
        upstream, upstream_url = start(cmd, "READY ", tmp / "upstream.log", cwd)
        try:
            for part in args.part.split(","):
                print(
                    f"{part:10s} {count(part, upstream_url, args.flows, tmp):>12,} instructions per round",
                    flush=True,
                )
        finally:
            stop(upstream)


if __name__ == "__main__":
    main()
