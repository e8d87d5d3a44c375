"""An input_required result where no result may stand is refused in both modes, in every framing.

The application behind the middleware is a raw ASGI app written here that answers the
bytes each test names (no SDK writes these on purpose); the codec, keys and replay
store are real. The same shapes against a ``statecodec proxy`` process and a raw HTTP
upstream are in test_proxy_failclosed.py (ENCRYPT); this file adds SIGN and what the
client and the log see.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from statecodec import KeyRing, StateCodec
from statecodec.adapters.asgi import RequestStateMiddleware
from statecodec.replay import MemoryReplayStore

PLAIN = "PLAINTEXT-of-the-upstream"
ASKING = {"resultType": "input_required", "inputRequests": {}, "requestState": PLAIN}
CALL = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "t", "arguments": {}}}


def _app(media: bytes, body: bytes) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", media)]})
        await send({"type": "http.response.body", "body": body})

    return app


async def _through(mode: str, media: bytes, body: bytes) -> httpx.Response:
    codec = StateCodec(KeyRing.generate(), mode=mode, replay=MemoryReplayStore())
    app = RequestStateMiddleware(_app(media, body), codec, audience="deploy")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
        return await http.post("/mcp", json=CALL, headers={"accept": "application/json, text/event-stream"})


def _line(message: dict[str, Any]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", **message}).encode()


ERROR_DATA = _line({"id": 3, "error": {"code": -32000, "message": "no", "data": ASKING}})
NOTIFICATION = _line({"method": "notifications/message", "params": {"level": "info", "data": [ASKING]}})
NESTED = _line(
    {"id": 3, "result": {"resultType": "complete", "content": [], "structuredContent": {"a": ASKING}}}
)


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
@pytest.mark.parametrize(
    ("media", "body", "expected_id", "where"),
    [
        (b"application/json", ERROR_DATA, 3, "error.data"),
        (b"application/json", NESTED, 3, "result.structuredContent.a"),
        (b"text/event-stream", b"data: " + NOTIFICATION + b"\n\n", None, "params.data[0]"),
    ],
    ids=["error_data", "nested", "sse_notification"],
)
async def test_a_stray_input_required_is_replaced_and_logged(
    mode: str,
    media: bytes,
    body: bytes,
    expected_id: int | None,
    where: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="statecodec"):
        response = await _through(mode, media, body)
    assert PLAIN.encode() not in response.content
    text = response.content.decode()
    data = text.removeprefix("data: ").strip() if media == b"text/event-stream" else text
    assert json.loads(data) == {
        "jsonrpc": "2.0",
        "id": expected_id,
        "error": {"code": -32603, "message": "Internal error"},
    }
    (record,) = [r for r in caplog.records if getattr(r, "reason", None) == "stray_input_required"]
    assert record.detail == where  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
async def test_a_member_named_request_state_in_a_tools_content_is_relayed_untouched(mode: str) -> None:
    own = {
        "resultType": "complete",
        "content": [],
        "structuredContent": {"requestState": "ß", "why": "the tool's"},
    }
    body = _line({"id": 3, "result": own})
    response = await _through(mode, b"application/json", body)
    assert response.content == body
