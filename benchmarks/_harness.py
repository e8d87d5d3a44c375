"""What every benchmark here shares: the request they protect, the machine, the sampling.

The method (benchmarks/README.md says why): candidates run interleaved in one process, in
a fresh seeded random order each repeat, so a slow phase of a shared machine hits all of
them alike; a sample is the CPU time of a loop with the garbage collector paused; a
figure is a median over repeats, and a comparison is the median of the per-repeat ratios
or differences, measured side by side, never a ratio of two medians from different runs.

pyperf was considered and not used: it runs each benchmark in worker processes of its
own, one after the other, so it cannot interleave candidates or pair their samples.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import ssl
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
# statecodec from this tree, and the tests' process and server fixtures (tests/processes.py,
# tests/fixtures_valkey.py), which the proxy and replay benchmarks start their servers with.
for _path in (ROOT / "tests", ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# One MCP request, as every benchmark protects it.
PRINCIPAL = "https://auth.example.com|weather-client|user:8f14e45f"
AUDIENCE = "weather-svc"
METHOD = "tools/call"
TARGET = "get_forecast"
ARGS: dict[str, Any] = {"city": "Lisbon", "days": 3, "units": "metric"}
OTHER_ARGS: dict[str, Any] = {"city": "Porto", "days": 3, "units": "metric"}
VERSIONS = ("statecodec", "cryptography", "pynacl", "pybase64", "orjson", "mcp", "pyseto", "itsdangerous")

T = TypeVar("T")


def compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def make_state(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes, shaped like a multi-round tool's state."""
    state: dict[str, Any] = {
        "v": 1,
        "step": 2,
        "pending": "confirm_booking",
        "cart": [{"sku": "A-1029", "qty": 2}, {"sku": "B-77", "qty": 1}],
        "ctx": {"city": "Lisbon", "days": 3, "units": "metric"},
        "note": "",
    }
    if len(compact(state)) > size:
        state = {"step": 2, "note": ""}
    state["note"] = "n" * (size - len(compact(state)))
    raw = compact(state)
    assert len(raw) == size, (len(raw), size)
    return raw


def parser(doc: str, *, out: bool = True) -> argparse.ArgumentParser:
    """``--quick``, ``--seed`` and (unless ``out=False``) ``--out DIR``; a script adds its own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer, shorter repeats (a look, not a result)")
    ap.add_argument("--seed", type=int, default=8, help="seed of the interleaving order")
    if out:
        ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    return ap


def write_json(result: dict[str, Any], out: Path, stem: str) -> Path:
    """``out/stem.json`` (``--quick`` runs pass a ``-quick`` stem, which git ignores)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def plot_beside(draw: Callable[[Path, Path], None], path: Path) -> None:
    """``draw`` the plot of the results at ``path`` beside them (``.png``), or say why not."""
    try:
        draw(path, path.with_suffix(".png"))
        print(f"plot: {path.with_suffix('.png')}")
    except ImportError:  # matplotlib is optional: the figures stand without their plot
        print("plot skipped: matplotlib is in the bench dependency group (pip install --group bench)")


def machine(*versions: str) -> dict[str, Any]:
    """The machine, the tree and the package versions a result was measured with."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    found: dict[str, str | None] = {}
    for dist in (*VERSIONS, *versions):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    found["openssl"] = ssl.OPENSSL_VERSION
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "git_commit": commit,
        "versions": found,
        "load_average": os.getloadavg(),
    }


# ---------------------------------------------------------------------------- sampling
@contextmanager
def gc_paused() -> Iterator[None]:
    """A collection first, then none inside: a sample pays for no other sample's garbage."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def interleaved(items: Sequence[T], repeats: int, seed: int) -> Iterator[list[T]]:
    """``repeats`` orders of ``items``, each a fresh shuffle of the last (seeded)."""
    rng, order = random.Random(seed), list(items)
    for _ in range(repeats):
        rng.shuffle(order)
        yield order


def calibrate(op: Callable[[], object], target_s: float) -> int:
    """Loops of ``op`` that take about ``target_s`` of CPU; running it is the warm-up."""
    n, t0 = 0, time.thread_time()
    while time.thread_time() - t0 < target_s / 4 or n < 3:
        op()
        n += 1
    per_op = (time.thread_time() - t0) / n
    return max(1, int(target_s / per_op))


def sample_us(op: Callable[[], object], loops: int) -> float:
    """Microseconds of CPU time of this thread per ``op()``, over ``loops`` calls."""
    with gc_paused():
        t0 = time.thread_time_ns()
        for _ in range(loops):
            op()
        t1 = time.thread_time_ns()
    return (t1 - t0) / loops / 1000.0


def paired_ratio(samples: Sequence[float], base: Sequence[float]) -> float:
    """The median of the per-repeat ratios to ``base``, measured in the same repeats."""
    return statistics.median(a / b for a, b in zip(samples, base, strict=True))


def paired_diff(samples: Sequence[float], base: Sequence[float]) -> float:
    """The median of the per-repeat differences to ``base``, measured in the same repeats."""
    return statistics.median(a - b for a, b in zip(samples, base, strict=True))


def quartiles(xs: Sequence[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


def spread(xs: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def peak_alloc(op: Callable[[], object]) -> int:
    """High-water mark of Python heap allocations during one op (OpenSSL/libsodium not seen)."""
    op()
    tracemalloc.start()
    try:
        op()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        op()
        return max(0, tracemalloc.get_traced_memory()[1] - base)
    finally:
        tracemalloc.stop()


# ---------------------------------------------------------------- distributions and plots
#: The quantiles a results JSON keeps of a latency distribution: enough for the box plots
#: (quartiles, whiskers at p1 and p99) and the tables, without every sample in the file.
QUANTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


def distribution(values: Sequence[float], digits: int = 4) -> dict[str, float]:
    """``{"n": ..., "p1": ..., ..., "p99": ...}`` of ``values`` (nearest-rank quantiles)."""
    ordered = sorted(values)
    last = len(ordered) - 1
    out: dict[str, float] = {"n": len(ordered)}
    for q in QUANTILES:
        out[f"p{q}"] = round(ordered[min(last, round(q / 100 * last))], digits)
    return out


def draw_boxes(ax: Any, dists: Sequence[dict[str, float]], labels: Sequence[str]) -> None:
    """Horizontal box plots from :func:`distribution` results: box p25-p75, whiskers p1-p99."""
    stats = [
        {
            "label": name,
            "med": d["p50"],
            "q1": d["p25"],
            "q3": d["p75"],
            "whislo": d["p1"],
            "whishi": d["p99"],
        }
        for d, name in zip(dists, labels, strict=True)
    ]
    ax.bxp(stats, orientation="horizontal", showfliers=False)
