"""Memory an answer takes while it is judged, and the budget of all of them together.

Allocations are measured with tracemalloc (Python's own allocator, which holds every
bytes, str and JSON object here), not timed. The middleware is the proxy's
(:class:`~statecodec.adapters.asgi.RequestStateMiddleware`), in front of a raw ASGI
application written here that sends a 15 MiB answer in 256 KiB pieces, as the
forwarder hands an upstream's answer on. The codec, keys and replay store are real.
"""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from typing import Any

import pytest

from statecodec import KeyRing, StateCodec
from statecodec.adapters.asgi import RequestStateMiddleware
from statecodec.replay import MemoryReplayStore

pytestmark = pytest.mark.timeout(120)
MIB = 1024 * 1024
PIECE = 256 * 1024
CALL = b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t","arguments":{}}}'


def answer(kind: str, size: int = 15 * MIB) -> bytes:
    """A ``tools/call`` answer of about ``size`` bytes, judged in full (not ASCII, or asking)."""
    letter = {"ascii_asking": "a", "latin": "é", "cjk": "漢"}[kind]
    text = letter * 1000
    count = size // (len(text.encode()) + 40)
    result: dict[str, Any] = {"resultType": "complete", "content": [{"type": "text", "text": text}] * count}
    if kind == "ascii_asking":
        result = {**result, "resultType": "input_required", "inputRequests": {}, "requestState": "plan"}
    return json.dumps({"jsonrpc": "2.0", "id": 5, "result": result}, ensure_ascii=False).encode()


def upstream(body: bytes, gate: asyncio.Event | None = None, hold_at: int = 0) -> Any:
    """An application answering ``body`` in pieces; its first answer, from ``hold_at`` on, only
    once ``gate`` is set."""
    calls = 0

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal calls
        calls += 1
        gated = gate if calls == 1 else None
        await receive()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        for at in range(0, len(body), PIECE):
            if gated is not None and at >= hold_at:
                await gated.wait()
            last = at + PIECE >= len(body)
            await send({"type": "http.response.body", "body": body[at : at + PIECE], "more_body": not last})

    return app


async def call(middleware: RequestStateMiddleware) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": CALL, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(b"content-type", b"application/json")],
    }
    await middleware(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def middleware(app: Any, **options: Any) -> RequestStateMiddleware:
    codec = StateCodec(KeyRing.generate(), mode="encrypt", replay=MemoryReplayStore())
    return RequestStateMiddleware(app, codec, audience="deploy", max_response_bytes=32 * MIB, **options)


@pytest.mark.parametrize("kind", ["ascii_asking", "latin", "cjk"])
async def test_a_15_mib_answer_raises_peak_memory_by_about_three_copies(kind: str) -> None:
    body = answer(kind)
    protected = middleware(upstream(body))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        status, out = await call(protected)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert status == 200
    assert (b"sc1e." in out) is (kind == "ascii_asking")  # judged: its state sealed
    # Three copies at most (the bytes, their text, the document or what is written back),
    # with the slack of object headers: under 3.5 times the answer (a 15 MiB answer took
    # about 6 times before, 16 times for text beyond ASCII).
    assert peak <= 3.5 * len(body), f"{peak / MIB:.1f} MiB for a {len(body) / MIB:.1f} MiB answer"


async def test_answers_beyond_the_judging_budget_are_refused_at_once_and_the_budget_comes_back() -> None:
    body = answer("latin", 8 * MIB)
    gate = asyncio.Event()
    protected = middleware(upstream(body, gate, hold_at=6 * MIB), max_judged_bytes=10 * MIB)
    first = asyncio.create_task(call(protected))
    while protected.judged_bytes.held < 6 * MIB:  # the first answer waits at the gate, 6 MiB buffered
        assert not first.done()
        await asyncio.sleep(0.01)
    status_two, out_two = await call(protected)  # its first 6 MiB would take the budget past 10 MiB
    assert status_two == 503  # refused at once, not kept waiting for the first to end
    assert json.loads(out_two) == {
        "jsonrpc": "2.0",
        "id": 5,
        "error": {"code": -32603, "message": "Too many answers being inspected: retry"},
    }
    gate.set()
    assert await first == (200, body)  # the first one, whole
    assert protected.judged_bytes.held == 0
    assert await call(protected) == (200, body)  # and the next answer is judged again
    assert protected.judged_bytes.held == 0


async def test_a_small_answer_that_comes_whole_is_judged_without_the_budget() -> None:
    large = answer("latin", 6 * MIB + 48 * 1024)  # waits at 6 MiB, its last 17 KiB to come
    small = answer("latin", 48 * 1024)  # judged in full (not ASCII), under UNCOUNTED_BYTES
    whole = answer("latin", 1 * MIB)  # whole in one message, but over UNCOUNTED_BYTES
    gate = asyncio.Event()
    pieces = upstream(large, gate, hold_at=6 * MIB)
    calls = 0

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            await pieces(scope, receive, send)
            return
        await receive()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": small if calls == 2 else whole, "more_body": False})

    # Room for the first answer and 1 KiB more: while it waits, what is left is less than `small`.
    protected = middleware(app, max_judged_bytes=len(large) + 1024)
    first = asyncio.create_task(call(protected))
    while protected.judged_bytes.held < 6 * MIB:
        assert not first.done()
        await asyncio.sleep(0.01)
    held = protected.judged_bytes.held
    assert protected.judged_bytes.limit - held < len(small)
    assert await call(protected) == (200, small)  # judged as it came, nothing taken
    assert protected.judged_bytes.held == held
    status, _ = await call(protected)  # a whole answer over UNCOUNTED_BYTES is counted: refused
    assert status == 503
    gate.set()
    assert await first == (200, large)
    assert protected.judged_bytes.held == 0
