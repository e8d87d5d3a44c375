"""Multi-round flows with real servers and real clients (issue 21), in both modes.

Two services, each as three instances sharing one key ring and one SQLite replay store:

- ``python``: tests/adapters/flows_server.py, a Python ``MCPServer`` protected by ``protect()``;
- ``typescript``: the TypeScript SDK server (tests/node/ts_upstream_server.mjs --flows, no
  protection of its own) behind three ``statecodec proxy`` processes.

Instances A and B pace requestState-only rounds by 1 s and hold an early retry up to 5 s
(what well-behaved clients need); C paces by 1 s and holds nothing (every early retry is
answered at once with its state), for the raw client that retries in a tight loop.
Both tools are in both servers: ``wait_for_approval`` (requestState-only rounds until the
approval arrives at the third check) and ``three_questions`` (one question per round).
Every handler run is recorded by the server, so the tests count and time them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from fixtures_mcp import Balancer
from fixtures_proxy import AUDIENCE, NODE_DIR, messages, modern_request, node_or_skip, start_proxies
from mcp.client import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from processes import await_line, spawn, start_all, stop, wait_for_log
from wire import PREFIX

from statecodec import Binding, KeyRing, StateCodec, _format, boundary

RETRY_AFTER = 1.0
HOLD = ("--max-hold", "5")
NO_HOLD = ("--max-hold", "0")
SERVICES = [("python", "sign"), ("python", "encrypt"), ("typescript", "sign"), ("typescript", "encrypt")]


@dataclass
class FlowService:
    kind: str
    mode: str
    keys_path: Path
    record: Path
    audience: str
    bases: dict[str, str]  # instance name -> base URL
    logs: dict[str, Path]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    def url(self, name: str) -> str:
        return self.bases[name] + "/mcp"

    def runs(self, tool: str, **match: Any) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        entries = [json.loads(line) for line in self.record.read_text(encoding="utf-8").splitlines() if line]
        return [e for e in entries if e.get("run") == tool and all(e.get(k) == v for k, v in match.items())]

    def log(self, name: str) -> str:
        return self.logs[name].read_text(encoding="utf-8", errors="replace")

    def wait_for_log(self, name: str, needle: str, timeout: float = 60.0) -> str:
        return wait_for_log(self.logs[name], needle, timeout)

    def codec(self, **kw: Any) -> StateCodec:
        ring = KeyRing.from_json(self.keys_path.read_text(encoding="utf-8"))
        return StateCodec(ring, mode=self.mode, **kw)

    def binding(self, tool: str, arguments: dict[str, Any]) -> Binding:
        return boundary.binding_for(
            "tools/call", {"name": tool, "arguments": arguments}, principal=None, audience=self.audience
        )


def _start_python(service: FlowService, tmp: Path, replay: str, no_hold: Sequence[str]) -> None:
    """Three flows_server.py instances; all are stopped if one does not start."""
    commands = [
        (name, [
            sys.executable, str(Path(__file__).resolve().parent / "flows_server.py"),
            "--keys", str(service.keys_path), "--replay", replay, "--mode", service.mode,
            "--record", str(service.record), "--instance", name, "--retry-after", str(RETRY_AFTER), *hold,
        ], tmp / f"{name}.log")
        for name, hold in (("A", HOLD), ("B", HOLD), ("C", no_hold))
    ]  # fmt: skip
    for name, url, proc, log_path in start_all(commands, "READY "):
        service.procs.append(proc)
        service.bases[name] = url.rsplit("/", 1)[0]
        service.logs[name] = log_path


def _start_typescript(service: FlowService, tmp: Path, replay: str, no_hold: Sequence[str]) -> None:
    """The TypeScript upstream behind three proxies, each process in ``service.procs`` once spawned."""
    log_path = tmp / "upstream.log"
    command = [
        node_or_skip(),
        str(NODE_DIR / "ts_upstream_server.mjs"),
        "--flows",
        "--record",
        str(service.record),
    ]
    upstream = spawn(command, log_path, NODE_DIR)
    service.procs.append(upstream)  # stopped by flow_service() even if no proxy starts
    upstream_url = await_line(upstream, "READY ", log_path)
    paced = ("--retry-after", str(RETRY_AFTER))
    common = {"keys": service.keys_path, "replay": replay, "mode": service.mode, "jwks": None}
    for names, hold in ((("A", "B"), HOLD), (("C",), no_hold)):
        for proxy in start_proxies(tmp, upstream_url, names=names, extra=(*paced, *hold), **common):  # type: ignore[arg-type]
            service.procs.append(proxy.proc)
            service.bases[proxy.name] = proxy.base
            service.logs[proxy.name] = proxy.log_path


@contextlib.contextmanager
def flow_service(tmp: Path, kind: str, mode: str, no_hold: Sequence[str] = NO_HOLD) -> Iterator[FlowService]:
    """One service of three instances (C started with ``no_hold``); every process it started is
    stopped at the end, and on every failure on the way there (one that does not start)."""
    keys = tmp / "keys.json"
    keys.write_text(KeyRing.generate().to_json(), encoding="utf-8")
    keys.chmod(0o600)
    replay, record = f"sqlite:{tmp / 'replay.sqlite3'}", tmp / "runs.jsonl"
    service = FlowService(kind, mode, keys, record, "flows" if kind == "python" else AUDIENCE, {}, {})
    try:
        (_start_python if kind == "python" else _start_typescript)(service, tmp, replay, no_hold)
        yield service
    finally:
        for proc in service.procs:
            stop(proc)


@pytest.fixture(scope="module", params=SERVICES, ids=[f"{k}-{m}" for k, m in SERVICES])
def flows(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowService]:
    kind, mode = request.param
    with flow_service(tmp_path_factory.mktemp(f"flows-{kind}-{mode}"), kind, mode) as service:
        yield service


def _children() -> set[int]:
    """The PIDs of this test process's children alive now (from /proc: Linux)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone since the listing
            continue
        if int(fields[1]) == os.getpid():
            found.add(int(stat.parent.name))
    return found


@pytest.mark.parametrize("kind", ["python", "typescript"])
def test_a_service_whose_last_instance_cannot_start_leaves_no_process_behind(
    kind: str, tmp_path: Path
) -> None:
    """A and B (and the TypeScript upstream) start; C gets an option it does not know and exits.

    The error names C's command (the instances are waited for in order, so A and B were
    serving by then), and every process the service had started is stopped.
    """
    before = _children()
    with (
        pytest.raises(RuntimeError, match="did not start") as failed,
        flow_service(tmp_path, kind, "sign", no_hold=("--not-an-option",)),
    ):
        pytest.fail("instance C started with an option it does not know")
    assert "--not-an-option" in str(failed.value)
    assert _children() == before


# ------------------------------------------------------------------ clients
def _ts_client(flows: FlowService, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The official TypeScript client at its defaults, alternating between A and B."""
    proc = subprocess.run(
        [node_or_skip(), str(NODE_DIR / "deploy_client.mjs"), "--urls", f"{flows.url('A')},{flows.url('B')}",
         "--tool", tool, "--arguments", json.dumps(arguments)],
        capture_output=True, text=True, timeout=120, cwd=NODE_DIR, env=dict(os.environ, NODE_NO_WARNINGS="1"),
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


async def _answer(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
    properties = getattr(params, "requested_schema", {}).get("properties", {})
    return types.ElicitResult(action="accept", content={f: f"{f}-answer" for f in properties})


async def _python_client(flows: FlowService, tool: str, arguments: dict[str, Any]) -> tuple[Any, Balancer]:
    """The official Python client (automatic MRTR), round-robin between A and B."""
    balancer = Balancer({"A": flows.bases["A"], "B": flows.bases["B"]})
    async with (
        httpx2.AsyncClient(transport=balancer, timeout=60) as http,
        Client(
            streamable_http_client(flows.url("A"), http_client=http), elicitation_callback=_answer
        ) as client,
    ):
        result = await client.call_tool(tool, arguments)
    return result, balancer


def _raw(
    http: httpx.Client, url: str, tool: str, arguments: dict[str, Any], state: str | None = None, **extra: Any
) -> dict[str, Any]:
    """One raw tools/call: the JSON-RPC answer (``result`` or ``error``)."""
    params: dict[str, Any] = {"name": tool, "arguments": arguments, **extra}
    if state is not None:
        params["requestState"] = state
    body, headers = modern_request("tools/call", params)
    response = http.post(url, content=body, headers=headers)
    return messages(response)[-1]


def _gaps(runs: list[dict[str, Any]]) -> list[float]:
    """Seconds between consecutive handler runs (the server's clock)."""
    return [b["at"] - a["at"] for a, b in itertools.pairwise(runs)]


def _header(token: str) -> _format.ParsedToken:
    return _format.parse(token, 8192)


def _text(result: Any) -> str:
    content = result["content"] if isinstance(result, dict) else result.content
    first = content[0]
    return str(first["text"] if isinstance(first, dict) else first.text)


# ------------------------------------------------------------------ well-behaved clients
@pytest.mark.node
def test_typescript_client_waits_for_approval_across_two_instances(flows: FlowService) -> None:
    ticket = f"CHG-ts-{flows.kind}-{flows.mode}"
    report = _ts_client(flows, "wait_for_approval", {"ticket": ticket})
    assert "error" not in report, report
    assert _text(report["result"]) == f"{ticket} approved after 3 checks"
    calls = report["toolCalls"]
    # Four answers (three requestState-only, one complete), well within the client's 10
    # rounds: every retry the client sent 250 ms after an answer was held until its time.
    assert [c["url"] for c in calls] == [flows.url("A"), flows.url("B"), flows.url("A"), flows.url("B")]
    tokens = [c["requestState"] for c in calls[1:]]
    headers = [_header(t) for t in tokens]
    assert all(t.startswith(PREFIX[flows.mode]) for t in tokens)
    assert [h.round for h in headers] == [1, 2, 3]
    assert len({h.flow_id for h in headers}) == 1 and headers[0].flow_id == headers[0].token_id
    assert all(h.not_before_ms >= 1000 for h in headers)
    if flows.kind == "typescript":  # the proxy's access line names the flow and the round
        line = f"round 1 of flow {headers[0].flow_id.hex()[:8]}: tools/call"
        assert line in flows.wait_for_log("B", line)
    runs = flows.runs("wait_for_approval", ticket=ticket)
    assert [r["step"] for r in runs] == [0, 1, 2, 3]
    assert all(gap >= RETRY_AFTER - 0.005 for gap in _gaps(runs)), _gaps(runs)


async def test_python_client_waits_for_approval_across_two_instances(flows: FlowService) -> None:
    ticket = f"CHG-py-{flows.kind}-{flows.mode}"
    result, balancer = await _python_client(flows, "wait_for_approval", {"ticket": ticket})
    assert _text(result) == f"{ticket} approved after 3 checks"
    calls = balancer.calls()
    assert [c.instance for c in calls] == ["A", "B", "A", "B"]  # no early answer, no extra round
    runs = flows.runs("wait_for_approval", ticket=ticket)
    assert [r["step"] for r in runs] == [0, 1, 2, 3]
    assert all(gap >= RETRY_AFTER - 0.005 for gap in _gaps(runs)), _gaps(runs)


@pytest.mark.node
def test_typescript_client_answers_three_batches_in_three_rounds(flows: FlowService) -> None:
    topic = f"ts-{flows.mode}"
    report = _ts_client(flows, "three_questions", {"topic": topic})
    assert _text(report["result"]) == f"{topic}: colour-answer, size-answer, count-answer"
    headers = [_header(c["requestState"]) for c in report["toolCalls"][1:]]
    assert [h.round for h in headers] == [1, 2, 3]
    assert len({h.flow_id for h in headers}) == 1
    assert [h.not_before_ms for h in headers] == [0, 0, 0]  # rounds with questions are never paced


async def test_python_client_answers_three_batches_in_three_rounds(flows: FlowService) -> None:
    topic = f"py-{flows.mode}"
    result, balancer = await _python_client(flows, "three_questions", {"topic": topic})
    assert _text(result) == f"{topic}: colour-answer, size-answer, count-answer"
    states = [c.body["params"].get("requestState") for c in balancer.calls()]
    assert states[0] is None and len({_header(s).flow_id for s in states[1:]}) == 1


# ------------------------------------------------------------------ a raw client
def test_a_tight_loop_of_retries_runs_the_handler_once_per_retry_after(flows: FlowService) -> None:
    ticket = f"CHG-loop-{flows.kind}-{flows.mode}"
    arguments = {"ticket": ticket}
    url = flows.url("C")  # holds nothing: every early retry is answered at once
    answers: dict[str, int] = {"same": 0, "next": 0, "complete": 0}
    with httpx.Client(timeout=30) as http:
        state = _raw(http, url, "wait_for_approval", arguments)["result"]["requestState"]
        for _ in range(1000):
            message = _raw(http, url, "wait_for_approval", arguments, state)
            assert "result" in message, message  # never an error: no retry burnt the token
            result = message["result"]
            if result.get("resultType") != "input_required":
                answers["complete"] += 1  # approved: the client starts its next flow
                state = _raw(http, url, "wait_for_approval", arguments)["result"]["requestState"]
                continue
            assert "inputRequests" not in result
            if result["requestState"] == state:
                answers["same"] += 1  # too early: the same token, unconsumed, no handler run
            else:
                answers["next"] += 1
                state = result["requestState"]
    runs = flows.runs("wait_for_approval", ticket=ticket)
    flows_started = sum(r["step"] == 0 for r in runs)
    # Every handler run but a flow's first redeemed a token, at most one per retry_after.
    assert len(runs) == flows_started + answers["next"] + answers["complete"]
    assert flows_started == answers["complete"] + 1
    for start in (i for i, r in enumerate(runs) if r["step"] == 0):
        flow = runs[start : start + 4]
        assert [r["step"] for r in flow] == list(range(len(flow)))
        assert all(gap >= RETRY_AFTER - 0.005 for gap in _gaps(flow)), _gaps(flow)
    assert answers["same"] + answers["next"] + answers["complete"] == 1000
    assert answers["same"] > answers["next"] + answers["complete"]  # most retries came early
    assert "rejected requestState" not in flows.log("C")


def test_the_eleventh_round_of_a_flow_is_refused(flows: FlowService) -> None:
    topic = f"long-{flows.mode}"
    arguments = {"topic": topic, "count": 12}
    with httpx.Client(timeout=30) as http:
        message = _raw(http, flows.url("A"), "three_questions", arguments)
        rounds = 0
        while "result" in message and message["result"].get("resultType") == "input_required":
            rounds += 1
            result = message["result"]
            field = next(iter(result["inputRequests"]))
            responses = {field: {"action": "accept", "content": {field: "x"}}}
            state = result["requestState"]
            assert _header(state).round == rounds
            message = _raw(
                http,
                flows.url("AB"[rounds % 2]),
                "three_questions",
                arguments,
                state,
                inputResponses=responses,
            )
    assert rounds == 10  # ten states minted; sealing the eleventh is refused
    assert message["error"]["code"] == boundary.INTERNAL_ERROR_CODE, message
    assert "round_limit" in flows.wait_for_log("AB"[rounds % 2], "round_limit")
    # A token of round 11, minted by an instance with a looser budget: refused, not run.
    loose = flows.codec(max_rounds=20)
    binding = flows.binding("three_questions", arguments)
    parent = None
    for i in range(11):
        token = loose.seal(json.dumps({"answers": ["x"] * i}).encode(), binding, parent=parent)
        parent = loose.unseal(token, binding)
    before = len(flows.runs("three_questions", topic=topic))
    with httpx.Client(timeout=30) as http:
        refused = _raw(http, flows.url("B"), "three_questions", arguments, token)
    assert refused["error"]["code"] == boundary.WIRE_ERROR_CODE
    assert "reason=round_limit" in flows.wait_for_log("B", "reason=round_limit")
    assert len(flows.runs("three_questions", topic=topic)) == before


def test_a_flow_older_than_max_flow_age_is_refused_though_its_token_is_fresh(flows: FlowService) -> None:
    arguments = {"ticket": f"CHG-old-{flows.mode}"}
    binding = flows.binding("wait_for_approval", arguments)
    started = time.time() - 3601
    then = flows.codec(clock=lambda: started)
    parent = then.unseal(then.seal(b'{"checks": 1}', binding), binding)
    fresh = flows.codec(max_flow_age=None).seal(b'{"checks": 2}', binding, parent=parent)
    assert _header(fresh).issued_at >= int(time.time()) - 1
    with httpx.Client(timeout=30) as http:
        message = _raw(http, flows.url("A"), "wait_for_approval", arguments, fresh)
    assert message["error"]["code"] == boundary.WIRE_ERROR_CODE
    assert "reason=flow_expired" in flows.wait_for_log("A", "reason=flow_expired")
    assert flows.runs("wait_for_approval", ticket=arguments["ticket"]) == []


def test_a_state_cannot_be_grafted_onto_another_flow(flows: FlowService) -> None:
    arguments = {"topic": f"graft-{flows.mode}"}
    chained = []
    with httpx.Client(timeout=30) as http:
        for _ in range(2):  # two flows of the same call, each to its second state
            first = _raw(http, flows.url("A"), "three_questions", arguments)["result"]
            responses = {"colour": {"action": "accept", "content": {"colour": "red"}}}
            second = _raw(
                http,
                flows.url("A"),
                "three_questions",
                arguments,
                first["requestState"],
                inputResponses=responses,
            )
            chained.append(second["result"]["requestState"])
        mine, other = (_format.b64decode(t[5:]) for t in chained)
        at = len(_header(chained[0]).header) - 21  # the flow fields close the header
        grafts = [
            mine[:at] + other[at : at + 16] + mine[at + 16 :],  # the other flow's id
            mine[: at + 16] + bytes((3,)) + mine[at + 17 :],  # another round
            mine[: at + 17] + other[at + 17 : at + 21] + mine[at + 21 :],  # another start
        ]
        before = len(flows.runs("three_questions", topic=arguments["topic"]))
        for raw in grafts:
            if raw == mine:
                continue  # the two flows started within the same second: same start bytes
            message = _raw(
                http, flows.url("B"), "three_questions", arguments, chained[0][:5] + _format.b64encode(raw)
            )
            assert message["error"]["code"] == boundary.WIRE_ERROR_CODE
        assert len(flows.runs("three_questions", topic=arguments["topic"])) == before
        assert "reason=tampered" in flows.wait_for_log("B", "reason=tampered")
