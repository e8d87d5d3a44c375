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


def _app(media: bytes, *chunks: bytes) -> Any:
    """An application answering ``chunks``, one body message each (the last ends the answer)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", media)]})
        for index, chunk in enumerate(chunks, 1):
            await send({"type": "http.response.body", "body": chunk, "more_body": index < len(chunks)})

    return app


async def _through(
    mode: str, media: bytes, *chunks: bytes, codec: StateCodec | None = None
) -> httpx.Response:
    codec = codec or StateCodec(KeyRing.generate(), mode=mode, replay=MemoryReplayStore())
    app = RequestStateMiddleware(_app(media, *chunks), codec, audience="deploy")
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


OTHER_PLAIN = "SECOND-plaintext-of-the-upstream"
# A stream of messages: SSE events, or newline-separated JSON under application/json.
FRAMINGS = pytest.mark.parametrize(
    ("media", "frame"),
    [
        (b"text/event-stream", lambda data: b"data: " + data + b"\n\n"),
        (b"application/json", lambda data: data + b"\n"),
    ],
    ids=["sse", "json_messages"],
)


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
@FRAMINGS
async def test_a_second_input_required_answer_to_one_request_is_replaced_and_logged(
    mode: str, media: bytes, frame: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """One round, one token: an upstream answering one request twice on one stream gets its
    first answer sealed and the second replaced by -32603 (the client took the first)."""
    first = _line({"id": 3, "result": ASKING})
    again = _line({"id": 3, "result": {**ASKING, "requestState": OTHER_PLAIN}})
    asks_only = _line({"id": 3, "result": {"resultType": "input_required", "inputRequests": {"a": {}}}})
    done_with_state = _line({"id": 3, "result": {"content": [], "requestState": OTHER_PLAIN}})
    codec = StateCodec(KeyRing.generate(), mode=mode, replay=MemoryReplayStore())
    with caplog.at_level(logging.ERROR, logger="statecodec"):
        response = await _through(
            mode, media, frame(first), frame(again), frame(asks_only), frame(done_with_state), codec=codec
        )
    assert PLAIN.encode() not in response.content and OTHER_PLAIN.encode() not in response.content
    sealed, *refused = [
        json.loads(line.removeprefix(b"data: ")) for line in response.content.splitlines() if line.strip()
    ]
    assert codec.verify_unbound(sealed["result"]["requestState"]).payload == PLAIN.encode()
    error = {"jsonrpc": "2.0", "id": 3, "error": {"code": -32603, "message": "Internal error"}}
    assert refused == [error, error, error]
    records = [r for r in caplog.records if getattr(r, "reason", None) == "repeated_answer"]
    assert [r.detail for r in records] == ["result.resultType", "result.resultType", "result.requestState"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
async def test_a_second_answer_without_a_state_to_one_request_is_relayed(mode: str) -> None:
    """Only what would ask again or hand out a state is refused: a repeated plain result is
    the client's to ignore."""
    done = _line({"id": 3, "result": {"resultType": "complete", "content": []}})
    events = b"data: " + _line({"id": 3, "result": ASKING}) + b"\n\n", b"data: " + done + b"\n\n"
    response = await _through(mode, b"text/event-stream", *events)
    assert response.content.endswith(events[1])
    assert PLAIN.encode() not in response.content


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
@FRAMINGS
async def test_a_first_answer_relayed_unread_still_answers_the_request(
    mode: str, media: bytes, frame: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A first answer that cannot hold a state goes out unparsed, yet the client takes it as
    the answer: an input_required answer after it is a second one, refused, not sealed.
    A notification naming an ``id`` before it answers nothing and changes nothing."""
    progress = _line({"method": "notifications/progress", "params": {"progressToken": 1, "id": 3}})
    done = _line({"id": 3, "result": {"resultType": "complete", "content": []}})
    again = _line({"id": 3, "result": ASKING})
    with caplog.at_level(logging.ERROR, logger="statecodec"):
        response = await _through(mode, media, frame(progress), frame(done), frame(again))
    assert PLAIN.encode() not in response.content
    assert response.content.startswith(frame(progress) + frame(done))
    (refused,) = [
        json.loads(line.removeprefix(b"data: "))
        for line in response.content[len(frame(progress) + frame(done)) :].splitlines()
        if line.strip()
    ]
    assert refused == {"jsonrpc": "2.0", "id": 3, "error": {"code": -32603, "message": "Internal error"}}
    (record,) = [r for r in caplog.records if getattr(r, "reason", None) == "repeated_answer"]
    assert record.detail == "result.resultType"  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
async def test_a_notification_naming_the_requests_id_is_not_its_answer(mode: str) -> None:
    """Only a response (no ``method``) with the request's id answers it: an input_required
    answer after a notification that mentions the id is the first answer, and sealed."""
    progress = _line({"method": "notifications/progress", "params": {"progressToken": 1, "id": 3}})
    asking = _line({"id": 3, "result": ASKING})
    codec = StateCodec(KeyRing.generate(), mode=mode, replay=MemoryReplayStore())
    response = await _through(mode, b"application/json", progress + b"\n", asking + b"\n", codec=codec)
    first, sealed = (json.loads(line) for line in response.content.splitlines())
    assert first == json.loads(progress)
    assert codec.verify_unbound(sealed["result"]["requestState"]).payload == PLAIN.encode()


async def test_a_first_answer_with_a_repeated_id_counts_as_the_answer() -> None:
    """Read last-wins its id is another request's, but a client reading the first takes it as
    this request's answer: counted as answered, so the input_required answer after it is refused."""
    done = b'{"jsonrpc": "2.0", "id": 3, "id": 99, "result": {"content": []}}\n'
    response = await _through("sign", b"application/json", done, _line({"id": 3, "result": ASKING}) + b"\n")
    first, refused = response.content.splitlines()
    assert first + b"\n" == done
    assert json.loads(refused)["error"] == {"code": -32603, "message": "Internal error"}
