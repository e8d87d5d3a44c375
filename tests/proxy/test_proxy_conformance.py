"""The proxy as a faithful intermediary (issue 25): what the official conformance harness found.

Against the real TypeScript SDK upstream (tests/node/ts_upstream_server.mjs with
``--host-check``: the SDK's own DNS-rebinding check on ``Host``) behind real ``statecodec
proxy`` processes:

- Host and Origin: the proxy refuses a foreign ``Host`` or ``Origin`` itself (loopback
  defaults), forwards the client's ``Host`` so the upstream's own check judges what the
  client sent, and will not start on a public address without a list;
- SEP-2243 exactly: a header/body mismatch is HTTP 400 with -32020, padded values are
  trimmed before the comparison, a repeated ``Mcp-Method``/``Mcp-Name`` is refused;
- a SEP-2575 ``subscriptions/listen`` stream passes through with its frames.

tests/conformance/ runs the whole harness on every path (scripts/conformance, a CI step).
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fixtures_proxy import (
    Proxy,
    Upstream,
    messages,
    modern_request,
    proxy_command,
    running_upstream,
    start_proxies,
)
from processes import ROOT, stop
from replicas import keys_file

from statecodec import KeyRing

pytestmark = pytest.mark.node


@dataclass
class Front:
    """One TypeScript upstream with its own Host check, behind a proxy with the loopback defaults."""

    upstream: Upstream
    proxy: Proxy
    keys: Path
    replay: str
    tmp: Path


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    tmp = tmp_path_factory.mktemp("proxy-conformance")
    keys = keys_file(tmp)
    with running_upstream("typescript", tmp, "--host-check") as upstream:
        replay = f"sqlite:{tmp / 'replay.sqlite3'}"
        (proxy,) = start_proxies(
            tmp, upstream.url, keys=keys, replay=replay, mode="sign", jwks=None, names=["S"]
        )
        try:
            yield Front(upstream, proxy, keys, replay, tmp)
        finally:
            proxy.stop()


@pytest.fixture(scope="module")
def open_proxy(front: Front) -> Iterator[Proxy]:
    """The same upstream behind a proxy whose own check is off (``--allowed-host '*'``)."""
    (proxy,) = start_proxies(
        front.tmp, front.upstream.url, keys=front.keys, replay=front.replay, mode="sign", jwks=None,
        names=["O"], extra=["--allowed-host", "*"],
    )  # fmt: skip
    try:
        yield proxy
    finally:
        stop(proxy.proc)


def _port(proxy: Proxy) -> str:
    return proxy.base.rsplit(":", 1)[1]


def _post(url: str, body: bytes, headers: dict[str, str] | list[tuple[str, str]]) -> httpx.Response:
    with httpx.Client(timeout=30) as http:
        return http.post(url, content=body, headers=headers)


# ---------------------------------------------------------------- Host and Origin
def test_a_foreign_host_is_refused_by_the_proxy_itself(front: Front) -> None:
    # A DNS-rebinding page: evil.example resolved to 127.0.0.1. The upstream checks Host,
    # so before this the proxy, rewriting Host to the upstream's authority, let it through.
    body, headers = modern_request("tools/list", {})
    response = _post(front.proxy.url, body, {**headers, "host": "evil.example"})
    assert response.status_code == 421
    assert "evil.example" in front.proxy.wait_for_log("host_not_allowed")


def test_a_foreign_origin_is_refused(front: Front) -> None:
    body, headers = modern_request("tools/list", {})
    origin = {**headers, "origin": "http://evil.example"}
    response = _post(front.proxy.url, body, origin)
    assert response.status_code == 403
    assert response.json()["error"]["message"] == "Origin not allowed"


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1"])
def test_loopback_hosts_and_origins_are_answered(front: Front, name: str) -> None:
    body, headers = modern_request("tools/list", {})
    authority = f"{name}:{_port(front.proxy)}"
    response = _post(front.proxy.url, body, {**headers, "host": authority, "origin": f"http://{authority}"})
    assert response.status_code == 200
    assert any(tool["name"] == "deploy_production" for tool in messages(response)[0]["result"]["tools"])


def test_the_upstream_sees_the_host_the_client_sent(open_proxy: Proxy) -> None:
    # The proxy's own check off (--allowed-host '*'): the upstream's DNS-rebinding check still
    # judges the client's Host, because the proxy forwards it instead of its own.
    body, headers = modern_request("tools/list", {})
    response = _post(open_proxy.url, body, {**headers, "host": "evil.example"})
    assert response.status_code == 403  # the TypeScript SDK's own refusal
    assert "evil.example" in response.text
    allowed = _post(open_proxy.url, body, {**headers, "host": f"localhost:{_port(open_proxy)}"})
    assert allowed.status_code == 200


def test_a_public_listen_address_without_allowed_hosts_does_not_start(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is on no interface: nothing ever listens there, whatever happens.
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate().to_json(), encoding="utf-8")
    keys.chmod(0o600)
    command = proxy_command(
        "http://127.0.0.1:9/mcp", keys=keys, replay="memory:", mode="sign", jwks=None,
    )  # fmt: skip
    command[command.index("--listen") + 1] = "192.0.2.1:0"
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--allowed-host" in lines[0] and "Traceback" not in done.stderr


# ---------------------------------------------------------------- SEP-2243
def test_a_routing_header_mismatch_is_400_with_header_mismatch(front: Front) -> None:
    body, headers = modern_request("tools/call", {"name": "deploy_production", "arguments": {"version": "1"}})
    response = _post(front.proxy.url, body, {**headers, "mcp-name": "deploy_staging"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32020


def _raw_post(proxy: Proxy, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """A POST written byte for byte: HTTP clients refuse to send padded header values."""
    lines = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{_port(proxy)}", "Connection: close"]
    lines += [f"{name}:{value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    with socket.create_connection(("127.0.0.1", int(_port(proxy))), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


def test_a_padded_routing_header_is_accepted(front: Front) -> None:
    # RFC 9110 section 5.5: the whitespace around a field value is not part of it, and
    # SEP-2243 says a server MUST accept it. Forwarded as sent: the upstream trims too.
    body, headers = modern_request("tools/call", {"name": "deploy_production", "arguments": {"version": "1"}})
    padded = {
        **headers,
        "accept": "application/json",
        "mcp-name": "  deploy_production\t",
        "mcp-method": " tools/call ",
    }
    status, answer = _raw_post(front.proxy, body, padded)
    assert status == 200, answer
    assert b"input_required" in answer


@pytest.mark.parametrize("header", ["mcp-name", "mcp-method"])
def test_a_repeated_routing_header_is_refused_before_the_token_is_judged(front: Front, header: str) -> None:
    # A router reading the last value would dispatch on one nobody compared with the body.
    params = {"name": "deploy_production", "arguments": {"version": "1"}, "requestState": "forged"}
    body, headers = modern_request("tools/call", params)
    repeated = [*((name, value) for name, value in headers.items() if name != header)]
    value = headers[header]
    repeated += [(header, value), (header, value if header == "mcp-method" else "deploy_staging")]
    response = _post(front.proxy.url, body, repeated)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32020
    assert "forged" not in front.upstream.received()


# ---------------------------------------------------------------- streams
def test_a_listen_stream_passes_through_with_its_frames(front: Front) -> None:
    listen, listen_headers = modern_request(
        "subscriptions/listen", {"notifications": {"toolsListChanged": True}}
    )
    frames: list[str] = []
    acknowledged = threading.Event()
    changed = threading.Event()

    def watch() -> None:
        with (
            httpx.Client(timeout=30) as http,
            http.stream("POST", front.proxy.url, content=listen, headers=listen_headers) as stream,
        ):
            assert stream.headers["content-type"].startswith("text/event-stream")
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    frames.append(line)
                    (changed if "tools/list_changed" in line else acknowledged).set()
                    if changed.is_set():
                        return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert acknowledged.wait(20), "no subscriptions/acknowledged frame came through the proxy"
    body, headers = modern_request("tools/call", {"name": "touch_tools", "arguments": {}})
    assert _post(front.proxy.url, body, headers).status_code == 200
    assert changed.wait(20), f"no tools/list_changed frame came through the proxy: {frames}"
    watcher.join(10)
    assert "notifications/subscriptions/acknowledged" in frames[0]
    assert all("subscriptionId" in frame for frame in frames)
