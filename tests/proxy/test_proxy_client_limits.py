"""The proxy under a hostile client: slow heads and bodies, floods of half-open connections,
long-lived streams, and early retries held (issue 25, attacks 1-4).

Real processes on loopback: a ``statecodec proxy`` subprocess in front of a tiny threaded
Python upstream (:class:`TinyUpstream`), which answers JSON-RPC POSTs, serves endless SSE
streams on GET (keep-alive comments, as a server's listen stream does), and paces one
tool: its first call answers ``input_required`` with a state only, its retry (with the
state) counts as one run of the handler. Every process is stopped by its own PID.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures_proxy import Proxy, modern_request, proxy_command
from loopback import Loopback, Quiet
from processes import await_line, spawn, stop
from replicas import keys_file

from statecodec.proxy._guard import FD_RESERVE

pytestmark = pytest.mark.timeout(120)

PACED_TOOL = "slow_report"


@dataclass
class TinyUpstream:
    url: str = ""
    calls: list[str] = field(default_factory=list)  # "method" or "tools/call:NAME[+state]"
    streams: int = 0  # streams open now (GET and subscriptions/listen)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handled(self) -> list[str]:
        with self.lock:
            return list(self.calls)


@pytest.fixture
def upstream() -> Iterator[TinyUpstream]:
    state = TinyUpstream()

    class Handler(Quiet):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
            method, params = body.get("method", ""), body.get("params") or {}
            if method == "subscriptions/listen":
                self.do_GET()  # a listen request's answer: a stream that stays open
                return
            result: dict[str, Any] = {"content": [{"type": "text", "text": "ok"}]}
            name = f"{method}:{params.get('name')}" if method == "tools/call" else method
            if method == "tools/call" and params.get("name") == PACED_TOOL:
                if params.get("requestState") is None:
                    result = {"resultType": "input_required", "requestState": "report-not-ready"}
                else:
                    name += "+state"
            with state.lock:
                state.calls.append(name)
            data = json.dumps({"jsonrpc": "2.0", "id": body.get("id"), "result": result}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-store")
            self.end_headers()
            with state.lock:
                state.streams += 1
            try:
                while True:  # a listen stream: keep-alive comments, forever
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            finally:
                with state.lock:
                    state.streams -= 1
                self.close_connection = True

    with Loopback(Handler) as server:
        state.url = f"{server.base}/mcp"
        yield state


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return keys_file(tmp_path)


@dataclass
class Started:
    proxy: Proxy
    admin: str | None


def start(
    tmp: Path, upstream: str, keys: Path, extra: Sequence[str], *, nofile: int | None = None
) -> Started:
    """One proxy (JSON logs, memory: store, no principal); ``nofile``: its open-file limit."""
    command = proxy_command(
        upstream, keys=keys, replay="memory:", mode="sign", jwks=None, extra=["--log-format", "json", *extra]
    )
    if nofile is not None:  # the limit is set in the proxy's own process, before it imports anything
        setup = (
            "import resource, runpy, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
            "sys.argv = ['statecodec'] + sys.argv[1:]; "
            "runpy.run_module('statecodec.cli', run_name='__main__')"
        )
        command = [sys.executable, "-c", setup, *command[3:]]
    log_path = tmp / "proxy.log"
    proc = spawn(command, log_path)
    admin = await_line(proc, "admin on ", log_path) if "--admin-listen" in extra else None
    return Started(Proxy("P", await_line(proc, "listening on ", log_path), proc, log_path), admin)


def address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the peer closed ``sock`` within ``seconds``, and what it sent before."""
    sock.settimeout(seconds)
    received = b""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            chunk = sock.recv(4096)
            if not chunk:
                return True, received
            received += chunk
    except ConnectionResetError:
        return True, received
    except TimeoutError:
        pass
    return False, received


def stalled(base: str, sent: bytes) -> tuple[bytes, float]:
    """What the proxy at ``base`` sent a client that stopped after ``sent``, and how long until it closed.

    How long past its deadline depends on the sweep period and on how loaded the machine is,
    so any close within a minute is taken as in time; only "not sooner" is checked exactly.
    """
    opened = time.monotonic()
    with socket.create_connection(address(base)) as sock:
        if sent:
            sock.sendall(sent)
        closed, received = closed_within(sock, 60)
    assert closed, f"a client stalled after {sent[-20:]!r} was still open after 60 s"
    return received, time.monotonic() - opened


def shed_records(proxy: Proxy, reason: str) -> list[dict[str, Any]]:
    return [r for r in proxy.records() if r.get("event") == "connection_shed" and r.get("reason") == reason]


def post(base: str, method: str, params: dict[str, Any], timeout: float = 10.0) -> httpx.Response:
    body, headers = modern_request(method, params)
    return httpx.post(base + "/mcp", content=body, headers=headers, timeout=timeout)


# ------------------------------------------------------------------ attack 1: slow clients
def test_a_head_that_never_completes_is_closed_within_the_deadline(
    tmp_path: Path, upstream: TinyUpstream, keys: Path
) -> None:
    started = start(tmp_path, upstream.url, keys, ["--head-timeout", "2s"])
    try:
        _, took = stalled(started.proxy.base, b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: app")
        assert took > 1.5, took  # the deadline, not sooner
        stalled(started.proxy.base, b"")  # connected, says nothing
        started.proxy.wait_for_log('"head_timeout"')
        assert len(shed_records(started.proxy, "head_timeout")) >= 2
        assert post(started.proxy.base, "tools/list", {}).status_code == 200  # others are served meanwhile
    finally:
        stop(started.proxy.proc)


def test_a_body_that_stops_after_one_byte_is_answered_408_and_closed(
    tmp_path: Path, upstream: TinyUpstream, keys: Path
) -> None:
    started = start(tmp_path, upstream.url, keys, ["--body-timeout", "2s"])
    try:
        received, took = stalled(
            started.proxy.base,
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{",
        )
        assert took > 1.5, took
        assert received.startswith(b"HTTP/1.1 408 "), received[:80]
        started.proxy.wait_for_log('"body_timeout"')
        [record] = shed_records(started.proxy, "body_timeout")
        assert record["status"] == 408 and record["client"].startswith("127.0.0.1:")
        assert "tools/call" not in "".join(upstream.handled())  # nothing reached the upstream
    finally:
        stop(started.proxy.proc)


def test_a_flood_of_half_sent_heads_does_not_stop_requests_or_livez(
    tmp_path: Path, upstream: TinyUpstream, keys: Path
) -> None:
    """With 256 descriptors, 300 half-sent heads; the head deadline is long, so the cap must shed them."""
    started = start(
        tmp_path,
        upstream.url,
        keys,
        ["--head-timeout", "2m", "--max-connections", "16", "--admin-listen", "127.0.0.1:0"],
        nofile=256,
    )
    flood: list[socket.socket] = []
    try:
        for _ in range(300):
            sock = socket.create_connection(address(started.proxy.base))
            sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            flood.append(sock)
        # Every flood connection accepted before the legitimate request comes (else, under load,
        # more than the cap of them could still arrive after it: a flood in progress, which
        # evicts the oldest waiting connection whoever it belongs to).
        cap = 256 - 16 - 100 - FD_RESERVE  # the open-file limit less upstream, streams, reserve
        deadline = time.monotonic() + 60
        while (
            len(shed_records(started.proxy, "connection_limit")) < 300 - cap and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        answer = post(started.proxy.base, "tools/list", {}, timeout=10)
        assert answer.status_code == 200, answer.text
        assert httpx.get(f"{started.admin}/livez", timeout=10).status_code == 200
        metrics = httpx.get(f"{started.admin}/metrics", timeout=10).text
        series = 'statecodec_shed_total{reason="connection_limit"}'
        shed = [line for line in metrics.splitlines() if line.startswith(series)]
        assert shed and float(shed[0].split()[-1]) >= 100, shed
        assert len(shed_records(started.proxy, "connection_limit")) >= 300 - cap
        assert "Too many open files" not in started.proxy.log()
    finally:
        for sock in flood:
            sock.close()
        stop(started.proxy.proc)


# ------------------------------------------------------------------ attack 2: long-lived streams
def client_from(source: str) -> httpx.Client:
    """An HTTP client whose connections come from ``source`` (another loopback address: another client)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30)


def clients_from(stack: contextlib.ExitStack, *sources: str) -> list[httpx.Client]:
    """One client per address of ``sources`` (:func:`client_from`), closed with ``stack``."""
    return [stack.enter_context(client_from(source)) for source in sources]


def open_stream(stack: contextlib.ExitStack, client: httpx.Client, base: str) -> httpx.Response:
    response = stack.enter_context(
        client.stream("GET", base + "/mcp", headers={"accept": "text/event-stream"})
    )
    return kept_open(stack, response)


def kept_open(stack: contextlib.ExitStack, response: httpx.Response) -> httpx.Response:
    """``response``; a stream once its first keep-alive came (open end to end), kept open by ``stack``."""
    if response.status_code == 200:
        chunks = response.iter_raw()
        next(chunks)
        stack.callback(chunks.close)  # kept: an iterator collected early would close the stream
    return response


def test_one_client_holding_every_stream_slot_does_not_stall_another_clients_post(
    tmp_path: Path, upstream: TinyUpstream, keys: Path
) -> None:
    # Two request connections, three stream slots: on today's code the streams would take
    # both request connections, and the POST would wait for the pool and get 504.
    limits = ["--max-connections", "2", "--max-streams", "3", "--max-streams-per-client", "3"]
    started = start(tmp_path, upstream.url, keys, [*limits, "--admin-listen", "127.0.0.1:0"])
    base = started.proxy.base
    try:
        with contextlib.ExitStack() as stack:
            greedy, other = clients_from(stack, "127.0.0.1", "127.0.0.2")
            streams = [open_stream(stack, greedy, base) for _ in range(3)]
            assert [s.status_code for s in streams] == [200, 200, 200]
            assert upstream.streams == 3
            for round_ in range(3):  # more POSTs than request connections, one after another
                body, headers = modern_request("tools/call", {"name": "echo", "arguments": {"n": round_}})
                answer = other.post(base + "/mcp", content=body, headers=headers)
                assert answer.status_code == 200, answer.text
            refused = open_stream(stack, other, base)  # a fourth stream: over the total
            assert refused.status_code == 503
            refused.read()
            assert refused.json()["error"]["message"] == "Too many streams"
        started.proxy.wait_for_log('"stream_refused"')
        [record] = [r for r in started.proxy.records() if r.get("event") == "stream_refused"]
        assert (record["reason"], record["status"], record["client"]) == ("stream_limit", 503, "127.0.0.2")
        metrics = httpx.get(f"{started.admin}/metrics", timeout=10).text
        assert 'statecodec_shed_total{reason="stream_limit"} 1.0' in metrics
        assert upstream.handled().count("tools/call:echo") == 3
    finally:
        stop(started.proxy.proc)


def open_listen(stack: contextlib.ExitStack, client: httpx.Client, base: str) -> httpx.Response:
    """A ``subscriptions/listen`` POST with no ``Mcp-Method`` header: only its body says it is a stream."""
    body, headers = modern_request("subscriptions/listen", {})
    del headers["mcp-method"]
    return kept_open(
        stack, stack.enter_context(client.stream("POST", base + "/mcp", content=body, headers=headers))
    )


def test_header_less_listen_requests_count_as_streams_and_do_not_starve_another_clients_ping(
    tmp_path: Path, upstream: TinyUpstream, keys: Path
) -> None:
    # Two request connections: listen requests taken for plain POSTs would hold both, and
    # the other client's ping would wait for the pool and get 504.
    limits = ["--max-connections", "2", "--max-streams", "8", "--max-streams-per-client", "3"]
    started = start(tmp_path, upstream.url, keys, limits)
    base = started.proxy.base
    try:
        with contextlib.ExitStack() as stack:
            greedy, other = clients_from(stack, "127.0.0.1", "127.0.0.2")
            listens = [open_listen(stack, greedy, base) for _ in range(6)]
            assert [listen.status_code for listen in listens] == [200, 200, 200, 429, 429, 429]
            assert listens[3].read() and listens[3].json()["id"] == 1  # the request's id, kept
            assert upstream.streams == 3
            for round_ in range(3):  # more POSTs than request connections
                body, headers = modern_request("ping", {}, request_id=10 + round_)
                answer = other.post(base + "/mcp", content=body, headers=headers)
                assert answer.status_code == 200, answer.text
                assert answer.json()["id"] == 10 + round_
        started.proxy.wait_for_log('"stream_client_limit"')
        reasons = [r["reason"] for r in started.proxy.records() if r.get("event") == "stream_refused"]
        assert reasons == ["stream_client_limit"] * 3
    finally:
        stop(started.proxy.proc)


def test_a_client_over_its_share_of_streams_is_refused_429_and_others_still_stream(
    tmp_path: Path, upstream: TinyUpstream, keys: Path
) -> None:
    started = start(tmp_path, upstream.url, keys, ["--max-streams", "4", "--max-streams-per-client", "2"])
    base = started.proxy.base
    try:
        with contextlib.ExitStack() as stack:
            greedy, other = clients_from(stack, "127.0.0.1", "127.0.0.3")
            assert [open_stream(stack, greedy, base).status_code for _ in range(2)] == [200, 200]
            over = open_stream(stack, greedy, base)
            assert over.status_code == 429
            over.read()
            assert open_stream(stack, other, base).status_code == 200  # another client's share is intact
        started.proxy.wait_for_log('"stream_client_limit"')
        reasons = [r["reason"] for r in started.proxy.records() if r.get("event") == "stream_refused"]
        assert reasons == ["stream_client_limit"]
        deadline = time.monotonic() + 60
        while upstream.streams and time.monotonic() < deadline:  # closed streams release their slots
            time.sleep(0.1)
        assert upstream.streams == 0
        with contextlib.ExitStack() as stack:
            greedy = stack.enter_context(client_from("127.0.0.1"))
            assert [open_stream(stack, greedy, base).status_code for _ in range(2)] == [200, 200]
    finally:
        stop(started.proxy.proc)


# ------------------------------------------------------------------ attacks 3-4: holds
# Early retries must reach the proxy before the state is redeemable: seconds to spare, on a loaded
# machine too. The debug level logs each hold as it starts ("early_retry_held").
RETRY_AFTER = 5
PACED = ["--retry-after", str(RETRY_AFTER), "--max-hold", "10", "--log-level", "debug"]


def paced_token(base: str) -> str:
    """Round 1 of the paced tool: its state, redeemable ``RETRY_AFTER`` seconds from now."""
    answer = post(base, "tools/call", {"name": PACED_TOOL, "arguments": {}})
    result = answer.json()["result"]
    assert result["resultType"] == "input_required", result
    return str(result["requestState"])


def retry_request(token: str) -> tuple[bytes, dict[str, str]]:
    return modern_request("tools/call", {"name": PACED_TOOL, "arguments": {}, "requestState": token})


def retry(base: str, token: str, timeout: float = 60.0) -> dict[str, Any]:
    body, headers = retry_request(token)
    answer = httpx.post(base + "/mcp", content=body, headers=headers, timeout=timeout)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_a_client_leaving_during_its_hold_releases_it_without_consuming_the_token(
    tmp_path: Path, upstream: TinyUpstream, keys: Path
) -> None:
    started = start(tmp_path, upstream.url, keys, PACED)
    base = started.proxy.base
    try:
        token = paced_token(base)
        issued = time.monotonic()
        body, headers = retry_request(token)
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        with socket.create_connection(address(base)) as sock:  # the early retry, then the client leaves
            sock.sendall(
                f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert '"early_retry_held"' in started.proxy.wait_for_log('"early_retry_held"')
        assert '"early_retry_abandoned"' in started.proxy.wait_for_log('"early_retry_abandoned"')
        time.sleep(max(0.0, issued + RETRY_AFTER + 1 - time.monotonic()))  # past the pacing time
        assert f"tools/call:{PACED_TOOL}+state" not in upstream.handled()  # nothing ran for nobody
        [record] = [r for r in started.proxy.records() if r.get("event") == "early_retry_abandoned"]
        assert record["reason"] == "hold_abandoned" and record["round"] == 1
        answer = retry(base, token)  # the on-time retry: the token was never consumed
        assert answer["result"]["content"][0]["text"] == "ok", answer
        assert upstream.handled().count(f"tools/call:{PACED_TOOL}+state") == 1
    finally:
        stop(started.proxy.proc)


def test_early_retries_of_one_token_beyond_its_bound_are_answered_at_once(
    tmp_path: Path, upstream: TinyUpstream, keys: Path
) -> None:
    started = start(tmp_path, upstream.url, keys, [*PACED, "--max-holds-per-token", "2"])
    base = started.proxy.base
    try:
        token = paced_token(base)
        answers: list[dict[str, Any]] = []
        threads = [threading.Thread(target=lambda: answers.append(retry(base, token))) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert len(answers) == 6
        at_once = [a for a in answers if a.get("result", {}).get("requestState") == token]
        assert len(at_once) == 4, answers  # the same state, unconsumed: the client retries later
        held = [a for a in answers if a not in at_once]
        # The two held ones run at the pacing time: one redeems the token, the other finds it used.
        assert sorted("result" in a for a in held) == [False, True], held
        assert upstream.handled().count(f"tools/call:{PACED_TOOL}+state") == 1
        records = [r for r in started.proxy.records() if r.get("reason") == "hold_limit"]
        assert len(records) == 4 and {r["event"] for r in records} == {"early_retry_answered"}
    finally:
        stop(started.proxy.proc)


def test_an_open_file_limit_too_low_to_serve_is_a_usage_error(tmp_path: Path, keys: Path) -> None:
    # 128 descriptors, hard: the defaults' 100 upstream connections, 100 streams and 64 do not fit.
    setup = (
        "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128)); "
        "sys.argv = ['statecodec'] + sys.argv[1:]; runpy.run_module('statecodec.cli', run_name='__main__')"
    )
    command = proxy_command("http://127.0.0.1:9/mcp", keys=keys, replay="memory:", mode="sign", jwks=None)
    done = subprocess.run(
        [sys.executable, "-c", setup, *command[3:]], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "open-file limit (128)" in done.stderr and "ulimit -n" in done.stderr
    assert "listening on" not in done.stdout


def test_the_open_file_limit_is_raised_within_the_hard_limit() -> None:
    code = (
        "import resource; from statecodec.proxy._guard import raise_open_file_limit as r; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024)); a = r(); "
        "b = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300)); print(a, b, r())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["1024", "(1024,", "1024)", "300"]
