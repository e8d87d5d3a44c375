"""A production deploy behind a confirmation: the canonical statecodec scenario.

The tool ``deploy_production(version)`` computes a deployment plan, then asks the user
two independent questions in ONE round (MCP 2026-07-28 multi-round-trip requests): a
boolean ``confirm_deploy`` and a string ``change_ticket``. The plan travels in
``requestState``. On the retry, which may reach another instance, the tool deploys
exactly the plan it recovers from the state: so that state must be tamper-proof, bound
to the user and the request, expiring and single use. statecodec makes it so in one
line, ``protect(server, codec)``, for each of the three ways to write an MCP server in
Python (``--flavor lowlevel | mcpserver | fastmcp``).

The tool and the three servers live in ``statecodec/_demo/`` (``_scenario.py`` and
``_servers.py``), so that ``statecodec demo`` runs the very same code from an installed
wheel; this file is the command line that serves them.

Run two instances that share keys and a replay store::

    statecodec keys generate -o keys.json
    python examples/deploy_server.py --keys keys.json --replay sqlite:/tmp/replay.db --port 8001 --instance A
    python examples/deploy_server.py --keys keys.json --replay sqlite:/tmp/replay.db --port 8002 --instance B

Over HTTP two users exist, with the bearer tokens ``alice-token`` and ``bob-token``
(a static verifier for the demo; use your OAuth verifier in production). With
``--port 0`` the server picks a free port; it prints ``READY <url>`` once listening.
``--transport stdio`` serves one client over stdin/stdout (no users there).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from statecodec import KeyRing, StateCodec
from statecodec._demo import FLAVORS, SERVER_NAME, build_mcpserver
from statecodec._demo._serve import serve_http
from statecodec.replay import store_from_url


def make_codec(args: argparse.Namespace) -> StateCodec:
    ring = KeyRing.from_json(Path(args.keys).read_text(encoding="utf-8")) if args.keys else KeyRing.generate()
    return StateCodec(
        ring,
        mode=args.mode,
        ttl=args.ttl,
        max_skew=args.max_skew,
        replay=store_from_url(args.replay),
        namespace=SERVER_NAME,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", choices=sorted(FLAVORS), default="mcpserver")
    parser.add_argument("--transport", choices=["http", "stdio"], default="http")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--keys", help="key ring JSON file shared by all instances (default: a fresh key)")
    parser.add_argument("--replay", default="memory:", help="replay store URL, e.g. sqlite:/path/replay.db")
    parser.add_argument("--mode", choices=["sign", "encrypt"], default="encrypt")
    parser.add_argument("--ttl", type=int, default=600, help="token lifetime in seconds")
    parser.add_argument("--max-skew", type=int, default=60, help="clock skew tolerated, in seconds")
    parser.add_argument(
        "--boundary",
        choices=["statecodec", "sdk"],
        default="statecodec",
        help="sdk: keep the MCP SDK's own requestState boundary instead (mcpserver only; for comparison)",
    )
    parser.add_argument(
        "--staging-tool",
        action="store_true",
        help="also serve deploy_staging, the same flow under another name (mcpserver only)",
    )
    parser.add_argument(
        "--instance", default="A", help="a label for this instance, shown in logs and results"
    )
    parser.add_argument("--no-auth", action="store_true", help="HTTP without bearer tokens")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    codec = make_codec(args)
    auth = args.transport == "http" and not args.no_auth
    if args.boundary == "sdk" or args.staging_tool:
        if args.flavor != "mcpserver":
            raise SystemExit("--boundary sdk and --staging-tool go with --flavor mcpserver")
        server = build_mcpserver(
            codec, args.instance, auth=auth, boundary=args.boundary, staging_tool=args.staging_tool
        )
    else:
        server = FLAVORS[args.flavor](codec, args.instance, auth=auth)
    # After the servers are built: MCPServer and FastMCP configure logging themselves.
    # Logs go to stderr (stdout is the protocol under stdio).
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        force=True,
        format=f"[{args.instance}] %(levelname)s %(name)s: %(message)s",
    )
    if args.transport == "stdio":
        asyncio.run(server.run_stdio())
    else:
        asyncio.run(serve_http(server.http_app(), args.host, args.port))


if __name__ == "__main__":
    main()
