"""Sealing a result: its plaintext ``requestState`` sealed as the next round of the
request's flow, or refused (-32603)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NoReturn

from .. import _telemetry
from .._binding import Binding
from .._codec import OpenedState, StateCodec
from .._errors import FlowBudgetExceeded
from ._bound import aliases_in, flow_fields
from ._judge import Judged
from ._wire import INPUT_REQUIRED, REQUEST_STATE, RESULT_KEYS, WireError

logger = logging.getLogger("statecodec")


def is_state_only(result: Mapping[str, Any]) -> bool:
    """An ``input_required`` result without ``inputRequests``: "not ready yet, come back"."""
    return result.get("resultType") == INPUT_REQUIRED and not result.get("inputRequests")


def seal_result(
    codec: StateCodec,
    judged: Judged | None,
    result: Mapping[str, Any],
    *,
    retry_after: float | None = None,
) -> Mapping[str, Any]:
    """``result`` with its plaintext ``requestState`` sealed to ``judged``'s binding.

    A result without a state comes back as it is (the same object). A state is sealed
    whatever ``resultType`` says: no plaintext state issued by a server ever reaches a
    client. When the request came in with a state, the new one is its next round (the
    same flow). ``retry_after`` paces a requestState-only result (:func:`is_state_only`):
    its token is not redeemable before that many seconds. Raises :class:`WireError`
    (-32603), after logging why, when it cannot be:

    - the result spells ``requestState`` another way (``request_state``, ``RequestState``):
      lenient clients read those, and nothing here can tell which one they would pick;
    - there is no request to bind it to (``judged`` is ``None``: an answer to another
      method, to an unknown id, on a stream that belongs to no request);
    - the request cannot be bound, or the state is not text, is too large, or no key mints;
    - the flow is out of budget (``max_rounds``, ``max_flow_age``);
    - it is ``input_required`` with neither ``inputRequests`` nor a state
      (:func:`check_asks_something`).
    """
    aliases = aliases_in(result, RESULT_KEYS)
    state = result.get(REQUEST_STATE)
    method = judged.method if judged is not None else "-"
    if state is None and not aliases:
        check_asks_something(codec, method, result)
        if judged is not None:  # the flow (if any) ends here
            judged.end_flow(codec)
        return result
    if aliases:
        _refuse_seal(
            codec, method, "alias", f"the result carries {aliases[0][:40]!r}, a spelling of requestState"
        )
    if judged is None:
        _refuse_seal(
            codec, method, "no_request", "the result carries a requestState but answers no MRTR request"
        )
    paced = retry_after if retry_after is not None and is_state_only(result) else None
    return {**result, REQUEST_STATE: seal_state(codec, judged, state, retry_after=paced)}


def check_asks_something(codec: StateCodec, method: str, result: Mapping[str, Any]) -> None:
    """Refuse (-32603) an ``input_required`` result with neither ``inputRequests`` nor ``requestState``.

    MCP 2026-07-28: every InputRequiredResult MUST include at least one of the two. One
    with neither asks the client nothing and gives it nothing to come back with; clients
    retry it until their round budget ends. The TypeScript SDK's own guard answers such a
    result with -32603, and so does every statecodec boundary, whoever wrote the handler.
    An empty ``inputRequests`` object counts as none, as it does there.
    """
    asks = result.get("inputRequests") or result.get(REQUEST_STATE) is not None
    if result.get("resultType") == INPUT_REQUIRED and not asks:
        why = "an input_required result with neither inputRequests nor requestState (it must carry one)"
        _refuse_seal(codec, method, "empty_input_required", why)


def seal_state(codec: StateCodec, judged: Judged, state: object, *, retry_after: float | None = None) -> str:
    """The token for a plaintext ``requestState`` answering ``judged``; see :func:`seal_result`.

    The core of :func:`seal_result`, for callers holding the state already (a result
    model). Anything but a ``str`` that encodes as UTF-8 raises :class:`WireError` (-32603).
    ``retry_after`` is applied as given: the caller decides that the result is state-only.
    """
    method = judged.method
    try:
        binding = judged.binding()
    except Exception as exc:  # deny on error: a raising binder never yields an unbound token
        why = f"the request cannot be bound: {type(exc).__name__}: {str(exc)[:200]}"
        _refuse_seal(codec, method, "unbindable", why)
    try:
        if not isinstance(state, str):
            raise TypeError(f"requestState must be a str, not {type(state).__name__}")
        token = codec.seal(state.encode("utf-8"), binding, parent=judged.opened, retry_after=retry_after)
    except Exception as exc:
        reason = exc.reason if isinstance(exc, FlowBudgetExceeded) else "seal_failed"
        why = f"{type(exc).__name__}: {exc}"
        _refuse_seal(codec, method, reason, why, binding=binding, parent=judged.opened)
    _telemetry.record_seal(str(codec.mode), method, "ok", len(token))
    judged.continue_flow()
    return token


def _refuse_seal(
    codec: StateCodec,
    method: str,
    reason: str,
    why: str,
    *,
    binding: Binding | None = None,
    parent: OpenedState | None = None,
) -> NoReturn:
    # Fail closed: a result whose state cannot be sealed is never sent as it is.
    mode = str(codec.mode)
    _telemetry.record_seal(mode, method, "error", None)
    target = None if binding is None else binding.target
    where = method if target is None else f"{method} {_telemetry.clip(target)!r}"
    logger.error(
        "could not seal requestState on %s: %s",
        where,
        why,
        extra=_telemetry.fields(
            "seal_refused",
            reason=reason,
            detail=why,
            audience=None if binding is None else binding.audience,
            method=method,
            target=target,
            mode=mode,
            **flow_fields(parent),
        ),
    )
    raise WireError.internal(why)
