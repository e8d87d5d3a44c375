"""HostGuard remembers accepted (Host, Origin) pairs: the memory never accepts what the policy refuses."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from statecodec.proxy import HostPolicy
from statecodec.proxy._hosts import _ALLOWED_CACHED, _CACHED_BYTES, HostGuard


class _App:
    """Records a 200 for every request the guard lets through."""

    def __init__(self) -> None:
        self.statuses: list[int] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.statuses.append(200)


def _guard() -> HostGuard:
    return HostGuard(_App(), HostPolicy.loopback())


async def _statuses(guard: HostGuard, requests: list[list[tuple[bytes, bytes]]]) -> list[int]:
    """The status of each request in turn: 200 when the guard let it through to the application."""
    assert isinstance(guard.app, _App)
    statuses = guard.app.statuses = []

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    for headers in requests:
        await guard({"type": "http", "headers": headers}, receive, send)
    return statuses


async def test_an_accepted_host_does_not_carry_a_foreign_origin_or_a_second_host() -> None:
    guard = _guard()
    host = (b"host", b"localhost:8000")
    requests = [
        [host],  # accepted, remembered
        [host],  # from memory
        [host, (b"origin", b"http://evil.example")],
        [host, (b"origin", b"http://localhost:3000")],  # accepted, remembered with its origin
        [host, (b"origin", b"http://localhost:3000"), (b"origin", b"http://evil.example")],
        [host, (b"host", b"evil.example")],
        [(b"host", b"evil.example:8000")],
        [host, (b"origin", b"http://localhost:3000")],
    ]
    statuses = await _statuses(guard, requests)
    assert statuses == [200, 200, 403, 200, 403, 400, 421, 200]
    assert guard._allowed == {(b"localhost:8000", None), (b"localhost:8000", b"http://localhost:3000")}


async def test_the_memory_is_bounded_and_the_rest_judged_each_time() -> None:
    guard = _guard()
    ports = range(1, _ALLOWED_CACHED + 51)
    statuses = await _statuses(guard, [[(b"host", b"127.0.0.1:%d" % port)] for port in ports])
    assert statuses == [200] * len(ports)
    assert len(guard._allowed) == _ALLOWED_CACHED
    refused = await _statuses(guard, [[(b"host", b"127.0.0.2:%d" % port)] for port in ports])
    assert refused == [421] * len(ports)
    assert len(guard._allowed) == _ALLOWED_CACHED


async def test_a_long_pair_is_judged_each_time_and_never_kept() -> None:
    guard = HostGuard(_App(), HostPolicy.of(["*"], ["*"]))  # any value passes: the memory must stay small
    long_host = [(b"host", b"a" * (_CACHED_BYTES + 1))]
    long_origin = [(b"host", b"h"), (b"origin", b"http://" + b"o" * _CACHED_BYTES)]
    assert await _statuses(guard, [long_host, long_origin, [(b"host", b"h")]]) == [200, 200, 200]
    assert guard._allowed == {(b"h", None)}


async def test_names_in_any_case_are_judged_as_lower_case_ones() -> None:
    # Servers hand the names lower-cased; the guard reads any spelling alike.
    requests = [
        [(b"host", b"localhost:8000")],
        [(b"host", b"localhost:8000"), (b"origin", b"http://evil.example")],
        [(b"host", b"localhost:8000"), (b"origin", b"http://localhost:3000"), (b"origin", b"http://x")],
        [(b"host", b"localhost:8000"), (b"host", b"evil.example")],
        [(b"host", b"evil.example:8000")],
        [(b"accept", b"*/*")],
        [],
    ]
    expected = [200, 403, 403, 400, 421, 400, 400]
    assert await _statuses(_guard(), requests) == expected
    shouted = [[(name.title(), value) for name, value in headers] for headers in requests]
    assert await _statuses(_guard(), shouted) == expected
    mixed = [[(b"X-Seen", b"1"), *headers] for headers in requests]  # one upper-case name elsewhere
    assert await _statuses(_guard(), mixed) == expected
