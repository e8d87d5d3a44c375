"""What ``protect(...)`` costs on a real MRTR round through the MCP SDK, in process.

    .venv/bin/python benchmarks/bench_protect.py            # full run, writes benchmarks/results/
    .venv/bin/python benchmarks/bench_protect.py --quick

A lowlevel ``mcp`` Server answers ``tools/call`` with an ``InputRequiredResult`` carrying a
300-byte JSON ``requestState``; the official ``mcp.client.Client`` echoes it back in the
next request, round after round. Every timed round is therefore one full steady-state
MRTR round: client request building, the SDK's dispatch, validation and middleware chain,
the handler, the result on the way back, and (when protected) one unseal, one replay
store consume and one seal. State-only rounds keep the SDK's own work small, which makes
the relative overhead of ``protect`` look as large as it can.

Transports: ``direct`` is what ``Client(server)`` does for an in-process server on the
2026-07-28 protocol (the SDK's DirectDispatcher pair, no JSON-RPC framing); ``memory`` is
``Client(InMemoryTransport(server))``, JSON-RPC messages over in-memory streams.

Variants run interleaved, each repeat in a fresh random order, timed in process CPU time
(see bench_codec.py for why); the overhead is the median over repeats of the per-repeat
ratio to the unprotected server on the same transport.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.client import Client
from mcp.client._memory import InMemoryTransport
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_codec import ARGS, PRINCIPAL, RESULTS, TARGET, machine, make_state

from statecodec import KeyRing, StateCodec
from statecodec.adapters.mcp import protect
from statecodec.replay.memory import MemoryReplayStore

Ctx = ServerRequestContext[Any, Any]
STATE = make_state(300).decode("utf-8")


def make_server(variant: str, ring: KeyRing, secret: bytes) -> tuple[Server[Any], list[str | None]]:
    """A server whose ``plan`` tool always asks for more input; ``seen`` records its states."""
    seen: list[str | None] = []

    async def list_tools(ctx: Ctx, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name=TARGET, input_schema={"type": "object"})])

    async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> Any:
        if len(seen) < 4:
            seen.append(params.request_state)
        return types.InputRequiredResult(request_state=STATE)

    server: Server[Any] = Server("forecast", on_list_tools=list_tools, on_call_tool=call_tool)
    if variant.startswith("statecodec"):
        mode = "sign" if "SIGN" in variant else "encrypt"
        codec = StateCodec(ring, mode=mode, replay=MemoryReplayStore(max_entries=10_000_000))
        protect(server, codec, principal=lambda ctx: PRINCIPAL)
    elif variant.startswith("MCP SDK"):
        security = RequestStateSecurity(keys=[secret], bind_principal=lambda ctx: PRINCIPAL)
        server.middleware.append(RequestStateBoundary(security, default_audience="forecast"))
    return server, seen


VARIANTS = (
    "unprotected",
    "statecodec SIGN + memory replay store",
    "statecodec ENCRYPT + memory replay store",
    "MCP SDK RequestStateBoundary (AES-GCM)",
)


async def first_state(client: Client) -> str:
    result = await client.session.call_tool(TARGET, ARGS, allow_input_required=True)
    assert isinstance(result, types.InputRequiredResult) and result.request_state
    return result.request_state


async def run_rounds(client: Client, state: str, n: int) -> tuple[str, int]:
    """``n`` rounds; returns the last state and the CPU nanoseconds they took."""
    session = client.session
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time_ns()
        for _ in range(n):
            result = await session.call_tool(TARGET, ARGS, request_state=state, allow_input_required=True)
            state = result.request_state  # type: ignore[union-attr]
        t1 = time.process_time_ns()
    finally:
        gc.enable()
    return state, t1 - t0


async def bench(transport: str, repeats: int, rounds: int, seed: int) -> dict[str, Any]:
    ring, secret = KeyRing.generate(), os.urandom(32)
    async with AsyncExitStack() as stack:
        clients: dict[str, Client] = {}
        states: dict[str, str] = {}
        for variant in VARIANTS:
            server, seen = make_server(variant, ring, secret)
            target: Any = InMemoryTransport(server) if transport == "memory" else server
            client = await stack.enter_async_context(Client(target))
            clients[variant] = client
            states[variant] = await first_state(client)
            states[variant], _ = await run_rounds(client, states[variant], 3)
            # The handler must see its own plaintext; the wire must carry a token (or not).
            assert seen[1:] == [STATE] * (len(seen) - 1), (variant, seen)
            wire = states[variant]
            if variant == "unprotected":
                assert wire == STATE
            else:
                assert wire != STATE and STATE not in wire, variant
            for _ in range(max(3, rounds // 4)):  # warm-up
                states[variant], _ = await run_rounds(client, states[variant], 1)
        samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
        rng, order = random.Random(seed), list(VARIANTS)
        for _ in range(repeats):
            rng.shuffle(order)
            for variant in order:
                states[variant], ns = await run_rounds(clients[variant], states[variant], rounds)
                samples[variant].append(ns / rounds / 1000.0)  # µs per round
    base = samples["unprotected"]
    rows = []
    for variant in VARIANTS:
        s = samples[variant]
        rows.append(
            {
                "variant": variant,
                "median_us_per_round": statistics.median(s),
                "rounds_per_s": 1e6 / statistics.median(s),
                "overhead_pct": None
                if variant == "unprotected"
                else 100 * (statistics.median(a / b for a, b in zip(s, base, strict=True)) - 1),
                "samples_us": [round(x, 2) for x in s],
            }
        )
    return {"transport": transport, "repeats": repeats, "rounds_per_sample": rounds, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a look, not a result)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--seed", type=int, default=8)
    args = ap.parse_args(argv)
    repeats, rounds = (5, 50) if args.quick else (21, 200)
    result: dict[str, Any] = {
        "command": "python benchmarks/bench_protect.py" + (" --quick" if args.quick else ""),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "state_bytes": len(STATE.encode()),
        "transports": [asyncio.run(bench(t, repeats, rounds, args.seed)) for t in ("direct", "memory")],
    }
    stem = "protect-quick" if args.quick else "protect"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")

    print("| transport | variant | µs per round | rounds/s | overhead vs unprotected |")
    print("|---|---|---:|---:|---:|")
    for t in result["transports"]:
        for r in t["rows"]:
            over = "" if r["overhead_pct"] is None else f"{r['overhead_pct']:+.1f}%"
            print(
                f"| {t['transport']} | {r['variant']} | {r['median_us_per_round']:.0f} | "
                f"{r['rounds_per_s']:.0f} | {over} |"
            )
    print(f"\nwrote {args.out / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
