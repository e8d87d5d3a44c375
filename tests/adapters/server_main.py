"""What the test servers run as processes share: ``--instance``/``--port``, their logging, serving.

tests/adapters/flows_server.py and tests/adapters/sdk_window_server.py each add their own options, build
their server, then :func:`serve` it over Streamable HTTP on 127.0.0.1 (``--port 0``: a
free port, printed as ``READY <url>``), every log line on stderr tagged with the instance
name so a test reading several logs knows which instance said what.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from statecodec._demo._serve import serve_http


def parser(description: str) -> argparse.ArgumentParser:
    """A parser with the two options every test server takes."""
    made = argparse.ArgumentParser(description=description)
    made.add_argument("--instance", default="A")
    made.add_argument("--port", type=int, default=0)
    return made


def serve(server: Any, args: argparse.Namespace) -> None:
    """Serve ``server`` (an ``MCPServer``) until the process is stopped."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        force=True,
        format=f"[{args.instance}] %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(serve_http(server.streamable_http_app(), "127.0.0.1", args.port))
