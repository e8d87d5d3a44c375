"""OpenTelemetry metrics for the adapters, or nothing at all.

Metrics go through ``opentelemetry-api`` only: the application decides whether an SDK
and an exporter are installed, and without one the API's own no-op meter swallows every
call. When the API itself is missing (``statecodec[otel]`` not installed) the
instruments here are plain no-ops, so the adapters never need it.

What is counted is safe to export: the mode, the outcome (``"ok"`` or one of the stable
:data:`statecodec.REASONS`) and the MCP method. Never a token, a kid, a principal or a
target, which could be user data or grow the metric cardinality without bound.
"""

from __future__ import annotations

import threading
from typing import Any, Final

METER_NAME: Final = "statecodec"
SEALS: Final = "statecodec.seals"
UNSEALS: Final = "statecodec.unseals"
TOKEN_SIZE: Final = "statecodec.token.size"  # noqa: S105 - a metric name, not a secret


class _Instruments:
    """The three instruments, created on first use so importing stays free."""

    __slots__ = ("seals", "size", "unseals")

    def __init__(self, meter: Any) -> None:
        self.seals = meter.create_counter(SEALS, unit="{token}", description="requestState tokens sealed")
        self.unseals = meter.create_counter(
            UNSEALS, unit="{token}", description="requestState tokens unsealed, by outcome reason"
        )
        self.size = meter.create_histogram(
            TOKEN_SIZE, unit="By", description="size of requestState tokens on the wire"
        )


_lock = threading.Lock()
_instruments: _Instruments | None = None
_unavailable = False


def _get() -> _Instruments | None:
    global _instruments, _unavailable  # noqa: PLW0603 - one lazily built module-wide singleton
    if _instruments is not None or _unavailable:
        return _instruments
    with _lock:
        if _instruments is None and not _unavailable:
            try:
                from opentelemetry import metrics  # noqa: PLC0415 - optional dependency
            except ImportError:
                _unavailable = True
                return None
            # The API's proxy meter follows a MeterProvider installed later, so creating
            # the instruments once, early, still reaches an SDK configured afterwards.
            _instruments = _Instruments(metrics.get_meter(METER_NAME))
    return _instruments


def record_seal(mode: str, method: str, outcome: str, size: int | None) -> None:
    """Count one seal attempt; ``size`` is the token length when it succeeded."""
    instruments = _get()
    if instruments is None:
        return
    attributes = {"mode": mode, "method": method, "outcome": outcome}
    instruments.seals.add(1, attributes)
    if size is not None:
        instruments.size.record(size, {"mode": mode, "direction": "seal"})


def record_unseal(mode: str, method: str, outcome: str, size: int | None) -> None:
    """Count one unseal attempt; ``outcome`` is ``"ok"`` or the rejection reason."""
    instruments = _get()
    if instruments is None:
        return
    instruments.unseals.add(1, {"mode": mode, "method": method, "outcome": outcome})
    if size is not None:
        instruments.size.record(size, {"mode": mode, "direction": "unseal"})
