"""MRTR on raw JSON-RPC: the one owner of a round, from the verdict on a request to its flow's end.

Framework-free: this package works on the wire shapes of MCP 2026-07-28 (``params`` and
``result`` objects as decoded JSON) and imports neither ``mcp`` nor ``fastmcp``. The SDK
middleware (:mod:`statecodec.adapters.mcp`), the FastMCP adapter, the ASGI middleware and
the proxy hold a :class:`Boundary` and supply only I/O: how to judge their request again
after a hold (:func:`hold_early`), how to wait while their client is there
(:data:`ClientStays`: :func:`client_stays` for an ASGI ``receive``), how to run the handler
and write the answer. A round:

- judge (:func:`judge_request`): the cheap shape checks, the binding, the codec's checks
  and, last, the replay store; a token of another format goes to the adapter's
  :class:`TokenReader` (the SDK migration window) after the shape checks. It returns a
  :class:`Judged` (the params with the plaintext state, the token redeemed, the binding
  to seal the answer with);
- hold (:func:`hold_early`): an early retry of a paced round is held, asynchronously,
  until its time when that is at most ``max_hold`` seconds away and :class:`Holds` has
  room, then judged again from the start; otherwise it is answered at once with the same
  state (:attr:`Judged.early`): the handler never runs early and the token is never
  consumed early. Holding rather than answering matters to well-behaved clients: the
  official TypeScript client retries 250 ms after such an answer and counts every answer
  against its 10 rounds, so answering each early retry would end its flow within seconds;
- run, then seal (:func:`seal_result`): the answer's state is sealed as the next round of
  the same flow (the codec's ``parent=``), so every flow keeps one id and the codec's round
  and age budgets hold; ``retry_after`` paces a requestState-only round (``input_required``
  without ``inputRequests``, :func:`is_state_only`), or the answer is refused;
- end of flow (:meth:`Boundary.end`, once the adapter wrote the answer): a round whose
  answer carried no new state ends its flow, counted once.

Every refusal is one exception, :class:`WireError`, which carries the JSON-RPC error to
answer instead (:meth:`WireError.response` for the whole body). Every token problem is the
same -32602 "Invalid or expired requestState" (the SDKs' convention: a forger learns
nothing); every result that cannot be sealed is -32603 "Internal error". One exception: a
replay store that could not record the token (``store_unavailable``) is -32603 with a
message saying to retry the same request, since the token was not consumed and is still
good; only an authentic, unexpired, correctly bound token ever reaches the store, so this
answer tells nothing to whoever forged, tampered or mis-bound one (docs/threat-model.md).
The precise reason goes to the ``statecodec`` logger and the metrics.

The plaintext a handler puts in ``requestState`` is a ``str`` (the SDKs' type); the codec
seals bytes. The mapping is UTF-8, strictly, both ways.

The package's modules: ``_wire`` (methods, keys, codes, :class:`WireError`), ``_bound``
(what a token is bound to, every spelling of ``requestState``), ``_holds`` (pacing and
holds), ``_judge`` (the verdict), ``_seal`` (sealing a result), ``_round``
(:class:`BoundaryOptions`, :class:`Boundary`). Import from ``statecodec.boundary``.
"""

from __future__ import annotations

from ._bound import (
    FOLDED_REQUEST_STATE,
    Binder,
    binding_for,
    carries_state,
    digested_arguments,
    flow_fields,
    fold_key,
    is_mrtr,
    principal_string,
    request_target,
    spells_state,
    state_aliases,
    target_field,
)
from ._holds import (
    DEFAULT_MAX_HOLD,
    DEFAULT_MAX_HOLDS,
    DEFAULT_MAX_HOLDS_PER_TOKEN,
    HOLDS_MAX,
    MAX_HOLD_LIMIT,
    ClientStays,
    Hold,
    Holds,
    Waiter,
    client_stays,
    hold_abandoned,
    hold_early,
    hold_refused,
    sleeping,
)
from ._judge import (
    Judged,
    TokenReader,
    judge_request,
)
from ._round import (
    Boundary,
    BoundaryOptions,
    Bounded,
    check_pacing,
)
from ._seal import (
    check_asks_something,
    is_state_only,
    seal_result,
    seal_state,
)
from ._wire import (
    HEADER_MISMATCH_CODE,
    INPUT_REQUIRED,
    INTERNAL_ERROR_CODE,
    INTERNAL_ERROR_MESSAGE,
    INVALID_REQUEST_CODE,
    JSONRPC_VERSION,
    MRTR_METHODS,
    PARAMS_KEYS,
    PARSE_ERROR_CODE,
    REQUEST_STATE,
    STORE_UNAVAILABLE_DATA,
    STORE_UNAVAILABLE_MESSAGE,
    WIRE_ERROR_CODE,
    WIRE_ERROR_DATA,
    WIRE_ERROR_MESSAGE,
    WireError,
    result_response,
)

__all__ = [
    "DEFAULT_MAX_HOLD",
    "DEFAULT_MAX_HOLDS",
    "DEFAULT_MAX_HOLDS_PER_TOKEN",
    "HEADER_MISMATCH_CODE",
    "HOLDS_MAX",
    "INPUT_REQUIRED",
    "INTERNAL_ERROR_CODE",
    "INTERNAL_ERROR_MESSAGE",
    "INVALID_REQUEST_CODE",
    "MAX_HOLD_LIMIT",
    "JSONRPC_VERSION",
    "MRTR_METHODS",
    "PARAMS_KEYS",
    "PARSE_ERROR_CODE",
    "FOLDED_REQUEST_STATE",
    "REQUEST_STATE",
    "STORE_UNAVAILABLE_DATA",
    "STORE_UNAVAILABLE_MESSAGE",
    "WIRE_ERROR_CODE",
    "WIRE_ERROR_DATA",
    "WIRE_ERROR_MESSAGE",
    "Binder",
    "Boundary",
    "Bounded",
    "BoundaryOptions",
    "ClientStays",
    "Hold",
    "Holds",
    "Judged",
    "TokenReader",
    "Waiter",
    "WireError",
    "binding_for",
    "carries_state",
    "check_asks_something",
    "check_pacing",
    "client_stays",
    "flow_fields",
    "hold_abandoned",
    "fold_key",
    "hold_early",
    "hold_refused",
    "is_state_only",
    "digested_arguments",
    "is_mrtr",
    "judge_request",
    "principal_string",
    "result_response",
    "request_target",
    "seal_result",
    "seal_state",
    "sleeping",
    "spells_state",
    "state_aliases",
    "target_field",
]
