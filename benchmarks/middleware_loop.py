"""The proxy's judging and sealing alone, in one process: a loop to profile (issue 30).

    .venv/bin/python benchmarks/middleware_loop.py [--flows 2000] [--profile cprofile|none]
        [--tree TREE] [--sort tottime]

The deploy flow of ``bench_proxy.py`` (two rounds) through
:class:`statecodec.adapters.asgi.RequestStateMiddleware` as ``statecodec proxy`` builds it
(ENCRYPT, a SQLite replay store, a key manager on a key file, metrics enabled), called
directly with ASGI messages: no sockets, no HTTP parsing, no forwarder. The application
behind it answers with the bytes the TypeScript upstream (``tests/node/ts_upstream_server.mjs``)
sent for the same flow, captured once at start-up (so round 1 carries the upstream's own
plaintext state and round 2 the upstream's own result). What is left is what the middleware
does per round: the strict parse, the key and header checks, the binding, seal and unseal,
the SQLite consume, the inspection of each answer, metrics and log calls.

``--profile cprofile`` prints the functions that cost most (``--sort``); ``none`` prints
the CPU time per round, for a quick side-by-side with ``--tree`` (another source tree,
e.g. a copy of ``main``; the instruction counts of ``proxy_instructions.py`` remain the
load-independent comparison). Needs node with ``npm ci`` in tests/node.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent


def capture(url: str) -> list[tuple[int, list[tuple[bytes, bytes]], bytes]]:
    """Status, headers and body of the upstream's two answers to one deploy flow, as sent."""
    from bench_proxy import ANSWERS, HEADERS, META, TOOL  # noqa: PLC0415

    params: dict[str, Any] = {"name": TOOL, "arguments": {"version": "1.2.3"}, "_meta": META}
    answers = []
    with httpx.Client(timeout=30) as http:
        first = http.post(url, json={"jsonrpc": "2.0", "id": 0, "method": "tools/call", "params": params},
                          headers=HEADERS)  # fmt: skip
        state = first.json()["result"]["requestState"]
        retry = {**params, "inputResponses": ANSWERS, "requestState": state}
        second = http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": retry},
                           headers=HEADERS)  # fmt: skip
        for response in (first, second):
            headers = [(k.lower(), v) for k, v in response.headers.raw]
            answers.append((response.status_code, headers, response.content))
    return answers


def build(tmp: Path, answers: list[tuple[int, list[tuple[bytes, bytes]], bytes]]) -> tuple[Any, Any]:
    """The middleware as the proxy builds it, in front of an application replaying ``answers``."""
    import statecodec.ops  # noqa: F401, PLC0415 - enables the Prometheus metrics, as the proxy does
    from statecodec import KeyRing, Mode, StateCodec  # noqa: PLC0415
    from statecodec.adapters.asgi import RequestStateMiddleware  # noqa: PLC0415
    from statecodec.kms import KeyManager  # noqa: PLC0415
    from statecodec.replay import store_from_url  # noqa: PLC0415

    keys = tmp / "keys.json"
    keys.write_text(KeyRing.generate().to_json())
    keys.chmod(0o600)
    manager = KeyManager(f"file:{keys}")
    manager.start()
    store = store_from_url(f"sqlite:{tmp / 'r.db'}")
    codec = StateCodec(manager, mode=Mode.ENCRYPT, replay=store)

    async def upstream(scope: Any, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        second = b"inputResponses" in body
        status, headers, answer = answers[second]
        # The captured answer with this request's id (the middleware checks that it answers it).
        request_id = body[body.index(b'"id":') + 5 :].split(b",", 1)[0]
        head, tail = answer.split(b'"id":%d' % second, 1)
        answer = b'%s"id":%s%s' % (head, request_id, tail)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer, "more_body": False})

    return RequestStateMiddleware(upstream, codec, audience="deploy"), (manager, store)


async def run(app: Any, flows: int, first_id: int) -> None:
    """``flows`` deploy flows through ``app``, as bench_proxy's client sends them."""
    from bench_proxy import ANSWERS, HEADERS, META, TOOL  # noqa: PLC0415

    from statecodec.adapters._json import dumps  # noqa: PLC0415

    headers = [(b"host", b"127.0.0.1:8000")] + [(k.encode(), v.encode()) for k, v in HEADERS.items()]
    params: dict[str, Any] = {"name": TOOL, "arguments": {"version": "1.2.3"}, "_meta": META}

    async def call(body: bytes) -> bytes:
        sent: list[Any] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: Any) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"",
                 "headers": [*headers, (b"content-length", str(len(body)).encode())]}  # fmt: skip
        await app(scope, receive, send)
        return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    import json  # noqa: PLC0415

    for n in range(first_id, first_id + flows):
        one = {"jsonrpc": "2.0", "id": 2 * n, "method": "tools/call", "params": params}
        state = json.loads(await call(dumps(one)))["result"]["requestState"]
        retry = {**params, "inputResponses": ANSWERS, "requestState": state}
        two = json.loads(await call(dumps({"jsonrpc": "2.0", "id": 2 * n + 1, "method": "tools/call",
                                           "params": retry})))  # fmt: skip
        if two.get("result", {}).get("structuredContent", {}).get("deployed") != "1.2.3":
            raise RuntimeError(f"the flow did not complete: {two}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flows", type=int, default=2000)
    parser.add_argument("--profile", choices=["cprofile", "none"], default="none")
    parser.add_argument("--sort", default="tottime")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument(
        "--tree", type=Path, default=BENCH.parent, help="the source tree whose middleware runs"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    sys.path.insert(1, str(BENCH))
    sys.path.insert(2, str(BENCH.parent / "tests"))
    importlib.import_module("statecodec")  # from --tree, before _harness puts this tree on the path
    from bench_proxy import start, upstream_command  # noqa: PLC0415
    from processes import stop  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="middleware-loop-") as tmp_dir:
        tmp = Path(tmp_dir)
        cmd, cwd = upstream_command("typescript")
        upstream, url = start(cmd, "READY ", tmp / "upstream.log", cwd)
        try:
            answers = capture(url)
        finally:
            stop(upstream)
        app, (manager, store) = build(tmp, answers)
        try:
            asyncio.run(run(app, 200, 0))  # warm up
            profiler = cProfile.Profile() if args.profile == "cprofile" else None
            start_cpu = time.process_time()
            if profiler is not None:
                profiler.enable()
            asyncio.run(run(app, args.flows, 200))
            if profiler is not None:
                profiler.disable()
            cpu = time.process_time() - start_cpu
        finally:
            store.close()
            manager.stop()
    import statecodec  # noqa: PLC0415

    print(f"{Path(statecodec.__file__).parent.parent}: {1e6 * cpu / (2 * args.flows):.1f} us CPU per round")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
