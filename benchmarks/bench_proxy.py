"""What ``statecodec proxy`` adds to an MCP round trip, on loopback.

    .venv/bin/python benchmarks/bench_proxy.py            # writes benchmarks/results/proxy.json
    .venv/bin/python benchmarks/bench_proxy.py --quick    # a fast look, writes proxy-quick.json

Starts the unprotected deploy server (examples/unprotected_server.py, or the TypeScript
SDK server with ``--upstream typescript``) and one ``statecodec proxy`` process in front
of it (SQLite replay store, or with ``--replay redis`` a Valkey server started for the
run; ENCRYPT by default), then drives the two-round deploy flow with raw JSON-RPC over
HTTP/1.1 keep-alive (no MCP client in the measurement):

* latency: one flow at a time, direct and proxied flows interleaved in random order so
  a noisy phase of a shared machine hits both alike; per round (round 1 = the call that
  gets ``input_required``, round 2 = the retry with the state), p50 and p99 of wall time,
  and the added latency as proxied minus direct;
* throughput: ``--concurrency`` flows in flight, direct then proxied through a proxy of
  each ``--workers`` count (default 1 and 2), completed flows per second, and the CPU time
  of each proxy (all its processes) per round.

``--baseline TREE`` adds the proxy of another source tree (for instance a ``git worktree``
of the commit before a change) to the throughput phase, run by this interpreter with
the same packages: the before and after of a change measured in one run.

The results JSON keeps the quantiles of each latency distribution (p1 to p99); the plot
of them (``--plot results.json``, drawn after each run with matplotlib from the ``bench``
group) is what docs/performance.md shows.

Both phases stop at ``--flows`` or ``--seconds``, whichever comes first. Every process
runs on the same machine, so the figures include the proxy competing with the client and
the upstream for CPU: on a 2-core machine they are an upper bound of the proxy's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _harness
import httpx
from _harness import ROOT, interleaved
from fixtures_proxy import ANSWERS, META, TOOL, modern_headers
from fixtures_valkey import ValkeyServer
from processes import await_line, spawn, started, stop

from statecodec import KeyRing

# The deploy flow's requests as the proxy tests send them (tests/fixtures_proxy.py).
HEADERS = modern_headers("tools/call", TOOL)


# ------------------------------------------------------------------ processes
def start(command: list[str], prefix: str, log: Path, cwd: Path = ROOT) -> tuple[subprocess.Popen[str], str]:
    """Spawn ``command`` (tests/processes.py) and wait for the line that gives its address."""
    proc = spawn(command, log, cwd)
    return proc, await_line(proc, prefix, log)


def upstream_command(kind: str) -> tuple[list[str], Path]:
    if kind == "typescript":
        node = shutil.which("node")
        if node is None:
            raise SystemExit("--upstream typescript needs node (and npm ci in tests/node)")
        return [node, str(ROOT / "tests" / "node" / "ts_upstream_server.mjs")], ROOT / "tests" / "node"
    return [sys.executable, str(ROOT / "examples" / "unprotected_server.py"), "--port", "0"], ROOT


# ------------------------------------------------------------------ one flow
def result_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC response in a JSON body or an SSE stream."""
    response.raise_for_status()
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and '"result"' in line:
                return json.loads(line[5:])  # type: ignore[no-any-return]
        raise RuntimeError("no result in the SSE stream")
    return response.json()  # type: ignore[no-any-return]


async def flow(http: httpx.AsyncClient, url: str, n: int) -> tuple[int, int]:
    """Both rounds of one deploy; returns their wall times in nanoseconds."""
    params: dict[str, Any] = {"name": TOOL, "arguments": {"version": "1.2.3"}, "_meta": META}
    t0 = time.perf_counter_ns()
    first = result_of(
        await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 2 * n, "method": "tools/call", "params": params},
            headers=HEADERS,
        )
    )
    t1 = time.perf_counter_ns()
    state = first["result"]["requestState"]
    retry = {**params, "inputResponses": ANSWERS, "requestState": state}
    second = result_of(
        await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 2 * n + 1, "method": "tools/call", "params": retry},
            headers=HEADERS,
        )
    )
    t2 = time.perf_counter_ns()
    if second["result"]["structuredContent"]["deployed"] != "1.2.3":
        raise RuntimeError(f"the flow did not complete: {second}")
    return t1 - t0, t2 - t1


# ------------------------------------------------------------------ phases
def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary_ms(values: list[int]) -> dict[str, float]:
    ms = [v / 1e6 for v in values]
    return {"p50": round(statistics.median(ms), 3), "p99": round(percentile(ms, 0.99), 3), "n": len(ms)}


async def latency(targets: dict[str, str], flows: int, seconds: float, seed: int) -> dict[str, Any]:
    rounds: dict[str, list[list[int]]] = {name: [[], []] for name in targets}
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=60) as http:
        for url in targets.values():  # warm up connections and code paths
            for i in range(5):
                await flow(http, url, 10_000 + i)
        done = 0
        for order in interleaved(list(targets), flows, seed):
            if time.monotonic() >= deadline:
                break
            for name in order:
                r1, r2 = await flow(http, targets[name], done)
                rounds[name][0].append(r1)
                rounds[name][1].append(r2)
            done += 1
    out: dict[str, Any] = {
        "distribution_ms": {
            name: [_harness.distribution([v / 1e6 for v in r]) for r in rs] for name, rs in rounds.items()
        }
    }
    for index, label in enumerate(("round1", "round2")):
        direct, proxied = summary_ms(rounds["direct"][index]), summary_ms(rounds["proxy"][index])
        out[label] = {
            "direct": direct,
            "proxy": proxied,
            "added_p50": round(proxied["p50"] - direct["p50"], 3),
            "added_p99": round(proxied["p99"] - direct["p99"], 3),
        }
    out["flows"] = done
    return out


async def throughput(url: str, flows: int, seconds: float, concurrency: int) -> dict[str, float]:
    started = time.perf_counter()
    deadline = time.monotonic() + seconds
    counter = iter(range(flows))
    completed = 0

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal completed
        for n in counter:
            if time.monotonic() > deadline:
                return
            await flow(http, url, 100_000 + n)
            completed += 1

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"flows": completed, "seconds": round(elapsed, 2), "flows_per_s": round(completed / elapsed, 1)}


# ------------------------------------------------------------------ main
def parse_args() -> argparse.Namespace:
    parser = _harness.parser(__doc__)
    parser.add_argument("--flows", type=int, help="flows per phase and target (default 300, quick 60)")
    parser.add_argument(
        "--seconds", type=float, help="time limit per phase and target (default 60, quick 15)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="flows in flight in the throughput phase")
    parser.add_argument("--upstream", choices=["python", "typescript"], default="python")
    parser.add_argument("--mode", choices=["sign", "encrypt"], default="encrypt")
    parser.add_argument(
        "--replay",
        choices=["sqlite", "redis"],
        default="sqlite",
        help="the proxies' shared replay store: a SQLite file, or a Valkey server started for the run",
    )
    parser.add_argument(
        "--workers",
        default="1,2",
        help="proxy worker counts whose throughput is measured, comma-separated (latency uses the first)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="TREE",
        help="also measure the throughput and CPU of the proxy of this source tree (one worker), "
        "e.g. a `git worktree` of an older commit, side by side with this one",
    )
    parser.add_argument(
        "--plot", type=Path, help="only draw the plot of this results JSON (needs matplotlib)"
    )
    args = parser.parse_args()
    args.workers = [int(n) for n in str(args.workers).split(",")]
    args.flows = args.flows or (60 if args.quick else 300)
    args.seconds = args.seconds or (15.0 if args.quick else 60.0)
    return args


async def measure(
    args: argparse.Namespace, direct: str, proxies: dict[int | str, tuple[str, int]]
) -> dict[str, Any]:
    first = args.workers[0]
    targets = {"direct": direct, "proxy": proxies[first][0]}
    report: dict[str, Any] = {"latency_ms": await latency(targets, args.flows, args.seconds, args.seed)}
    report["throughput"] = {"direct": await throughput(direct, args.flows, args.seconds, args.concurrency)}
    # CPU time is what the proxy costs whatever else runs on the machine: wall-clock
    # latency on a shared 2-core box is mostly waiting for a core. With workers, the
    # CPU of every process of the proxy (supervisor and workers) is counted.
    report["workers"] = {}
    for count, (url, pid) in proxies.items():
        before = tree_cpu_seconds(pid)
        result = await throughput(url, args.flows, args.seconds, args.concurrency)
        rounds = 2 * result["flows"]
        result["cpu_ms_per_round"] = round((tree_cpu_seconds(pid) - before) * 1000 / rounds, 3)
        result["ratio"] = round(result["flows_per_s"] / report["throughput"]["direct"]["flows_per_s"], 3)
        report["workers"][str(count)] = result
    report["throughput"]["proxy"] = report["workers"][str(first)]
    report["proxy_cpu_ms_per_round"] = report["workers"][str(first)]["cpu_ms_per_round"]
    report["throughput"]["ratio"] = report["workers"][str(first)]["ratio"]
    return report


def table(report: dict[str, Any]) -> str:
    rows = [
        "| round | direct p50 / p99 (ms) | proxied p50 / p99 (ms) | added p50 / p99 (ms) |",
        "|---|---|---|---|",
    ]
    for label in ("round1", "round2"):
        r = report["latency_ms"][label]
        direct, proxied = r["direct"], r["proxy"]
        rows.append(
            f"| {label[-1]} | {direct['p50']} / {direct['p99']} | {proxied['p50']} / {proxied['p99']} "
            f"| {r['added_p50']} / {r['added_p99']} |"
        )
    t = report["throughput"]
    rows += [
        "",
        f"Throughput ({report['settings']['concurrency']} flows in flight), direct: "
        f"{t['direct']['flows_per_s']} flows/s; load average {report['settings']['load_average']}",
        "",
        "| proxy (workers) | proxied flows/s | ratio to direct | proxy CPU per round (ms) |",
        "|---|---|---|---|",
    ]
    for count, result in report["workers"].items():
        rows.append(
            f"| {count} | {result['flows_per_s']} | {result['ratio']} | {result['cpu_ms_per_round']} |"
        )
    return "\n".join(rows)


def _tree(path: Path) -> str:
    """The commit a baseline tree is at, as ``git describe`` says."""
    described = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=path, capture_output=True, text=True, check=False
    )
    return described.stdout.strip() or str(path)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """:func:`cpu_seconds` of ``pid`` and of its descendants still running."""
    total = cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(FileNotFoundError):  # it ended meanwhile
                total += tree_cpu_seconds(int(child))
    return total


def plot(path: Path, out: Path) -> None:
    """Per-round latency distributions, direct and proxied, from a results JSON."""
    import matplotlib  # noqa: PLC0415 - the bench dependency group

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    report = json.loads(path.read_text())
    dists = report["latency_ms"]["distribution_ms"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for index, ax in enumerate(axes):
        _harness.draw_boxes(ax, [dists["direct"][index], dists["proxy"][index]], ["direct", "proxied"])
        ax.set_title(
            f"round {index + 1} ({'input_required, seal' if index == 0 else 'retry, unseal + consume'})"
        )
        ax.set_xlabel("ms per round (box: quartiles, whiskers: p1-p99)")
    settings = report["settings"]
    fig.suptitle(
        f"bench_proxy: {settings['upstream']} upstream, {settings['mode']}, load average "
        f"{settings['load_average'][0]:.1f}"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    args = parse_args()
    if args.plot is not None:
        plot(args.plot, args.plot.with_suffix(".png"))
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp_dir:
        tmp = Path(tmp_dir)
        keys = tmp / "keys.json"
        keys.write_text(KeyRing.generate().to_json())
        keys.chmod(0o600)
        command, cwd = upstream_command(args.upstream)
        upstream, upstream_url = start(command, "READY ", tmp / "upstream.log", cwd)
        procs: list[subprocess.Popen[str]] = []
        valkey = started(ValkeyServer) if args.replay == "redis" else None
        try:
            proxies: dict[int | str, tuple[str, int]] = {}
            # One proxy per worker count, sharing keys and store; the baseline's from its tree.
            runs: list[tuple[int | str, int, Path]] = [(count, count, ROOT) for count in args.workers]
            if args.baseline is not None:
                runs.append(("baseline", 1, args.baseline.resolve()))
            for label, count, tree in runs:
                replay = valkey.url if valkey is not None else f"sqlite:{tmp / 'replay.db'}"
                proc, base = start(
                    [sys.executable, "-m", "statecodec.cli", "proxy", "--upstream", upstream_url,
                     "--listen", "127.0.0.1:0", "--keys", f"file:{keys}", "--replay", replay,
                     "--audience", "deploy", "--mode", args.mode, "--log-level", "warning",
                     *(["--workers", str(count)] if tree == ROOT else [])],
                    "listening on ", tmp / f"proxy-{label}.log", cwd=tree,
                )  # fmt: skip
                procs.append(proc)
                proxies[label] = (base + "/mcp", proc.pid)
            report = asyncio.run(measure(args, upstream_url, proxies))
        finally:
            for proc in procs:
                stop(proc)
            stop(upstream)
            if valkey is not None:
                valkey.stop()
    report["settings"] = {
        "upstream": args.upstream,
        "mode": args.mode,
        "flows": args.flows,
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "workers": args.workers,
        "baseline": None if args.baseline is None else _tree(args.baseline),
        "replay": args.replay,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "load_average": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "git_commit": _harness.machine()["git_commit"],
    }
    path = _harness.write_json(report, args.out, f"proxy-{args.upstream}{'-quick' if args.quick else ''}")
    print(table(report))
    print(f"\nwritten to {path}")
    _harness.plot_beside(plot, path)


if __name__ == "__main__":
    main()
