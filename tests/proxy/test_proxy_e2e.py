"""End to end: ``statecodec proxy`` in front of MCP servers that have NO protection of their own.

For each upstream (the TypeScript SDK server under Node, and the low-level Python
``Server``), the ``proxied`` fixture runs two proxy processes sharing a key ring and a
SQLite replay store. Real clients (the Python ``mcp`` Client and the TypeScript client)
complete the deploy flow with round 1 through proxy A and round 2 through proxy B, and
every bad token is answered by a proxy before the upstream sees it. Each upstream
records every requestState it issued and received, straight from the HTTP body, and the
tests hold that record against what they sent: the upstream only ever receives the
plaintext it issued. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import mcp_types as types
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fixtures_mcp import Balancer, connect, round_one, round_two
from fixtures_proxy import TOOL, JWKSServer, Service, messages, modern_request
from mcp.shared.exceptions import MCPError
from processes import NODE_DIR, node_or_skip
from wire import PREFIX, assert_wire_error, payload_of, tamper


def assert_untouched(service: Service, *tokens: str) -> None:
    """The upstream never received these, nor anything it had not issued itself."""
    received = service.upstream.received()
    for token in tokens:
        assert token not in received
    assert service.foreign_states() == []


# ------------------------------------------------------------------ happy paths
async def test_python_client_completes_the_flow_across_two_proxies(
    proxied: Service, jwks_server: JWKSServer
) -> None:
    lb = Balancer(proxied.bases())
    async with connect(lb, bearer=jwks_server.mint("alice")) as client:
        result = await client.call_tool(TOOL, {"version": "1.2.3"})

    assert not result.is_error, result
    outcome = result.structured_content
    assert outcome is not None and outcome["deployed"] == "1.2.3" and outcome["ticket"] == "CHG-1234"
    assert [c.instance for c in lb.calls()] == ["A", "B"]
    token = lb.calls()[1].body["params"]["requestState"]
    assert token.startswith(PREFIX[proxied.mode])  # the client only ever held a sealed token
    assert (outcome["plan_id"].encode() in payload_of(token)) is (proxied.mode == "sign")
    # The upstream got its own plaintext plan back, and nothing else.
    issued = [
        state for state in proxied.upstream.issued() if json.loads(state)["plan_id"] == outcome["plan_id"]
    ]
    assert len(issued) == 1 and issued[0] in proxied.upstream.received()
    assert_untouched(proxied, token)


@pytest.mark.node
def test_typescript_client_completes_the_flow_across_two_proxies(
    proxied: Service, jwks_server: JWKSServer
) -> None:
    node = node_or_skip()
    proc = subprocess.run(
        [node, str(NODE_DIR / "deploy_client.mjs"), "--urls", f"{proxied.a.url},{proxied.b.url}",
         "--token", jwks_server.mint("alice"), "--version", "2.0.0"],
        capture_output=True, text=True, timeout=120, cwd=NODE_DIR, env=dict(os.environ, NODE_NO_WARNINGS="1"),
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    outcome = report["result"]["structuredContent"]
    assert outcome["deployed"] == "2.0.0" and outcome["ticket"] == "CHG-1234"
    assert [(c["round"], c["url"]) for c in report["toolCalls"]] == [(1, proxied.a.url), (2, proxied.b.url)]
    token = report["toolCalls"][1]["requestState"]
    assert token.startswith(PREFIX[proxied.mode])
    assert_untouched(proxied, token)


# ------------------------------------------------------------------ rejections
REJECTIONS = {
    "tampered": "tampered",
    "expired": "expired",
    "replayed": "replayed",
    "forged_plaintext": "malformed",
    "other_user": "binding_mismatch",
    "other_arguments": "binding_mismatch",
    "anonymous": "binding_mismatch",
    "unverifiable_jwt": "malformed",
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
async def test_bad_token_is_rejected_before_the_upstream(
    proxied: Service, jwks_server: JWKSServer, case: str
) -> None:
    alice = jwks_server.mint("alice")
    async with connect(Balancer(proxied.bases(), pin="A"), bearer=alice) as client:
        state = (await round_one(client)).request_state
    assert state is not None and state.startswith(PREFIX[proxied.mode])
    bearer: str | None = alice
    version = "1.2.3"
    sent = state
    if case == "tampered":
        sent = tamper(state)
    elif case == "expired":
        plan = json.dumps({"version": version, "plan_id": "stale", "planned_on": "x", "steps": []}).encode()
        past = proxied.codec()
        past.clock = lambda: time.time() - 7200  # what the service sealed two hours ago
        sent = past.seal(plan, proxied.binding("alice"), ttl=600)
    elif case == "replayed":
        async with connect(Balancer(proxied.bases(), pin="B"), bearer=alice) as client:
            first = await round_two(client, state)  # the one redemption, through B
        assert isinstance(first, types.CallToolResult) and not first.is_error
    elif case == "forged_plaintext":
        sent = json.dumps({"version": "6.6.6", "plan_id": "evil", "planned_on": "x", "steps": ["rm -rf"]})
    elif case == "other_user":
        bearer = jwks_server.mint("bob")
    elif case == "other_arguments":
        version = "6.6.6"
    elif case == "anonymous":
        bearer = None
    elif case == "unverifiable_jwt":  # alice's claims, signed by someone else's key
        bearer = jwks_server.mint("alice", key=rsa.generate_private_key(public_exponent=65537, key_size=2048))

    rejected_on = "A" if case == "replayed" else "B"
    async with connect(Balancer(proxied.bases(), pin=rejected_on), bearer=bearer) as client:
        with pytest.raises(MCPError) as caught:
            await round_two(client, sent, version=version)
    assert_wire_error(caught.value)
    proxy = proxied.a if rejected_on == "A" else proxied.b
    log = proxy.wait_for_log(f'"reason": "{REJECTIONS[case]}"')
    rejected = [r for r in proxy.records() if r.get("event") == "token_rejected"]  # fields, not text
    assert rejected and rejected[-1]["reason"] == REJECTIONS[case], log[-2000:]
    # The audience is what the request was bound to: none when its bearer token did not verify.
    audience = None if case == "unverifiable_jwt" else "deploy"
    facts = (rejected[-1]["method"], rejected[-1]["target"], rejected[-1].get("audience"))
    assert facts == ("tools/call", TOOL, audience), rejected[-1]
    assert sent not in log and state not in log and alice not in log  # never a token in the log
    assert_untouched(proxied, sent)
    if case in ("other_user", "other_arguments", "anonymous", "unverifiable_jwt"):
        # A mis-bound presentation fails before the replay store: alice's token is not burnt.
        async with connect(Balancer(proxied.bases(), pin="A"), bearer=alice) as client:
            done = await round_two(client, state)
        assert isinstance(done, types.CallToolResult) and not done.is_error, done


# ------------------------------------------------------------------ the wire
async def test_batches_are_refused_before_the_upstream(proxied: Service, jwks_server: JWKSServer) -> None:
    # MCP dropped JSON-RPC batches in 2025-06-18; MRTR exists only in 2026-07-28.
    alice = jwks_server.mint("alice")
    plan = json.dumps({"version": "1.2.3", "plan_id": "batch01", "planned_on": "x", "steps": ["s"]})
    good = proxied.seal(plan, "alice")
    call = {"name": TOOL, "arguments": {"version": "1.2.3"}}
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {**call, "requestState": good}},
    ]
    headers = {"authorization": f"Bearer {alice}", "accept": "application/json, text/event-stream"}
    before = len(proxied.upstream.entries())
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(proxied.a.url, json=batch, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"] == {"code": -32600, "message": "JSON-RPC batches are not accepted"}
    assert len(proxied.upstream.entries()) == before and plan not in proxied.upstream.received()
    assert_untouched(proxied, good)


async def test_other_methods_pass_through_byte_for_byte(proxied: Service) -> None:
    body, headers = modern_request("tools/list", {})
    async with httpx.AsyncClient(timeout=30) as http:
        direct = await http.post(proxied.upstream.url, content=body, headers=headers)
        proxied_response = await http.post(proxied.a.url, content=body, headers=headers)
        direct_get = await http.get(proxied.upstream.url, headers={"accept": "text/event-stream"})
        proxied_get = await http.get(proxied.a.url, headers={"accept": "text/event-stream"})
    assert direct.status_code == proxied_response.status_code == 200
    assert direct.headers["content-type"] == proxied_response.headers["content-type"]
    if proxied.kind == "typescript":
        assert proxied_response.content == direct.content  # JSON, deterministic: identical bytes
    else:  # SSE carries per-stream event ids: compare the messages
        assert messages(proxied_response) == messages(direct)
    assert messages(proxied_response)[0]["result"]["tools"][0]["name"] == TOOL
    assert (proxied_get.status_code, proxied_get.content) == (direct_get.status_code, direct_get.content)


async def test_session_and_protocol_headers_are_forwarded(proxied: Service) -> None:
    initialize = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}},
    }  # fmt: skip
    accept = {"accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=30) as http:
        direct = await http.post(proxied.upstream.url, json=initialize, headers=accept)
        through = await http.post(proxied.a.url, json=initialize, headers=accept)
        assert through.status_code == direct.status_code == 200
        session = through.headers.get("mcp-session-id")
        assert (session is None) == (direct.headers.get("mcp-session-id") is None)
        if session is None:
            return  # the TypeScript server serves 2025-era traffic statelessly
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        headers = {**accept, "mcp-protocol-version": "2025-06-18"}
        without = await http.post(proxied.a.url, json=listing, headers=headers)
        with_session = await http.post(
            proxied.a.url, json=listing, headers={**headers, "mcp-session-id": session}
        )
    assert without.status_code == 400  # the upstream wants its session back...
    assert with_session.status_code == 200  # ...and got it through the proxy
    assert messages(with_session)[0]["result"]["tools"][0]["name"] == TOOL


async def test_oversized_body_is_refused_without_reaching_the_upstream(proxied: Service) -> None:
    before = len(proxied.upstream.entries())
    params = {"name": TOOL, "arguments": {"version": "x" * (5 * 1024 * 1024)}, "requestState": "forged"}
    huge = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(proxied.b.url, content=huge, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == -32600
    assert len(proxied.upstream.entries()) == before


async def test_routing_header_disagreeing_with_the_body_is_refused(proxied: Service) -> None:
    # A router or server dispatching on Mcp-Method would run tools/call with a state the
    # proxy never judged (it read the body's tools/list): refused before the upstream.
    body, headers = modern_request("tools/list", {"requestState": "forged"})
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            proxied.a.url, content=body, headers={**headers, "mcp-method": "tools/call"}
        )
    assert response.status_code == 400
    assert "forged" not in proxied.upstream.received()
