"""OpenTelemetry metrics for the adapters, or nothing at all.

Metrics go through ``opentelemetry-api`` only: the application decides whether an SDK
and an exporter are installed, and without one the API's own proxy meter swallows every
call. When the API itself is missing (``statecodec[otel]`` not installed) both recorders
become a function that does nothing, so the adapters never need it.

What is counted is safe to export: the mode, the outcome (``"ok"`` or one of the stable
:data:`statecodec.REASONS`) and the MCP method; and a histogram of the rounds per flow,
recorded when a flow ends (a round that came in with a state is answered without one),
labelled by mode only. Never a token, a kid, a principal or a
target, which could be user data or grow the metric cardinality without bound.

The recorders run on every MRTR request, so they cost as little as the API allows:
:data:`record_seal` and :data:`record_unseal` start as stubs that, on their first call,
import the API (importing ``statecodec`` stays free of it), create the instruments and
rebind both module names to the final functions, a no-op when the API is missing.
Callers look them up as ``_metrics.record_seal`` at call time, so they get the final
function from then on. The attribute dicts come from a small cache: every key is drawn
from fixed vocabularies (two modes, three methods, the reasons), and the cache is capped
in case a caller ever passes something else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

METER_NAME: Final = "statecodec"
SEALS: Final = "statecodec.seals"
UNSEALS: Final = "statecodec.unseals"
TOKEN_SIZE: Final = "statecodec.token.size"  # noqa: S105 - a metric name, not a secret
FLOW_ROUNDS: Final = "statecodec.flow.rounds"

#: ``record(mode, method, outcome, size)``: ``outcome`` is ``"ok"`` or the reason;
#: ``size`` is the token length (``None`` when there is no token, e.g. a failed seal).
Recorder: TypeAlias = Callable[[str, str, str, "int | None"], None]
#: ``record_flow_rounds(mode, rounds)``: a flow ended after ``rounds`` tokens.
FlowRecorder: TypeAlias = Callable[[str, int], None]

_ATTRIBUTES_CACHED: Final = 256
_Attributes: TypeAlias = tuple[Mapping[str, str], Mapping[str, str]]
_AttributeCache: TypeAlias = dict[tuple[str, str, str], _Attributes]

_lock = threading.Lock()
_unavailable = False  # True once the first call found opentelemetry-api missing


def _noop(mode: str, method: str, outcome: str, size: int | None) -> None:
    """What both recorders are without ``opentelemetry-api``."""


def _noop_flow(mode: str, rounds: int) -> None:
    """What the flow recorder is without ``opentelemetry-api``."""


def _otel_recorders(meter: Any) -> tuple[Recorder, Recorder, FlowRecorder]:
    """The two recorders over ``meter``'s instruments.

    The API's proxy meter follows a MeterProvider installed later, so creating the
    instruments once, at the first call, still reaches an SDK configured afterwards.
    """
    seals = meter.create_counter(SEALS, unit="{token}", description="requestState tokens sealed").add
    unseals = meter.create_counter(
        UNSEALS, unit="{token}", description="requestState tokens unsealed, by outcome reason"
    ).add
    size_of = meter.create_histogram(
        TOKEN_SIZE, unit="By", description="size of requestState tokens on the wire"
    ).record
    # Never the flow id as a label: one series per flow would grow without bound.
    rounds_of = meter.create_histogram(
        FLOW_ROUNDS,
        unit="{round}",
        description="requestState tokens per MRTR flow, recorded when a flow ends",
    ).record
    by_mode = {mode: {"mode": mode} for mode in ("sign", "encrypt")}
    # (outcome attributes, size attributes) per (mode, method, outcome), one cache per
    # direction. Shared dicts: never mutated here, and the OpenTelemetry SDK only reads them.
    sealed: _AttributeCache = {}
    unsealed: _AttributeCache = {}

    def new_attributes(cache: _AttributeCache, direction: str, key: tuple[str, str, str]) -> _Attributes:
        mode, method, outcome = key
        made = {"mode": mode, "method": method, "outcome": outcome}, {"mode": mode, "direction": direction}
        if len(cache) < _ATTRIBUTES_CACHED:
            cache[key] = made
        return made

    def record_seal(mode: str, method: str, outcome: str, size: int | None) -> None:
        key = (mode, method, outcome)
        counted, sized = sealed.get(key) or new_attributes(sealed, "seal", key)
        seals(1, counted)
        if size is not None:
            size_of(size, sized)

    def record_unseal(mode: str, method: str, outcome: str, size: int | None) -> None:
        key = (mode, method, outcome)
        counted, sized = unsealed.get(key) or new_attributes(unsealed, "unseal", key)
        unseals(1, counted)
        if size is not None:
            size_of(size, sized)

    def record_flow_rounds(mode: str, rounds: int) -> None:
        rounds_of(rounds, by_mode.get(mode) or {"mode": mode})

    return record_seal, record_unseal, record_flow_rounds


def _resolve() -> None:
    """Bind the recorders for good: to the instruments, or to the no-op."""
    global _unavailable, record_seal, record_unseal, record_flow_rounds  # noqa: PLW0603 - rebound once
    with _lock:
        if record_seal is not _first_seal:  # another thread got here first
            return
        try:
            from opentelemetry import metrics  # noqa: PLC0415 - optional dependency, imported on first use
        except ImportError:
            _unavailable = True
            record_seal, record_unseal, record_flow_rounds = _noop, _noop, _noop_flow
            return
        record_seal, record_unseal, record_flow_rounds = _otel_recorders(metrics.get_meter(METER_NAME))


def _first_seal(mode: str, method: str, outcome: str, size: int | None) -> None:
    _resolve()
    record_seal(mode, method, outcome, size)


def _first_unseal(mode: str, method: str, outcome: str, size: int | None) -> None:
    _resolve()
    record_unseal(mode, method, outcome, size)


def _first_flow_rounds(mode: str, rounds: int) -> None:
    _resolve()
    record_flow_rounds(mode, rounds)


#: Count one seal attempt; ``size`` is the token length when it succeeded.
record_seal: Recorder = _first_seal
#: Count one unseal attempt; ``outcome`` is ``"ok"`` or the rejection reason.
record_unseal: Recorder = _first_unseal
#: Record the number of tokens of a flow that just ended.
record_flow_rounds: FlowRecorder = _first_flow_rounds
