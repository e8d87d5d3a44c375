"""The forwarder's header filters in one pass: what ``Connection`` names is dropped, in either direction."""

from __future__ import annotations

import pytest

from statecodec.adapters.asgi import BODY_METHOD
from statecodec.proxy._forward import _opens_stream, _RequestHeaders, _response_headers


def test_an_answer_keeps_its_headers_in_order_without_the_hop_by_hop_ones() -> None:
    headers = [
        (b"Content-Type", b"application/json"),
        (b"Connection", b"keep-alive"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Mcp-Session-Id", b"s-1"),
    ]
    assert _response_headers(headers) == [(b"Content-Type", b"application/json"), (b"Mcp-Session-Id", b"s-1")]


def test_what_an_answers_connection_headers_name_is_dropped_wherever_it_stands() -> None:
    headers = [
        (b"X-Early", b"named below"),
        (b"Connection", b"Keep-Alive"),
        (b"Connection", b" X-Early ,close"),
        (b"x-late", b"named above"),
        (b"connection", b"X-LATE"),
        (b"Set-Cookie", b"a=1"),
    ]
    assert _response_headers(headers) == [(b"Set-Cookie", b"a=1")]


def test_a_request_drops_what_its_connection_header_names() -> None:
    headers = _RequestHeaders(
        [
            (b"x-hop", b"1"),
            (b"connection", b"close, X-Hop"),
            (b"host", b"localhost:8000"),
            (b"host", b"second"),
            (b"x-forwarded-for", b"192.0.2.1"),
            (b"x-forwarded-for", b"192.0.2.2"),
            (b"mcp-method", b" subscriptions/listen "),
            (b"content-length", b"2"),
            (b"close", b"named by Connection too: dropped"),
        ]
    )
    assert headers.kept == [(b"mcp-method", b" subscriptions/listen ")]
    assert headers.host == b"localhost:8000"
    assert headers.chain == b"192.0.2.1, 192.0.2.2"
    assert headers.length == b"2"


LISTEN = b'{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{}}'


@pytest.mark.parametrize(
    ("method", "body", "stream"),
    [
        ("GET", b"", True),
        ("POST", LISTEN, True),  # whatever the headers say: none are read
        ("POST", LISTEN.replace(b"/", b"\\/"), True),  # an escaped slash spells it too
        ("POST", LISTEN.replace(b"listen", b"\\u006cisten"), True),
        ("POST", LISTEN.replace(b"{}", b'{"q":"a\\"b\\\\"}'), True),  # escapes that spell nothing of it
        ("POST", b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"q":"\\"listen\\""}}', False),
        ("POST", b"\xef\xbb\xbf" + LISTEN, True),  # as a lenient server reads it
        ("POST", b"[" + LISTEN + b"]", True),
        ("POST", b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"listen"}}', False),
        ("POST", b'{"method":"subscriptions/listen"', False),  # no server reads a method in it
        ("POST", b"", False),
        ("DELETE", LISTEN, False),
    ],
)
def test_a_stream_is_known_by_its_method_in_the_body(method: str, body: bytes, stream: bool) -> None:
    assert _opens_stream({"method": method, "extensions": {}}, body) is stream


@pytest.mark.parametrize(
    ("read", "stream"), [("subscriptions/listen", True), ("tools/call", False), (None, False)]
)
def test_the_method_the_middleware_read_decides_without_a_second_read(read: str | None, stream: bool) -> None:
    # The body says the opposite of the middleware's verdict: only the verdict is used.
    body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}' if stream else LISTEN
    scope = {"method": "POST", "extensions": {BODY_METHOD: read}}
    assert _opens_stream(scope, body) is stream
    assert _opens_stream({"method": "GET", "extensions": {BODY_METHOD: "ping"}}, b"")  # a GET is a stream


async def test_a_body_in_pieces_is_not_read_ahead() -> None:
    async def pieces():  # type: ignore[no-untyped-def]
        yield LISTEN

    assert not _opens_stream({"method": "POST"}, pieces())
