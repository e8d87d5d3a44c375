"""A Python ``MCPServer`` with two multi-round tools, protected by ``protect()`` (issue 21 tests).

- ``wait_for_approval(ticket, checks=3)``: answers requestState-only rounds ("not ready
  yet, come back with this") until the approval arrives, which it does at the
  ``checks``-th retry; the state counts the checks so far.
- ``three_questions(topic, count=3)``: asks one question per round, ``count`` rounds,
  and answers with the answers carried in the state.

Every handler run appends one JSON line to ``--record`` (``{"run": TOOL, "at", "step",
"instance"}``), so a test can count and time the runs. Prints ``READY <url>`` once
listening (``--port 0``); stopped by the tests through its PID.

usage: python tests/adapters/flows_server.py --keys KEYS.json --replay URL --mode sign|encrypt
           [--retry-after S] [--max-hold S] [--max-rounds N] [--max-flow-age S] [--instance A]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import mcp_types as types
import server_main
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

from statecodec import KeyRing, StateCodec
from statecodec.adapters.mcp import protect
from statecodec.replay import store_from_url

NAME = "flows"
QUESTIONS = ("colour", "size", "count")


def question(i: int) -> str:
    """The field asked in round ``i + 1``: three named ones, then q4, q5..."""
    return QUESTIONS[i] if i < len(QUESTIONS) else f"q{i + 1}"


def _record(path: str | None, **entry: Any) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({**entry, "at": time.time()}) + "\n")


def _question(field: str) -> types.ElicitRequest:
    schema = {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=f"Which {field}?", requested_schema=schema)
    )


def _answer(responses: Any, field: str) -> str | None:
    reply = (responses or {}).get(field)
    if isinstance(reply, BaseModel):
        reply = reply.model_dump()
    content = reply.get("content") if isinstance(reply, dict) else None
    return str(content.get(field))[:80] if isinstance(content, dict) and field in content else None


def build(args: argparse.Namespace) -> MCPServer[Any]:
    ring = KeyRing.from_json(Path(args.keys).read_text(encoding="utf-8"))
    codec = StateCodec(
        ring,
        mode=args.mode,
        replay=store_from_url(args.replay),
        max_rounds=args.max_rounds,
        max_flow_age=args.max_flow_age,
        namespace=NAME,
    )
    server: MCPServer[Any] = MCPServer(NAME, log_level="INFO")

    @server.tool(description="Wait until the change is approved")
    async def wait_for_approval(
        ticket: str, ctx: Context, checks: int = 3
    ) -> types.CallToolResult | types.InputRequiredResult:
        done = 0 if ctx.request_state is None else int(json.loads(ctx.request_state)["checks"])
        _record(args.record, run="wait_for_approval", step=done, instance=args.instance, ticket=ticket)
        if done < checks:  # not approved yet: come back later, with this state
            return types.InputRequiredResult(request_state=json.dumps({"checks": done + 1}))
        text = f"{ticket} approved after {done} checks"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    @server.tool(description="Ask three questions, one per round")
    async def three_questions(
        topic: str, ctx: Context, count: int = 3
    ) -> types.CallToolResult | types.InputRequiredResult:
        answers: list[str] = [] if ctx.request_state is None else json.loads(ctx.request_state)["answers"]
        _record(args.record, run="three_questions", step=len(answers), instance=args.instance, topic=topic)
        if ctx.request_state is not None:
            answer = _answer(ctx.input_responses, question(len(answers)))
            if answer is not None:
                answers = [*answers, answer]
        if len(answers) < count:
            field = question(len(answers))
            state = json.dumps({"answers": answers})
            return types.InputRequiredResult(input_requests={field: _question(field)}, request_state=state)
        text = f"{topic}: " + ", ".join(answers)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    protect(server, codec, retry_after=args.retry_after, max_hold=args.max_hold)
    return server


def main() -> None:
    parser = server_main.parser(__doc__.splitlines()[0])
    parser.add_argument("--keys", required=True)
    parser.add_argument("--replay", required=True)
    parser.add_argument("--mode", choices=["sign", "encrypt"], default="encrypt")
    parser.add_argument("--retry-after", type=float)
    parser.add_argument("--max-hold", type=float, default=10.0)
    parser.add_argument("--max-rounds", type=int, default=10)
    parser.add_argument("--max-flow-age", type=int, default=3600)
    parser.add_argument("--record")
    args = parser.parse_args()
    server_main.serve(build(args), args)


if __name__ == "__main__":
    main()
