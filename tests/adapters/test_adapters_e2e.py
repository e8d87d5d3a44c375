"""End to end: real MCP clients, two real server instances, a shared key ring and replay store.

For each flavour (lowlevel Server, MCPServer, FastMCP) and mode (SIGN, ENCRYPT), the
``deploy_cluster`` fixture runs examples/deploy_server.py twice as separate processes.
The clients are the official ones (Python ``mcp`` and TypeScript
``@modelcontextprotocol/client``); the "load balancer" sends round 1 to one instance
and round 2 to the other. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import mcp_types as types
import pytest
from fixtures_mcp import (
    AUDIENCE,
    CLIENT_ID,
    ISSUER,
    ROOT,
    TOOL,
    Balancer,
    Cluster,
    answer_elicitation,
    connect,
    round_one,
    round_two,
    server_command,
)
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from processes import NODE_DIR, node_or_skip
from wire import PREFIX, assert_wire_error, payload_of, tamper

from statecodec import KeyRing, boundary


def balancer(cluster: Cluster, pin: str | None = None) -> Balancer:
    return Balancer({i.name: i.base for i in cluster.instances}, pin=pin)


def assert_logged(cluster: Cluster, instance_name: str, reason: str, token: str) -> None:
    instance = next(i for i in cluster.instances if i.name == instance_name)
    log = cluster.wait_for_log(instance, f"reason={reason} ")
    lines = [line for line in log.splitlines() if "rejected requestState" in line]
    assert lines, log[-2000:]
    last = lines[-1]
    assert f"reason={reason} " in last, last
    assert "WARNING statecodec" in last and f"tools/call '{TOOL}'" in last, last
    assert token not in log  # never the token itself


# ------------------------------------------------------------------ happy paths
async def test_python_client_round_one_on_a_round_two_on_b(deploy_cluster: Cluster) -> None:
    lb = balancer(deploy_cluster)
    async with connect(lb) as client:
        result = await client.call_tool(TOOL, {"version": "1.2.3"})

    assert not result.is_error, result
    outcome = result.structured_content
    assert outcome is not None
    assert outcome["deployed"] == "1.2.3" and outcome["ticket"] == "CHG-1234"
    assert (outcome["planned_on"], outcome["deployed_on"]) == ("A", "B")
    calls = lb.calls()
    assert [c.instance for c in calls] == ["A", "B"]
    # The client echoed a statecodec token of the cluster's mode, never the plaintext plan.
    token = calls[1].body["params"]["requestState"]
    assert token.startswith(PREFIX[deploy_cluster.mode])
    readable = outcome["plan_id"].encode() in payload_of(token)
    assert readable is (deploy_cluster.mode == "sign")
    # The servers say the same: round 1 on A, round 2 on B, for this plan.
    plan = outcome["plan_id"]
    assert f"round=1 instance=A version=1.2.3 plan={plan}" in deploy_cluster.wait_for_log(
        deploy_cluster.a, plan
    )
    assert f"round=2 instance=B plan={plan} deployed" in deploy_cluster.wait_for_log(deploy_cluster.b, plan)


@pytest.mark.node
def test_typescript_client_round_one_on_a_round_two_on_b(deploy_cluster: Cluster) -> None:
    node = node_or_skip("client")
    urls = ",".join(i.url for i in deploy_cluster.instances)
    proc = subprocess.run(
        [
            node,
            str(NODE_DIR / "deploy_client.mjs"),
            "--urls",
            urls,
            "--token",
            "alice-token",
            "--version",
            "2.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=NODE_DIR,
        env=dict(os.environ, NODE_NO_WARNINGS="1"),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    outcome = report["result"]["structuredContent"]
    assert outcome["deployed"] == "2.0.0" and outcome["ticket"] == "CHG-1234"
    assert (outcome["planned_on"], outcome["deployed_on"]) == ("A", "B")
    assert [(c["round"], c["url"]) for c in report["toolCalls"]] == [
        (1, deploy_cluster.a.url),
        (2, deploy_cluster.b.url),
    ]
    assert report["toolCalls"][1]["requestState"].startswith(PREFIX[deploy_cluster.mode])


async def test_token_minted_offline_with_the_default_binding_is_accepted(deploy_cluster: Cluster) -> None:
    """The default binding is exactly: principal [client, issuer, subject], audience = server
    name, method, tool name, argument digest. A token minted elsewhere with the shared keys
    and that binding deploys the plan it carries: so the servers use those fields."""
    binding = boundary.binding_for(
        "tools/call",
        {"name": TOOL, "arguments": {"version": "3.1.4"}},
        principal=boundary.principal_string(CLIENT_ID, ISSUER, "alice"),
        audience=AUDIENCE,
    )
    plan = {"version": "3.1.4", "plan_id": "offline1", "planned_on": "test", "steps": ["s"]}
    token = deploy_cluster.codec().seal(json.dumps(plan).encode(), binding)
    async with connect(balancer(deploy_cluster, pin="B")) as client:
        result = await round_two(client, token, version="3.1.4")
    assert isinstance(result, types.CallToolResult) and not result.is_error, result
    assert result.structured_content is not None
    assert result.structured_content["plan_id"] == "offline1"
    assert result.structured_content["deployed_on"] == "B"


# ------------------------------------------------------------------ rejections
REJECTIONS = {
    "tampered": "tampered",
    "expired": "expired",
    "replayed": "replayed",
    "other_user": "binding_mismatch",
    "other_arguments": "binding_mismatch",
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
async def test_bad_token_gets_the_uniform_error(deploy_cluster: Cluster, case: str) -> None:
    lb_a = balancer(deploy_cluster, pin="A")
    lb_b = balancer(deploy_cluster, pin="B")
    async with connect(lb_a) as alice_a:
        state = (await round_one(alice_a)).request_state
    assert state is not None
    bearer, version = "alice-token", "1.2.3"
    if case == "tampered":
        state = tamper(state)
    elif case == "expired":
        binding = boundary.binding_for(
            "tools/call",
            {"name": TOOL, "arguments": {"version": version}},
            principal=boundary.principal_string(CLIENT_ID, ISSUER, "alice"),
            audience=AUDIENCE,
        )
        plan = json.dumps({"version": version, "plan_id": "old", "planned_on": "x", "steps": []}).encode()
        state = deploy_cluster.codec(clock=lambda: time.time() - 7200).seal(plan, binding, ttl=600)
    elif case == "replayed":
        async with connect(lb_b) as alice_b:  # the first redemption, on B, succeeds
            first = await round_two(alice_b, state)
        assert isinstance(first, types.CallToolResult) and not first.is_error
    elif case == "other_user":
        bearer = "bob-token"
    elif case == "other_arguments":
        version = "6.6.6"

    rejected_on = "A" if case == "replayed" else "B"  # replays go back to A: the store is shared
    async with connect(balancer(deploy_cluster, pin=rejected_on), bearer=bearer) as client:
        with pytest.raises(MCPError) as caught:
            await round_two(client, state, version=version)
    assert_wire_error(caught.value)
    assert_logged(deploy_cluster, rejected_on, REJECTIONS[case], state)


# ------------------------------------------------------------------ stdio
@pytest.mark.parametrize("flavor", ["lowlevel", "mcpserver", "fastmcp"])
async def test_stdio_single_instance(tmp_path: Path, flavor: str) -> None:
    """Over stdio (no users there): the flow completes; tampered and replayed tokens fail."""
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate().to_json(), encoding="utf-8")
    command = server_command(
        flavor=flavor, mode="encrypt", keys=keys, replay=f"sqlite:{tmp_path / 'replay.db'}", name="S",
        transport="stdio",
    )  # fmt: skip
    params = StdioServerParameters(command=command[0], args=command[1:], cwd=str(ROOT))
    log_path = tmp_path / "stdio.log"
    with log_path.open("w", encoding="utf-8") as errlog:
        async with Client(
            stdio_client(params, errlog=errlog), elicitation_callback=answer_elicitation
        ) as client:
            done = await client.call_tool(TOOL, {"version": "4.0.0"})
            assert done.structured_content is not None
            assert done.structured_content["deployed"] == "4.0.0"
            assert done.structured_content["planned_on"] == done.structured_content["deployed_on"] == "S"

            state = (await round_one(client)).request_state
            assert state is not None and state.startswith("sc1e.")
            with pytest.raises(MCPError) as tampered:
                await round_two(client, tamper(state))
            assert_wire_error(tampered.value)
            redeemed = await round_two(client, state)
            assert isinstance(redeemed, types.CallToolResult) and not redeemed.is_error
            with pytest.raises(MCPError) as replayed:
                await round_two(client, state)
            assert_wire_error(replayed.value)
    log = log_path.read_text(encoding="utf-8")
    reasons = [
        line.split("reason=")[1].split()[0] for line in log.splitlines() if "rejected requestState" in line
    ]
    assert reasons[0] in ("tampered", "malformed") and reasons[1:] == ["replayed"], log
