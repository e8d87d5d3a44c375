"""The forwarder's header filters in one pass: what ``Connection`` names is dropped, in either direction."""

from __future__ import annotations

from statecodec.proxy._forward import _RequestHeaders, _response_headers


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


def test_a_request_drops_what_its_connection_header_names_and_sees_a_listen_request() -> None:
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
    assert headers.listen
    assert not _RequestHeaders([(b"mcp-method", b"tools/call")]).listen
