"""statecodec.boundary: the framework-free MRTR rules, with a real codec and store."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from statecodec import Binding, KeyRing, StateCodec, boundary
from statecodec._errors import REASONS
from statecodec.boundary import WIRE_ERROR_CODE, WIRE_ERROR_DATA, WIRE_ERROR_MESSAGE, WireError
from statecodec.replay.memory import MemoryReplayStore

TOOL_PARAMS: dict[str, Any] = {
    "name": "deploy_production",
    "arguments": {"version": "1.2.3", "regions": [1, 2]},
}
ALICE = boundary.principal_string("deploy-cli", "https://idp.example", "alice")


def make_codec(mode: str = "sign", **kwargs: Any) -> StateCodec:
    kwargs.setdefault("replay", MemoryReplayStore())
    return StateCodec(KeyRing.generate(), mode=mode, **kwargs)


def bind(
    method: str = "tools/call", params: dict[str, Any] | None = None, principal: str | None = ALICE
) -> Binding:
    return boundary.binding_for(
        method, TOOL_PARAMS if params is None else params, principal=principal, audience="svc"
    )


# ------------------------------------------------------------------ what is bound
def test_the_three_mrtr_methods() -> None:
    assert {"tools/call", "resources/read", "prompts/get"} == boundary.MRTR_METHODS
    assert boundary.is_mrtr("prompts/get") and not boundary.is_mrtr("tools/list")


def test_targets() -> None:
    assert boundary.request_target("tools/call", TOOL_PARAMS) == "deploy_production"
    assert boundary.request_target("prompts/get", {"name": "p"}) == "p"
    assert boundary.request_target("resources/read", {"uri": "file:///x", "name": "ignored"}) == "file:///x"
    for method, params in [
        ("tools/call", {}),
        ("tools/call", {"name": 5}),
        ("resources/read", {"name": "x"}),
    ]:
        with pytest.raises(ValueError, match="must be a string"):
            boundary.request_target(method, params)


def test_digested_arguments_are_an_allowlist() -> None:
    assert boundary.digested_arguments("tools/call", TOOL_PARAMS) == TOOL_PARAMS["arguments"]
    assert boundary.digested_arguments("prompts/get", {"name": "p", "arguments": {"a": "b"}}) == {"a": "b"}
    assert boundary.digested_arguments("tools/call", {"name": "t"}) == {}
    assert boundary.digested_arguments("tools/call", {"name": "t", "arguments": None}) == {}
    assert boundary.digested_arguments("resources/read", {"uri": "u", "arguments": {"a": 1}}) is None
    with pytest.raises(ValueError, match="must be an object"):
        boundary.digested_arguments("tools/call", {"name": "t", "arguments": [1]})


def test_round_specific_fields_never_change_the_binding() -> None:
    retry = {
        **TOOL_PARAMS,
        "inputResponses": {"confirm_deploy": {"action": "accept", "content": {"confirm": True}}},
        "requestState": "sc1s.anything",
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"},
    }
    assert bind(params=retry) == bind()
    assert bind() == Binding(ALICE, "svc", "tools/call", "deploy_production", TOOL_PARAMS["arguments"])
    # Absent, null and empty arguments are the same request to a handler.
    assert bind(params={"name": "t"}) == bind(params={"name": "t", "arguments": {}})
    for changed in [
        bind(params={**TOOL_PARAMS, "arguments": {"version": "1.2.4", "regions": [1, 2]}}),
        bind(params={**TOOL_PARAMS, "name": "other"}),
        bind(method="prompts/get"),
        bind(principal=boundary.principal_string("deploy-cli", "https://idp.example", "bob")),
        bind(principal=None),
    ]:
        assert changed != bind()


def test_principal_string_is_unambiguous() -> None:
    assert ALICE == '["deploy-cli","https://idp.example","alice"]'
    assert boundary.principal_string("c", None, None) == '["c",null,null]'
    assert boundary.principal_string("a,b", None, "c") != boundary.principal_string("a", "b", "c")


def test_unbindable_arguments_raise() -> None:
    with pytest.raises(TypeError, match="interoperable range"):
        bind(params={"name": "t", "arguments": {"n": 2**60}})


# ------------------------------------------------------------ judge and seal
def binder(**overrides: Any) -> boundary.Binder:
    return lambda: bind(**overrides)


async def judge(codec: StateCodec, params: dict[str, Any], **overrides: Any) -> boundary.Judged:
    return await boundary.judge_request(
        codec, overrides.pop("method", "tools/call"), params, binder(**overrides)
    )


def asked(codec: StateCodec, state: object = "plan ✓", **overrides: Any) -> str:
    """A token as the adapters seal it for round 1 of a ``bind()`` request."""
    round_one = boundary.Judged("tools/call", TOOL_PARAMS, binder(**overrides))
    result = {"resultType": "input_required", "inputRequests": {"k": {}}, "requestState": state}
    return str(boundary.seal_result(codec, round_one, result)["requestState"])


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
async def test_round_trip(mode: str) -> None:
    codec = make_codec(mode)
    result = {"resultType": "input_required", "inputRequests": {"k": {}}, "requestState": "plan ✓"}
    sealed = boundary.seal_result(codec, boundary.Judged("tools/call", TOOL_PARAMS, binder()), result)
    token = sealed["requestState"]
    assert token.startswith(f"sc1{mode[0]}.") and sealed["inputRequests"] == {"k": {}}
    assert result["requestState"] == "plan ✓"  # the handler's dict is not mutated
    params = {**TOOL_PARAMS, "requestState": token, "inputResponses": {"k": {"action": "accept"}}}
    judged = await judge(codec, params)
    assert judged.params == {**params, "requestState": "plan ✓"}
    assert params["requestState"] == token
    assert judged.opened is not None and judged.opened.payload == "plan ✓".encode()
    assert judged.binding() == bind()  # the next round is sealed to what this one was
    again = boundary.seal_result(codec, judged, {"resultType": "input_required", "requestState": "round 3"})
    assert (await judge(codec, {**params, "requestState": again["requestState"]})).params[
        "requestState"
    ] == "round 3"


async def test_params_without_state_are_not_judged() -> None:
    codec = make_codec()
    calls: list[int] = []

    def counting() -> Binding:
        calls.append(1)
        return bind()

    for params in (TOOL_PARAMS, {**TOOL_PARAMS, "requestState": None}, None):
        judged = await boundary.judge_request(codec, "tools/call", params, counting)
        assert judged.params == (params or {}) and judged.opened is None
    assert calls == []  # no binding (no argument digest) without a state to check


def test_results_without_state_pass_through() -> None:
    codec = make_codec()
    judged = boundary.Judged("tools/call", TOOL_PARAMS, binder())
    complete = {"resultType": "complete", "content": []}
    assert boundary.seal_result(codec, judged, complete) is complete
    only_requests = {"resultType": "input_required", "inputRequests": {"k": {}}}
    assert boundary.seal_result(codec, judged, only_requests) is only_requests
    assert boundary.seal_result(codec, None, complete) is complete


def test_every_state_is_sealed_or_refused() -> None:
    codec = make_codec()
    judged = boundary.Judged("tools/call", TOOL_PARAMS, binder())
    # A state is sealed whatever resultType says: no plaintext state reaches a client.
    complete = boundary.seal_result(codec, judged, {"resultType": "complete", "requestState": "s"})
    assert codec.verify_unbound(complete["requestState"]).payload == b"s"
    for result in (
        {"resultType": "input_required", "request_state": "plain"},  # pydantic populate_by_name reads it
        {"resultType": "input_required", "requestState": "s", "RequestState": "plain"},
    ):
        with pytest.raises(WireError) as caught:
            boundary.seal_result(codec, judged, result)
        assert caught.value.error() == {"code": -32603, "message": "Internal error"}
    with pytest.raises(WireError, match="answers no MRTR request"):  # nothing to bind it to
        boundary.seal_result(codec, None, {"resultType": "input_required", "requestState": "plain"})


async def test_rejections_log_one_precise_line(caplog: pytest.LogCaptureFixture) -> None:
    codec = make_codec()
    token = asked(codec, "s")
    params = {**TOOL_PARAMS, "requestState": token}
    with caplog.at_level(logging.WARNING, logger="statecodec"):
        with pytest.raises(WireError) as wrong_user:
            await judge(codec, params, principal="mallory")
        await judge(codec, params)  # not burnt by the failure
        with pytest.raises(WireError) as replayed:
            await judge(codec, params)
    assert (wrong_user.value.reason, replayed.value.reason) == ("binding_mismatch", "replayed")
    assert replayed.value.error() == boundary.WireError.invalid_state().error()
    records = [
        r for r in caplog.records if r.name == "statecodec" and getattr(r, "event", None) == "token_rejected"
    ]
    assert len(records) == 2
    token_id = codec.verify_unbound(token).token_id
    kid = codec.keys.signing_key().kid
    for record, reason in zip(records, ["binding_mismatch", "replayed"], strict=True):
        # The facts are fields of the record, for any JSON formatter; the message says them too.
        facts = {
            name: getattr(record, name, None) for name in ("reason", "kid", "token_id", "method", "target")
        }
        assert facts == {
            "reason": reason,
            "kid": kid,
            "token_id": token_id[:8],
            "method": "tools/call",
            "target": "deploy_production",
        }
        assert record.audience == "svc" and record.size == len(token)  # type: ignore[attr-defined]
        line = record.getMessage()
        assert line.startswith("rejected requestState on tools/call 'deploy_production': ")
        assert f"reason={reason} " in line and f"token={token_id[:8]} " in line
        everything = line + repr(vars(record))
        assert token not in everything and token_id not in everything


@pytest.mark.parametrize(
    ("state", "reason", "detail"),
    [
        (42, "malformed", "JSON int, not a string"),
        (["x"], "malformed", "JSON list"),
        ("v1.sdk-token", "malformed", "not a statecodec token"),
    ],
)
async def test_bad_state_values(
    state: object, reason: str, detail: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="statecodec"), pytest.raises(WireError) as caught:
        await judge(make_codec(), {**TOOL_PARAMS, "requestState": state})
    assert caught.value.reason == reason and detail in caplog.text


async def test_a_binder_that_raises_refuses_before_the_store(caplog: pytest.LogCaptureFixture) -> None:
    codec = make_codec()
    token = asked(codec)

    def broken() -> Binding:
        raise PermissionError("signature does not verify")

    params = {**TOOL_PARAMS, "requestState": token}
    with caplog.at_level(logging.WARNING, logger="statecodec"), pytest.raises(WireError) as caught:
        await boundary.judge_request(codec, "tools/call", params, broken)
    assert caught.value.reason == "malformed" and "signature does not verify" in caplog.text
    assert (await judge(codec, params)).params["requestState"] == "plan ✓"  # not burnt
    with pytest.raises(WireError, match="cannot be bound"):  # nor sealed for no one on the way out
        boundary.seal_result(codec, boundary.Judged("tools/call", TOOL_PARAMS, broken), {"requestState": "s"})


async def test_a_payload_that_is_not_utf8_is_rejected() -> None:
    codec = make_codec()
    token = codec.seal(b"\xff\xfe", bind())  # minted by someone else sharing the keys
    with pytest.raises(WireError) as caught:
        await judge(codec, {**TOOL_PARAMS, "requestState": token})
    assert caught.value.reason == "malformed"


def test_seal_failures_raise_and_log_no_plaintext(caplog: pytest.LogCaptureFixture) -> None:
    small = make_codec(max_token_bytes=128)
    secret_plan = "x" * 400
    with caplog.at_level(logging.ERROR, logger="statecodec"), pytest.raises(WireError):
        asked(small, secret_plan)
    assert "over max_token_bytes=128" in caplog.text and secret_plan not in caplog.text
    with pytest.raises(WireError):
        asked(make_codec(), {"a": 1})
    with pytest.raises(WireError):  # a lone surrogate is not UTF-8 text
        asked(make_codec(), "\ud800")


async def test_hostile_targets_stay_on_one_clipped_log_line(caplog: pytest.LogCaptureFixture) -> None:
    uri = "file:///x\nWARNING forged line" + "y" * 500
    params = {"uri": uri, "requestState": "garbage"}
    binding = boundary.binding_for("resources/read", params, principal=None, audience=None)
    with caplog.at_level(logging.WARNING, logger="statecodec"), pytest.raises(WireError):
        await boundary.judge_request(make_codec(), "resources/read", params, lambda: binding)
    message = caplog.records[-1].getMessage()
    assert "\n" not in message and "\\n" in message and len(message) < 500


def test_wire_errors() -> None:
    assert WireError.invalid_state().error() == {
        "code": -32602,
        "message": "Invalid or expired requestState",
        "data": {"reason": "invalid_request_state"},
    }
    assert (WIRE_ERROR_CODE, WIRE_ERROR_MESSAGE, WIRE_ERROR_DATA) == (
        -32602,
        "Invalid or expired requestState",
        {"reason": "invalid_request_state"},
    )
    fresh = WireError.invalid_state().error()
    fresh["data"]["reason"] = "changed"
    assert WireError.invalid_state().error()["data"] == {"reason": "invalid_request_state"}
    assert WireError.internal("why").error() == {"code": -32603, "message": "Internal error"}
    assert "why" not in str(WireError.internal("why").error())  # the reason is for logs only


def test_a_store_outage_is_answered_retry_not_invalid() -> None:
    # Every verdict on a token is -32602; a store that could not record it is none: -32603,
    # saying to send the same request again (the token was not consumed).
    retry = WireError.refusing("store_unavailable")
    assert retry.error() == {
        "code": -32603,
        "message": "Temporarily unavailable: retry the same request (its requestState was not consumed)",
        "data": {"reason": "temporarily_unavailable"},
    }
    assert retry.reason == "store_unavailable" and "store" not in str(retry.error())
    for reason in sorted(set(REASONS) - {"store_unavailable"}):
        assert WireError.refusing(reason).error() == WireError.invalid_state().error(), reason


async def test_judge_request_maps_a_full_store_to_retry_and_burns_nothing() -> None:
    # A real store condition, no fake: a MemoryReplayStore full to max_entries refuses to
    # consume (rather than forget a live entry). Its clock is the test's, so it empties.
    now = [0.0]
    store = MemoryReplayStore(max_entries=1, clock=lambda: now[0])
    codec = StateCodec(KeyRing.generate(), replay=store)
    binding = boundary.binding_for("tools/call", {"name": "t"}, principal=None, audience="svc")
    first, second = codec.seal(b"1", binding), codec.seal(b"2", binding)
    await boundary.judge_request(codec, "tools/call", {"name": "t", "requestState": first}, lambda: binding)
    params = {"name": "t", "requestState": second}
    with pytest.raises(WireError) as caught:
        await boundary.judge_request(codec, "tools/call", params, lambda: binding)
    assert caught.value.code == -32603 and "retry the same request" in caught.value.message
    now[0] += codec.ttl + codec.max_skew + 1  # the first entry is forgotten: room again
    judged = await boundary.judge_request(codec, "tools/call", params, lambda: binding)
    assert judged.params["requestState"] == "2"  # the same request, retried, redeems
    with pytest.raises(WireError) as again:
        await boundary.judge_request(codec, "tools/call", params, lambda: binding)
    assert again.value.code == -32602  # and only once


def test_the_core_knows_no_wire() -> None:
    import statecodec  # noqa: PLC0415
    from statecodec import _errors  # noqa: PLC0415

    assert not any(name.startswith("WIRE_") for name in (*vars(_errors), *statecodec.__all__))


# ------------------------------------------------------- optional dependencies
def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_core_and_boundary_import_neither_mcp_nor_fastmcp() -> None:
    out = _run(
        """
        import sys
        import statecodec, statecodec.adapters, statecodec.boundary
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("mcp", "fastmcp", "opentelemetry")))
        """
    )
    assert out.strip() == "[]"


_DRIVE = """
    import asyncio
    from statecodec import KeyRing, StateCodec
    from statecodec import boundary
    from statecodec.replay.memory import MemoryReplayStore

    async def drive():
        codec = StateCodec(KeyRing.generate(), mode="encrypt", replay=MemoryReplayStore())
        binding = boundary.binding_for("tools/call", {"name": "t"}, principal=None, audience="a")
        judged = boundary.Judged("tools/call", {"name": "t"}, lambda: binding)
        token = boundary.seal_result(codec, judged, {"resultType": "input_required", "requestState": "s"})
        params = {"name": "t", "requestState": token["requestState"]}
        await boundary.judge_request(codec, "tools/call", params, lambda: binding)
        for _ in range(2):
            try:
                await boundary.judge_request(codec, "tools/call", params, lambda: binding)
            except boundary.WireError:
                pass
        return len(token["requestState"])
"""


def test_metrics_are_a_no_op_without_opentelemetry() -> None:
    out = _run(
        "import sys\nsys.modules['opentelemetry'] = None  # as if not installed\n"
        + textwrap.dedent(_DRIVE)
        + "print(asyncio.run(drive()))\n"
        + "from statecodec import _telemetry\nprint(_telemetry._otel_missing)\n"
    )
    size, unavailable = out.split()
    assert int(size) > 100 and unavailable == "True"


def test_metrics_through_opentelemetry() -> None:
    pytest.importorskip("opentelemetry.sdk.metrics", reason="opentelemetry-sdk is in the test extra")
    setup = """
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    """
    report = """
        import json
        size = asyncio.run(drive())
        out = {"size": size}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    out[metric.name] = [
                        [dict(p.attributes), getattr(p, "value", None), getattr(p, "count", None),
                         getattr(p, "sum", None)]
                        for p in metric.data.data_points
                    ]
        print(json.dumps(out))
    """
    data = json.loads(_run(textwrap.dedent(setup) + textwrap.dedent(_DRIVE) + textwrap.dedent(report)))
    size = data["size"]
    base = {"mode": "encrypt", "method": "tools/call"}
    assert data["statecodec.seals"] == [[{**base, "outcome": "ok"}, 1, None, None]]
    unseals = {p[0]["outcome"]: p[1] for p in data["statecodec.unseals"]}
    assert unseals == {"ok": 1, "replayed": 2}
    assert all(p[0] == {**base, "outcome": p[0]["outcome"]} for p in data["statecodec.unseals"])
    sizes = {p[0]["direction"]: (p[2], p[3]) for p in data["statecodec.token.size"]}
    assert sizes == {"seal": (1, size), "unseal": (3, 3 * size)}


@pytest.mark.parametrize(
    "result",
    [
        {"resultType": "input_required"},
        {"resultType": "input_required", "inputRequests": {}},  # an empty object asks nothing either
        {"resultType": "input_required", "inputRequests": None, "requestState": None},
    ],
)
def test_an_input_required_result_that_asks_nothing_is_replaced(
    result: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # MCP 2026-07-28: it MUST carry inputRequests or requestState; the TypeScript SDK's guard
    # answers -32603, and so does the boundary, whether or not the request held a state.
    codec = make_codec()
    for judged in (boundary.Judged("tools/call", TOOL_PARAMS, binder()), None):
        with caplog.at_level(logging.ERROR, logger="statecodec"), pytest.raises(WireError) as caught:
            boundary.seal_result(codec, judged, result)
        assert caught.value.error() == {"code": -32603, "message": "Internal error"}
    assert [r.reason for r in caplog.records] == ["empty_input_required"] * 2  # type: ignore[attr-defined]
