"""What a private seam of a dependency earns per request, in instructions (callgrind).

    .venv/bin/python benchmarks/seam_instructions.py --without FILE.py [--without ...] [--flows 60]
    .venv/bin/python benchmarks/seam_instructions.py --sdk --without FILE.py

A seam is kept only where a request-level benchmark shows at least 1% from it
(docs/architecture.md). Each ``FILE.py`` takes one seam away the way a release without it
would (it runs as ``sitecustomize`` in the measured process, so it may patch statecodec
or a dependency before the first request); the tree is measured as it is and once per
file, side by side in one run, under one hash seed, and the instructions per round of
each and the differences are printed. docs/performance.md lists the files used for the
seams measured so far.

The round is the deployed proxy's (``statecodec proxy``, ENCRYPT, SQLite replay store,
in front of the TypeScript upstream, counted as benchmarks/proxy_instructions.py counts
it), or with ``--sdk`` bench_protect.py's round through the MCP SDK (the official client,
``Client(server)`` in one process, ``protect()`` in ENCRYPT mode, memory replay store).

Needs what benchmarks/proxy_instructions.py needs (valgrind, node with ``npm ci`` in tests/node).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import _harness  # first: puts tests/ and the tree on sys.path
import processes
import proxy_instructions
from bench_proxy import start, upstream_command
from processes import stop
from proxy_instructions import count

_SDK_ROUNDS = """
import asyncio, sys
sys.path.insert(0, sys.argv[2])
import _harness
from bench_protect import ENCRYPT, make_server, one_round
from mcp.client import Client
from statecodec import KeyRing
async def main(n):
    server, _ = make_server(ENCRYPT, KeyRing.generate(), bytes(32))
    async with Client(server) as client:
        for _ in range(20):
            await one_round(client)
        print("ready", flush=True)
        sys.stdin.readline()  # instrumentation goes on meanwhile
        for _ in range(n):
            await one_round(client)
        print("done", flush=True)
        sys.stdin.readline()
asyncio.run(main(int(sys.argv[1])))
"""


def sdk_count(name: str, rounds: int, tmp: Path) -> int:
    """Instructions per SDK round (two requests)."""
    out = tmp / f"callgrind.sdk-{name}"
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    command = [sys.executable, "-c", _SDK_ROUNDS, str(rounds), str(Path(__file__).parent)]
    proc = subprocess.Popen(
        valgrind + command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    for toggle, line in (("on", "ready"), ("off", "done")):
        if proc.stdout.readline().strip() != line:
            proc.kill()
            raise RuntimeError(f"the SDK rounds did not say {line!r}")
        subprocess.run(["callgrind_control", "-i", toggle, str(proc.pid)], check=True, capture_output=True)
        proc.stdin.write("\n")
        proc.stdin.flush()
    proc.wait()
    for text in out.read_text(errors="replace").splitlines():
        if text.startswith("totals:"):
            return round(int(text.split()[1]) / rounds)
    raise RuntimeError(f"no totals in {out}")


def compare(measure: Callable[[str], int], without: list[Path], tmp: Path) -> None:
    shipped = measure("shipped")
    print(f"{'as it is':24s} {shipped:>10,} instructions per round", flush=True)
    for path in without:
        site = tmp / path.stem
        site.mkdir()
        shutil.copy(path, site / "sitecustomize.py")
        os.environ["PYTHONPATH"] = str(site)
        try:
            seamless = measure(path.stem)
        finally:
            del os.environ["PYTHONPATH"]
        saved = seamless - shipped
        print(
            f"{'without ' + path.stem:24s} {seamless:>10,} instructions per round: the seam saves "
            f"{saved:,} ({saved / seamless:.2%})",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--without", type=Path, action="append", required=True, help="a sitecustomize file")
    parser.add_argument("--flows", type=int, default=60, help="measured flows (two rounds each)")
    parser.add_argument("--sdk", action="store_true", help="the MCP SDK round instead of the proxy's")
    parser.add_argument("--mode", choices=["encrypt", "sign"], default="encrypt", help="the proxy's mode")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    processes.START_TIMEOUT = 900.0  # a Python under callgrind starts slowly on a loaded machine
    # One hash seed for every process: dict and set layouts, and so the instruction counts,
    # then differ only by what a file changes.
    os.environ["PYTHONHASHSEED"] = "0"
    with tempfile.TemporaryDirectory(prefix="seam-instructions-") as tmp_dir:
        tmp = Path(tmp_dir)
        if args.sdk:
            compare(lambda name: sdk_count(name, args.flows, tmp), args.without, tmp)
            return
        deployed = proxy_instructions.command

        def in_mode(
            part: str, upstream: str, folder: Path, client: str = "httptools", code: str = ""
        ) -> list[str]:
            argv = deployed(part, upstream, folder, client, code)
            before = ["", *argv]
            return [args.mode if prev == "--mode" else arg for prev, arg in zip(before, argv, strict=False)]

        proxy_instructions.command = in_mode
        cmd, cwd = upstream_command("typescript")
        upstream, upstream_url = start(cmd, "READY ", tmp / "upstream.log", cwd)
        try:
            runs = iter(range(1_000))

            def proxy(name: str) -> int:
                run = tmp / f"run-{next(runs)}"  # count() writes its files by part name: one folder each
                run.mkdir()
                return count("proxy", upstream_url, args.flows, run, _harness.ROOT, "httptools")

            compare(proxy, args.without, tmp)
        finally:
            stop(upstream)


if __name__ == "__main__":
    main()
