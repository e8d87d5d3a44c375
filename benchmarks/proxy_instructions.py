"""Instructions the proxy executes per round, counted by valgrind (callgrind): repeatable on a busy machine.

    .venv/bin/python benchmarks/proxy_instructions.py [--flows 100] [--part proxy,forwarder,server]
        [--tree TREE] [--client httptools|h11] [--before CODE] [--keep DIR] [--traffic deploy|relay]
        [--count instructions|opcodes]

CPU time on a shared VM moves by a third from one minute to the next; an instruction
count does not. Each part runs under ``valgrind --tool=callgrind`` with instrumentation
switched on only for ``--flows`` deploy flows (two rounds each) after 40 warm-up flows,
one flow at a time, in front of the TypeScript upstream, driven as bench_proxy drives it:

* ``proxy``: ``statecodec proxy`` as deployed (ENCRYPT, SQLite replay store);
* ``forwarder``: :class:`statecodec.proxy.UpstreamApp` alone under the same server (no
  judging, no sealing: what forwarding costs);
* ``server``: uvicorn with a trivial application answering the same bytes (no upstream).

``--tree TREE`` runs the parts from another source tree (a copy of ``main``) with this
interpreter and its packages; ``--client h11`` runs them with the h11 candidate in the
place of the httptools connection toward the upstream (benchmarks/_h11_client.py).
``--before CODE`` runs a line of Python in the measured process first: a part taken away
(``import statecodec.proxy._server as s; s.MeteredApp = lambda app: app``) shows what it
costs, an upper bound of what making it cheaper can save (docs/performance.md).
``--keep DIR`` copies each part's callgrind output there (``callgrind.PART``), for
``callgrind_annotate --inclusive=yes`` (the profile that picks the next step).
``--traffic relay`` sends ``tools/list`` requests instead of deploy flows (``--flows`` of
them, counted per request): answers that cannot carry a state, the relay path alone.
``--count opcodes`` counts Python opcodes instead, without valgrind: ``sys.settrace`` with
``f_trace_opcodes`` in the measured process's main thread, switched on and off by signals
around the measured traffic, with uvicorn's tick and the connection guard's sweep (and
whatever they call) left out. Deterministic from run to run on a loaded machine (the
interpreter is run with ``PYTHONHASHSEED=0``), but blind to work done in C: the A/B for a
change to Python code, callgrind the cost in full.

User-space instructions only: the system calls' kernel work is not in these counts.
Needs ``valgrind`` (Debian package) and node with ``npm ci`` in tests/node.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from _harness import ROOT  # also puts tests/ and the tree on sys.path
from bench_proxy import HEADERS, META, flow, result_of, start, upstream_command
from processes import stop

from statecodec import KeyRing

WARM_UP = 40
IDLE = 5.0  # seconds the process is left idle after the measured traffic, its timers counted
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


# Run before a part's code when ``--client h11``: the candidate replaces the connection class.
_H11 = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
    "import _h11_client; _h11_client.install()\n"
)


# Run before a part's code when ``--count opcodes``: SIGUSR1 starts the count in the main
# thread (where the event loop runs), SIGUSR2 stops it and writes it to the file named by
# STATECODEC_OPCODES. A timer's coroutine mutes the count while it runs, calls included:
# its cost is per second, not per request (see drive()).
_OPCODES = """
import os, signal, sys
_n = [0]; _muted = [False]
_timers = {("main_loop", "server.py"), ("on_tick", "server.py"), ("run", "_guard.py")}
def _local(frame, event, arg):
    if event == "opcode":
        _n[0] += 1
    return _local
def _timer(frame, event, arg):
    if event == "return":
        _muted[0] = False
    return _timer
def _global(frame, event, arg):
    if _muted[0]:
        return None
    code = frame.f_code
    if (code.co_name, os.path.basename(code.co_filename)) in _timers:
        _muted[0] = True
        return _timer
    frame.f_trace_opcodes = True
    return _local
def _on(*_):
    sys.settrace(_global)
def _off(*_):
    sys.settrace(None)
    # Written aside, then renamed: the reader waits for the name, so it never sees it empty.
    with open(os.environ["STATECODEC_OPCODES"] + ".part", "w") as out:
        out.write(str(_n[0]))
    os.replace(os.environ["STATECODEC_OPCODES"] + ".part", os.environ["STATECODEC_OPCODES"])
signal.signal(signal.SIGUSR1, _on)
signal.signal(signal.SIGUSR2, _off)
"""


def command(
    part: str, upstream: str, tmp: Path, client: str = "httptools", before: str = "", opcodes: bool = False
) -> list[str]:
    preamble = (
        (_H11 if client == "h11" else "") + (before + "\n" if before else "") + (_OPCODES if opcodes else "")
    )
    if part == "proxy":
        keys = tmp / "keys.json"
        keys.write_text(KeyRing.generate().to_json())
        keys.chmod(0o600)
        run = "import runpy; runpy.run_module('statecodec.cli', run_name='__main__', alter_sys=True)"
        return [sys.executable, "-c", preamble + run, "proxy", "--upstream", upstream,
                "--listen", "127.0.0.1:0", "--keys", f"file:{keys}", "--replay", f"sqlite:{tmp / 'r.db'}",
                "--audience", "deploy", "--mode", "encrypt", "--log-level", "warning"]  # fmt: skip
    return [sys.executable, "-c", preamble + _SERVE, part, upstream]


async def listing(http: httpx.AsyncClient, url: str, n: int) -> None:
    """One ``tools/list``: a request no state is in, and an answer that cannot carry one."""
    headers = {**HEADERS, "mcp-method": "tools/list"}
    del headers["mcp-name"]
    body = {"jsonrpc": "2.0", "id": n, "method": "tools/list", "params": {"_meta": META}}
    response = await http.post(url, json=body, headers=headers)
    if response.status_code != 200 or not result_of(response)["result"]["tools"]:
        raise RuntimeError(f"tools/list failed: {response.status_code} {response.text[:200]}")


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


async def drive(url: str, pid: int, flows: int, traffic: str = "deploy", opcodes: bool = False) -> float:
    """Drive the measured traffic, then (counting instructions) leave the process idle for
    :data:`IDLE` seconds.

    Returns the measured phase's wall time. Its instructions are dumped apart from the idle
    window's (``callgrind_control --dump`` zeroes the counters), so that the timers the
    process runs while idle (uvicorn's tick, the connection guard's sweep) can be taken
    out: they cost per second, not per round, and on a loaded machine a round takes
    longer. Opcodes are counted without the timers (:data:`_OPCODES`): no idle window.
    """
    one = flow if traffic == "deploy" else listing
    async with httpx.AsyncClient(timeout=300) as http:
        for n in range(WARM_UP):
            await one(http, url, n)
        if opcodes:
            os.kill(pid, signal.SIGUSR1)
        else:
            _control(pid, "-i", "on")
        started = time.monotonic()
        for n in range(flows):
            await one(http, url, WARM_UP + n)
        elapsed = time.monotonic() - started
        if opcodes:
            os.kill(pid, signal.SIGUSR2)
            return elapsed
        _control(pid, "--dump=measured")
        await asyncio.sleep(IDLE)
        _control(pid, "--dump=idle")
        _control(pid, "-i", "off")
    return elapsed


def count(
    part: str,
    upstream: str,
    flows: int,
    tmp: Path,
    tree: Path,
    client: str,
    before: str = "",
    keep: Path | None = None,
    traffic: str = "deploy",
) -> tuple[int, int]:
    """Instructions per round (per request with ``relay``) of one part, run from ``tree``:
    as counted, and without what the idle timers cost over the measured phase's wall time."""
    out = tmp / f"callgrind.{part}"
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    proc, url = start(
        valgrind + command(part, upstream, tmp, client, before), "listening on ", tmp / f"{part}.log", tree
    )
    try:
        elapsed = asyncio.run(drive(url + "/mcp", proc.pid, flows, traffic))
    finally:
        stop(proc)  # callgrind writes its last totals as the process exits
    dumps = {_trigger(path): (path, _totals(path)) for path in tmp.glob(f"callgrind.{part}*")}
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dumps["measured"][0], keep / out.name)
    rounds = 2 * flows if traffic == "deploy" else flows
    measured, idle = dumps["measured"][1], dumps["idle"][1]
    return round(measured / rounds), round((measured - idle * elapsed / IDLE) / rounds)


def count_opcodes(
    part: str, upstream: str, flows: int, tmp: Path, tree: Path, client: str, before: str, traffic: str
) -> float:
    """Python opcodes per round (per request with ``relay``) of one part, run from ``tree``."""
    out = tmp / f"opcodes.{part}"
    os.environ["STATECODEC_OPCODES"] = str(out)  # read by the part's preamble (spawn passes os.environ)
    os.environ["PYTHONHASHSEED"] = "0"  # set and dict orders, hence some loops, as in every run
    proc, url = start(
        command(part, upstream, tmp, client, before, opcodes=True), "listening on ", tmp / f"{part}.log", tree
    )
    try:
        asyncio.run(drive(url + "/mcp", proc.pid, flows, traffic, opcodes=True))
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        counted = int(out.read_text())
    finally:
        stop(proc)
    return counted / (2 * flows if traffic == "deploy" else flows)


def _trigger(path: Path) -> str:
    """Which dump ``path`` is: ``measured``, ``idle`` (named by :func:`drive`), or another."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("desc: Trigger:"):  # "desc: Trigger: dump measured"
            return line.rsplit(":", 1)[1].strip().removeprefix("dump ")
    return path.name


def _totals(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flows", type=int, default=100, help="measured flows per part (two rounds each)")
    parser.add_argument("--part", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the source tree whose parts are run")
    parser.add_argument(
        "--client",
        choices=["httptools", "h11"],
        default="httptools",
        help="the connection toward the upstream",
    )
    parser.add_argument("--before", default="", help="Python run in the measured process before the part")
    parser.add_argument("--keep", type=Path, help="a directory to copy each part's callgrind output to")
    parser.add_argument(
        "--traffic",
        choices=["deploy", "relay"],
        default="deploy",
        help="deploy flows (two rounds each), or tools/list requests (the relay path alone)",
    )
    parser.add_argument(
        "--count",
        choices=["instructions", "opcodes"],
        default="instructions",
        help="machine instructions under callgrind, or Python opcodes (sys.settrace, no valgrind)",
    )
    args = parser.parse_args()
    needs_valgrind = args.count == "instructions"
    if needs_valgrind and (shutil.which("valgrind") is None or shutil.which("callgrind_control") is None):
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="proxy-instructions-") as tmp_dir:
        tmp = Path(tmp_dir)
        cmd, cwd = upstream_command("typescript")
        upstream, upstream_url = start(cmd, "READY ", tmp / "upstream.log", cwd)
        try:
            tree = args.tree.resolve()
            for part in args.part.split(","):
                unit = "round" if args.traffic == "deploy" else "request"
                if args.count == "opcodes":
                    opcodes = count_opcodes(
                        part, upstream_url, args.flows, tmp, tree, args.client, args.before, args.traffic
                    )
                    print(f"{part:10s} {opcodes:>12,.1f} Python opcodes per {unit}", flush=True)
                    continue
                per_round = count(
                    part,
                    upstream_url,
                    args.flows,
                    tmp,
                    tree,
                    args.client,
                    args.before,
                    args.keep,
                    args.traffic,
                )
                counted, busy = per_round
                print(
                    f"{part:10s} {counted:>12,} instructions per {unit}, {busy:>12,} without the idle timers",
                    flush=True,
                )
        finally:
            stop(upstream)


if __name__ == "__main__":
    main()
