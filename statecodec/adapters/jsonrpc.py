"""MRTR on raw JSON-RPC dicts: what to bind, how to unseal a request and seal a result.

Framework-free: this module works on the wire shapes of MCP 2026-07-28 (``params`` and
``result`` objects as decoded JSON) and imports neither ``mcp`` nor ``fastmcp``, so the
SDK middleware (:mod:`statecodec.adapters.mcp`), the FastMCP adapter and an HTTP proxy
all share one definition of what a token is bound to and one error behaviour.

The plaintext a handler puts in ``requestState`` is a ``str`` (the SDKs' type); the
codec seals bytes. The mapping is UTF-8, strictly, both ways: ``state.encode("utf-8")``
is sealed, and the unsealed payload is decoded as UTF-8 before the handler sees it. A
state that is not valid Unicode (a lone surrogate) cannot be sealed and fails like any
other seal failure.

Every rejection looks the same on the wire (:data:`INVALID_STATE_ERROR`, the SDKs'
convention): the client learns nothing about why, so a forger gets no oracle. The precise
reason goes to the ``statecodec`` logger (one WARNING line) and to the metrics.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final

from .._binding import Binding
from .._codec import Mode, StateCodec
from .._errors import WIRE_ERROR_CODE, WIRE_ERROR_DATA, WIRE_ERROR_MESSAGE, InvalidState, StateCodecError
from . import _metrics

logger = logging.getLogger("statecodec")

#: The only methods whose results may be ``input_required`` (spec 2026-07-28).
MRTR_METHODS: Final = frozenset({"tools/call", "resources/read", "prompts/get"})
REQUEST_STATE: Final = "requestState"
INPUT_REQUIRED: Final = "input_required"

INTERNAL_ERROR_CODE: Final = -32603
INTERNAL_ERROR_MESSAGE: Final = "Internal error"

#: The JSON-RPC ``error`` member for every rejected token. Copy before mutating.
INVALID_STATE_ERROR: Final[Mapping[str, Any]] = {
    "code": WIRE_ERROR_CODE,
    "message": WIRE_ERROR_MESSAGE,
    "data": dict(WIRE_ERROR_DATA),
}
#: The JSON-RPC ``error`` member when a result cannot be sealed. Says nothing more.
SEAL_FAILED_ERROR: Final[Mapping[str, Any]] = {"code": INTERNAL_ERROR_CODE, "message": INTERNAL_ERROR_MESSAGE}

#: The metrics label of each mode: what ``codec.mode.value`` says, without the enum
#: property's Python-level lookup on every request.
_MODE_LABEL: Final[Mapping[Mode, str]] = {mode: mode.value for mode in Mode}

_LOG_TARGET_MAX = 120
#: Params keys of the MRTR requests (2026-07-28) that are not aliases of ``requestState``:
#: a request holding only these skips the per-key normalisation in :func:`state_aliases`.
#: None of them normalises to ``requeststate``; any other key is normalised and checked.
_PLAIN_KEYS: Final = frozenset({"name", "arguments", "uri", "inputResponses", REQUEST_STATE, "_meta", "task"})


class SealFailed(StateCodecError):  # noqa: N818 - mirrors InvalidState
    """A result's ``requestState`` could not be sealed; answer :data:`SEAL_FAILED_ERROR`.

    The cause is logged where it happens; the message is safe to log, never to send.
    """


def invalid_state_error() -> dict[str, Any]:
    """A fresh copy of :data:`INVALID_STATE_ERROR`."""
    return {"code": WIRE_ERROR_CODE, "message": WIRE_ERROR_MESSAGE, "data": dict(WIRE_ERROR_DATA)}


def seal_failed_error() -> dict[str, Any]:
    """A fresh copy of :data:`SEAL_FAILED_ERROR`."""
    return dict(SEAL_FAILED_ERROR)


def is_mrtr(method: str) -> bool:
    """True for ``tools/call``, ``resources/read`` and ``prompts/get``."""
    return method in MRTR_METHODS


def request_target(method: str, params: Mapping[str, Any] | None) -> str:
    """The tool or prompt ``name``, or the resource ``uri``, of an MRTR request.

    Raises ``ValueError`` when it is missing or not a string: such a request is malformed,
    and a binding must never be computed over a coerced value.
    """
    field = "uri" if method == "resources/read" else "name"
    value = (params or {}).get(field)
    if not isinstance(value, str):
        raise ValueError(f"{method} params.{field} must be a string")
    return value


def digested_arguments(method: str, params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The arguments a token is bound to: tool or prompt ``arguments``, nothing for resources.

    An allowlist per method, never "params minus some fields": ``inputResponses``,
    ``requestState`` and ``_meta`` change from round to round (or are the token itself)
    and must stay out, and a field added to the protocol later must not join silently.
    Absent and ``null`` arguments mean ``{}``, as they do to the SDK handlers.
    """
    if method == "resources/read":
        return None
    arguments = (params or {}).get("arguments")
    if arguments is None:
        return {}
    if not isinstance(arguments, dict):
        raise ValueError(f"{method} params.arguments must be an object")
    return arguments


def principal_string(client_id: str | None, issuer: str | None, subject: str | None) -> str:
    """The principal of an access token as one string: JSON ``[client_id, issuer, subject]``.

    The same (client, issuer, subject) triple the MCP SDK uses for its own binding, so two
    users of one OAuth client differ whenever the verifier supplies a subject. JSON keeps
    the three fields unambiguous whatever characters they contain.

    The strings are cached: a server sees the same few principals request after
    request. ``typed`` keeps equal keys of different types (``1``, ``1.0``, ``True``)
    apart, as JSON does.
    """
    try:
        return _principal_json(client_id, issuer, subject)
    except TypeError:  # an unhashable component from a custom verifier: not cached
        return _principal_json.__wrapped__(client_id, issuer, subject)


@lru_cache(maxsize=1024, typed=True)
def _principal_json(client_id: str | None, issuer: str | None, subject: str | None) -> str:
    return json.dumps([client_id, issuer, subject], separators=(",", ":"), ensure_ascii=False)


def binding_for(
    method: str, params: Mapping[str, Any] | None, *, principal: str | None, audience: str | None
) -> Binding:
    """The default :class:`~statecodec.Binding` of an MRTR request.

    Raises ``ValueError`` or ``TypeError`` when the params cannot be bound (no target,
    arguments that are not canonical JSON such as integers beyond 2**53).
    """
    # Positional (principal, audience, method, target, arguments): this runs on every
    # request, and keyword arguments cost a little more.
    target, arguments = request_target(method, params), digested_arguments(method, params)
    return Binding(principal, audience, method, target, arguments)


def state_aliases(params: Mapping[str, Any]) -> list[str]:
    """Keys of ``params`` that spell ``requestState`` some other way (``request_state``...).

    Only ``requestState`` is checked, but FastMCP re-validates raw params with pydantic's
    ``populate_by_name``, so a snake_case ``request_state`` reaches ``ctx.request_state``
    unverified on legacy protocol versions. Any key that normalises to the same name
    (case-folded, ``_`` and ``-`` removed) is therefore refused outright.
    """
    if params.keys() <= _PLAIN_KEYS:  # the usual request: no key to normalise
        return []
    return [
        key
        for key in params
        if key != REQUEST_STATE
        and isinstance(key, str)
        and key.casefold().replace("_", "").replace("-", "") == "requeststate"
    ]


def carries_state(params: Mapping[str, Any]) -> bool:
    """Whether ``params`` hold a state to check: ``requestState`` or any alias of it."""
    return params.get(REQUEST_STATE) is not None or bool(state_aliases(params))


def check_state_shape(codec: StateCodec, method: str, params: Mapping[str, Any]) -> str:
    """The cheap checks, run before anything costly such as the argument digest.

    Refuses state aliases, a ``requestState`` that is not a string, and one over the
    codec's size cap, so a hostile request cannot make the server digest megabytes of
    arguments for a token that was never going to pass. Logs and raises InvalidState;
    returns the token that passed, for :func:`unseal_checked`.
    """
    try:
        aliases = state_aliases(params)
        if aliases:
            raise InvalidState("malformed", f"params carry {aliases[0][:40]!r}, an alias of requestState")
        token = params.get(REQUEST_STATE)
        if not isinstance(token, str):
            raise InvalidState("malformed", f"requestState is a JSON {type(token).__name__}, not a string")
        if len(token) > codec.max_token_bytes:
            raise InvalidState(
                "too_large", f"token is {len(token)} characters, the limit is {codec.max_token_bytes}"
            )
    except InvalidState as exc:
        log_rejection(codec, method, params, exc)
        raise
    return token


async def unseal_params(
    codec: StateCodec, method: str, params: Mapping[str, Any], binding: Binding
) -> dict[str, Any]:
    """``params`` with ``requestState`` replaced by the plaintext the server sealed.

    Without a state (``requestState`` absent or ``null``, and no alias of it) the params
    come back unchanged. A token that fails any check, and a plaintext that is not UTF-8,
    raise :class:`~statecodec.InvalidState` after one WARNING log line and a metric:
    answer :data:`INVALID_STATE_ERROR`. The replay store is awaited (single use).
    """
    if not carries_state(params):
        return dict(params)
    return await unseal_checked(codec, method, params, check_state_shape(codec, method, params), binding)


async def unseal_checked(
    codec: StateCodec, method: str, params: Mapping[str, Any], token: str, binding: Binding
) -> dict[str, Any]:
    """:func:`unseal_params` for the ``token`` that :func:`check_state_shape` returned.

    For callers that ran the cheap checks themselves before computing the binding, so
    the checks do not run twice per request. Same errors, logs and metrics.
    """
    try:
        opened = await codec.aunseal(token, binding)
        try:
            plaintext = opened.payload.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidState(
                "malformed", "the sealed state is not UTF-8 text", kid=opened.kid, token_id=opened.token_id
            ) from None
    except InvalidState as exc:
        log_rejection(codec, method, params, exc)
        raise
    _metrics.record_unseal(_MODE_LABEL.get(codec.mode) or codec.mode.value, method, "ok", len(token))
    return {**params, REQUEST_STATE: plaintext}


def log_rejection(
    codec: StateCodec, method: str, params: Mapping[str, Any] | None, exc: InvalidState
) -> None:
    """One WARNING line and one metric for a rejected token.

    Carries the reason, the detail, the kid and the first 8 hex digits of the token id
    (enough to correlate, useless to replay), the method and the target. Never the token.
    """
    token = (params or {}).get(REQUEST_STATE)
    size = len(token) if isinstance(token, str) else None
    _metrics.record_unseal(codec.mode.value, method, exc.reason, size)
    logger.warning(
        "statecodec: rejected requestState on %s %s: reason=%s detail=%r kid=%s token=%s size=%s",
        method,
        _target_for_log(method, params),
        exc.reason,
        exc.detail,
        exc.kid or "-",
        exc.token_id[:8] if exc.token_id else "-",
        size if size is not None else "-",
    )


def seal_result(codec: StateCodec, result: Mapping[str, Any], binding: Binding) -> Mapping[str, Any]:
    """``result`` with its plaintext ``requestState`` sealed, when it is ``input_required``.

    Anything else comes back as it is, as does an ``input_required`` result carrying only
    ``inputRequests``. Raises :class:`SealFailed` (after logging why) rather than ever
    letting a plaintext state reach the client: answer :data:`SEAL_FAILED_ERROR`.
    """
    if result.get("resultType") != INPUT_REQUIRED:
        return result
    state = result.get(REQUEST_STATE)
    if state is None:
        return result
    return {**result, REQUEST_STATE: seal_state(codec, state, binding)}


def seal_state(codec: StateCodec, state: object, binding: Binding) -> str:
    """The token for the plaintext ``requestState`` of an ``input_required`` result.

    The core of :func:`seal_result`, for callers that already looked at the result.
    Anything but a ``str`` that encodes as UTF-8 raises :class:`SealFailed`, logged.
    """
    method = binding.method or "-"
    mode = _MODE_LABEL.get(codec.mode) or codec.mode.value
    try:
        if not isinstance(state, str):
            raise TypeError(f"requestState must be a str, not {type(state).__name__}")
        token = codec.seal(state.encode("utf-8"), binding)
    except Exception as exc:
        # Fail closed: a result whose state cannot be sealed is never sent as it is.
        _metrics.record_seal(mode, method, "error", None)
        logger.error(
            "statecodec: could not seal requestState on %s %r: %s: %s",
            method,
            _clip(binding.target),
            type(exc).__name__,
            exc,
        )
        raise SealFailed(f"{type(exc).__name__} while sealing requestState on {method}") from None
    _metrics.record_seal(mode, method, "ok", len(token))
    return token


def _target_for_log(method: str, params: Mapping[str, Any] | None) -> str:
    try:
        return repr(_clip(request_target(method, params)))
    except ValueError:
        return "<no target>"


def _clip(text: str | None) -> str | None:
    # Targets come from the client: repr() in the log line keeps them on one line, and
    # clipping keeps a hostile URI from flooding the log.
    if text is None or len(text) <= _LOG_TARGET_MAX:
        return text
    return text[:_LOG_TARGET_MAX] + "..."
