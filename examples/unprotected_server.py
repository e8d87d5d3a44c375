"""The deploy scenario on a low-level ``mcp`` Server with NO requestState protection.

This is what ``statecodec proxy`` (or ``RequestStateMiddleware``) is for: a server that
puts its deployment plan in ``requestState`` as plaintext JSON and trusts whatever comes
back. On its own, anyone can edit the plan between the two rounds. Behind the proxy, the
client only ever sees a sealed token, and the server only ever receives the plaintext it
issued itself::

    python examples/unprotected_server.py --port 9000 --record /tmp/states.jsonl
    statecodec keys generate -o keys.json
    statecodec proxy --upstream http://127.0.0.1:9000/mcp --listen 127.0.0.1:8000 \\
        --keys file:keys.json --replay sqlite:/tmp/replay.db --audience deploy

``--record PATH`` appends one JSON line per ``requestState`` the server *issued*
(``{"issued": ...}``) and per ``requestState`` it *received* in any JSON-RPC message of
any POST body (``{"received": ..., "method": ...}``), read straight from the HTTP body
before the SDK parses it. The proxy tests compare the two. The tool is the one of
examples/deploy_server.py (``statecodec._demo``) on the same lowlevel server, which here never
calls ``protect()``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections import deque
from pathlib import Path
from typing import Any

from statecodec._demo._serve import serve_http
from statecodec._demo._servers import lowlevel_server

log = logging.getLogger("unprotected")


class Recorder:
    """Appends JSON lines to a file (or nowhere); one write per line, flushed at once."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None

    def write(self, **entry: Any) -> None:
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(entry) + "\n")


def recording(app: Any, recorder: Recorder) -> Any:
    """ASGI wrapper noting every requestState in every POST body, before the SDK reads it."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        read: deque[Any] = deque()
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        body = b"".join(message.get("body", b"") for message in read)
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        for message in document if isinstance(document, list) else [document]:
            params = message.get("params") if isinstance(message, dict) else None
            if isinstance(params, dict) and "requestState" in params:
                recorder.write(received=params["requestState"], method=message.get("method"))

        async def replay() -> Any:  # the messages read, as they came, then the live channel
            return read.popleft() if read else await receive()

        await app(scope, replay, send)

    return wrapped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000, help="0 picks a free port")
    parser.add_argument("--instance", default="U", help="a label shown in results and logs")
    parser.add_argument("--record", help="append issued and received requestState values to this file")
    parser.add_argument("--json-response", action="store_true", help="answer with JSON bodies, not SSE")
    args = parser.parse_args(argv)
    recorder = Recorder(args.record)
    # The plan in params.request_state is trusted as it is: nothing checks where it came from.
    server = lowlevel_server(args.instance, on_issued=lambda state: recorder.write(issued=state))
    app = recording(server.streamable_http_app(json_response=args.json_response), recorder)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        force=True,
        format=f"[{args.instance}] %(levelname)s %(message)s",
    )
    asyncio.run(serve_http(app, args.host, args.port))


if __name__ == "__main__":
    main()
