"""Hostile inputs: huge, deep, wide, non-UTF-8, control characters, NUL bytes.

Each must end in a clear, precise error (``InvalidState`` with the right reason for a
token, ``ValueError``/``TypeError`` naming the problem for arguments) in bounded time
and memory, never a crash, a hang, or a leaked traceback.

The bound, stated: every rejection here takes under BOUND = 2 seconds of CPU and
allocates under 16 MiB beyond the input itself (64 MiB for an 8 MiB string argument,
whose canonical form is built once). Measured on the 2-core CI machine they take
microseconds to about 150 ms (docs/security.md has the numbers); the bounds are loose
on purpose because the machine is shared: they catch a quadratic or unbounded path,
not a slow run.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from statecodec import Binding, InvalidState, KeyRing, Mode, StateCodec, argument_digest, canonical_json
from statecodec.replay.memory import MemoryReplayStore

BOUND = 2.0
MEMORY_BOUND = 16 * 2**20
MiB = 2**20

RING = KeyRing.from_secret(bytes(range(32)), "k1")
BINDING = Binding(principal="alice", audience="aud", method="tools/call", target="t", arguments={"a": 1})


@pytest.fixture(params=[Mode.SIGN, Mode.ENCRYPT], ids=str)
def codec(request: pytest.FixtureRequest) -> StateCodec:
    return StateCodec(RING, mode=request.param, replay=MemoryReplayStore())


@contextmanager
def bounded(seconds: float = BOUND) -> Iterator[None]:
    # CPU time of this thread, not wall time: on a loaded 2-core machine the 8 MiB digest
    # took 2.5 to 3.3 s of wall time (load 16-18) for 0.2 s of CPU.
    # The bound is there to catch a quadratic path, which costs CPU time either way.
    start = time.thread_time()
    yield
    elapsed = time.thread_time() - start
    assert elapsed < seconds, f"took {elapsed:.2f}s of CPU (bound {seconds}s)"


def assert_bounded_memory(call: Callable[[], Any], memory: int = MEMORY_BOUND) -> None:
    """Run ``call`` (which may raise) under tracemalloc; its peak must stay under ``memory``.

    A separate run from the timed one: tracemalloc slows allocation-heavy Python code
    twenty-fold, which would turn a memory check into a timing flake.
    """
    tracemalloc.start()
    try:
        call()
    except (InvalidState, ValueError, TypeError):
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < memory, f"allocated {peak / MiB:.1f} MiB at peak (bound {memory / MiB:.0f} MiB)"


def rejected(call: Callable[[], Any], reason: str) -> InvalidState:
    with bounded(), pytest.raises(InvalidState) as info:
        call()
    exc = info.value
    assert exc.reason == reason, f"{exc.reason}: {exc.detail}"
    assert_clean_message(str(exc))
    assert_bounded_memory(call)
    return exc


def assert_clean_message(message: str) -> None:
    # A log line an attacker cannot forge or flood: short, one line, printable.
    assert len(message) < 300, message[:300]
    assert message.isprintable(), repr(message)


# --------------------------------------------------------------------------- size
def test_one_mebibyte_token_is_rejected_before_decoding(codec: StateCodec) -> None:
    prefix = "sc1s." if codec.mode is Mode.SIGN else "sc1e."
    for token in (prefix + "A" * MiB, "x" * MiB, prefix + "\u00e9" * MiB, prefix + "\x00" * MiB):
        exc = rejected(lambda token=token: codec.unseal(token, BINDING), "too_large")
        assert f"limit is {codec.max_token_bytes}" in exc.detail
    assert len(codec.replay) == 0  # type: ignore[arg-type]


def test_one_mebibyte_token_under_a_raised_limit_is_decoded_and_rejected_in_bounded_time() -> None:
    # An operator may raise max_token_bytes; then the whole token is decoded and MACed.
    big = StateCodec(RING, max_token_bytes=2 * MiB)
    genuine = big.seal(b"p" * (MiB // 2), BINDING)
    forged = genuine[:-4] + ("AAAA" if not genuine.endswith("AAAA") else "BBBA")
    rejected(lambda: big.unseal(forged, BINDING), "tampered")
    rejected(lambda: big.unseal("sc1s." + "A" * MiB, BINDING), "malformed")  # kid length 0
    with bounded():
        assert big.unseal(genuine, BINDING).payload == b"p" * (MiB // 2)


def test_sealing_more_than_the_limit_fails_with_advice(codec: StateCodec) -> None:
    with bounded(), pytest.raises(ValueError, match="over max_token_bytes=8192; keep less in requestState"):
        codec.seal(b"\x00" * MiB, BINDING)


# ---------------------------------------------------------------- bad characters
@pytest.mark.parametrize(
    "token",
    [
        "sc1s.\x00\x00\x00\x00",
        "sc1s.AAAA\x00",
        "\x00sc1s.AAAA",
        "sc1s.AA\r\nInjected: log line",
        "sc1s.\udc80\udcff",  # lone surrogates: what a non-UTF-8 byte becomes via surrogateescape
        "sc1s.\u202e\u2066",  # bidi controls
        "sc1s.AAAA====",
        "sc1s. AAAA",
        "sc1s.\t",
        "sc1s.\U0001f600",
        "sc1s.ÄÖÜ",
        "SC1S.AAAA",
    ],
    ids=repr,
)
def test_non_alphabet_characters_are_malformed(token: str) -> None:
    codec = StateCodec(RING)
    exc = rejected(lambda: codec.unseal(token, BINDING), "malformed")
    for char in ("\x00", "\r", "\n", "\u202e", "\udc80"):
        assert char not in exc.detail  # the input is never echoed into logs


@pytest.mark.parametrize("token", [b"sc1s.AAAA", bytearray(b"sc1s."), None, 12, ["sc1s."], {"t": 1}])
def test_non_string_tokens_are_malformed(token: Any) -> None:
    exc = rejected(lambda: StateCodec(RING).unseal(token, BINDING), "malformed")
    assert "token must be str" in exc.detail


def test_binding_fields_with_nul_control_and_surrogate_characters_are_exact() -> None:
    # Bound text is length-prefixed and encoded with surrogatepass: NUL, controls and
    # lone surrogates are data, and no two different principals share a tag.
    codec = StateCodec(RING, replay=MemoryReplayStore())
    odd = ["", "\x00", "\x00\x00", "a\x00b", "a\nb", "\udc80", "\ud800", "\u0000alice", "alice\x00"]
    tokens = {p: codec.seal(b"x", Binding(principal=p)) for p in odd}
    for sealed_for, token in tokens.items():
        for other in odd:
            if other != sealed_for:
                rejected(
                    lambda t=token, o=other: codec.unseal(t, Binding(principal=o), consume=False),
                    "binding_mismatch",
                )
        assert codec.unseal(token, Binding(principal=sealed_for)).payload == b"x"


# ------------------------------------------------------- the argument digest's input
def _nested(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def test_deeply_nested_arguments_fail_fast_without_recursion_error() -> None:
    assert argument_digest(_nested(64))  # the documented limit is accepted
    for depth in (65, 1000, 200_000):  # far beyond the interpreter's recursion limit
        deep = _nested(depth)
        with bounded(), pytest.raises(ValueError, match="nested deeper than 64 levels"):
            Binding(method="tools/call", arguments=deep)
        assert_bounded_memory(lambda deep=deep: Binding(method="tools/call", arguments=deep))


def test_too_many_values_fail_with_the_limit_named() -> None:
    wide = [0] * 100_000  # 100_001 values with the list itself
    with bounded(), pytest.raises(ValueError, match="more than 100000 JSON values"):
        argument_digest(wide)
    with bounded(), pytest.raises(ValueError, match="more than 100000 JSON values"):
        argument_digest({"a": [[0] * 1000 for _ in range(200)]})
    assert_bounded_memory(lambda: argument_digest(wide))


def test_ten_thousand_key_dict_digests_in_bounded_time_and_ignores_order() -> None:
    forward = {f"key{i:05d}": i for i in range(10_000)}
    backward = dict(reversed(list(forward.items())))
    with bounded():
        digest = argument_digest(forward)
    assert digest == argument_digest(backward)
    assert digest != argument_digest({**forward, "key00000": 1})
    codec = StateCodec(RING)
    token = codec.seal(b"x", Binding(method="tools/call", arguments=forward))
    with bounded():
        assert codec.unseal(token, Binding(method="tools/call", arguments=backward)).payload == b"x"


def test_huge_string_arguments_digest_in_bounded_time() -> None:
    arguments = {"blob": "x" * (8 * MiB), "unicode": "\u00e9\U0001f600" * MiB}
    with bounded():
        argument_digest(arguments)
    # The canonical text is built in memory once (about twice the input as UTF-8).
    assert_bounded_memory(lambda: argument_digest(arguments), memory=64 * MiB)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"a": "\udc80"}, TypeError, "cannot be canonical JSON"),  # lone surrogate (non-UTF-8)
        ({"\ud800": 1}, TypeError, "cannot be canonical JSON"),
        ({"a": b"bytes"}, TypeError, "type bytes cannot be canonical JSON"),
        ({1: "int key"}, TypeError, "keys must be str, not int"),
        ({"a": 2**53}, TypeError, "outside the interoperable range"),
        ({"a": float("nan")}, TypeError, "cannot be canonical JSON"),
        ({"a": float("inf")}, TypeError, "cannot be canonical JSON"),
        ({"a": {1, 2}}, TypeError, "type set cannot be canonical JSON"),
    ],
    ids=repr,
)
def test_non_json_arguments_fail_with_the_culprit_named(arguments: Any, error: type, message: str) -> None:
    with bounded(), pytest.raises(error, match=message):
        Binding(method="tools/call", arguments=arguments)


def test_control_and_nul_characters_in_arguments_are_data() -> None:
    weird = {"\x00": "\x00", "line\nbreak": "\r\n", "bidi\u202e": "\u2066", "emoji\U0001f600": "\x7f"}
    assert canonical_json(weird) == canonical_json(dict(reversed(list(weird.items()))))
    assert argument_digest(weird) != argument_digest({**weird, "\x00": ""})


# -------------------------------------------------------------------- on the wire
async def test_the_boundary_answers_hostile_request_state_with_the_uniform_error() -> None:
    boundary = pytest.importorskip("statecodec.boundary", reason="adapters not installed")
    codec = StateCodec(RING, replay=MemoryReplayStore())
    params = {"name": "t", "arguments": {"a": 1}}
    binding = boundary.binding_for("tools/call", params, principal="alice", audience="aud")
    for state in ("sc1s." + "A" * MiB, "sc1s.\x00\r\n", 12, ["x"], {"a": "b"}, "sc1s.\udc80"):
        with bounded(), pytest.raises(boundary.WireError) as caught:
            await boundary.judge_request(
                codec, "tools/call", {**params, "requestState": state}, lambda: binding
            )
        assert caught.value.error() == boundary.WireError.invalid_state().error()
    assert boundary.WireError.invalid_state().error() == {
        "code": -32602,
        "message": "Invalid or expired requestState",
        "data": {"reason": "invalid_request_state"},
    }
    with bounded(), pytest.raises(ValueError, match="nested deeper"):
        boundary.binding_for(
            "tools/call", {"name": "t", "arguments": _nested(10_001)}, principal=None, audience=None
        )
