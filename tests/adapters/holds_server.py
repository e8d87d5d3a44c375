"""A Python ``MCPServer`` with one paced tool, protected by ``protect()`` (issue 25 hold tests).

``slow_report()`` answers its first round with a requestState-only ``input_required``
("not ready, come back with this"), paced by ``--retry-after``; the retry with that state
completes. Every handler run appends one JSON line to ``--record`` (``{"step", "at"}``),
so a test can tell whether an abandoned early retry ran the handler. Served over
Streamable HTTP, with JSON answers (``--json-response``) or SSE ones; the ``statecodec``
logger writes its lines from DEBUG up (a hold starting among them) to stderr. Prints
``READY <url>`` once listening (port 0); stopped by the tests through its PID.

usage: python tests/adapters/holds_server.py --record PATH [--json-response] [--retry-after S] [--max-hold S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer

from statecodec import KeyRing, StateCodec
from statecodec._demo._serve import serve_http
from statecodec.adapters.mcp import protect
from statecodec.replay import MemoryReplayStore

TOOL = "slow_report"


def build(args: argparse.Namespace) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer("holds", log_level="INFO")

    @server.tool(description="A report that is not ready at first")
    async def slow_report(ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        step = 0 if ctx.request_state is None else 1
        with open(args.record, "a", encoding="utf-8") as out:
            out.write(json.dumps({"step": step, "at": time.time()}) + "\n")
        if ctx.request_state is None:
            return types.InputRequiredResult(request_state="not ready")
        return types.CallToolResult(content=[types.TextContent(type="text", text="ready")])

    codec = StateCodec(KeyRing.generate(), mode="sign", replay=MemoryReplayStore())
    protect(server, codec, retry_after=args.retry_after, max_hold=args.max_hold)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", required=True)
    parser.add_argument("--json-response", action="store_true")
    parser.add_argument("--retry-after", type=float, default=2.0)
    parser.add_argument("--max-hold", type=float, default=5.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = build(args)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, force=True, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("statecodec").setLevel(logging.DEBUG)  # "held for": a test waits for the hold
    app = server.streamable_http_app(json_response=args.json_response)
    asyncio.run(serve_http(app, "127.0.0.1", args.port))


if __name__ == "__main__":
    main()
