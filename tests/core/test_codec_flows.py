"""Flows in the codec: chained states, the round and age budgets, pacing (issue 21).

A flow's rounds share a flow id (the first token's id), count their round, and carry the
flow's start; all three are in the MAC / AEAD input. Budgets hold on both sides (sealing
and unsealing), and pacing is a distinct outcome that never consumes a token.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from clocks import ManualClock

import statecodec as sc
from statecodec import _format
from statecodec.replay.memory import MemoryReplayStore

T0 = 1_750_000_000
MODES = [sc.Mode.SIGN, sc.Mode.ENCRYPT]
RING = sc.KeyRing([sc.Key("k1", bytes(range(32)), 0)], primary="k1")
BOUND = sc.Binding("alice", "svc", "tools/call", "wait_for_approval", arguments={"id": 7})


def _codec(mode: sc.Mode, **kw: Any) -> sc.StateCodec:
    kw.setdefault("clock", ManualClock(T0))
    return sc.StateCodec(RING, mode=mode, **kw)


def _clock(codec: sc.StateCodec) -> ManualClock:
    assert isinstance(codec.clock, ManualClock)
    return codec.clock


def _reason(codec: sc.StateCodec, token: str, binding: sc.Binding = BOUND) -> sc.InvalidState:
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(token, binding)
    return info.value


def _flow(codec: sc.StateCodec, rounds: int) -> list[sc.OpenedState]:
    """Open ``rounds`` rounds of one flow, each sealed with the previous one as parent."""
    opened: list[sc.OpenedState] = []
    parent = None
    for i in range(rounds):
        token = codec.seal(f"round {i + 1}".encode(), BOUND, parent=parent)
        parent = codec.unseal(token, BOUND)
        opened.append(parent)
    return opened


@pytest.mark.parametrize("mode", MODES)
def test_a_first_round_is_a_flow_of_one_with_todays_bytes(mode: sc.Mode) -> None:
    codec = _codec(mode)
    token = codec.seal(b"x" * 300, BOUND)
    opened = codec.unseal(token, BOUND)
    assert (opened.flow_id, opened.round, opened.flow_started_at) == (opened.token_id, 1, T0)
    assert opened.not_before is None
    # No flag, no extra field: the header is 41 + len(kid) bytes, as before flows existed.
    raw = _format.b64decode(token[5:])
    assert raw[0] == len("k1")
    assert len(_format.parse(token, 8192).header) == 41 + 2


@pytest.mark.parametrize("mode", MODES)
def test_rounds_chain_with_one_flow_id_and_start(mode: sc.Mode) -> None:
    codec = _codec(mode)
    first = codec.unseal(codec.seal(b"r1", BOUND), BOUND)
    _clock(codec).now += 5
    second = codec.unseal(codec.seal(b"r2", BOUND, parent=first), BOUND)
    _clock(codec).now += 5
    third = codec.unseal(codec.seal(b"r3", BOUND, parent=second), BOUND)
    assert [o.round for o in (first, second, third)] == [1, 2, 3]
    assert {o.flow_id for o in (first, second, third)} == {first.token_id}
    assert {o.flow_started_at for o in (first, second, third)} == {T0}
    assert len({o.token_id for o in (first, second, third)}) == 3
    assert (second.issued_at, third.issued_at) == (T0 + 5, T0 + 10)
    assert third.payload == b"r3"


@pytest.mark.parametrize("mode", MODES)
def test_the_eleventh_round_is_refused_when_sealing(mode: sc.Mode) -> None:
    codec = _codec(mode)
    tenth = _flow(codec, 10)[-1]
    assert tenth.round == 10
    with pytest.raises(sc.FlowBudgetExceeded) as info:
        codec.seal(b"r11", BOUND, parent=tenth)
    assert info.value.reason == "round_limit"
    assert (info.value.flow_id, info.value.round) == (tenth.flow_id, 11)
    assert isinstance(info.value, ValueError)  # like every other refusal to seal


@pytest.mark.parametrize("mode", MODES)
def test_a_looser_instance_cannot_extend_a_flow(mode: sc.Mode) -> None:
    store = MemoryReplayStore()
    strict = _codec(mode, replay=store)
    loose = _codec(mode, replay=store, max_rounds=20, clock=strict.clock)
    tenth = _flow(loose, 10)[-1]
    eleventh = loose.seal(b"r11", BOUND, parent=tenth)
    exc = _reason(strict, eleventh)
    assert exc.reason == "round_limit"
    assert (exc.flow_id, exc.round) == (tenth.flow_id, 11)
    # Refused, not consumed: the looser instance (its own business) can still redeem it.
    assert loose.unseal(eleventh, BOUND).round == 11


@pytest.mark.parametrize("mode", MODES)
def test_a_flow_older_than_max_flow_age_is_refused_though_its_token_is_fresh(mode: sc.Mode) -> None:
    strict = _codec(mode, max_flow_age=600, ttl=300)
    loose = _codec(mode, max_flow_age=None, ttl=300, clock=strict.clock)
    first = strict.unseal(strict.seal(b"r1", BOUND), BOUND)
    _clock(strict).now = T0 + 500
    second = strict.seal(b"r2", BOUND, parent=first)
    # A round's token never outlives its flow: 300 s asked, 100 s left.
    assert _format.parse(second, 8192).expires_at == T0 + 600
    opened = strict.unseal(second, BOUND)
    _clock(strict).now = T0 + 600
    with pytest.raises(sc.FlowBudgetExceeded) as info:
        strict.seal(b"r3", BOUND, parent=opened)
    assert info.value.reason == "flow_expired"
    # A looser instance mints a fresh round 3 at T0 + 600: the strict one refuses it (a flow
    # ends like a token: at start + max_flow_age).
    fresh = loose.seal(b"r3", BOUND, parent=opened)
    assert _format.parse(fresh, 8192).issued_at == T0 + 600
    exc = _reason(strict, fresh)
    assert exc.reason == "flow_expired" and exc.round == 3
    # Just before the flow's end, a round minted then is still fine.
    _clock(strict).now = T0 + 599.5
    assert strict.unseal(loose.seal(b"r3", BOUND, parent=opened), BOUND).round == 3


@pytest.mark.parametrize("mode", MODES)
def test_flow_fields_cannot_be_grafted(mode: sc.Mode) -> None:
    codec = _codec(mode)
    other = _flow(codec, 2)[-1]
    mine = codec.unseal(codec.seal(b"r1", BOUND), BOUND)
    token = codec.seal(b"r2", BOUND, parent=mine)
    raw = _format.b64decode(token[5:])
    at = 41 + 2  # after the base header of kid "k1"
    grafts = {
        "flow id": raw[:at] + bytes.fromhex(other.flow_id) + raw[at + 16 :],
        "round": raw[: at + 16] + bytes((3,)) + raw[at + 17 :],
        "start": raw[: at + 17] + (T0 - 10).to_bytes(4, "big") + raw[at + 21 :],
        "unchained": bytes((raw[0] & 0x3F,)) + raw[1:at] + raw[at + 21 :],
    }
    for what, forged in grafts.items():
        assert forged != raw, what
        exc = _reason(codec, token[:5] + _format.b64encode(forged))
        assert exc.reason == "tampered", what
    assert codec.unseal(token, BOUND).flow_id == mine.flow_id


def test_a_chained_round_one_is_malformed_one_spelling_per_token() -> None:
    header = _format.pack_header(_format.kid_field("k1"), T0, T0 + 9, bytes(16), bytes(16))
    chained = (
        bytes((header[0] | _format.FLAG_CHAINED,)) + header[1:] + bytes(16) + b"\x01" + T0.to_bytes(4, "big")
    )
    with pytest.raises(sc.InvalidState, match="chained token of round 1") as info:
        _format.parse(_format.encode(_format.PREFIX_SIGN, chained + bytes(32)), 8192)
    assert info.value.reason == "malformed"
    with pytest.raises(ValueError, match=r"round 2\.\.255"):
        _format.pack_header(
            _format.kid_field("k1"), T0, T0 + 9, bytes(16), bytes(16), flow=(bytes(16), 1, T0)
        )


@pytest.mark.parametrize("mode", MODES)
def test_an_early_retry_is_too_early_and_burns_nothing(mode: sc.Mode) -> None:
    codec = _codec(mode, replay=MemoryReplayStore())
    clock = _clock(codec)
    clock.now = T0 + 0.25
    token = codec.seal(b"not ready", BOUND, retry_after=1)
    for now in (T0 + 0.25, T0 + 0.5, T0 + 1.249):
        clock.now = now
        exc = _reason(codec, token)
        assert exc.reason == "too_early"
        assert exc.retry_at == pytest.approx(T0 + 1.25)
        assert exc.flow_id == exc.token_id and exc.round == 1
        assert f"redeemable in {T0 + 1.25 - now:.3f}s" in str(exc)  # what is left, never a negative
    # A wrong binding is told as such, never as "too early" (the order of checks).
    assert _reason(codec, token, sc.Binding("mallory")).reason == "binding_mismatch"
    clock.now = T0 + 1.25
    opened = codec.unseal(token, BOUND)  # not burnt by the early tries
    assert opened.not_before == pytest.approx(T0 + 1.25)
    assert _reason(codec, token).reason == "replayed"


@pytest.mark.parametrize("mode", MODES)
def test_pacing_and_chaining_together(mode: sc.Mode) -> None:
    codec = _codec(mode)
    first = codec.unseal(codec.seal(b"r1", BOUND), BOUND)
    token = codec.seal(b"r2", BOUND, parent=first, retry_after=2.5)
    header = _format.parse(token, 8192)
    assert (header.round, header.not_before_ms) == (2, 2500)
    assert _reason(codec, token).reason == "too_early"
    _clock(codec).now += 2.5
    assert codec.unseal(token, BOUND).round == 2


def test_bad_budgets_and_pacing_are_refused_clearly() -> None:
    for bad in (0, 256, 1.5, True):
        with pytest.raises(ValueError, match="max_rounds"):
            sc.StateCodec(RING, max_rounds=bad)  # type: ignore[arg-type]
    for bad_age in (0, -1, 2**31, 1.5):
        with pytest.raises(ValueError, match="max_flow_age"):
            sc.StateCodec(RING, max_flow_age=bad_age)  # type: ignore[arg-type]
    codec = _codec(sc.Mode.SIGN, ttl=60)
    for bad_wait in (0, -1, float("nan"), "1"):
        with pytest.raises(ValueError, match="retry_after"):
            codec.seal(b"", retry_after=bad_wait)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beyond the token's 60s lifetime"):
        codec.seal(b"", retry_after=61)
    with pytest.raises(TypeError, match="OpenedState"):
        codec.seal(b"", parent=("not", "opened"))  # type: ignore[arg-type]


def test_flow_facts_survive_pickling() -> None:
    exc = sc.InvalidState("too_early", "soon", kid="k1", token_id="ab", flow_id="cd", round=3, retry_at=5.5)
    again = pickle.loads(pickle.dumps(exc))
    assert (again.reason, again.kid, again.token_id, again.flow_id, again.round, again.retry_at) == (
        "too_early",
        "k1",
        "ab",
        "cd",
        3,
        5.5,
    )


def test_every_reason_is_documented_and_in_the_cli_schema() -> None:
    assert {"round_limit", "flow_expired", "too_early"} <= set(sc.REASONS)
    root = Path(__file__).resolve().parents[2]
    table = (root / "docs" / "format.md").read_text(encoding="utf-8")
    schema = json.loads((root / "docs" / "cli-schema.json").read_text(encoding="utf-8"))
    listed = set(schema["$defs"]["error"]["properties"]["reason"]["enum"])
    for reason in sc.REASONS:
        assert f"`{reason}`" in table, reason
        assert reason in listed, reason


@pytest.mark.parametrize("mode", MODES)
def test_a_replay_rejection_names_its_flow_and_round(mode: sc.Mode, caplog: pytest.LogCaptureFixture) -> None:
    # Operators correlate rejections by flow: a replayed round says which flow it was
    # (it was logged flow=-), in the exception and in the boundary's log record.
    import asyncio  # noqa: PLC0415
    import logging  # noqa: PLC0415

    from statecodec import boundary  # noqa: PLC0415

    codec = _codec(mode, replay=MemoryReplayStore())
    first = codec.unseal(codec.seal(b"r1", BOUND), BOUND)
    second = codec.seal(b"r2", BOUND, parent=first)
    codec.unseal(second, BOUND)
    exc = _reason(codec, second)
    assert (exc.reason, exc.flow_id, exc.round) == ("replayed", first.flow_id, 2)
    params = {"name": BOUND.target, "requestState": second}
    with caplog.at_level(logging.WARNING, logger="statecodec"), pytest.raises(boundary.WireError):
        asyncio.run(boundary.judge_request(codec, "tools/call", params, lambda: BOUND))
    (record,) = [r for r in caplog.records if getattr(r, "reason", None) == "replayed"]
    assert f"flow={first.flow_id[:8]} round=2" in record.getMessage()
    assert record.flow_id == first.flow_id[:8] and record.round == 2  # 8 hex digits, as token ids
