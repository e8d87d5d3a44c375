"""statecodec.adapters.mcp and .fastmcp in one process: installation, the three MRTR
methods, binding overrides, seal failures, and sdk_codec under the SDK's own boundary.

The servers are real SDK servers and the client is the official ``mcp`` Client connected
in-process (the SDK's direct dispatcher: the full middleware chain and handlers run, only
the HTTP hop is skipped; the HTTP path is covered by test_adapters_e2e.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import mcp_types as types
import pytest
from fastmcp import FastMCP
from fastmcp_servers import deploy_server
from mcp.client import Client
from mcp.server._otel import OpenTelemetryMiddleware
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import InvalidRequestState, RequestStateBoundary, RequestStateSecurity
from mcp.shared.exceptions import MCPError
from mcp_requests import request_context

from statecodec import KeyRing, StateCodec, boundary
from statecodec.adapters import fastmcp as fastmcp_adapter
from statecodec.adapters.mcp import StateCodecMiddleware, protect, sdk_codec
from statecodec.replay.memory import MemoryReplayStore

Ctx = ServerRequestContext[Any, Any]


def make_codec(mode: str = "encrypt", **kwargs: Any) -> StateCodec:
    kwargs.setdefault("replay", MemoryReplayStore())
    return StateCodec(KeyRing.generate(), mode=mode, **kwargs)


async def _noop_middleware(ctx: Ctx, call_next: Any) -> Any:
    return await call_next(ctx)


# ------------------------------------------------------------------ installation
def test_mcpserver_boundary_is_replaced_in_place() -> None:
    server = MCPServer("svc", middleware=[_noop_middleware])
    before = list(server.middleware)
    assert isinstance(before[0], OpenTelemetryMiddleware) and isinstance(before[1], RequestStateBoundary)

    installed = protect(server, make_codec())

    assert server.middleware == [before[0], installed, _noop_middleware]
    assert not any(isinstance(m, RequestStateBoundary) for m in server.middleware)
    assert installed.audience == "svc"


def test_lowlevel_server_gets_it_inside_telemetry_before_user_middleware() -> None:
    server: Server[Any] = Server("low")
    server.middleware.append(_noop_middleware)
    installed = protect(server, make_codec(), audience="shared-audience")
    assert isinstance(server.middleware[0], OpenTelemetryMiddleware)
    assert server.middleware[1:] == [installed, _noop_middleware]
    assert installed.audience == "shared-audience"


def test_protecting_twice_keeps_only_the_latest() -> None:
    server = MCPServer("svc")
    first = protect(server, make_codec())
    second = protect(server, make_codec("sign"))
    chain = server.middleware
    assert second in chain and first not in chain
    assert sum(isinstance(m, StateCodecMiddleware | RequestStateBoundary) for m in chain) == 1


def test_fastmcp_boundary_is_replaced_in_the_sdk_chain() -> None:
    server: FastMCP[Any] = FastMCP("deploy")
    chain = server._mcp_server.middleware
    position = next(i for i, m in enumerate(chain) if isinstance(m, RequestStateBoundary))
    others = [m for m in chain if not isinstance(m, RequestStateBoundary)]

    installed = fastmcp_adapter.protect(server, make_codec())

    assert chain[position] is installed
    assert [m for m in chain if m is not installed] == others
    assert installed.audience == "deploy"


@pytest.mark.parametrize(
    "make",
    [lambda: MCPServer(None), lambda: MCPServer(""), lambda: MCPServer(), lambda: Server("")],
    ids=["MCPServer(None)", "MCPServer('')", "MCPServer()", "Server('')"],
)
def test_an_unnamed_server_is_refused_naming_audience(make: Callable[[], Any]) -> None:
    # The SDK refuses an unnamed MCPServer with shared keys (its placeholder "mcp-server"
    # would be every unnamed service's audience); protect() refuses it likewise.
    server = make()
    chain = server.middleware if isinstance(server, Server) else server._lowlevel_server.middleware
    before = list(chain)
    with pytest.raises(ValueError, match=r"audience=") as info:
        protect(server, make_codec())
    assert "no name of its own" in str(info.value)
    assert list(chain) == before  # nothing installed
    # The fix the message names works.
    assert protect(make(), make_codec(), audience="deploy").audience == "deploy"


@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_audience_is_refused(blank: str) -> None:
    with pytest.raises(ValueError, match="audience= must name the service"):
        protect(MCPServer("deploy"), make_codec(), audience=blank)
    with pytest.raises(ValueError, match="audience= must name the service"):
        fastmcp_adapter.protect(FastMCP("deploy"), make_codec(), audience=blank)


def test_an_unnamed_fastmcp_is_refused_naming_audience() -> None:
    # It warned before; now as the mcp adapter: a generated name differs per process.
    with pytest.raises(ValueError, match=r"audience=") as info:
        fastmcp_adapter.protect(FastMCP(), make_codec())
    assert "FastMCP-" in str(info.value)
    assert fastmcp_adapter.protect(FastMCP(), make_codec(), audience="deploy").audience == "deploy"
    assert fastmcp_adapter.protect(FastMCP("deploy"), make_codec()).audience == "deploy"


def test_protect_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match=r"FastMCP use statecodec\.adapters\.fastmcp"):
        protect(FastMCP("x"), make_codec())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a FastMCP"):
        fastmcp_adapter.protect(MCPServer("x"), make_codec())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="StateCodec"):
        protect(MCPServer("x"), object())  # type: ignore[arg-type]


# ------------------------------------------------------- the three MRTR methods
class EchoServer:
    """A lowlevel server whose three MRTR handlers ask once, then echo what they got."""

    def __init__(self, name: str = "echo") -> None:
        self.received: list[str | None] = []
        self.server: Server[Any] = Server(
            name,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_read_resource=self.read_resource,
            on_get_prompt=self.get_prompt,
        )

    def _state(self, what: str, arguments: Any) -> str:
        # Non-ASCII on purpose: the str <-> bytes mapping is UTF-8 both ways.
        return f"plan for {what} {json.dumps(arguments, sort_keys=True)} ✓ ünïcode"

    async def list_tools(self, ctx: Ctx, params: Any) -> types.ListToolsResult:
        # The client validates tool results against the listing.
        return types.ListToolsResult(tools=[types.Tool(name="deploy", input_schema={"type": "object"})])

    async def call_tool(self, ctx: Ctx, params: types.CallToolRequestParams) -> Any:
        self.received.append(params.request_state)
        if params.request_state is None:
            return types.InputRequiredResult(request_state=self._state(params.name, params.arguments))
        return types.CallToolResult(content=[types.TextContent(type="text", text=params.request_state)])

    async def read_resource(self, ctx: Ctx, params: types.ReadResourceRequestParams) -> Any:
        self.received.append(params.request_state)
        if params.request_state is None:
            return types.InputRequiredResult(request_state=self._state(str(params.uri), None))
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, text=params.request_state)]
        )

    async def get_prompt(self, ctx: Ctx, params: types.GetPromptRequestParams) -> Any:
        self.received.append(params.request_state)
        if params.request_state is None:
            return types.InputRequiredResult(request_state=self._state(params.name, params.arguments))
        text = types.TextContent(type="text", text=params.request_state)
        return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=text)])


async def call(client: Client, method: str, state: str | None = None, *, variant: str = "a") -> Any:
    """One round of ``method`` by hand; returns the InputRequiredResult or the final text."""
    session = client.session
    if method == "tools/call":
        result: Any = await session.call_tool(
            "deploy", {"version": variant}, request_state=state, allow_input_required=True
        )
    elif method == "prompts/get":
        result = await session.get_prompt(
            "deploy", {"version": variant}, request_state=state, allow_input_required=True
        )
    else:
        result = await session.read_resource(
            f"deploy://{variant}", request_state=state, allow_input_required=True
        )
    if isinstance(result, types.InputRequiredResult):
        return result
    if isinstance(result, types.CallToolResult):
        return result.content[0].text  # type: ignore[union-attr]
    if isinstance(result, types.GetPromptResult):
        return result.messages[0].content.text  # type: ignore[union-attr]
    return result.contents[0].text  # type: ignore[union-attr]


METHODS = ["tools/call", "prompts/get", "resources/read"]


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
@pytest.mark.parametrize("method", METHODS)
async def test_each_method_is_sealed_and_unsealed(method: str, mode: str) -> None:
    echo = EchoServer()
    protect(echo.server, make_codec(mode))
    async with Client(echo.server) as client:
        asked = await call(client, method)
        token = asked.request_state
        assert token.startswith("sc1s." if mode == "sign" else "sc1e.")
        assert "plan for" not in token  # base64url, never the plaintext itself
        final = await call(client, method, token)
    # The handler saw exactly the plaintext it sealed, non-ASCII included.
    if method == "resources/read":
        expected = echo._state("deploy://a", None)
    else:
        expected = echo._state("deploy", {"version": "a"})
    assert echo.received == [None, expected]
    assert final == expected


async def test_a_token_is_bound_to_its_method_target_and_arguments(caplog: pytest.LogCaptureFixture) -> None:
    echo = EchoServer()
    protect(echo.server, make_codec())
    async with Client(echo.server) as client:
        token = (await call(client, "tools/call")).request_state
        for method, variant in [("prompts/get", "a"), ("tools/call", "b")]:
            with pytest.raises(MCPError) as caught:
                await call(client, method, token, variant=variant)
            assert (
                caught.value.error.model_dump(exclude_none=True) == boundary.WireError.invalid_state().error()
            )
        assert caplog.text.count("reason=binding_mismatch") == 2
        # Rejections never burn the token: the rightful request still redeems it, once.
        assert (await call(client, "tools/call", token)).startswith("plan for deploy")
        with pytest.raises(MCPError):
            await call(client, "tools/call", token)
    assert "reason=replayed" in caplog.text
    assert echo.received == [None, echo.received[1]]  # the handler never saw a bad token


# ------------------------------------------------------------------ overrides
async def test_principal_override_binds_to_the_user() -> None:
    echo = EchoServer()
    user = {"name": "alice"}
    protect(echo.server, make_codec(), principal=lambda ctx: user["name"])
    async with Client(echo.server) as client:
        token = (await call(client, "tools/call")).request_state
        user["name"] = "bob"
        with pytest.raises(MCPError) as caught:
            await call(client, "tools/call", token)
        assert caught.value.code == -32602
        user["name"] = "alice"
        assert (await call(client, "tools/call", token)).startswith("plan for")


async def test_audience_defaults_to_the_server_name_and_can_be_shared() -> None:
    codec = make_codec()
    one, two = EchoServer("one"), EchoServer("two")
    protect(one.server, codec)
    protect(two.server, codec)
    async with Client(one.server) as c1, Client(two.server) as c2:
        token = (await call(c1, "tools/call")).request_state
        with pytest.raises(MCPError):
            await call(c2, "tools/call", token)  # same keys, another service
    shared1, shared2 = EchoServer("one"), EchoServer("two")
    protect(shared1.server, codec, audience="deploy-service")
    protect(shared2.server, codec, audience="deploy-service")
    async with Client(shared1.server) as c1, Client(shared2.server) as c2:
        token = (await call(c1, "tools/call")).request_state
        assert (await call(c2, "tools/call", token)).startswith("plan for")


async def test_binding_callback_adds_fields() -> None:
    echo = EchoServer()
    tenant = {"id": "t1"}
    protect(echo.server, make_codec(), binding=lambda ctx, b: b.replace(extra={"tenant": tenant["id"]}))
    async with Client(echo.server) as client:
        token = (await call(client, "tools/call")).request_state
        tenant["id"] = "t2"
        with pytest.raises(MCPError):
            await call(client, "tools/call", token)
        tenant["id"] = "t1"
        assert (await call(client, "tools/call", token)).startswith("plan for")


async def test_a_raising_principal_fails_closed_both_ways(caplog: pytest.LogCaptureFixture) -> None:
    codec = make_codec()
    good, bad = EchoServer("svc"), EchoServer("svc")
    protect(good.server, codec)

    def broken(ctx: Ctx) -> str:
        raise RuntimeError("directory down")

    protect(bad.server, codec, principal=broken)
    async with Client(good.server) as c_good, Client(bad.server) as c_bad:
        token = (await call(c_good, "tools/call")).request_state
        with pytest.raises(MCPError) as inbound:
            await call(c_bad, "tools/call", token)
        assert inbound.value.code == -32602
        assert "reason=malformed" in caplog.text and "directory down" in caplog.text
        with pytest.raises(MCPError) as outbound:
            await call(c_bad, "tools/call")
    assert (outbound.value.code, outbound.value.message, outbound.value.data) == (
        -32603,
        "Internal error",
        None,
    )
    assert bad.received == [None]  # round 1 ran; its result was refused, never sent unsealed


async def test_a_seal_failure_is_an_internal_error_with_nothing_leaked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    echo = EchoServer()
    protect(echo.server, make_codec(max_token_bytes=128))  # too small for the echo plan
    async with Client(echo.server) as client:
        with pytest.raises(MCPError) as caught:
            await call(client, "tools/call")
    assert (caught.value.code, caught.value.message, caught.value.data) == (-32603, "Internal error", None)
    assert "could not seal requestState on tools/call 'deploy'" in caplog.text
    assert "max_token_bytes" in caplog.text


async def test_a_store_outage_reaches_the_client_as_retry_not_invalid() -> None:
    # Through the official client: a replay store that cannot record the token (a real
    # MemoryReplayStore full to max_entries) is -32603 "retry the same request", never the
    # -32602 of a forgery; the token was not consumed, and the same request then redeems.
    now = [0.0]
    echo = EchoServer()
    codec = make_codec(replay=MemoryReplayStore(max_entries=1, clock=lambda: now[0]))
    protect(echo.server, codec)
    async with Client(echo.server) as client:
        first = await call(client, "tools/call")
        await call(client, "tools/call", first.request_state)  # fills the store
        second = await call(client, "tools/call", variant="a")
        with pytest.raises(MCPError) as caught:
            await call(client, "tools/call", second.request_state)
        assert caught.value.code == -32603
        assert caught.value.message.startswith("Temporarily unavailable: retry the same request")
        assert caught.value.data == {"reason": "temporarily_unavailable"}
        now[0] += codec.ttl + codec.max_skew + 1
        assert "plan for deploy" in await call(client, "tools/call", second.request_state)
    assert echo.received.count(None) == 2 and len(echo.received) == 4  # the refused round never ran


async def test_other_methods_pass_untouched() -> None:
    async def list_tools(ctx: Ctx, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

    server: Server[Any] = Server("svc", on_list_tools=list_tools)
    protect(server, make_codec())
    async with Client(server) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["t"]


async def test_called_directly_the_middleware_returns_the_type_the_handler_returned() -> None:
    # Code composing middleware sees what the SDK's own boundary gives: the result model,
    # its state sealed (issue 22); the runner's wire dicts stay wire dicts.
    codec = make_codec()
    middleware = StateCodecMiddleware(codec, audience="svc", principal=None)
    params = {"name": "deploy", "arguments": {"version": "1"}}
    question = types.ElicitRequest(params=types.ElicitRequestFormParams(message="Sure?", requested_schema={}))
    model = types.InputRequiredResult(input_requests={"confirm": question}, request_state="plan ✓")

    async def ask(ctx: Ctx) -> Any:
        return model

    async def ask_wire(ctx: Ctx) -> Any:
        return {"resultType": "input_required", "requestState": "wire plan"}

    asked = await middleware(request_context(params), ask)
    assert type(asked) is types.InputRequiredResult
    assert asked.input_requests == model.input_requests and model.request_state == "plan ✓"  # a copy
    assert (
        asked.request_state is not None
        and codec.verify_unbound(asked.request_state).payload == "plan ✓".encode()
    )
    wired = await middleware(request_context(params), ask_wire)
    assert type(wired) is dict and codec.verify_unbound(wired["requestState"]).payload == b"wire plan"

    done = types.CallToolResult(content=[types.TextContent(type="text", text="ok")])
    seen: list[Any] = []

    async def complete(ctx: Ctx) -> Any:
        seen.append((ctx.params or {})["requestState"])
        return done

    assert (
        await middleware(request_context({**params, "requestState": asked.request_state}), complete) is done
    )
    assert seen == ["plan ✓"]


# ------------------------------------------------------------- FastMCP in-process
async def test_fastmcp_tool_round_trip_in_process() -> None:
    server, seen = deploy_server(lambda version: f"plan {version}")
    fastmcp_adapter.protect(server, make_codec("sign"))
    async with Client(server._mcp_server) as client:
        asked = await client.session.call_tool("deploy", {"version": "9"}, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult) and asked.request_state is not None
        assert asked.request_state.startswith("sc1s.")
        done = await client.session.call_tool(
            "deploy", {"version": "9"}, request_state=asked.request_state, allow_input_required=True
        )
    assert isinstance(done, types.CallToolResult)
    assert seen == [None, "plan 9"]


# ------------------------------------------------------------------ sdk_codec
async def test_sdk_codec_under_the_sdk_boundary() -> None:
    codec = make_codec("sign")
    server = MCPServer("svc", request_state_security=RequestStateSecurity(codec=sdk_codec(codec)))
    seen: list[str | None] = []

    @server.tool()
    async def deploy(version: str, ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        seen.append(ctx.request_state)
        if ctx.request_state is None:
            return types.InputRequiredResult(request_state=f"plan {version}")
        return types.CallToolResult(content=[types.TextContent(type="text", text=ctx.request_state)])

    async with Client(server) as client:
        asked = await client.session.call_tool("deploy", {"version": "1"}, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult) and asked.request_state is not None
        token = asked.request_state
        assert token.startswith("sc1s.")  # statecodec's format around the SDK's claims envelope
        done = await client.session.call_tool(
            "deploy", {"version": "1"}, request_state=token, allow_input_required=True
        )
        assert isinstance(done, types.CallToolResult)
        with pytest.raises(MCPError) as replayed:  # single use, which the SDK alone lacks
            await client.session.call_tool("deploy", {"version": "1"}, request_state=token)
        refusal = boundary.WireError.invalid_state().error()
        assert replayed.value.error.model_dump(exclude_none=True) == refusal
    assert seen == [None, "plan 1"]


def test_sdk_codec_raises_the_sdk_exception() -> None:
    adapted = sdk_codec(make_codec(), consume=False)
    token = adapted.seal(b"payload")
    assert adapted.unseal(token) == b"payload"
    assert adapted.unseal(token) == b"payload"  # consume=False: the SDK's own semantics
    with pytest.raises(InvalidRequestState, match="malformed"):
        adapted.unseal("v1.not-ours")


@pytest.mark.parametrize("wire", [False, True], ids=["model", "wire-dict"])
async def test_an_input_required_result_that_asks_nothing_is_an_internal_error(wire: bool) -> None:
    # MCP 2026-07-28: inputRequests or requestState, at least one; the TypeScript SDK's guard
    # answers -32603, and so does protect(), for the runner's dicts and for result models (the
    # SDK's model validates this, but model_construct, used by code further in, skips that).
    middleware = StateCodecMiddleware(make_codec(), audience="svc", principal=None)
    params = {"name": "deploy", "arguments": {"version": "1"}}

    async def nothing(ctx: Ctx) -> Any:
        return {"resultType": "input_required"} if wire else types.InputRequiredResult.model_construct()

    with pytest.raises(MCPError) as caught:
        await middleware(request_context(params), nothing)
    assert caught.value.error.code == -32603
