"""statecodec's Python conformance server: every 2026-07-28 server scenario on a real ``MCPServer``.

The official harness (``@modelcontextprotocol/conformance``, ``conformance list``) names the
tools, resources and prompts each scenario calls; this server implements them on the
``mcp`` SDK (2.3+), served over Streamable HTTP by uvicorn with the SDK's own DNS-rebinding
protection (``host="127.0.0.1"``: loopback hosts and origins only).

Three ways to protect its ``requestState`` (scripts/conformance runs each):

- ``--boundary sdk`` (the default): the SDK's own ``RequestStateBoundary`` with its
  per-process key: what the server does *without* statecodec, the baseline;
- ``--boundary sign`` / ``--boundary encrypt``: :func:`statecodec.adapters.mcp.protect` in
  its place, with the key ring ``--keys`` and the replay store ``--replay`` (single use).

Prints ``READY <url>`` once listening (``--port 0`` picks a free port); stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import mcp.types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.prompts.base import UserMessage
from mcp.server.mcpserver.tools.base import Tool
from mcp.shared.exceptions import MCPError
from pydantic import Field

from statecodec import KeyRing, StateCodec
from statecodec._demo._serve import serve_http
from statecodec.adapters.mcp import protect
from statecodec.replay import store_from_url

NAME = "statecodec-conformance-python"
# A 1x1 PNG and a tiny WAV: the scenarios check the media type and that the data is base64.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
WAV = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
#: The JSON Schema 2020-12 fixture of the json-schema-2020-12 scenario (SEP-1613, SEP-2106).
SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}


def _text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


def _form(message: str, field: str, kind: str) -> types.ElicitRequest:
    schema = {"type": "object", "properties": {field: {"type": kind}}, "required": [field]}
    return types.ElicitRequest(params=types.ElicitRequestFormParams(message=message, requested_schema=schema))


def _sample(prompt: str, max_tokens: int) -> types.CreateMessageRequest:
    message = types.SamplingMessage(role="user", content=_text(prompt))
    return types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(messages=[message], max_tokens=max_tokens)
    )


def _accepted(responses: Any, key: str, field: str) -> Any:
    """``field`` of an accepted elicitation answer ``key``, or None."""
    answer = (responses or {}).get(key)
    if isinstance(answer, types.ElicitResult) and answer.action == "accept" and answer.content:
        return answer.content.get(field)
    return None


def _content_tools(server: MCPServer[Any]) -> None:
    @server.tool(description="Simple text content")
    def test_simple_text() -> str:
        return "This is a simple text response for testing."

    @server.tool(description="Image content")
    def test_image_content() -> list[types.ImageContent]:
        return [types.ImageContent(type="image", data=PNG, mime_type="image/png")]

    @server.tool(description="Audio content")
    def test_audio_content() -> list[types.AudioContent]:
        return [types.AudioContent(type="audio", data=WAV, mime_type="audio/wav")]

    def embedded(uri: str, mime: str, text: str) -> types.EmbeddedResource:
        contents = types.TextResourceContents(uri=uri, mime_type=mime, text=text)
        return types.EmbeddedResource(type="resource", resource=contents)

    @server.tool(description="Embedded resource content")
    def test_embedded_resource() -> list[types.EmbeddedResource]:
        return [embedded("test://embedded-resource", "text/plain", "This is an embedded resource content.")]

    @server.tool(description="Text, image and resource content")
    def test_multiple_content_types() -> list[types.ContentBlock]:
        return [
            _text("Multiple content types test:"),
            types.ImageContent(type="image", data=PNG, mime_type="image/png"),
            embedded("test://mixed-content-resource", "application/json", '{"test":"data","value":123}'),
        ]

    @server.tool(description="Always fails")
    def test_error_handling() -> str:
        raise RuntimeError("This tool intentionally returns an error for testing")

    @server.tool(description="Reports progress 0, 50, 100")
    async def test_tool_with_progress(ctx: Context) -> str:
        for progress in (0, 50, 100):
            await ctx.report_progress(progress=progress, total=100)
            if progress < 100:
                await asyncio.sleep(0.05)
        return "progress reported"

    @server.tool(description="Logs through the request-scoped channel")
    async def test_logging_tool(ctx: Context) -> str:
        await ctx.info("test_logging_tool ran")  # delivered only when the request set a logLevel
        return "logged"

    @server.tool(description="A plain result: no request on the response stream")
    def test_streaming_elicitation() -> str:
        return "done"

    @server.tool(description="SEP-2243: region is mirrored into Mcp-Param-Region")
    def test_x_mcp_header(
        region: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Region"})] = "<none>",
    ) -> str:
        return f"region={region}"

    def json_schema_2020_12_tool() -> str:
        return "json_schema_2020_12_tool"

    # The schema as written, not as pydantic would derive it from a signature.
    tool = Tool.from_function(json_schema_2020_12_tool, description="Tool with JSON Schema 2020-12 features")
    server._tool_manager._tools[tool.name] = tool.model_copy(update={"parameters": SCHEMA_2020_12})


def _stateless_tools(server: MCPServer[Any]) -> None:
    @server.tool(description="Publishes tools/list_changed to subscriptions/listen streams")
    async def test_trigger_tool_change(ctx: Context) -> str:
        await ctx.notify_tools_changed()
        return "tools list changed"

    @server.tool(description="Publishes prompts/list_changed to subscriptions/listen streams")
    async def test_trigger_prompt_change(ctx: Context) -> str:
        await ctx.notify_prompts_changed()
        return "prompts list changed"

    @server.tool(description="Needs the sampling client capability")
    async def test_missing_capability(ctx: Context) -> str:
        caps = ctx.client_capabilities
        if caps is None or caps.sampling is None:
            raise MCPError(
                code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                message="This tool requires the client's sampling capability",
                data={"requiredCapabilities": {"sampling": {}}},
            )
        return "sampling declared"


def _ask_name(message: str = "What is your name?") -> types.ElicitRequest:
    return _form(message, "name", "string")


def _one_round_tools(server: MCPServer[Any]) -> None:
    """SEP-2322 tools whose second round completes without a requestState."""

    @server.tool(description="SEP-2322: one elicitation round")
    async def test_input_required_result_elicitation(ctx: Context) -> str | types.InputRequiredResult:
        name = _accepted(ctx.input_responses, "user_name", "name")
        if not isinstance(name, str):
            return types.InputRequiredResult(input_requests={"user_name": _ask_name()})
        return f"Hello, {name}!"

    @server.tool(description="SEP-2322: one sampling round")
    async def test_input_required_result_sampling(ctx: Context) -> str | types.InputRequiredResult:
        answer = (ctx.input_responses or {}).get("capital_question")
        if not isinstance(answer, types.CreateMessageResult):
            return types.InputRequiredResult(
                input_requests={"capital_question": _sample("What is the capital of France?", 100)}
            )
        content = answer.content
        return f"Sampling response: {content.text if isinstance(content, types.TextContent) else '?'}"

    @server.tool(description="SEP-2322: one roots/list round")
    async def test_input_required_result_list_roots(ctx: Context) -> str | types.InputRequiredResult:
        answer = (ctx.input_responses or {}).get("client_roots")
        if not isinstance(answer, types.ListRootsResult):
            return types.InputRequiredResult(input_requests={"client_roots": types.ListRootsRequest()})
        return "roots: " + ", ".join(str(root.uri) for root in answer.roots)

    @server.tool(description="SEP-2322: input requests only for declared capabilities")
    async def test_input_required_result_capabilities(ctx: Context) -> str | types.InputRequiredResult:
        if ctx.input_responses is not None:
            return "capability-aware input received"
        caps = ctx.client_capabilities
        requests: dict[str, types.InputRequest] = {}
        if caps is not None and caps.elicitation is not None:
            requests["user_name"] = _ask_name()
        if caps is not None and caps.sampling is not None:
            requests["greeting"] = _sample("Say hello", 50)
        if caps is not None and caps.roots is not None:
            requests["client_roots"] = types.ListRootsRequest()
        if not requests:
            return "no declared capability takes an input request"
        return types.InputRequiredResult(input_requests=requests)


def _stateful_tools(server: MCPServer[Any]) -> None:
    """SEP-2322 tools that round-trip a requestState (protected by the boundary in front)."""

    @server.tool(description="SEP-2322: requestState round-tripped")
    async def test_input_required_result_request_state(ctx: Context) -> str | types.InputRequiredResult:
        if _accepted(ctx.input_responses, "confirm", "ok") is None:
            return types.InputRequiredResult(
                input_requests={"confirm": _form("Please confirm", "ok", "boolean")},
                request_state=json.dumps({"tool": "request_state"}),
            )
        if ctx.request_state is None or json.loads(ctx.request_state).get("tool") != "request_state":
            raise MCPError(code=types.INVALID_PARAMS, message="requestState missing or not this tool's")
        return "state-ok: requestState verified"

    @server.tool(description="SEP-2322: three kinds of input in one round")
    async def test_input_required_result_multiple_inputs(ctx: Context) -> str | types.InputRequiredResult:
        responses = ctx.input_responses or {}
        if {"user_name", "greeting", "client_roots"} <= responses.keys():
            return "all inputs received"
        return types.InputRequiredResult(
            input_requests={
                "user_name": _ask_name(),
                "greeting": _sample("Generate a greeting", 50),
                "client_roots": types.ListRootsRequest(),
            },
            request_state=json.dumps({"tool": "multiple_inputs"}),
        )

    @server.tool(description="SEP-2322: three rounds, the state evolving")
    async def test_input_required_result_multi_round(ctx: Context) -> str | types.InputRequiredResult:
        state = json.loads(ctx.request_state) if ctx.request_state else {"round": 0}
        ask_color = _form("Step 2: What is your favorite color?", "color", "string")
        if state.get("round") == 1:
            name = _accepted(ctx.input_responses, "step1", "name")
            if isinstance(name, str):
                return types.InputRequiredResult(
                    input_requests={"step2": ask_color},
                    request_state=json.dumps({"round": 2, "name": name}),
                )
        elif state.get("round") == 2:
            color = _accepted(ctx.input_responses, "step2", "color")
            if isinstance(color, str):
                return f"{state.get('name')} likes {color}"
        return types.InputRequiredResult(
            input_requests={"step1": _ask_name("Step 1: What is your name?")},
            request_state=json.dumps({"round": 1}),
        )

    @server.tool(description="SEP-2322: a tampered requestState is refused")
    async def test_input_required_result_tampered_state(ctx: Context) -> str | types.InputRequiredResult:
        if ctx.request_state is None:
            return types.InputRequiredResult(
                input_requests={"confirm": _form("Please confirm", "ok", "boolean")},
                request_state=json.dumps({"tool": "tampered_state"}),
            )
        return "integrity-ok"


def _resources_and_prompts(server: MCPServer[Any]) -> None:
    @server.resource("test://static-text", description="A static text resource", mime_type="text/plain")
    def static_text() -> str:
        return "This is the content of the static text resource."

    @server.resource("test://static-binary", description="A static binary resource", mime_type="image/png")
    def static_binary() -> bytes:
        return base64.b64decode(PNG)

    @server.resource("test://template/{id}/data", description="A template", mime_type="application/json")
    def template(id: str) -> str:
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @server.prompt(description="A simple prompt")
    def test_simple_prompt() -> list[UserMessage]:
        return [UserMessage(content=_text("This is a simple prompt for testing."))]

    @server.prompt(description="A prompt with two arguments")
    def test_prompt_with_arguments(arg1: str, arg2: str) -> list[UserMessage]:
        return [UserMessage(content=_text(f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"))]

    @server.prompt(description="A prompt embedding a resource")
    def test_prompt_with_embedded_resource(resourceUri: str) -> list[UserMessage]:
        contents = types.TextResourceContents(
            uri=resourceUri, mime_type="text/plain", text="Embedded resource content for testing."
        )
        return [
            UserMessage(content=types.EmbeddedResource(type="resource", resource=contents)),
            UserMessage(content=_text("Please process the embedded resource above.")),
        ]

    @server.prompt(description="A prompt with an image")
    def test_prompt_with_image() -> list[UserMessage]:
        return [
            UserMessage(content=types.ImageContent(type="image", data=PNG, mime_type="image/png")),
            UserMessage(content=_text("Please analyze the image above.")),
        ]

    @server.prompt(description="SEP-2322 on prompts/get")
    async def test_input_required_result_prompt(
        ctx: Context,
    ) -> list[UserMessage] | types.InputRequiredResult:
        context = _accepted(ctx.input_responses, "user_context", "context")
        if not isinstance(context, str):
            ask = _form("What context should the prompt use?", "context", "string")
            return types.InputRequiredResult(input_requests={"user_context": ask})
        return [UserMessage(content=_text(f"Use this context: {context}"))]

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> types.Completion:
        return types.Completion(values=[], total=0, has_more=False)


def build(boundary: str, keys: str | None, replay: str | None) -> MCPServer[Any]:
    server: MCPServer[Any] = MCPServer(NAME, log_level="WARNING")
    _content_tools(server)
    _stateless_tools(server)
    _one_round_tools(server)
    _stateful_tools(server)
    _resources_and_prompts(server)
    if boundary != "sdk":
        if keys is None or replay is None:
            raise SystemExit("--boundary sign|encrypt needs --keys and --replay")
        ring = KeyRing.from_json(Path(keys).read_text(encoding="utf-8"))
        protect(server, StateCodec(ring, mode=boundary, replay=store_from_url(replay)), principal=None)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boundary", choices=["sdk", "sign", "encrypt"], default="sdk")
    parser.add_argument("--keys", help="a key ring file (statecodec keys), with sign/encrypt")
    parser.add_argument("--replay", help="a replay store URL (sqlite:PATH, redis://...), with sign/encrypt")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    # Plain log lines, set before MCPServer configures its own: the SDK's default handler
    # renders tracebacks with rich, which took over 10 s on a loaded machine the first time
    # a tool raised (tools-call-error), longer than the harness waits for an answer.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    server = build(args.boundary, args.keys, args.replay)
    asyncio.run(serve_http(server.streamable_http_app(host="127.0.0.1"), "127.0.0.1", args.port))


if __name__ == "__main__":
    main()
