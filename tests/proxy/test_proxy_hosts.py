"""The proxy's Host and Origin policy (statecodec/proxy/_hosts.py), case by case."""

from __future__ import annotations

from typing import Any

import pytest

from statecodec.proxy import HostPolicy
from statecodec.proxy._hosts import HostGuard, is_loopback

LOOPBACK = HostPolicy.loopback()


@pytest.mark.parametrize(
    ("host", "origin", "expected"),
    [
        (b"localhost:8000", None, None),
        (b"127.0.0.1", None, None),
        (b"[::1]:9", None, None),
        (b"LOCALHOST:1", b"http://LocalHost:1", None),  # names compare case-insensitively
        (b"127.0.0.1:8000", b"https://127.0.0.1", None),
        (b"evil.example", None, (421, "host_not_allowed")),
        (b"localhost.evil.example:80", None, (421, "host_not_allowed")),
        (b"127.0.0.2", None, (421, "host_not_allowed")),  # loopback, but not a name the SDKs allow
        (b"localhost:99999", None, (400, "malformed_host")),
        (b"[::1", None, (400, "malformed_host")),
        (b"a@localhost", None, (400, "malformed_host")),
        (None, None, (400, "missing_host")),
        (b"localhost", b"http://evil.example", (403, "origin_not_allowed")),
        (b"localhost", b"null", (403, "origin_not_allowed")),  # a sandboxed page
        (b"localhost", b"ftp://localhost", (403, "origin_not_allowed")),
        (b"localhost", b"http://localhost/path", (403, "origin_not_allowed")),
    ],
)
def test_the_loopback_policy(host: bytes | None, origin: bytes | None, expected: Any) -> None:
    assert LOOPBACK.refusal(host, [] if origin is None else [origin]) == expected


def test_a_repeated_origin_is_refused() -> None:
    assert LOOPBACK.refusal(b"localhost", [b"http://localhost", b"http://localhost"]) == (
        403,
        "repeated_origin",
    )


def test_listed_names_ports_and_wildcards() -> None:
    policy = HostPolicy.of(
        ["mcp.example.com", "api.example.com:8443", "[2001:db8::1]"], ["https://app.example.com"]
    )
    assert policy.refusal(b"mcp.example.com:443", []) is None  # no port listed: any port
    assert policy.refusal(b"api.example.com:8443", []) is None
    assert policy.refusal(b"api.example.com", []) == (421, "host_not_allowed")  # the port listed is the one
    assert policy.refusal(b"[2001:db8::1]:80", []) is None
    assert policy.refusal(b"mcp.example.com", [b"https://app.example.com:443"]) is None
    assert policy.refusal(b"mcp.example.com", [b"http://app.example.com"]) == (403, "origin_not_allowed")
    anything = HostPolicy.of(["*"], ["*"])
    assert anything.refusal(b"whatever", [b"http://evil.example"]) is None
    assert HostPolicy.of(["*"], ["null"]).refusal(b"x", [b"null"]) is None


@pytest.mark.parametrize("entry", ["http://x", "x/y", "x:0", "[::1]x", ""])
def test_a_host_entry_that_is_not_a_host_is_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        HostPolicy.of([entry], [])


@pytest.mark.parametrize(
    "entry", ["localhost", "ws://localhost", "http://localhost/mcp", "http://u@localhost"]
)
def test_an_origin_entry_that_is_not_an_origin_is_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        HostPolicy.of(["localhost"], [entry])


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("192.0.2.1", False), ("mcp.example.com", False)],
)  # fmt: skip
def test_which_listen_addresses_are_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


async def test_the_guard_answers_before_the_application() -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope)

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    guard = HostGuard(app, LOOPBACK)
    twice = [(b"host", b"localhost"), (b"host", b"evil.example")]  # which one would a router read?
    await guard({"type": "http", "headers": twice}, receive, send)
    await guard({"type": "http", "headers": [(b"host", b"localhost:1")]}, receive, send)
    assert sent[0]["status"] == 400 and len(seen) == 1
