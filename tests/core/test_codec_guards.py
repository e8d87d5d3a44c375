"""Regression tests for the findings of the internal security review.

Each test names the hole it closes: a buggy replay store that switched single use off,
a clock that raised or returned NaN, a Binding mutated after construction, and the
pure-Python canonical-JSON path as a CPU sink.
"""

from __future__ import annotations

import asyncio
import logging
import math

import pytest
from click.testing import CliRunner

import statecodec as sc
from statecodec._binding import MAX_JCS_NODES
from statecodec.cli import main
from statecodec.replay import MemoryReplayStore, ReplayStore

NOW = 1_800_000_000


def _codec(**kw: object) -> sc.StateCodec:
    return sc.StateCodec(sc.KeyRing.generate(created_at=NOW - 10), clock=lambda: NOW, **kw)  # type: ignore[arg-type]


class _AsyncByMistake(ReplayStore):
    """A custom store whose author wrote ``async def consume``: it returns a coroutine."""

    def consume(self, key: str, retention: float) -> bool:  # type: ignore[override]
        async def answer() -> bool:
            return True

        coro = answer()
        coro.close()  # never awaited; closing avoids the 'never awaited' warning
        return coro  # type: ignore[return-value]


class _Truthy(ReplayStore):
    def consume(self, key: str, retention: float) -> bool:
        return 1  # type: ignore[return-value]


@pytest.mark.parametrize("store", [_AsyncByMistake(), _Truthy()], ids=["coroutine", "int"])
def test_a_store_answering_non_bool_fails_closed(store: ReplayStore) -> None:
    codec = _codec(replay=store)
    token = codec.seal(b"approve")
    for _ in range(2):  # both attempts fail: nothing is accepted on a non-answer
        with pytest.raises(sc.InvalidState) as info:
            codec.unseal(token)
        assert info.value.reason == "store_unavailable"


def test_a_store_answering_non_bool_fails_closed_async() -> None:
    codec = _codec(replay=_Truthy())
    token = codec.seal(b"approve")
    with pytest.raises(sc.InvalidState) as info:
        asyncio.run(codec.aunseal(token))
    assert info.value.reason == "store_unavailable"


def test_real_store_still_single_use() -> None:
    codec = _codec(replay=MemoryReplayStore(clock=lambda: NOW))
    token = codec.seal(b"approve")
    assert codec.unseal(token).payload == b"approve"
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(token)
    assert info.value.reason == "replayed"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_time_rejects(value: float) -> None:
    sealer = _codec()
    token = sealer.seal(b"x")
    broken = sc.StateCodec(sealer.keys, clock=lambda: value)
    with pytest.raises(sc.InvalidState) as info:
        broken.unseal(token)
    assert info.value.reason == "internal_error"
    with pytest.raises(sc.InvalidState) as info:
        broken.verify_unbound(token)
    assert info.value.reason == "internal_error"
    with pytest.raises(sc.InvalidState) as info:
        asyncio.run(broken.aunseal(token))
    assert info.value.reason == "internal_error"


def test_nan_never_accepts_an_expired_token() -> None:
    now = [float(NOW)]
    codec = sc.StateCodec(sc.KeyRing.generate(created_at=NOW - 10), ttl=10, max_skew=0, clock=lambda: now[0])
    token = codec.seal(b"x")
    now[0] = NOW + 11
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(token)
    assert info.value.reason == "expired"
    now[0] = math.nan
    with pytest.raises(sc.InvalidState):
        codec.unseal(token)


def test_a_raising_clock_fails_closed() -> None:
    sealer = _codec()
    token = sealer.seal(b"x")

    def clock() -> float:
        raise ZeroDivisionError

    with pytest.raises(sc.InvalidState) as info:
        sc.StateCodec(sealer.keys, clock=clock).unseal(token)
    assert info.value.reason == "internal_error"


def test_binding_is_immutable() -> None:
    b = sc.Binding(principal="alice", extra={"tenant": "A"})
    with pytest.raises(AttributeError, match="immutable"):
        b.principal = "bob"  # type: ignore[misc]
    with pytest.raises(TypeError):
        b.extra["tenant"] = "B"  # type: ignore[index]
    assert b.principal == "alice" and b.extra == {"tenant": "A"}
    assert b.replace(principal="bob").principal == "bob"


def test_jcs_path_has_a_smaller_budget_than_the_fast_path() -> None:
    floats = [0.5] * (MAX_JCS_NODES + 1)
    with pytest.raises(ValueError, match="limited to"):
        sc.argument_digest(floats)
    ints = list(range(MAX_JCS_NODES + 1))  # the C path takes many more
    assert len(sc.argument_digest(ints)) == 32


def test_inspect_json_output_is_ascii_only() -> None:
    token = _codec().seal("evil \x9b31m \u202e txt \x1b[2J".encode())
    result = CliRunner().invoke(main, ["inspect", "--json", token])
    assert result.exit_code == 0, result.output
    assert result.output.isascii()
    assert "\\u202e" in result.output and "\\u009b" in result.output


class _Flaky(ReplayStore):
    """A store that is down until ``up`` is set: a stand-in for an outage of any backend."""

    kind = "flaky"

    def __init__(self) -> None:
        self.up = False
        self.inner = MemoryReplayStore(clock=lambda: NOW)

    def consume(self, key: str, retention: float) -> bool:
        if not self.up:
            raise sc.ReplayStoreError("connection refused")
        return self.inner.consume(key, retention)


def test_a_store_outage_is_logged_once_and_its_end_once(caplog: pytest.LogCaptureFixture) -> None:
    store = _Flaky()
    codec = _codec(replay=store)
    tokens = [codec.seal(b"x") for _ in range(20)]
    with caplog.at_level(logging.DEBUG, logger="statecodec"):
        for token in tokens:
            with pytest.raises(sc.InvalidState) as info:
                codec.unseal(token)
            assert info.value.reason == "store_unavailable"
        store.up = True
        for token in tokens:  # not consumed during the outage: each redeems once now
            assert codec.unseal(token).payload == b"x"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "unavailable" in warnings[0] and "answers again" in warnings[1]
    assert sum("unavailable" in r.getMessage() for r in caplog.records) == 20  # the rest at DEBUG


@pytest.mark.parametrize("marker", [True, 1.0, "1"])
def test_key_ring_format_marker_must_be_the_integer_1(marker: object) -> None:
    doc = sc.KeyRing.generate().to_dict()
    doc["statecodec_keyring"] = marker
    with pytest.raises(ValueError, match="not a statecodec key ring"):
        sc.KeyRing.from_dict(doc)
    doc["statecodec_keyring"] = 1
    assert len(sc.KeyRing.from_dict(doc)) == 1
