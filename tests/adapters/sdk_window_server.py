"""A Python ``MCPServer`` for the migration tests: the SDK's own boundary, or statecodec with a window.

- ``--boundary sdk``: ``MCPServer(request_state_security=RequestStateSecurity(keys=[SDK_KEY]))``,
  what a fleet runs before the migration (the key shared by every instance);
- ``--boundary statecodec``: the same server with ``protect(server, codec,
  sdk_window=SDKStateWindow([SDK_KEY], until=...))``, keys from ``--keys``, replay store
  ``--replay`` (shared by every instance).

One tool, ``deploy_production(version)``, of three requestState-only rounds: no state ->
``step-1`` -> ``step-2`` -> done ("deployed VERSION after step-2 on INSTANCE"). Prints
``READY <url>`` once listening (``--port 0``); stopped by the tests through its PID.

usage: python tests/adapters/sdk_window_server.py --boundary sdk|statecodec --sdk-key HEX
           [--keys KEYS.json --replay URL --window-until UNIX] [--instance A]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import mcp_types as types
import server_main
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity

from statecodec import KeyRing, StateCodec
from statecodec.adapters.mcp import protect
from statecodec.adapters.sdk_window import SDKStateWindow
from statecodec.replay import store_from_url

NAME = "deploy"
TOOL = "deploy_production"


def build(args: argparse.Namespace) -> MCPServer[Any]:
    sdk_key = bytes.fromhex(args.sdk_key)
    security = RequestStateSecurity(keys=[sdk_key]) if args.boundary == "sdk" else None
    server: MCPServer[Any] = MCPServer(NAME, request_state_security=security)

    @server.tool(name=TOOL)
    async def deploy(version: str, ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        state = ctx.request_state
        if state is None:
            return types.InputRequiredResult(request_state="step-1")
        if state == "step-1":
            return types.InputRequiredResult(request_state="step-2")
        text = f"deployed {version} after {state} on {args.instance}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    if args.boundary == "statecodec":
        codec = StateCodec(KeyRing.from_json(Path(args.keys).read_text()), replay=store_from_url(args.replay))
        protect(server, codec, sdk_window=SDKStateWindow([sdk_key], until=args.window_until))
    return server


def main() -> None:
    parser = server_main.parser(__doc__.splitlines()[0])
    parser.add_argument("--boundary", choices=["sdk", "statecodec"], required=True)
    parser.add_argument("--sdk-key", required=True)
    parser.add_argument("--keys")
    parser.add_argument("--replay")
    parser.add_argument("--window-until", type=float)
    args = parser.parse_args()
    server_main.serve(build(args), args)


if __name__ == "__main__":
    main()
