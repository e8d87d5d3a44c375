"""What statecodec tells operators: the log record fields and the metrics, in one place.

**Log fields.** Library log records carry their facts as ``extra=`` fields (:func:`fields`),
so any JSON formatter picks them up and no code ever parses a message. The vocabulary is
:data:`LOG_FIELDS`; a token never appears, only the first 8 hex digits of its id (enough
to correlate, useless to replay), and client-supplied text (targets) is clipped.

**Metrics.** Each recorder below counts one kind of event twice over, both optional:

- through ``opentelemetry-api`` (``statecodec[otel]``): the application decides whether an
  SDK and an exporter are installed, and without one the API's proxy meter swallows every
  call. Its instruments (``statecodec.unseals``, unit ``{token}``...) translate to the
  Prometheus names below under OpenTelemetry's Prometheus exporter;
- through ``prometheus-client`` (``statecodec[ops]``, in the proxy's extra), into
  :func:`prometheus_registry`, which :mod:`statecodec.ops` serves on ``/metrics``; only
  once :func:`enable_prometheus` ran (importing :mod:`statecodec.ops` does), so a server
  that never serves ``/metrics`` pays nothing for it. When
  ``PROMETHEUS_MULTIPROC_DIR`` is set before ``prometheus_client`` is first imported, the
  values go to that directory's files and a serving process sums every process's
  (prometheus-client's multiprocess mode; see :mod:`statecodec.ops`).

Prometheus names and labels: ``statecodec_unseals_total{outcome}`` (``ok`` or an
:data:`~statecodec.REASONS` reason), ``statecodec_seals_total{mode}``,
``statecodec_token_size_bytes``, ``statecodec_flow_rounds``, ``statecodec_replay_store_errors_total``,
``statecodec_key_refresh_failures_total``, ``statecodec_proxy_requests_total{code}``,
``statecodec_proxy_request_duration_seconds``, ``statecodec_upstream_errors_total{kind}``,
``statecodec_shed_total{reason}`` (a connection, stream or hold refused or closed to keep a
bound: :data:`SHED_REASONS`);
the key ring's gauges are read when scraped (:mod:`statecodec.ops`). A label is only ever
drawn from a fixed vocabulary: never a token, kid, principal, target or flow id, which
could be user data or grow the number of series without bound.

The recorders run on every MRTR request, so they cost as little as the libraries allow:
each starts as a stub that, on its first call, imports what is installed (importing
``statecodec`` stays free of both), creates the instruments and rebinds every recorder
name in this module to its final function (once more if Prometheus is enabled later). Callers look them up as
``_telemetry.record_seal`` at call time, so they get the final function from then on.

Multi-round flows add their record fields (``flow_id``, ``round``, ``wait``) to
:data:`LOG_FIELDS` and their rounds-per-flow histogram (``statecodec.flow.rounds``, recorded
when a flow ends) beside ``token_size``. The flow id is a record field, never a label.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeAlias

from ._errors import REASONS, InvalidState

# ---------------------------------------------------------------- log records
#: Every ``extra=`` field a statecodec log record may carry.
LOG_FIELDS: Final = (
    "event",  # what happened, a stable snake_case name: "token_rejected", "keys_refresh_failed"...
    "reason",  # an InvalidState reason, or another short stable cause
    "detail",  # the human detail of a reason (never a token or a secret)
    "kid",
    "token_id",  # the first 8 hex digits of the token id
    "audience",
    "method",
    "target",  # tool or prompt name, resource URI; clipped
    "mode",
    "size",
    "source",  # a key source, described without credentials
    "store",  # a replay store's kind
    "kind",  # an upstream error's kind
    "status",  # an HTTP status
    "flow_id",  # a multi-round flow: the first 8 hex digits of its first token's id
    "round",  # the round of that flow a token belongs to (1 for a first round)
    "wait",  # seconds until a paced round's token is redeemable
    "client",  # a client's address (HOST or HOST:PORT), on the proxy's shed records
    "upstream",  # the proxy's upstream URL, on its upstream_error and upstream_framing records
)
_TEXT_MAX: Final = 120


def fields(event: str, **facts: object) -> dict[str, object]:
    """The ``extra=`` of one log record: ``event`` and every fact that is not ``None``.

    ``token_id`` and ``flow_id`` are cut to their first 8 hex digits and ``target`` to 120
    characters here, so no caller can forget to.
    """
    record: dict[str, object] = {"event": event}
    for name, value in facts.items():
        if value is None:
            continue
        if name in ("token_id", "flow_id"):  # a flow id is its first token's id
            record[name] = str(value)[:8]
        elif name == "target":
            record[name] = clip(str(value))
        else:
            record[name] = value
    return record


def rejection(exc: InvalidState, **facts: object) -> dict[str, object]:
    """The ``extra=`` of a ``token_rejected`` record: the facts of ``exc``, and ``facts``."""
    return fields("token_rejected", reason=exc.reason, detail=exc.detail, **exc.ids, **facts)


def clip(text: str) -> str:
    """Client-supplied text for a log: at most 120 characters."""
    return text if len(text) <= _TEXT_MAX else text[:_TEXT_MAX] + "..."


# ---------------------------------------------------------------- metric names
METER_NAME: Final = "statecodec"
SEALS: Final = "statecodec.seals"
UNSEALS: Final = "statecodec.unseals"
TOKEN_SIZE: Final = "statecodec.token.size"  # noqa: S105 - a metric name, not a secret
FLOW_ROUNDS: Final = "statecodec.flow.rounds"
STORE_ERRORS: Final = "statecodec.replay_store.errors"
REFRESH_FAILURES: Final = "statecodec.key_refresh.failures"

#: The Prometheus families statecodec exports, each with its labels (the gauges included).
PROMETHEUS: Final[Mapping[str, tuple[str, ...]]] = {
    "statecodec_unseals_total": ("outcome",),
    "statecodec_seals_total": ("mode",),
    "statecodec_token_size_bytes": (),
    "statecodec_flow_rounds": (),
    "statecodec_replay_store_errors_total": (),
    "statecodec_key_refresh_failures_total": (),
    "statecodec_proxy_requests_total": ("code",),
    "statecodec_proxy_request_duration_seconds": (),
    "statecodec_upstream_errors_total": ("kind",),
    "statecodec_shed_total": ("reason",),
    "statecodec_minting": (),
    "statecodec_key_ring_age_seconds": (),
    "statecodec_key_refresh_interval_seconds": (),
}
MODES: Final = ("sign", "encrypt")
#: ``kind`` of ``statecodec_upstream_errors_total``.
UPSTREAM_ERRORS: Final = ("timeout", "unreachable", "broken")
#: ``reason`` of ``statecodec_shed_total``: what was shed to keep a bound (docs/proxy.md).
SHED_REASONS: Final = (
    "head_timeout",  # a request head not complete within the proxy's head deadline
    "body_timeout",  # a request body not complete within the body deadline
    "connection_limit",  # the oldest idle or half-open connection, closed for a new one
    "busy",  # a new connection refused: every connection had a request in flight
    "stream_limit",  # a long-lived stream refused: all stream slots taken
    "stream_client_limit",  # a long-lived stream refused: its client holds its share
    "hold_limit",  # an early retry answered at once: the holds' bound is reached
    "hold_abandoned",  # a held early retry whose client went away (nothing consumed)
)
TOKEN_SIZE_BUCKETS: Final = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)
FLOW_ROUNDS_BUCKETS: Final = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 50, 255)
DURATION_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# ---------------------------------------------------------------- recorders
#: ``record(mode, method, outcome, size)``: ``outcome`` is ``"ok"``, a reason, or
#: ``"error"`` (a seal that failed); ``size`` is the token length, ``None`` without one.
Recorder: TypeAlias = Callable[[str, str, str, "int | None"], None]
_ATTRIBUTES_CACHED: Final = 256
_lock = threading.Lock()
_resolved = False
_otel_missing = False  # True once the first call found opentelemetry-api missing
_registry: Any = None  # the prometheus_client CollectorRegistry, once enabled
_otel_side: dict[str, Callable[..., None]] = {}
_prometheus_side: dict[str, Callable[..., None]] = {}


def _noop(*args: object) -> None:
    """What a recorder is when neither library is installed."""


def _otel(meter: Any) -> dict[str, Callable[..., None]]:
    """The OpenTelemetry side of each recorder.

    The API's proxy meter follows a MeterProvider installed later, so creating the
    instruments once, at the first call, still reaches an SDK configured afterwards.
    """

    def counter(name: str, unit: str, description: str) -> Callable[..., None]:
        add: Callable[..., None] = meter.create_counter(name, unit=unit, description=description).add
        return add

    def histogram(name: str, unit: str, description: str) -> Callable[..., None]:
        record: Callable[..., None] = meter.create_histogram(name, unit=unit, description=description).record
        return record

    seals = counter(SEALS, "{token}", "requestState tokens sealed")
    unseals = counter(UNSEALS, "{token}", "requestState tokens unsealed, by outcome reason")
    size_of = histogram(TOKEN_SIZE, "By", "size of requestState tokens on the wire")
    rounds_of = histogram(
        FLOW_ROUNDS, "{round}", "requestState tokens per MRTR flow, recorded when a flow ends"
    )
    by_mode = {mode: {"mode": mode} for mode in MODES}
    store_errors = counter(STORE_ERRORS, "{error}", "replay store calls that failed (the token was refused)")
    refresh_failures = counter(REFRESH_FAILURES, "{failure}", "key ring refreshes that failed")
    # (outcome attributes, size attributes) per (mode, method, outcome), one cache per
    # direction. Shared dicts: never mutated here, and the OpenTelemetry SDK only reads them.
    cached: dict[tuple[str, str, str, str], tuple[Mapping[str, str], Mapping[str, str]]] = {}

    def attributes(key: tuple[str, str, str, str]) -> tuple[Mapping[str, str], Mapping[str, str]]:
        direction, mode, method, outcome = key
        made = {"mode": mode, "method": method, "outcome": outcome}, {"mode": mode, "direction": direction}
        if len(cached) < _ATTRIBUTES_CACHED:
            cached[key] = made
        return made

    def tokens(direction: str, count: Callable[..., None]) -> Callable[[str, str, str, int | None], None]:
        """The recorder of one direction: sealed and unsealed tokens differ only in their counter."""

        def record(mode: str, method: str, outcome: str, size: int | None) -> None:
            key = (direction, mode, method, outcome)
            counted, sized = cached.get(key) or attributes(key)
            count(1, counted)
            if size is not None:
                size_of(size, sized)

        return record

    return {
        "record_seal": tokens("seal", seals),
        "record_unseal": tokens("unseal", unseals),
        "record_flow_rounds": lambda mode, rounds: rounds_of(rounds, by_mode.get(mode) or {"mode": mode}),
        "record_store_error": lambda store: store_errors(1, {"store": store}),
        "record_key_refresh_failure": lambda: refresh_failures(1),
    }


def _prometheus(registry: Any) -> dict[str, Callable[..., None]]:
    """The prometheus-client side of each recorder, over ``registry``.

    Label children are looked up once (``.labels()`` takes a lock and builds a tuple) and
    kept in dicts; the fixed vocabularies are created up front so their series exist at
    0 from the start (a rate over a series that appears late misses its first increase).
    """
    from prometheus_client import Counter, Histogram  # noqa: PLC0415 - optional dependency

    unseals = Counter("statecodec_unseals", "requestState tokens unsealed, by outcome", ["outcome"],
                      registry=registry)  # fmt: skip
    seals = Counter("statecodec_seals", "requestState tokens sealed, by mode", ["mode"], registry=registry)
    size_of = Histogram(
        "statecodec_token_size_bytes", "size of requestState tokens on the wire (sealed and unsealed)",
        buckets=TOKEN_SIZE_BUCKETS, registry=registry,
    )  # fmt: skip
    flow_rounds = Histogram(
        "statecodec_flow_rounds", "requestState tokens per multi-round flow, recorded when a flow ends",
        buckets=FLOW_ROUNDS_BUCKETS, registry=registry,
    )  # fmt: skip
    store_errors = Counter(
        "statecodec_replay_store_errors", "replay store calls that failed (the token was refused)",
        registry=registry,
    )  # fmt: skip
    refresh_failures = Counter(
        "statecodec_key_refresh_failures", "key ring refreshes that failed", registry=registry
    )
    requests = Counter("statecodec_proxy_requests", "HTTP requests answered by the proxy, by status code",
                       ["code"], registry=registry)  # fmt: skip
    duration = Histogram(
        "statecodec_proxy_request_duration_seconds", "time from a request's arrival to the end of its answer",
        buckets=DURATION_BUCKETS, registry=registry,
    )  # fmt: skip
    upstream = Counter("statecodec_upstream_errors", "upstream failures seen by the proxy, by kind",
                       ["kind"], registry=registry)  # fmt: skip
    shed = Counter("statecodec_shed", "connections, streams and holds shed to keep a bound, by reason",
                   ["reason"], registry=registry)  # fmt: skip

    outcomes = {outcome: unseals.labels(outcome) for outcome in ("ok", *REASONS)}
    modes = {mode: seals.labels(mode) for mode in MODES}
    kinds = {kind: upstream.labels(kind) for kind in UPSTREAM_ERRORS}
    sheds = {reason: shed.labels(reason) for reason in SHED_REASONS}
    codes: dict[int, Any] = {}
    observe_size, observe_duration = size_of.observe, duration.observe

    def seal(mode: str, method: str, outcome: str, size: int | None) -> None:
        if outcome == "ok":
            (modes.get(mode) or seals.labels(mode)).inc()
        if size is not None:
            observe_size(size)

    def unseal(mode: str, method: str, outcome: str, size: int | None) -> None:
        (outcomes.get(outcome) or unseals.labels(outcome)).inc()
        if size is not None:
            observe_size(size)

    def proxy_request(status: int, seconds: float) -> None:
        child = codes.get(status)
        if child is None:
            child = requests.labels(str(status))
            if len(codes) < _ATTRIBUTES_CACHED:
                codes[status] = child
        child.inc()
        observe_duration(seconds)

    return {
        "record_seal": seal,
        "record_unseal": unseal,
        "record_flow_rounds": lambda mode, rounds: flow_rounds.observe(rounds),
        "record_store_error": lambda store: store_errors.inc(),
        "record_key_refresh_failure": refresh_failures.inc,
        "record_proxy_request": proxy_request,
        "record_upstream_error": lambda kind: (kinds.get(kind) or upstream.labels(kind)).inc(),
        "record_shed": lambda reason: (sheds.get(reason) or shed.labels(reason)).inc(),
    }


def _both(first: Callable[..., None] | None, second: Callable[..., None] | None) -> Callable[..., None]:
    if first is None or second is None:
        return first or second or _noop

    def both(*args: Any) -> None:
        first(*args)
        second(*args)

    return both


def resolve() -> None:
    """Bind every recorder for good (at the first record, or now: servers call it at start-up)."""
    global _resolved, _otel_missing, _otel_side  # noqa: PLW0603 - bound once, see the module doc
    with _lock:
        if _resolved:
            return
        try:
            from opentelemetry import metrics  # noqa: PLC0415 - optional dependency, imported on first use
        except ImportError:
            _otel_missing = True
        else:
            _otel_side = _otel(metrics.get_meter(METER_NAME))
        _bind()
        _resolved = True


def enable_prometheus() -> None:
    """Count for Prometheus too, from now on (:mod:`statecodec.ops` calls it when imported).

    Off until then, so a server that never serves ``/metrics`` pays nothing for it. Without
    ``prometheus-client`` installed this does nothing.
    """
    global _registry, _prometheus_side  # noqa: PLW0603 - bound once, see the module doc
    with _lock:
        if _registry is not None:
            return
        try:
            from prometheus_client import CollectorRegistry  # noqa: PLC0415 - optional dependency
        except ImportError:
            return
        _registry = CollectorRegistry(auto_describe=True)
        _prometheus_side = _prometheus(_registry)
        if _resolved:
            _bind()  # already recording for OpenTelemetry: rebind with both


def _bind() -> None:
    namespace = globals()
    for name in _RECORDERS:
        namespace[name] = _both(_otel_side.get(name), _prometheus_side.get(name))


def prometheus_registry() -> Any:
    """The ``prometheus_client.CollectorRegistry`` the recorders count into (``None`` without it)."""
    enable_prometheus()
    resolve()
    return _registry


def _stub(name: str) -> Callable[..., None]:
    def first(*args: Any) -> None:
        resolve()
        globals()[name](*args)

    return first


_RECORDERS: Final = (
    "record_seal",
    "record_unseal",
    "record_flow_rounds",
    "record_store_error",
    "record_key_refresh_failure",
    "record_proxy_request",
    "record_upstream_error",
    "record_shed",
)
#: Count one seal attempt; ``size`` is the token length when it succeeded.
record_seal: Recorder = _stub("record_seal")
#: Count one unseal attempt; ``outcome`` is ``"ok"`` or the rejection reason.
record_unseal: Recorder = _stub("record_unseal")
#: ``record_flow_rounds(mode, rounds)``: a flow ended after ``rounds`` tokens.
record_flow_rounds: Callable[[str, int], None] = _stub("record_flow_rounds")
#: ``record_store_error(store_kind)``: a replay store call failed; the token was refused unconsumed.
record_store_error: Callable[[str], None] = _stub("record_store_error")
#: ``record_key_refresh_failure()``: a key ring refresh failed.
record_key_refresh_failure: Callable[[], None] = _stub("record_key_refresh_failure")
#: ``record_proxy_request(status, seconds)``: the proxy answered one HTTP request.
record_proxy_request: Callable[[int, float], None] = _stub("record_proxy_request")
#: ``record_upstream_error(kind)``: ``timeout``, ``unreachable`` or ``broken`` (a stream cut short).
record_upstream_error: Callable[[str], None] = _stub("record_upstream_error")
#: ``record_shed(reason)``: one connection, stream or hold shed to keep a bound (:data:`SHED_REASONS`).
record_shed: Callable[[str], None] = _stub("record_shed")
