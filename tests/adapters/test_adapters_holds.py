"""Held early retries: bounded per token and in total, cheap in memory, released when their client leaves.

The hold is shared: :func:`statecodec.boundary.judge_request` holds in place for
``protect()`` (an SDK cancellation ends it), and the ASGI middleware (and so the proxy)
holds the retry itself, keeping only its raw body. Real codecs and replay stores; the ASGI
application is called through its interface, as uvicorn calls it. The proxy's end-to-end
tests are in tests/proxy/test_proxy_client_limits.py.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from clocks import ManualClock

from statecodec import Binding, KeyRing, StateCodec, boundary
from statecodec.adapters.asgi import Message, RequestStateMiddleware, Scope
from statecodec.replay.memory import MemoryReplayStore

AUDIENCE = "deploy"
T0 = 1_750_000_000.0
TOOL = "slow_report"


def _codec(clock: ManualClock | None = None) -> StateCodec:
    if clock is None:
        return StateCodec(KeyRing.generate(), mode="sign", replay=MemoryReplayStore())
    return StateCodec(KeyRing.generate(), mode="sign", replay=MemoryReplayStore(clock=clock), clock=clock)


async def _until(condition: Callable[[], bool]) -> None:
    """Once ``condition()`` holds (a minute at most): the state a test needs, however loaded the machine."""
    async with asyncio.timeout(60):
        while not condition():
            await asyncio.sleep(0.01)


def _params(arguments: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": TOOL, "arguments": arguments}
    if token is not None:
        params["requestState"] = token
    return params


def _binding(arguments: dict[str, Any]) -> Binding:
    return boundary.binding_for("tools/call", _params(arguments), principal=None, audience=AUDIENCE)


# ------------------------------------------------------------------ the shared rule (protect())
async def test_a_cancelled_hold_consumes_nothing_and_leaves_its_place() -> None:
    # The codec's time moves only by hand: the retry stays early, and held, until the test moves it.
    clock = ManualClock(T0)
    codec, holds = _codec(clock), boundary.Holds(total=4, per_token=2)
    binding = _binding({})
    token = codec.seal(b"not ready", binding, retry_after=1)
    params = _params({}, token)
    held = asyncio.create_task(
        boundary.judge_request(codec, "tools/call", params, lambda: binding, max_hold=5, holds=holds)
    )
    await _until(lambda: holds.held == 1)
    held.cancel()  # what the SDK does when the client of an SSE answer goes away
    with pytest.raises(asyncio.CancelledError):
        await held
    assert holds.held == 0
    clock.now += 1  # the pacing time
    judged = await boundary.judge_request(
        codec, "tools/call", params, lambda: binding, max_hold=5, holds=holds
    )
    assert judged.opened is not None and judged.params["requestState"] == "not ready"  # never consumed


async def test_holds_are_bounded_per_token_and_in_total() -> None:
    clock = ManualClock(T0)  # moved by hand: the held retries stay early until the test moves it
    codec, holds = _codec(clock), boundary.Holds(total=3, per_token=2)
    binding = _binding({})
    first, second = (codec.seal(b"wait", binding, retry_after=0.5) for _ in range(2))

    def judge(token: str) -> Any:
        params = _params({}, token)
        return boundary.judge_request(codec, "tools/call", params, lambda: binding, max_hold=5, holds=holds)

    tasks = [asyncio.create_task(judge(token)) for token in (first, first, first, second, second)]
    await _until(lambda: holds.held == 3 and sum(task.done() for task in tasks) == 2)
    # The third retry of `first` is over its token's bound; the second of `second` over the total.
    done = [task for task in tasks if task.done()]
    assert done == [tasks[2], tasks[4]] and all(task.result().early is not None for task in done)
    assert holds.held == 3
    clock.now += 0.5  # the pacing time
    results = await asyncio.gather(*(tasks[i] for i in (0, 1, 3)), return_exceptions=True)
    # At the pacing time one retry of `first` redeems it and the other finds it used.
    outcomes = sorted(type(r).__name__ if isinstance(r, Exception) else "opened" for r in results[:2])
    assert outcomes == ["WireError", "opened"], results
    assert not isinstance(results[2], BaseException) and results[2].opened is not None
    assert holds.held == 0


def test_hold_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="max_holds"):
        boundary.Holds(total=-1)
    with pytest.raises(ValueError, match="max_holds"):
        RequestStateMiddleware(_App(), _codec(), audience=AUDIENCE, max_holds_per_token=1.5)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the ASGI middleware
class _App:
    """The protected application: counts its calls (none may happen for an abandoned hold)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        self.calls += 1
        await receive()
        body = b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}'
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _Client:
    """One HTTP exchange: sends ``body``, then stays until :attr:`leave` is set (then disconnects)."""

    def __init__(self, body: bytes, leave: asyncio.Event) -> None:
        self.original = body  # kept by the test: only what the middleware keeps is measured
        self.body: bytes | None = body
        self.leave = leave
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.leave.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


def _scope(body: bytes) -> Scope:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return {"type": "http", "method": "POST", "path": "/mcp", "raw_path": b"/mcp", "headers": headers}


async def test_held_retries_keep_their_raw_body_only_and_a_client_leaving_releases_its_hold() -> None:
    """100 concurrent early retries of ~1 MB each: the holds cost about one copy of each body.

    Before, a hold kept the raw body, its parse and the body re-written for forwarding
    (about three copies: 100 such retries took some 300 MB); now the parse and the
    re-written body are dropped while the retry waits.
    """
    codec, app = _codec(), _App()
    middleware = RequestStateMiddleware(app, codec, audience=AUDIENCE, retry_after=30, max_hold=60)
    arguments = {"report": "x" * (1024 * 1024)}
    binding = _binding(arguments)
    leave = asyncio.Event()
    clients = []
    for i in range(100):
        token = codec.seal(f"state {i}".encode(), binding, retry_after=30)
        message = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": _params(arguments, token)}
        clients.append(_Client(json.dumps(message).encode(), leave))
    size = sum(len(client.original) for client in clients)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tasks = [
            asyncio.create_task(middleware(_scope(client.original), client.receive, client.send))
            for client in clients
        ]
        async with asyncio.timeout(60):
            while middleware.holds.held < 100:
                await asyncio.sleep(0.05)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1.5 * size, f"{held / 1e6:.0f} MB held for {size / 1e6:.0f} MB of bodies"
    leave.set()  # every client goes away during its hold
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert middleware.holds.held == 0
    assert app.calls == 0 and not any(client.sent for client in clients)  # nothing run, nothing answered
