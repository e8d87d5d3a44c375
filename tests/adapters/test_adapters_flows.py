"""Flows on the one judging path (statecodec.boundary): chaining, pacing, budgets, facts.

A real codec, a real replay store and real time: a hold is an ``asyncio.sleep`` until the
token's not-before time, so the tests assert lower bounds on elapsed time only (never
upper bounds, which a loaded machine could break). The real clients and servers are in
tests/adapters/test_flows_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import subprocess
import sys
import textwrap
import time
from typing import Any

import mcp_types
import pytest
from clocks import ManualClock
from fastmcp import Context as FastMCPContext
from fastmcp import FastMCP
from mcp.client import Client
from mcp.server.mcpserver import Context, MCPServer

from statecodec import Binding, KeyRing, StateCodec, _format, boundary
from statecodec.adapters import fastmcp as fastmcp_adapter
from statecodec.adapters.mcp import protect
from statecodec.boundary import WireError
from statecodec.replay.memory import MemoryReplayStore

MODES = ["sign", "encrypt"]
PARAMS: dict[str, Any] = {"name": "wait_for_approval", "arguments": {"ticket": "CHG-1"}}
STATE_ONLY: dict[str, Any] = {"resultType": "input_required", "requestState": '{"checks": 1}'}
ASKING: dict[str, Any] = {
    "resultType": "input_required",
    "inputRequests": {"q": {"method": "elicitation/create", "params": {}}},
    "requestState": '{"asked": 1}',
}


T0 = 1_750_000_000.0


def _codec(mode: str, **kw: Any) -> StateCodec:
    kw.setdefault("replay", MemoryReplayStore())
    return StateCodec(KeyRing.generate(), mode=mode, **kw)


def _bind() -> Binding:
    return boundary.binding_for("tools/call", PARAMS, principal="alice", audience="svc")


async def _first(codec: StateCodec, result: dict[str, Any], retry_after: float | None = None) -> str:
    judged = await boundary.judge_request(codec, "tools/call", PARAMS, _bind)
    return str(boundary.seal_result(codec, judged, result, retry_after=retry_after)["requestState"])


async def _retry(codec: StateCodec, token: str, **kw: Any) -> boundary.Judged:
    return await boundary.judge_request(codec, "tools/call", {**PARAMS, "requestState": token}, _bind, **kw)


@pytest.mark.parametrize("mode", MODES)
async def test_a_round_that_came_with_a_state_seals_the_next_round_of_its_flow(mode: str) -> None:
    codec = _codec(mode)
    first = await _first(codec, ASKING)
    judged = await _retry(codec, first)
    assert judged.opened is not None and judged.opened.round == 1
    second = boundary.seal_result(codec, judged, ASKING)["requestState"]
    header = _format.parse(second, 8192)
    assert header.round == 2 and header.flow_id.hex() == judged.opened.flow_id
    assert header.not_before_ms == 0  # a round with questions is never paced


@pytest.mark.parametrize("mode", MODES)
async def test_only_requeststate_only_rounds_are_paced(mode: str) -> None:
    codec = _codec(mode)
    paced = await _first(codec, STATE_ONLY, retry_after=2)
    asking = await _first(codec, ASKING, retry_after=2)
    assert _format.parse(paced, 8192).not_before_ms >= 2000
    assert _format.parse(asking, 8192).not_before_ms == 0
    assert boundary.is_state_only(STATE_ONLY) and not boundary.is_state_only(ASKING)
    assert boundary.is_state_only({**STATE_ONLY, "inputRequests": {}})
    assert not boundary.is_state_only({"resultType": "complete", "requestState": "x"})


@pytest.mark.parametrize("mode", MODES)
async def test_an_early_retry_within_the_hold_waits_then_runs(mode: str) -> None:
    codec = _codec(mode)
    token = await _first(codec, STATE_ONLY, retry_after=0.3)
    judged = await _retry(codec, token, max_hold=5)
    assert judged.early is None and judged.opened is not None  # held, not refused nor answered early
    assert judged.opened.not_before is not None and time.time() >= judged.opened.not_before
    with pytest.raises(WireError):  # and it was consumed by that one run
        await _retry(codec, token, max_hold=5)


@pytest.mark.parametrize("mode", MODES)
async def test_an_early_retry_beyond_the_hold_gets_the_same_state_and_burns_nothing(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(T0)
    codec = _codec(mode, clock=clock)
    token = await _first(codec, STATE_ONLY, retry_after=0.4)
    caplog.set_level(logging.INFO, logger="statecodec")
    for _ in range(50):
        clock.now += 0.001  # 50 retries within 50 ms of the seal
        judged = await _retry(codec, token, max_hold=0)
        assert judged.opened is None
        assert judged.early == {"resultType": "input_required", "requestState": token}
    early = [r for r in caplog.records if getattr(r, "reason", None) == "too_early"]
    assert early and all(r.levelno == logging.INFO for r in early)  # not a warning: no attack
    assert {getattr(r, "round", None) for r in early} == {1}
    # 8 hex digits: the flow id is the first token's id, logged as token ids are.
    assert {getattr(r, "flow_id", None) for r in early} == {_format.parse(token, 8192).token_id.hex()[:8]}
    clock.now = T0 + 0.4
    judged = await _retry(codec, token, max_hold=0)
    assert judged.opened is not None  # never consumed by the early ones


@pytest.mark.parametrize("mode", MODES)
async def test_concurrent_early_retries_are_held_and_only_one_runs(mode: str) -> None:
    codec = _codec(mode)
    token = await _first(codec, STATE_ONLY, retry_after=0.3)
    outcomes = await asyncio.gather(
        *(_retry(codec, token, max_hold=5) for _ in range(20)), return_exceptions=True
    )
    ran = [o for o in outcomes if isinstance(o, boundary.Judged) and o.opened is not None]
    refused = [o for o in outcomes if isinstance(o, WireError)]
    assert len(ran) == 1 and len(refused) == 19  # single use holds for the held ones too


@pytest.mark.parametrize("mode", MODES)
async def test_a_wrong_binding_is_refused_at_once_even_when_early(mode: str) -> None:
    codec = _codec(mode)
    token = await _first(codec, STATE_ONLY, retry_after=5)
    other = {"name": "wait_for_approval", "arguments": {"ticket": "CHG-2"}, "requestState": token}
    # With max_hold=0 an early token is answered with its state: a refusal instead shows
    # that the binding is judged before the pacing.
    with pytest.raises(WireError) as info:
        await boundary.judge_request(
            codec,
            "tools/call",
            other,
            lambda: boundary.binding_for("tools/call", other, principal="alice", audience="svc"),
            max_hold=0,
        )
    assert info.value.reason == "binding_mismatch"


@pytest.mark.parametrize("mode", MODES)
async def test_sealing_past_the_round_budget_is_an_internal_error_with_the_flow_in_the_log(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    codec = _codec(mode, max_rounds=2)
    token = await _first(codec, ASKING)
    judged = await _retry(codec, token)
    token = boundary.seal_result(codec, judged, ASKING)["requestState"]
    judged = await _retry(codec, token)
    assert judged.opened is not None and judged.opened.round == 2
    with pytest.raises(WireError) as info:
        boundary.seal_result(codec, judged, ASKING)
    assert info.value.code == boundary.INTERNAL_ERROR_CODE and "round_limit" in info.value.reason
    record = next(r for r in caplog.records if "could not seal" in r.getMessage())
    assert (getattr(record, "flow_id", None), getattr(record, "round", None)) == (
        judged.opened.flow_id[:8],
        2,
    )


@pytest.mark.parametrize("mode", MODES)
async def test_rejections_name_the_flow_and_round_as_fields(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    strict = _codec(mode, max_rounds=1)
    loose = StateCodec(strict.keys, mode=mode, replay=strict.replay, max_rounds=5)
    binding = _bind()
    parent = loose.unseal(loose.seal(b"{}", binding), binding)
    second = loose.seal(b"{}", binding, parent=parent)
    with pytest.raises(WireError) as info:
        await _retry(strict, second)
    assert info.value.reason == "round_limit"
    record = next(r for r in caplog.records if getattr(r, "reason", None) == "round_limit")
    assert (getattr(record, "flow_id", None), getattr(record, "round", None)) == (parent.flow_id[:8], 2)
    assert record.levelno == logging.WARNING


def test_pacing_settings_are_checked_when_the_server_is_assembled() -> None:
    codec = _codec("sign", ttl=60)
    for bad in (0, -1, 60, "1"):
        with pytest.raises(ValueError, match="retry_after"):
            boundary.check_pacing(codec, bad, 10)  # type: ignore[arg-type]
    for hold in (-1, 301):
        with pytest.raises(ValueError, match="max_hold"):
            boundary.check_pacing(codec, 1, hold)
    boundary.check_pacing(codec, None, 0)
    boundary.check_pacing(codec, 59.5, 300)


_FLOW = """
    import asyncio
    from statecodec import KeyRing, StateCodec
    from statecodec import boundary
    from statecodec.replay.memory import MemoryReplayStore

    async def drive():
        codec = StateCodec(KeyRing.generate(), mode="sign", replay=MemoryReplayStore())
        binding = boundary.binding_for("tools/call", {"name": "t"}, principal=None, audience="a")
        judged = boundary.Judged("tools/call", {"name": "t"}, lambda: binding)
        for _ in range(3):  # three states, then the final answer
            token = boundary.seal_result(codec, judged, {"resultType": "input_required", "requestState": "s"})
            params = {"name": "t", "requestState": token["requestState"]}
            judged = await boundary.judge_request(codec, "tools/call", params, lambda: binding)
        boundary.seal_result(codec, judged, {"content": []})
"""


def test_a_histogram_counts_the_rounds_of_each_flow_never_its_id() -> None:
    pytest.importorskip("opentelemetry.sdk.metrics", reason="opentelemetry-sdk is in the test extra")
    script = (
        textwrap.dedent(
            """
        import json
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        """
        )
        + textwrap.dedent(_FLOW)
        + textwrap.dedent(
            """
        asyncio.run(drive())
        asyncio.run(drive())
        out = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out[metric.name] = [
                        [dict(p.attributes), getattr(p, "count", None), getattr(p, "sum", None)]
                        for p in metric.data.data_points
                    ]
        print(json.dumps(out))
        """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["statecodec.flow.rounds"] == [[{"mode": "sign"}, 2, 6]]  # two flows of three states


# ------------------------------------------------------------------ the SDK adapters in process
@pytest.mark.parametrize("mode", MODES)
async def test_fastmcp_paces_and_chains(mode: str) -> None:
    server: FastMCP[Any] = FastMCP("approvals")
    seen: list[str | None] = []

    @server.tool
    async def wait_for_approval(ticket: str, ctx: FastMCPContext) -> Any:
        seen.append(ctx.request_state)
        checks = 0 if ctx.request_state is None else json.loads(ctx.request_state)["checks"]
        if checks < 2:
            return mcp_types.InputRequiredResult(request_state=json.dumps({"checks": checks + 1}))
        return f"{ticket} approved"

    clock = ManualClock(T0)
    installed = fastmcp_adapter.protect(server, _codec(mode, clock=clock), retry_after=0.3, max_hold=0)
    assert (installed.retry_after, installed.max_hold) == (0.3, 0)
    async with Client(server._mcp_server) as client:
        session = client.session
        first = await session.call_tool("wait_for_approval", {"ticket": "T"}, allow_input_required=True)
        assert isinstance(first, mcp_types.InputRequiredResult) and first.request_state is not None
        token = first.request_state
        early = await session.call_tool(
            "wait_for_approval", {"ticket": "T"}, request_state=token, allow_input_required=True
        )
        assert isinstance(early, mcp_types.InputRequiredResult)
        assert early.request_state == token and len(seen) == 1  # the same state; the tool did not run
        clock.now += 0.3
        second = await session.call_tool(
            "wait_for_approval", {"ticket": "T"}, request_state=token, allow_input_required=True
        )
    assert len(seen) == 2
    assert isinstance(second, mcp_types.InputRequiredResult) and second.request_state is not None
    one, two = _format.parse(token, 8192), _format.parse(second.request_state, 8192)
    assert (two.round, two.flow_id) == (2, one.token_id) and two.not_before_ms >= 300


@pytest.mark.parametrize("mode", MODES)
async def test_mcpserver_holds_an_early_retry_then_runs_it(mode: str) -> None:
    server: MCPServer[Any] = MCPServer("approvals")
    runs: list[float] = []

    @server.tool()
    async def wait_for_approval(ticket: str, ctx: Context) -> Any:
        runs.append(time.time())
        if ctx.request_state is None:
            return mcp_types.InputRequiredResult(request_state="not yet")
        return f"{ticket} approved"

    protect(server, _codec(mode), retry_after=0.3, max_hold=5)
    async with Client(server) as client:
        first = await client.session.call_tool(
            "wait_for_approval", {"ticket": "T"}, allow_input_required=True
        )
        assert isinstance(first, mcp_types.InputRequiredResult)
        done = await client.session.call_tool(
            "wait_for_approval", {"ticket": "T"}, request_state=first.request_state, allow_input_required=True
        )
    assert isinstance(done, mcp_types.CallToolResult)  # held, then run: a real answer, not the same state
    assert len(runs) == 2 and runs[1] - runs[0] >= 0.3 - 0.005


async def test_a_clock_that_fails_while_pacing_refuses_and_burns_nothing() -> None:
    class Failing(ManualClock):
        fail_after: int | None = None

        def __call__(self) -> float:
            if self.fail_after is not None:
                if self.fail_after == 0:
                    return math.nan
                self.fail_after -= 1
            return self.now

    clock = Failing(T0)
    codec = _codec("sign", clock=clock)
    token = await _first(codec, STATE_ONLY, retry_after=1)
    clock.fail_after = 1  # the codec's own read works, the pacing's read gets NaN
    with pytest.raises(WireError) as info:
        await _retry(codec, token, max_hold=5)
    assert info.value.reason == "internal_error"
    clock.fail_after, clock.now = None, T0 + 1
    assert (await _retry(codec, token, max_hold=0)).opened is not None  # not consumed
