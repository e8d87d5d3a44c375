"""A Python instance of the mixed fleet (tests/ts/test_ts_mixed_fleet.py): protect()ed MCPServer over HTTP.

Keys come from an OpenBao transit key through a KeyManager refreshed every second, single
use from a Valkey store: the same key source, store, namespace, audience and timeline as
the TypeScript instance (ts/test/fixtures/fleet_server.ts), so either opens what the other
sealed and a token consumed by one is a replay for the other.

``relay(flow)`` is a three-round flow: each round appends ``"python"`` to the path carried
in requestState and asks one elicitation, the third answers the path. ``fleet_keys`` tells
the kid this instance mints with now and the kids it verifies (no secrets), so a test can
wait for a rotation to reach it. Prints ``READY <url>`` once listening (``--port 0``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from mcp import types
from mcp.server.mcpserver import Context, MCPServer

from statecodec import StateCodec
from statecodec._demo._serve import serve_http
from statecodec.adapters import mcp as mcp_adapter
from statecodec.kms import KeyManager, VaultSettings, source_from_url
from statecodec.kms._timeline import TimelineSettings
from statecodec.replay import RedisReplayStore

AUDIENCE = "fleet-svc"  # also the TypeScript instance's audience
NAMESPACE = "fleet"
ROUNDS = 3
# The fleet's timeline, the same numbers in both languages: a rotated key mints 2 s after
# its creation (refresh 1 s, no jitter, no skew), when every instance verifies it.
TIMING: TimelineSettings = {"refresh_interval": 1, "jitter": 0, "max_skew": 0, "max_ttl": 600}


def question() -> dict[str, types.CreateMessageRequest | types.ListRootsRequest | types.ElicitRequest]:
    requested = {"type": "object", "properties": {"go": {"type": "boolean"}}, "required": ["go"]}
    params = types.ElicitRequestFormParams(message="Go on?", requested_schema=requested)
    return {"go": types.ElicitRequest(params=params)}


def build(manager: KeyManager, replay: RedisReplayStore) -> MCPServer[Any]:
    codec = StateCodec(manager, mode="encrypt", ttl=600, max_skew=0, replay=replay, namespace=NAMESPACE)
    server: MCPServer[Any] = MCPServer(AUDIENCE)

    @server.tool(name="relay", description="Three rounds, each served by whichever instance gets it")
    async def relay(flow: str, ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        state = ctx.request_state
        path = [*(json.loads(state)["path"] if state is not None else []), "python"]
        if len(path) < ROUNDS:
            return types.InputRequiredResult(
                input_requests=question(), request_state=json.dumps({"path": path})
            )
        text = json.dumps({"flow": flow, "path": path})
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    @server.tool(name="fleet_keys", description="The kid minted with now and the kids verified")
    def fleet_keys() -> str:
        return json.dumps({"primary": manager.signing_key().kid, "kids": list(manager.keyring().kids)})

    mcp_adapter.protect(server, codec, audience=AUDIENCE)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", required=True, help="vault-transit:MOUNT/NAME")
    parser.add_argument("--vault-addr", required=True)
    parser.add_argument("--vault-token", required=True)
    parser.add_argument("--replay", required=True, help="redis://...")
    parser.add_argument("--replay-prefix", required=True, help="the store's key prefix")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    vault = VaultSettings(addr=args.vault_addr, token=args.vault_token)
    manager = KeyManager(source_from_url(args.keys, vault=vault), **TIMING).start()
    server = build(manager, RedisReplayStore(args.replay, prefix=args.replay_prefix))
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, force=True, format="[py] %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(serve_http(server.streamable_http_app(), "127.0.0.1", args.port))


if __name__ == "__main__":
    main()
