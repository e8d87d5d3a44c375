"""A TypeScript SDK server protected by @statecodec/ts and the Python library, round by round.

``ts/dist/tools/adapter.js`` runs a real ``@modelcontextprotocol/server`` 2.4.0 server wired
with ``protect()`` and the official client in one Node process. A round-1 token the Python
library sealed with its adapters' default binding (``statecodec.boundary.binding_for``) is
redeemed there once, refused when replayed or moved to other arguments; the round-2 token the
TypeScript handler seals is the next round of the same flow for Python. Both server shapes:
an ``McpServer`` (``guard.tool``: the SDK turns the refusal into an ``isError`` tool result)
and a low-level ``Server`` (``guard.callTool``: the JSON-RPC -32602 a Python server sends).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from ts_package import SKIPS, run_tool

import statecodec as sc
from statecodec.boundary import WIRE_ERROR_CODE, WIRE_ERROR_DATA, WIRE_ERROR_MESSAGE, binding_for

pytestmark = SKIPS

RING = sc.KeyRing.generate("fleet-1")
AUDIENCE = "deploy-svc"
ARGS = {"version": "1.2.3"}


def binding(arguments: dict[str, Any]) -> sc.Binding:
    return binding_for(
        "tools/call", {"name": "deploy", "arguments": arguments}, principal=None, audience=AUDIENCE
    )


def assert_refused_on_the_wire(server: str, wire: dict[str, Any]) -> None:
    if server == "low-level":
        assert wire == {"code": WIRE_ERROR_CODE, "message": WIRE_ERROR_MESSAGE, "data": dict(WIRE_ERROR_DATA)}
    else:
        assert wire["isError"] is True
        assert wire["content"] == [{"type": "text", "text": WIRE_ERROR_MESSAGE}]


@pytest.mark.parametrize("server", ["mcp", "low-level"])
@pytest.mark.parametrize("mode", ["sign", "encrypt"])
def test_a_python_round_is_redeemed_once_by_a_protected_typescript_server(mode: str, server: str) -> None:
    codec = sc.StateCodec(RING, mode=mode)
    token = codec.seal(json.dumps({"plan": "from-python"}).encode(), binding(ARGS))
    calls = [
        {"arguments": {"version": "9.9.9"}, "requestState": token},  # moved: refused, not consumed
        {"arguments": ARGS, "requestState": token, "next": {"plan": "from-typescript"}},
        {"arguments": ARGS, "requestState": token},  # replayed
    ]
    spec = {"keyring": RING.to_dict(), "mode": mode, "audience": AUDIENCE, "server": server, "calls": calls}
    moved, redeemed, replayed = run_tool("adapter", spec)["results"]
    assert moved["refused"] == "binding_mismatch"
    assert replayed["refused"] == "replayed"
    for refused in (moved, replayed):
        assert_refused_on_the_wire(server, refused["wire"])
    assert (redeemed["state"], redeemed["round"]) == ({"plan": "from-python"}, 1)
    # The TypeScript round is round 2 of the Python token's flow, bound to the same request.
    first = codec.verify_unbound(token)
    second = codec.unseal(redeemed["sealed"], binding(ARGS))
    assert json.loads(second.payload) == {"plan": "from-typescript"}
    assert (second.flow_id, second.round, second.flow_started_at) == (first.token_id, 2, first.issued_at)
    with pytest.raises(sc.InvalidState, match="binding_mismatch"):
        codec.unseal(redeemed["sealed"], binding({"version": "9.9.9"}))
