"""Python and the TypeScript package read and write the same tokens.

Each test sends one batch to ``ts/dist/tools/interop.js`` (one Node process): tokens the
Python library sealed are opened by the TypeScript package and the reverse, in both modes,
with full bindings (JSON arguments with floats and astral-plane text, extra fields),
chained and paced rounds; and the two canonical JSON encoders agree on a few hundred
generated argument values.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from ts_package import SKIPS, run_tool

import statecodec as sc
from statecodec._binding import canonical_json
from statecodec.replay import MemoryReplayStore

pytestmark = SKIPS

NOW = 1_780_000_000.25
RING = sc.KeyRing.generate("py-ts-1").with_key(sc.Key.generate("older"))
ARGUMENTS: list[Any] = [
    {"version": "v2.1.0", "force": False, "replicas": 3},
    {"tiny": 1e-7, "huge": 1e21, "neg": -0.0, "pi": 3.141592653589793, "int": 2**53 - 1},
    {"\U0001f600": "astral key", "\ue000": "private use", "caf\u00e9": ["\u0007", None, True]},
    [],
    {},
    "just text",
]
BINDINGS: list[dict[str, Any] | None] = [
    None,
    {"principal": "alice@example.com", "audience": "deploy-svc", "method": "tools/call", "target": "deploy"},
    {
        "principal": "",
        "audience": None,
        "method": "prompts/get",
        "target": "\u00e9t\u00e9",
        "extra": {"b": "2", "a": "1"},
    },
    *({"principal": "bob", "method": "tools/call", "target": "t", "arguments": a} for a in ARGUMENTS),
]


def py_binding(doc: dict[str, Any] | None) -> sc.Binding | None:
    if doc is None:
        return None
    return sc.Binding(
        doc.get("principal"),
        doc.get("audience"),
        doc.get("method"),
        doc.get("target"),
        arguments=doc.get("arguments"),
        extra=doc.get("extra"),
    )


def ts_binding(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if doc is None:
        return None
    return {"principal": None, "audience": None, "method": None, "target": None, "extra": {}, **doc}


def ts(ops: list[dict[str, Any]], mode: str, **codec: Any) -> list[dict[str, Any]]:
    spec = {"keyring": RING.to_dict(), "codec": {"mode": mode, **codec}, "now": NOW, "ops": ops}
    return list(run_tool("interop", spec)["results"])


def fields(opened: sc.OpenedState) -> dict[str, Any]:
    return {
        "payload_hex": opened.payload.hex(),
        "kid": opened.kid,
        "issued_at": opened.issued_at,
        "expires_at": opened.expires_at,
        "token_id": opened.token_id,
        "mode": opened.mode.value,
        "flow_id": opened.flow_id,
        "round": opened.round,
        "flow_started_at": opened.flow_started_at,
        "not_before": opened.not_before,
    }


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
def test_typescript_opens_what_python_sealed(mode: str) -> None:
    codec = sc.StateCodec(RING, mode=mode, clock=lambda: NOW - 1)
    payload = '{"step": 2, "note": "caf\u00e9"}'.encode()
    sealed = [(codec.seal(payload, py_binding(b)), b) for b in BINDINGS]
    first = codec.unseal(sealed[1][0], py_binding(BINDINGS[1]))
    chained = codec.seal(b"round 2", py_binding(BINDINGS[1]), parent=first, retry_after=0.5)
    ops = [{"op": "open", "token": token, "binding": ts_binding(b)} for token, b in sealed]
    ops.append({"op": "open", "token": chained, "binding": ts_binding(BINDINGS[1])})
    # The same tokens under a binding that differs in one field are refused.
    ops.append(
        {"op": "open", "token": sealed[1][0], "binding": ts_binding({**BINDINGS[1], "principal": "mallory"})}
    )
    ops.append(
        {"op": "open", "token": sealed[-1][0], "binding": ts_binding({**BINDINGS[-1], "arguments": "other"})}
    )
    results = ts(ops, mode)
    reader = sc.StateCodec(RING, mode=mode, clock=lambda: NOW)
    expected = [fields(reader.verify_unbound(token)) for token in [*(t for t, _ in sealed), chained]]
    assert results[: len(expected)] == expected
    assert results[-2]["reason"] == results[-1]["reason"] == "binding_mismatch"
    assert expected[-1]["round"] == 2 and expected[-1]["not_before"] is not None


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
def test_python_opens_what_typescript_sealed(mode: str) -> None:
    first = sc.StateCodec(RING, mode=mode, clock=lambda: NOW - 30).seal(b"r1", py_binding(BINDINGS[1]))
    parent = sc.StateCodec(RING, mode=mode, clock=lambda: NOW - 30).unseal(first, py_binding(BINDINGS[1]))
    ops: list[dict[str, Any]] = [
        {"op": "seal", "payload_hex": bytes([i, 255 - i]).hex(), "binding": ts_binding(b)}
        for i, b in enumerate(BINDINGS)
    ]
    ops.append({"op": "seal", "payload_hex": "", "binding": None, "ttl": 5})
    ops.append(
        {
            "op": "seal",
            "payload_hex": b"r2".hex(),
            "binding": ts_binding(BINDINGS[1]),
            "parent": {
                "flow_id": parent.flow_id,
                "round": parent.round,
                "flow_started_at": parent.flow_started_at,
            },
            "retry_after": 1.5,
        }
    )
    tokens = [r["token"] for r in ts(ops, mode, ttl=120)]
    verifier = sc.StateCodec(RING, mode=mode, clock=lambda: NOW + 2, replay=MemoryReplayStore())
    for i, (token, b) in enumerate(zip(tokens, BINDINGS, strict=False)):
        opened = verifier.unseal(token, py_binding(b))
        assert (opened.payload, opened.kid, opened.issued_at, opened.expires_at) == (
            bytes([i, 255 - i]),
            "py-ts-1",
            math.floor(NOW),
            math.floor(NOW) + 120,
        )
        with pytest.raises(sc.InvalidState, match="replayed"):
            verifier.unseal(token, py_binding(b))
    assert verifier.unseal(tokens[-2]).expires_at == math.floor(NOW) + 5
    second = verifier.unseal(tokens[-1], py_binding(BINDINGS[1]))
    assert (second.flow_id, second.round, second.flow_started_at) == (parent.token_id, 2, parent.issued_at)
    assert second.not_before == math.floor(NOW) + 1.75  # NOW + 1.5, to the millisecond after iat
    with pytest.raises(sc.InvalidState) as info:
        sc.StateCodec(RING, mode=mode, clock=lambda: NOW + 1.49).unseal(tokens[-1], py_binding(BINDINGS[1]))
    assert info.value.reason == "too_early"


def random_text(rng: random.Random) -> str:
    alphabet = 'az\u00e9\u0000\u001f"\\\u2028\ue000\U0001f600\U00010000'
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(6)))


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.randint(-(2**53) + 1, 2**53 - 1)
    if kind == 3:
        return rng.choice([0.1, -2.5e-8, 1e300, 5e-324, 123456789.125, 1e21, 1e20, -0.0]) * rng.choice(
            [1, -1, 3.7]
        )
    if kind in (4, 5):
        return random_text(rng)
    if kind in (6, 7):
        return {random_text(rng): random_json(rng, depth + 1) for _ in range(rng.randrange(5))}
    return [random_json(rng, depth + 1) for _ in range(rng.randrange(5))]


def test_both_canonicalisers_agree_on_generated_arguments() -> None:
    rng = random.Random(8785)
    values = [random_json(rng) for _ in range(400)]
    values = [v if isinstance(v, dict | list) else {"v": v} for v in values]
    results = ts([{"op": "canonical", "value": v} for v in values], "sign")
    assert [r.get("canonical") for r in results] == [canonical_json(v).decode() for v in values]
