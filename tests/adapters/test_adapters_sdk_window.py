"""Migrating off the SDK's own requestState boundary: ``protect(..., sdk_window=SDKStateWindow(...))``.

Both sides are the real ``mcp`` SDK (2.3): instance A is an ``MCPServer`` protected by the
SDK's own ``RequestStateSecurity`` (its AES-GCM tokens, its boundary), instance B the same
server protected by statecodec with a window for A's tokens. The real ``mcp.Client`` drives
the rounds by hand (``allow_input_required=True``), in memory: a flow started on A
finishes on B; a replay of A's token is refused; after the window A's tokens are refused.
FastMCP, which uses the same SDK class, is held to the same flow. The last test runs the
same flow over Streamable HTTP between separate processes (tests/adapters/sdk_window_server.py),
two statecodec instances sharing a key ring file and a SQLite replay store.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError
from processes import await_line, spawn, stop

from statecodec import KeyRing, StateCodec
from statecodec.adapters.mcp import protect
from statecodec.adapters.sdk_window import SDKStateWindow
from statecodec.compat import detect
from statecodec.replay.memory import MemoryReplayStore

fastmcp: Any
try:  # module-level: FastMCP resolves a tool's annotations (fastmcp.Context) in these globals
    import fastmcp
except ImportError:  # pragma: no cover - the fastmcp extra
    fastmcp = None

SERVER = Path(__file__).resolve().parent / "sdk_window_server.py"
SDK_KEY = b"the-secret-the-sdk-instances-were-given-0123"
NAME = "deploy"
TOOL = "deploy_production"
ARGS = {"version": "1.2.3"}


class Clock:
    """The statecodec instance's clock: real time, moved forward on demand."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def build(seen: list[str | None], security: RequestStateSecurity | None = None) -> MCPServer[Any]:
    """Three rounds: no state -> "step-1" -> "step-2" -> done. Each round records its state."""

    server: MCPServer[Any] = MCPServer(NAME, request_state_security=security)

    @server.tool(name=TOOL)
    async def deploy(version: str, ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        state = ctx.request_state
        seen.append(state)
        if state is None:
            return types.InputRequiredResult(request_state="step-1")
        if state == "step-1":
            return types.InputRequiredResult(request_state="step-2")
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"deployed {version} after {state}")]
        )

    return server


def sdk_instance(seen: list[str | None]) -> MCPServer[Any]:
    # What the team runs today: the SDK's own boundary, keys shared by every instance.
    return build(seen, RequestStateSecurity(keys=[SDK_KEY]))


def statecodec_instance(
    seen: list[str | None], clock: Clock, *, until: float, **window: Any
) -> tuple[MCPServer[Any], MemoryReplayStore]:
    server = build(seen)
    store = MemoryReplayStore()
    codec = StateCodec(KeyRing.generate(), replay=store, clock=clock)
    protect(server, codec, sdk_window=SDKStateWindow([SDK_KEY], until=until, **window))
    return server, store


async def call(server: MCPServer[Any], state: str | None, args: dict[str, Any] = ARGS) -> Any:
    async with Client(server) as client:
        return await client.session.call_tool(TOOL, args, request_state=state, allow_input_required=True)


async def refused(server: MCPServer[Any], state: str, args: dict[str, Any] = ARGS) -> Any:
    """The JSON-RPC error a request carrying ``state`` is answered with."""
    async with Client(server) as client:
        with pytest.raises(MCPError) as err:
            await client.session.call_tool(TOOL, args, request_state=state, allow_input_required=True)
    return err.value.error


async def sdk_token() -> str:
    first = await call(sdk_instance([]), None)
    assert isinstance(first, types.InputRequiredResult) and first.request_state is not None
    return first.request_state


async def test_a_flow_started_on_the_sdk_instance_finishes_on_the_statecodec_instance() -> None:
    seen_a: list[str | None] = []
    seen_b: list[str | None] = []
    a = sdk_instance(seen_a)
    clock = Clock()
    b, _ = statecodec_instance(seen_b, clock, until=clock() + 3600)

    first = await call(a, None)  # round 1 on the SDK instance
    token = first.request_state
    assert (
        token is not None and token.startswith("v1.") and detect(token).candidates == ("mcp-py-v1", "ruby-v1")
    )
    second = await call(b, token)  # round 2 on statecodec: the SDK token is accepted...
    assert isinstance(second, types.InputRequiredResult)
    assert (second.request_state or "").startswith("sc1")  # ...and the next state is statecodec's
    third = await call(b, second.request_state)
    assert isinstance(third, types.CallToolResult)
    assert isinstance(third.content[0], types.TextContent)
    assert third.content[0].text == "deployed 1.2.3 after step-2"
    assert seen_a == [None] and seen_b == ["step-1", "step-2"]


async def test_a_replayed_sdk_token_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    b, _ = statecodec_instance([], clock, until=clock() + 3600)
    token = await sdk_token()
    assert isinstance(await call(b, token), types.InputRequiredResult)
    with caplog.at_level(logging.WARNING, logger="statecodec"):
        error = await refused(b, token)
    assert error.code == -32602 and error.message == "Invalid or expired requestState"
    rejected = [r for r in caplog.records if getattr(r, "event", None) == "token_rejected"]
    assert [(r.reason, r.mode) for r in rejected] == [("replayed", "mcp-py-v1")]  # type: ignore[attr-defined]


async def test_after_the_window_the_sdk_tokens_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    b, _ = statecodec_instance([], clock, until=clock() + 60)
    token = await sdk_token()
    clock.offset = 61.0  # the window closed; the SDK token itself is still within its own ttl
    with caplog.at_level(logging.WARNING, logger="statecodec"):
        assert (await refused(b, token)).code == -32602
    rejected = [r for r in caplog.records if getattr(r, "event", None) == "token_rejected"]
    assert rejected[0].reason == "expired" and "window closed" in rejected[0].detail  # type: ignore[attr-defined]
    # Statecodec's own flows go on: a fresh flow still works.
    assert isinstance(await call(b, None), types.InputRequiredResult)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param(lambda: ({"version": "9.9.9"}, None), "binding_mismatch", id="other-arguments"),
        pytest.param(
            lambda: (ARGS, {"audience": "another-service"}), "binding_mismatch", id="other-audience"
        ),
        pytest.param(lambda: (ARGS, {"ttl": 10}), "expired", id="longer-than-the-sdk-ttl"),
    ],
)
async def test_the_sdk_binding_rules_hold(
    change: Callable[[], tuple[dict[str, Any], dict[str, Any] | None]],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    args, window = change()
    clock = Clock()
    store_server, _ = statecodec_instance([], clock, until=clock() + 3600, **(window or {}))
    token = await sdk_token()
    with caplog.at_level(logging.WARNING, logger="statecodec"):
        await refused(store_server, token, args)
    rejected = [r for r in caplog.records if getattr(r, "event", None) == "token_rejected"]
    assert rejected[0].reason == reason  # type: ignore[attr-defined]
    # A refused request burns nothing: the token still redeems once with the right request.
    if window is None:
        assert isinstance(await call(store_server, token), types.InputRequiredResult)


async def test_an_sdk_token_of_other_keys_is_refused() -> None:
    clock = Clock()
    other = statecodec_instance([], clock, until=clock() + 3600)[0]
    other_window = SDKStateWindow([b"some-other-sdk-secret-0123456789abcdef"], until=clock() + 3600)
    assert other_window.audience is None
    server = build([])
    protect(
        server,
        StateCodec(KeyRing.generate(), replay=MemoryReplayStore(), clock=clock),
        sdk_window=other_window,
    )
    token = await sdk_token()
    await refused(server, token)
    assert isinstance(await call(other, token), types.InputRequiredResult)


async def test_a_failing_clock_accepts_no_sdk_token(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    server, _ = statecodec_instance([], clock, until=clock() + 3600)
    token = await sdk_token()
    clock.offset = float("nan")
    with caplog.at_level(logging.WARNING, logger="statecodec"):
        assert (await refused(server, token)).code == -32602
    rejected = [r for r in caplog.records if getattr(r, "event", None) == "token_rejected"]
    assert rejected[0].reason == "internal_error"  # type: ignore[attr-defined]


def test_the_window_is_validated_when_the_server_is_assembled() -> None:
    with pytest.raises(ValueError, match="replay store"):
        protect(build([]), StateCodec(KeyRing.generate()), sdk_window=SDKStateWindow([SDK_KEY], until=1e10))
    bad: dict[str, Any]
    for bad in ({"keys": []}, {"keys": SDK_KEY}, {"keys": [b"short"]}, {"until": float("nan")}, {"ttl": 0}):
        kwargs: dict[str, Any] = {"keys": [SDK_KEY], "until": 1e10, **bad}
        with pytest.raises((TypeError, ValueError)):
            SDKStateWindow(**kwargs)


async def test_fastmcp_flow_moves_off_its_sdk_boundary() -> None:
    if fastmcp is None:
        pytest.skip("fastmcp is not installed")
    from statecodec.adapters import fastmcp as fastmcp_adapter  # noqa: PLC0415

    def make(seen: list[str | None], security: RequestStateSecurity | None) -> Any:
        server = fastmcp.FastMCP(NAME, request_state_security=security)

        @server.tool(name=TOOL)
        async def deploy(version: str, ctx: fastmcp.Context) -> Any:
            seen.append(ctx.request_state)
            if ctx.request_state is None:
                return types.InputRequiredResult(request_state="step-1")
            return f"deployed {version} after {ctx.request_state}"

        return server

    seen_b: list[str | None] = []
    a = make([], RequestStateSecurity(keys=[SDK_KEY]))
    clock = Clock()
    b = make(seen_b, None)
    codec = StateCodec(KeyRing.generate(), replay=MemoryReplayStore(), clock=clock)
    fastmcp_adapter.protect(b, codec, sdk_window=SDKStateWindow([SDK_KEY], until=clock() + 3600))
    async with Client(a._mcp_server) as client:
        first = await client.session.call_tool(TOOL, ARGS, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult) and (first.request_state or "").startswith("v1.")
    async with Client(b._mcp_server) as client:
        done = await client.session.call_tool(
            TOOL, ARGS, request_state=first.request_state, allow_input_required=True
        )
        assert isinstance(done, types.CallToolResult) and seen_b == ["step-1"]
        with pytest.raises(MCPError):
            await client.session.call_tool(
                TOOL, ARGS, request_state=first.request_state, allow_input_required=True
            )


# ------------------------------------------------------------------ over HTTP, separate processes
@pytest.fixture(scope="module")
def migrating_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    # Yields each instance's URL under its name, and its log file under "<name> log".
    """A: the SDK's boundary; B: statecodec with an open window; C: the same after the window.

    Three processes of tests/adapters/sdk_window_server.py on free loopback ports, B and C sharing a
    key ring file and a SQLite replay store, stopped by their own PIDs.
    """
    tmp = tmp_path_factory.mktemp("sdk-window")
    keys = tmp / "keys.json"
    keys.write_text(KeyRing.generate().to_json())
    keys.chmod(0o600)
    common = [sys.executable, str(SERVER), "--sdk-key", SDK_KEY.hex()]
    shared = ["--keys", str(keys), "--replay", f"sqlite:{tmp / 'replay.db'}"]
    open_until, closed_at = str(time.time() + 3600), str(time.time() - 1)
    commands = {
        "A": [*common, "--boundary", "sdk", "--instance", "A"],
        "B": [*common, "--boundary", "statecodec", *shared, "--window-until", open_until, "--instance", "B"],
        "C": [*common, "--boundary", "statecodec", *shared, "--window-until", closed_at, "--instance", "C"],
    }
    started: list[tuple[str, Any, Path]] = []
    try:
        for name, command in commands.items():
            log_path = tmp / f"{name}.log"
            started.append((name, spawn(command, log_path), log_path))
        urls = {name: await_line(proc, "READY ", log_path) for name, proc, log_path in started}
        yield {**urls, **{f"{name} log": str(log_path) for name, _, log_path in started}}
    finally:
        for _, proc, _ in started:
            stop(proc)


async def http_call(url: str, state: str | None) -> Any:
    async with Client(streamable_http_client(url)) as client:
        return await client.session.call_tool(TOOL, ARGS, request_state=state, allow_input_required=True)


async def http_refused(url: str, state: str) -> Any:
    async with Client(streamable_http_client(url)) as client:
        with pytest.raises(MCPError) as err:
            await client.session.call_tool(TOOL, ARGS, request_state=state, allow_input_required=True)
    return err.value.error


async def test_over_http_a_flow_moves_from_an_sdk_instance_to_a_statecodec_one(
    migrating_fleet: dict[str, str],
) -> None:
    first = await http_call(migrating_fleet["A"], None)
    assert isinstance(first, types.InputRequiredResult) and first.request_state is not None
    sdk_state = first.request_state
    second = await http_call(migrating_fleet["B"], sdk_state)
    assert isinstance(second, types.InputRequiredResult) and (second.request_state or "").startswith("sc1")
    done = await http_call(migrating_fleet["B"], second.request_state)
    assert isinstance(done, types.CallToolResult) and isinstance(done.content[0], types.TextContent)
    assert done.content[0].text == "deployed 1.2.3 after step-2 on B"
    # The SDK token was redeemed once, in the store B and C share: a replay is refused...
    replay = await http_refused(migrating_fleet["B"], sdk_state)
    assert (replay.code, replay.message) == (-32602, "Invalid or expired requestState")
    # ...and a fresh SDK token is refused by an instance whose window has closed.
    fresh = await http_call(migrating_fleet["A"], None)
    assert (await http_refused(migrating_fleet["C"], fresh.request_state)).code == -32602
    assert "reason=expired detail='an SDK requestState after the migration window closed'" in Path(
        migrating_fleet["C log"]
    ).read_text(encoding="utf-8")
    assert "reason=replayed" in Path(migrating_fleet["B log"]).read_text(encoding="utf-8")
    assert isinstance(await http_call(migrating_fleet["B"], fresh.request_state), types.InputRequiredResult)
