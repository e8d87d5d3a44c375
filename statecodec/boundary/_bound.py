"""What a token is bound to: the request's target, its digested arguments, the principal;
and every spelling of ``requestState``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, Final, TypeAlias

from .._binding import Binding
from .._codec import OpenedState
from ._wire import MRTR_METHODS, PARAMS_KEYS, REQUEST_STATE

#: ``bind() -> Binding``: the request's binding, computed only when needed. It may raise
#: (a principal that cannot be verified, arguments that cannot be digested): the request
#: is then never bound to anyone, neither to accept a token nor to seal a new one.
Binder: TypeAlias = Callable[[], Binding]


def is_mrtr(method: str) -> bool:
    """True for ``tools/call``, ``resources/read`` and ``prompts/get``."""
    return method in MRTR_METHODS


def target_field(method: str) -> str:
    """The params field naming an MRTR request's target: ``uri`` for a resource, else ``name``."""
    return "uri" if method == "resources/read" else "name"


def request_target(method: str, params: Mapping[str, Any] | None) -> str:
    """The tool or prompt ``name``, or the resource ``uri``, of an MRTR request.

    Raises ``ValueError`` when it is missing or not a string: such a request is malformed,
    and a binding must never be computed over a coerced value.
    """
    field = target_field(method)
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
    the three fields unambiguous whatever characters they contain. Cached (``typed``
    keeps ``1``, ``1.0`` and ``True`` apart, as JSON does): a server sees the same few
    principals request after request.
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

    Only ``requestState`` is checked, but readers are lenient: FastMCP re-validates raw
    params with pydantic's ``populate_by_name`` (a snake_case ``request_state`` reaches
    ``ctx.request_state``), the SDK's result models read ``request_state`` too, and Go's
    ``encoding/json`` matches keys case-insensitively. Any key that normalises to the same
    name (case-folded, ``_`` and ``-`` removed) is therefore refused outright.
    """
    return aliases_in(params, PARAMS_KEYS)


#: ``requestState`` as :func:`fold_key` writes it: every key that folds to this is read as a state.
FOLDED_REQUEST_STATE: Final = "requeststate"


def fold_key(key: str) -> str:
    """``key`` as a lenient reader may match it: case-folded, ``_`` and ``-`` removed.

    The one normalisation behind every alias check (:func:`state_aliases`, the answers'
    and the passthrough bodies' scans of the ASGI middleware).
    """
    # ASCII folds as it lowers, and str.lower has a fast path for it that casefold lacks.
    folded = key.lower() if key.isascii() else key.casefold()
    return folded.replace("_", "").replace("-", "")


def spells_state(key: object) -> bool:
    """Whether ``key`` is ``requestState`` or any spelling of it a lenient reader accepts."""
    return isinstance(key, str) and fold_key(key) == FOLDED_REQUEST_STATE


def aliases_in(mapping: Mapping[str, Any], plain: frozenset[str]) -> list[str]:
    if plain.issuperset(mapping):  # the usual message: no key to normalise
        return []
    return [key for key in mapping if key != REQUEST_STATE and spells_state(key)]


def carries_state(params: Mapping[str, Any]) -> bool:
    """Whether ``params`` hold a state to check: ``requestState`` or any alias of it."""
    return params.get(REQUEST_STATE) is not None or bool(state_aliases(params))


def flow_fields(opened: OpenedState | None) -> dict[str, Any]:
    """The ``extra=`` fields naming a round's flow in log records (empty without a state)."""
    if opened is None:
        return {}
    return {"flow_id": opened.flow_id, "round": opened.round}


def target_or_none(method: str, params: Mapping[str, Any] | None) -> str | None:
    try:
        return request_target(method, params)
    except ValueError:
        return None
