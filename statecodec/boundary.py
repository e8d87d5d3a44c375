"""MRTR on raw JSON-RPC: the one place that judges a request and seals a result.

Framework-free: this module works on the wire shapes of MCP 2026-07-28 (``params`` and
``result`` objects as decoded JSON) and imports neither ``mcp`` nor ``fastmcp``. The SDK
middleware (:mod:`statecodec.adapters.mcp`), the FastMCP adapter, the ASGI middleware
and the proxy all call the same two functions:

- :func:`judge_request` takes an inbound ``tools/call``, ``resources/read`` or
  ``prompts/get`` and decides what the server may see: the cheap shape checks, the
  binding, the codec's checks and, last, the replay store. It returns a :class:`Judged`
  (the params with the plaintext state, the token redeemed, the binding to seal the
  answer with);
- :func:`seal_result` takes the server's answer to that request and seals its state,
  or refuses to let it out.

Flows: :func:`seal_result` seals the state of a round that came in with one as the next
round of the same flow (the codec's ``parent=``), so every flow keeps one id and the
codec's round and age budgets hold. Pacing: ``seal_result(..., retry_after=S)`` paces a
requestState-only round (``input_required`` without ``inputRequests``); a retry of it that
comes early is held, asynchronously, until its time when that is at most ``max_hold``
seconds away (then the round runs as usual), and otherwise answered at once with the same
state (:attr:`Judged.early`): the handler never runs early and the token is never
consumed early. Holding rather than answering matters to well-behaved clients: the
official TypeScript client retries 250 ms after such an answer and counts every answer
against its 10 rounds, so answering each early retry would end its flow within seconds.

Both raise one exception, :class:`WireError`, which carries the JSON-RPC error to answer
instead. Every token problem is the same -32602 "Invalid or expired requestState" (the
SDKs' convention: a forger learns nothing); every result that cannot be sealed is -32603
"Internal error". One exception: a replay store that could not record the token
(``store_unavailable``) is -32603 with a message saying to retry the same request, since
the token was not consumed and is still good; only an authentic, unexpired, correctly
bound token ever reaches the store, so this answer tells nothing to whoever forged,
tampered or mis-bound one (docs/threat-model.md). The precise reason goes to the
``statecodec`` logger and the metrics.

The plaintext a handler puts in ``requestState`` is a ``str`` (the SDKs' type); the codec
seals bytes. The mapping is UTF-8, strictly, both ways.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Final, NoReturn, Protocol, TypeAlias, TypeVar

from . import _format, _telemetry
from ._binding import Binding
from ._codec import OpenedState, StateCodec
from ._errors import FlowBudgetExceeded, InvalidState, StateCodecError

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
    "fold_key",
    "hold_early",
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

logger = logging.getLogger("statecodec")

#: How long an early retry of a paced round may be held before it runs (seconds); a retry
#: that would wait longer is answered at once with the same state.
DEFAULT_MAX_HOLD: Final = 10.0
#: The longest ``max_hold`` (seconds): a held request keeps its client connection open.
MAX_HOLD_LIMIT: Final = 300
#: Early retries held at once by one adapter; one more is answered at once with its state.
DEFAULT_MAX_HOLDS: Final = 100
#: Early retries of one token held at once (a client has one retry outstanding; two
#: allow for a client that gave up waiting and sent the retry again).
DEFAULT_MAX_HOLDS_PER_TOKEN: Final = 2
#: An early retry is held at most this many times (the clock may wake a hair early).
HOLDS_MAX: Final = 3

#: The only methods whose results may be ``input_required`` (spec 2026-07-28).
MRTR_METHODS: Final = frozenset({"tools/call", "resources/read", "prompts/get"})
REQUEST_STATE: Final = "requestState"
INPUT_REQUIRED: Final = "input_required"
#: The params keys of the MRTR requests (2026-07-28). None of them but ``requestState``
#: itself spells ``requestState``, so a request holding only these needs no alias check;
#: the ASGI middleware also refuses any other spelling of them (``"Arguments"``).
PARAMS_KEYS: Final = frozenset({"name", "uri", "arguments", "inputResponses", REQUEST_STATE, "_meta", "task"})
# Result keys of the MRTR methods that are not aliases of requestState (the same shortcut).
_RESULT_KEYS: Final = frozenset(
    {
        "resultType",
        REQUEST_STATE,
        "inputRequests",
        "content",
        "structuredContent",
        "isError",
        "contents",
        "messages",
        "description",
        "_meta",
    }
)

# ---------------------------------------------------------------- the wire
#: What every rejected token is answered with (the SDKs' convention).
WIRE_ERROR_CODE: Final = -32602
WIRE_ERROR_MESSAGE: Final = "Invalid or expired requestState"
WIRE_ERROR_DATA: Final[Mapping[str, str]] = MappingProxyType({"reason": "invalid_request_state"})
#: What a result that cannot be sealed is replaced with. Says nothing more.
INTERNAL_ERROR_CODE: Final = -32603
INTERNAL_ERROR_MESSAGE: Final = "Internal error"
#: What a request is answered (with -32603) when the replay store could not record its
#: token: nothing was consumed, so the client should send the same request again.
STORE_UNAVAILABLE_MESSAGE: Final = (
    "Temporarily unavailable: retry the same request (its requestState was not consumed)"
)
STORE_UNAVAILABLE_DATA: Final[Mapping[str, str]] = MappingProxyType({"reason": "temporarily_unavailable"})
#: JSON-RPC's codes for a body that is not JSON, and for JSON that is not a request.
PARSE_ERROR_CODE: Final = -32700
INVALID_REQUEST_CODE: Final = -32600
JSONRPC_VERSION: Final = "2.0"
#: MCP 2026-07-28 (SEP-2243): the ``Mcp-*`` routing headers and the body disagree (HTTP 400).
HEADER_MISMATCH_CODE: Final = -32020


class WireError(StateCodecError):
    """Answer this JSON-RPC error instead: a request refused, or a result that cannot go out.

    ``code``, ``message`` and ``data`` are what the client sees (:meth:`error`); ``status``
    is the HTTP status for byte-level intermediaries (200 for a JSON-RPC answer); ``reason``
    says why, for logs and metrics only: the :class:`~statecodec.InvalidState` reason
    for a token, a short text otherwise. It is never on the wire.
    """

    def __init__(
        self,
        code: int,
        message: str,
        *,
        data: Mapping[str, Any] | None = None,
        status: int = 200,
        reason: str = "",
    ) -> None:
        super().__init__(f"{code} {message}: {reason}" if reason else f"{code} {message}")
        self.code = code
        self.message = message
        self.data = data
        self.status = status
        self.reason = reason

    @classmethod
    def invalid_state(cls, reason: str = "", *, status: int = 200) -> WireError:
        """The uniform -32602 for a token that failed any check."""
        return cls(WIRE_ERROR_CODE, WIRE_ERROR_MESSAGE, data=WIRE_ERROR_DATA, status=status, reason=reason)

    @classmethod
    def refusing(cls, reason: str) -> WireError:
        """The answer to a token the codec refused for ``reason`` (an InvalidState reason).

        -32602 for every reason but ``store_unavailable``: that one is no verdict on the
        token (it passed every check and was not consumed), so it is -32603 asking for
        the same request again, never the answer a forgery gets.
        """
        if reason == "store_unavailable":
            return cls(
                INTERNAL_ERROR_CODE, STORE_UNAVAILABLE_MESSAGE, data=STORE_UNAVAILABLE_DATA, reason=reason
            )
        return cls.invalid_state(reason)

    @classmethod
    def internal(cls, reason: str = "", *, status: int = 200) -> WireError:
        """-32603 for a result whose state cannot be sealed (or an answer that cannot be read)."""
        return cls(INTERNAL_ERROR_CODE, INTERNAL_ERROR_MESSAGE, status=status, reason=reason)

    def error(self) -> dict[str, Any]:
        """A fresh JSON-RPC ``error`` member."""
        member: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            member["data"] = dict(self.data)
        return member

    def response(self, request_id: Any = None) -> dict[str, Any]:
        """The whole JSON-RPC error response to ``request_id`` (``None``: to no request known)."""
        return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": self.error()}


def result_response(request_id: Any, result: Mapping[str, Any]) -> dict[str, Any]:
    """The whole JSON-RPC response carrying ``result`` to ``request_id``."""
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "result": dict(result)}


# ---------------------------------------------------------------- what is bound
#: ``bind() -> Binding``: the request's binding, computed only when needed. It may raise
#: (a principal that cannot be verified, arguments that cannot be digested): the request
#: is then never bound to anyone, neither to accept a token nor to seal a new one.
Binder: TypeAlias = Callable[[], Binding]

_NO_PARAMS: Final[Mapping[str, Any]] = MappingProxyType({})


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
    return _aliases(params, PARAMS_KEYS)


#: ``requestState`` as :func:`fold_key` writes it: every key that folds to this is read as a state.
FOLDED_REQUEST_STATE: Final = "requeststate"


def fold_key(key: str) -> str:
    """``key`` as a lenient reader may match it: case-folded, ``_`` and ``-`` removed.

    The one normalisation behind every alias check (:func:`state_aliases`, the answers'
    and the passthrough bodies' scans of the ASGI middleware).
    """
    return key.casefold().replace("_", "").replace("-", "")


def spells_state(key: object) -> bool:
    """Whether ``key`` is ``requestState`` or any spelling of it a lenient reader accepts."""
    return isinstance(key, str) and fold_key(key) == FOLDED_REQUEST_STATE


def _aliases(mapping: Mapping[str, Any], plain: frozenset[str]) -> list[str]:
    if plain.issuperset(mapping):  # the usual message: no key to normalise
        return []
    return [key for key in mapping if key != REQUEST_STATE and spells_state(key)]


def carries_state(params: Mapping[str, Any]) -> bool:
    """Whether ``params`` hold a state to check: ``requestState`` or any alias of it."""
    return params.get(REQUEST_STATE) is not None or bool(state_aliases(params))


# ---------------------------------------------------------------- holding early retries
#: ``wait(seconds)``: hold an early retry that long; raise (any exception, or be cancelled)
#: when its client went away. The hold is then abandoned: nothing consumed, nothing run.
Waiter: TypeAlias = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Hold:
    """An early retry its adapter holds itself (``judge_request(..., wait=None)``).

    ``seconds`` to hold it before judging the request again; ``early`` is the
    ``too_early`` verdict, for :class:`Holds` (its token id) and the log records.
    """

    seconds: float
    early: InvalidState

    @property
    def token_id(self) -> str:
        return self.early.token_id or "-"


class Holds:
    """How many early retries are held at once: at most ``total``, ``per_token`` of one token.

    A held retry costs a coroutine and what its adapter keeps of the request until it
    runs (the ASGI middleware keeps the raw body, one copy); these bounds keep a client
    that sends one token's early retry a hundred times, or many tokens' at once, from
    holding memory without limit. A retry over either bound is answered at once with the
    same state (unconsumed), as one due beyond ``max_hold`` is: a well-behaved client just
    retries later, where a refusal would end its flow. One instance per adapter; not
    thread-safe (one event loop).
    """

    __slots__ = ("_by_token", "held", "per_token", "total")

    def __init__(self, total: int = DEFAULT_MAX_HOLDS, per_token: int = DEFAULT_MAX_HOLDS_PER_TOKEN) -> None:
        _check_hold_counts(total, per_token)
        self.total = total
        self.per_token = per_token
        self.held = 0
        self._by_token: dict[str, int] = {}

    def enter(self, token_id: str) -> bool:
        """Take a place for an early retry of ``token_id``; False when a bound is reached."""
        count = self._by_token.get(token_id, 0)
        if self.held >= self.total or count >= self.per_token:
            return False
        self.held += 1
        self._by_token[token_id] = count + 1
        return True

    def leave(self, token_id: str) -> None:
        self.held -= 1
        count = self._by_token.pop(token_id) - 1
        if count:
            self._by_token[token_id] = count


def _check_hold_counts(total: object, per_token: object) -> None:
    if not (isinstance(total, int) and isinstance(per_token, int) and total >= 0 and per_token >= 0):
        raise ValueError(f"max_holds and max_holds_per_token must be counts, got {total!r}, {per_token!r}")


# ---------------------------------------------------------------- judging a request
class TokenReader(Protocol):
    """Another format's tokens, read beside the codec's (the SDK migration window).

    ``label`` names the format in metrics and log records; ``audience`` is what its
    tokens are bound to, for the log record of a refusal. :meth:`redeem` runs every check
    and the consumption, and raises :class:`~statecodec.InvalidState` for the first that
    fails (a store outage is ``store_unavailable``): the boundary logs it and answers.
    """

    @property
    def label(self) -> str: ...

    @property
    def audience(self) -> str | None: ...

    def reads(self, token: str) -> bool:
        """Whether ``token`` is of this reader's format (the codec reads every other)."""
        ...

    async def redeem(
        self, codec: StateCodec, method: str, params: Mapping[str, Any], *, token: str, bind: Binder
    ) -> tuple[str, Binding]:
        """The plaintext state and the binding of the answer's state, once all checks passed."""
        ...


class Judged:
    """The verdict on one MRTR request: what to hand on, what was redeemed, what to seal with.

    ``params`` are what the server may see: the request's own params, with the plaintext
    state in place of the token when one was redeemed (``opened``). :meth:`binding` is
    the binding the answer's state is sealed with: the one the token was checked against,
    or computed on first use (only an answer that carries a state needs it). ``opened`` is
    also the parent of the answer's state: the next round of its flow.

    ``early``, when set, is the whole answer: the request retried a paced round too early
    to be held, so the handler must not run and the client gets this result (the same
    state, unconsumed) instead. ``hold`` is set beside it when the caller asked to hold
    the retry itself (``wait=None``) and it may be held (:class:`Hold`): its place in
    :class:`Holds` is not taken yet.
    """

    __slots__ = ("_bind", "_binding", "_flow_told", "early", "hold", "method", "opened", "params")

    def __init__(
        self,
        method: str,
        params: Mapping[str, Any],
        bind: Binder,
        opened: OpenedState | None = None,
        binding: Binding | None = None,
        *,
        early: Mapping[str, Any] | None = None,
        hold: Hold | None = None,
    ) -> None:
        self.method = method
        self.params = params
        self.opened = opened
        self.early = early
        self.hold = hold
        self._bind = bind
        self._binding = binding
        self._flow_told = False  # whether this round's answer was seen to continue or end its flow

    def __repr__(self) -> str:
        opened = self.opened.token_id[:8] if self.opened else None
        return f"Judged(method={self.method!r}, opened={opened!r}, early={self.early is not None})"

    def end_flow(self, codec: StateCodec) -> None:
        """Count the flow as ended by this round's answer, unless a new state continued it.

        Called for an answer without a state (:func:`seal_result` does), and once the round
        is over (:meth:`Boundary.run`), for adapters that do not show every answer to
        :func:`seal_result`. Counted once: a round that came in with a state ends its flow
        or continues it, not both.
        """
        if self.opened is not None and not self._flow_told:
            self._flow_told = True
            _telemetry.record_flow_rounds(codec.mode.value, self.opened.round)

    def continue_flow(self) -> None:
        """This round's answer carries the next state of its flow (:func:`seal_state`): it does not end."""
        self._flow_told = True

    def binding(self) -> Binding:
        """The request's binding; raises ``Exception`` from the binder when it cannot be made."""
        if self._binding is None:
            self._binding = _checked(self._bind())
        return self._binding


async def judge_request(
    codec: StateCodec,
    method: str,
    params: Mapping[str, Any] | None,
    bind: Binder,
    *,
    max_hold: float = DEFAULT_MAX_HOLD,
    holds: Holds | None = None,
    wait: Waiter | None = asyncio.sleep,
    reader: TokenReader | None = None,
) -> Judged:
    """Judge an inbound MRTR request; raise :class:`WireError` (-32602) to refuse it.

    Without a state (``requestState`` absent or ``null``, and no alias of it) nothing is
    checked or consumed, and ``bind`` is not called: the params come back as they are.
    With one, every check that can fail runs before the one that consumes the token, so
    a request refused for any reason never burns it:

    1. the shape: no alias of ``requestState``, a string, within ``codec.max_token_bytes``
       (cheap, before the argument digest);
    2. the binding, ``bind()`` (principal, audience, target, argument digest);
    3. ``codec.aunseal``: format, key, MAC or AEAD, times, flow budgets, binding, pacing
       and, last, the replay store (single use, awaited).

    A token that is ``too_early`` (a paced round retried before its time) is no refusal:
    the request is held until then when that is at most ``max_hold`` seconds away and
    ``holds`` has room (asynchronously, holding no thread: ``await wait(seconds)``) and
    judged again from the start (:func:`hold_early`); otherwise the verdict carries
    :attr:`Judged.early`, the same state to answer at once, and nothing was consumed. A
    hold whose ``wait`` raises (or is cancelled: its client went away) is abandoned:
    logged, counted, the exception re-raised, the token neither consumed nor the handler
    run. ``wait=None``: the caller holds the retry itself (to keep less of the request
    while it waits, with :func:`hold_early`): the verdict is early with :attr:`Judged.hold`
    set.

    Then the payload is read as UTF-8 text; only a holder of the keys can mint one that
    is not, and such a token could never be redeemed here anyway. Each refusal logs one
    WARNING line and counts one metric.

    A token ``reader`` reads (:class:`TokenReader`, after the shape checks) is judged by
    it instead of the codec, and answered the same way: a refusal is -32602, a store
    outage -32603 asking for the same request again.
    """
    if wait is None:
        return await _judge_once(codec, method, params, bind, max_hold=max_hold, reader=reader)

    async def judge(left: float) -> tuple[Judged, None]:
        return await _judge_once(codec, method, params, bind, max_hold=left, reader=reader), None

    verdict = await hold_early(judge, max_hold=max_hold, holds=holds, stays=_staying(wait))
    assert verdict is not None  # a Waiter raises when its client leaves: it never says so
    return verdict[0]


async def _judge_once(
    codec: StateCodec,
    method: str,
    params: Mapping[str, Any] | None,
    bind: Binder,
    *,
    max_hold: float,
    reader: TokenReader | None,
) -> Judged:
    """:func:`judge_request` without holding: an early retry's verdict says how long to hold it."""
    params = _NO_PARAMS if params is None else params
    if params.get(REQUEST_STATE) is None and not state_aliases(params):
        return Judged(method, params, bind)
    binding: Binding | None = None
    foreign = None
    try:
        token = _token_of(codec, params)
        if reader is not None and reader.reads(token):
            foreign = reader
            return await _judge_foreign(reader, codec, method, params, token=token, bind=bind)
        try:
            binding = _checked(bind())
        except Exception as exc:  # deny on error: an unbindable request is never bound to no one
            raise InvalidState(
                "malformed", f"the request cannot be bound: {type(exc).__name__}: {str(exc)[:200]}"
            ) from None
        opened = await _paced_unseal(codec, token, binding, max_hold)
        if not isinstance(opened, OpenedState):  # too early: held by the caller or answered at once
            _telemetry.record_unseal(codec.mode.value, method, "too_early", len(token))
            early = {"resultType": INPUT_REQUIRED, REQUEST_STATE: token}
            return Judged(method, params, bind, None, binding, early=early, hold=opened)
        try:
            plaintext = opened.payload.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidState(
                "malformed", "the sealed state is not UTF-8 text", kid=opened.kid, token_id=opened.token_id
            ) from None
    except InvalidState as exc:
        _log_rejection(codec, method, params, exc, binding, reader=foreign)
        raise WireError.refusing(exc.reason) from None
    _telemetry.record_unseal(codec.mode.value, method, "ok", len(token))
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "redeemed requestState on %s: flow=%s round=%d",
            method,
            opened.flow_id[:8],
            opened.round,
            extra=_telemetry.fields("token_redeemed", method=method, **flow_fields(opened)),
        )
    return Judged(method, {**params, REQUEST_STATE: plaintext}, bind, opened, binding)


async def _judge_foreign(
    reader: TokenReader,
    codec: StateCodec,
    method: str,
    params: Mapping[str, Any],
    *,
    token: str,
    bind: Binder,
) -> Judged:
    """The verdict on a token of ``reader``'s format; its answer's state starts a new statecodec flow."""
    state, binding = await reader.redeem(codec, method, params, token=token, bind=bind)
    _telemetry.record_unseal(reader.label, method, "ok", len(token))
    logger.debug(
        "redeemed a %s requestState on %s",
        reader.label,
        method,
        extra=_telemetry.fields("token_redeemed", method=method, format=reader.label),
    )
    return Judged(method, {**params, REQUEST_STATE: state}, bind, None, binding)


async def _paced_unseal(
    codec: StateCodec, token: str, binding: Binding, max_hold: float
) -> OpenedState | Hold | None:
    """``codec.aunseal``; for a ``too_early`` token, how long to hold it if that is within ``max_hold``.

    ``None``: the token is too early to hold (it was not consumed).
    """
    try:
        return await codec.aunseal(token, binding)
    except InvalidState as exc:
        if exc.reason != "too_early" or exc.retry_at is None:
            raise
        seconds = _wait_until(codec, exc)
        if seconds > max_hold:
            _log_early(
                logging.INFO, "early_retry_answered", exc, seconds,
                "answered with the same state (%.3fs early)", seconds,
            )  # fmt: skip
            return None
        # The verdict, not its traceback: the traceback's frames keep the request's parse
        # alive for the whole hold (several copies of the body).
        return Hold(seconds, exc.with_traceback(None))


#: ``stays(seconds)``: wait that long while the client is there; False as soon as it left.
#: An adapter's I/O for a hold (:func:`client_stays` for an ASGI ``receive``).
ClientStays: TypeAlias = Callable[[float], Awaitable[bool]]
_Verdict = TypeVar("_Verdict", bound=tuple[Any, ...])


async def hold_early(
    judge: Callable[[float], Awaitable[_Verdict]],
    *,
    max_hold: float,
    holds: Holds | None,
    stays: ClientStays,
) -> _Verdict | None:
    """Judge a request, holding an early retry until its time: the one hold loop of every adapter.

    ``judge(max_hold_left)`` judges the request from the start (re-reading it: an adapter
    keeps only its raw form during a hold) without holding, and returns a tuple whose
    first item is the :class:`Judged` verdict. An early verdict with a :attr:`Judged.hold`
    takes a place in ``holds`` (none left: answered at once, unconsumed), waits
    ``stays(seconds)`` and is judged again, at most :data:`HOLDS_MAX` times, within
    ``max_hold`` seconds in all. ``None``: the client left during a hold (logged and
    counted; nothing consumed, nothing run). A ``stays`` that raises (or is cancelled)
    abandons the hold the same way and the exception goes on.
    """
    held = 0.0
    for attempt in range(HOLDS_MAX + 1):
        verdict = await judge(max_hold - held)
        hold = verdict[0].hold
        if hold is None or attempt == HOLDS_MAX:
            return verdict  # judged, or early and answered at once
        if holds is not None and not holds.enter(hold.token_id):
            hold_refused(holds, hold.early, hold.seconds)
            return verdict
        del verdict  # nothing of the request but its raw form is kept during the hold
        try:
            present = await _hold(stays, hold)
        finally:
            if holds is not None:
                holds.leave(hold.token_id)
        if not present:
            return None
        held += hold.seconds
    raise AssertionError("unreachable: the last attempt returns")  # pragma: no cover


async def _hold(stays: ClientStays, hold: Hold) -> bool:
    early, seconds = hold.early, hold.seconds
    _log_early(logging.DEBUG, "early_retry_held", early, seconds, "held for %.3fs", seconds)
    try:
        present = await stays(seconds)
    except BaseException:
        hold_abandoned(early, seconds)
        raise
    if not present:
        hold_abandoned(early, seconds)
    return present


def _staying(wait: Waiter) -> ClientStays:
    """A :data:`Waiter` (raises when its client leaves) as a :data:`ClientStays`."""

    async def stays(seconds: float) -> bool:
        await wait(seconds)
        return True

    return stays


async def sleeping(seconds: float) -> bool:
    """The :data:`ClientStays` of a transport that cannot tell a client left: wait, and say it stayed."""
    await asyncio.sleep(seconds)
    return True


async def client_stays(receive: Callable[[], Awaitable[Mapping[str, Any]]], seconds: float) -> bool:
    """Wait ``seconds`` watching an ASGI ``receive`` whose request body is read: False once the client left.

    The next message of such a channel is ``http.disconnect`` when the client closes its
    connection; a channel that breaks means the same. Any other message is unexpected
    once the body is read: the rest of the wait goes unwatched.
    """
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    listener = asyncio.ensure_future(receive())
    try:
        done, _ = await asyncio.wait((listener,), timeout=seconds)
    finally:
        if not listener.done():
            listener.cancel()
    if not done:
        return True
    try:
        if listener.result().get("type") == "http.disconnect":
            return False
    except Exception:  # a receive channel that broke: the client is as good as gone
        return False
    await asyncio.sleep(max(until - loop.time(), 0.0))
    return True


def hold_refused(holds: Holds, early: InvalidState, seconds: float) -> None:
    """Log and count an early retry answered at once because ``holds`` is full."""
    _telemetry.record_shed("hold_limit")
    _log_early(
        logging.WARNING, "early_retry_answered", early, seconds,
        "answered with the same state: %d retries held, at most %d (%d of one token)",
        holds.held, holds.total, holds.per_token, reason="hold_limit",
    )  # fmt: skip


def hold_abandoned(early: InvalidState, seconds: float) -> None:
    """Log and count a hold given up because its client went away: nothing consumed, nothing run."""
    _telemetry.record_shed("hold_abandoned")
    _log_early(
        logging.INFO, "early_retry_abandoned", early, seconds,
        "abandoned by its client during the hold; token not consumed", reason="hold_abandoned",
    )  # fmt: skip


def _log_early(
    level: int,
    event: str,
    early: InvalidState,
    seconds: float,
    what: str,
    *args: object,
    reason: str = "too_early",
) -> None:
    """One record on an early retry, "early retry of flow F round R " then ``what``; its facts as fields."""
    if not logger.isEnabledFor(level):
        return
    fields = _telemetry.fields(
        event, reason=reason, kid=early.kid, token_id=early.token_id, flow_id=early.flow_id,
        round=early.round, wait=round(seconds, 3),
    )  # fmt: skip
    logger.log(
        level,
        "early retry of flow %s round %s " + what,
        (early.flow_id or "-")[:8],
        early.round,
        *args,
        extra=fields,
    )


def _wait_until(codec: StateCodec, early: InvalidState) -> float:
    """Seconds from now (the codec's clock) until ``early``'s token is redeemable; at least 1 ms."""
    try:
        wait = float(early.retry_at) - codec.clock()  # type: ignore[arg-type]
    except Exception:  # deny on error: a clock that fails now holds nothing
        wait = math.nan
    if not math.isfinite(wait):
        raise InvalidState(
            "internal_error", "the clock failed while pacing", kid=early.kid, token_id=early.token_id
        )
    return max(wait, 0.001)


def _token_of(codec: StateCodec, params: Mapping[str, Any]) -> str:
    """The cheap checks, before anything costly such as the argument digest."""
    aliases = state_aliases(params)
    if aliases:
        raise InvalidState("malformed", f"params carry {aliases[0][:40]!r}, an alias of requestState")
    token = params.get(REQUEST_STATE)
    if not isinstance(token, str):
        raise InvalidState("malformed", f"requestState is a JSON {type(token).__name__}, not a string")
    _format.check_size(token, codec.max_token_bytes)
    return token


def _checked(binding: object) -> Binding:
    if not isinstance(binding, Binding):
        raise TypeError(f"the binding callback returned {type(binding).__name__}, not a Binding")
    return binding


def _log_rejection(
    codec: StateCodec,
    method: str,
    params: Mapping[str, Any],
    exc: InvalidState,
    binding: Binding | None,
    *,
    reader: TokenReader | None = None,
) -> None:
    """One WARNING record and one metric for a rejected token.

    The facts are record fields (:func:`statecodec._telemetry.fields`): the reason, the
    detail, the kid, the first 8 hex digits of the token id (enough to correlate, useless
    to replay), the audience, the method and the target. Never the token.
    """
    token = params.get(REQUEST_STATE)
    size = len(token) if isinstance(token, str) else None
    mode = codec.mode.value if reader is None else reader.label
    _telemetry.record_unseal(mode, method, exc.reason, size)
    target = _target_of(method, params)
    audience = binding.audience if reader is None and binding is not None else None
    if reader is not None:
        audience = reader.audience
    logger.warning(
        "rejected %srequestState on %s %s: reason=%s detail=%r kid=%s token=%s flow=%s round=%s size=%s",
        "" if reader is None else f"{reader.label} ",
        method,
        "<no target>" if target is None else repr(_telemetry.clip(target)),
        exc.reason,
        exc.detail,
        exc.kid or "-",
        exc.token_id[:8] if exc.token_id else "-",
        exc.flow_id[:8] if exc.flow_id else "-",
        exc.round if exc.round is not None else "-",
        size if size is not None else "-",
        extra=_telemetry.rejection(
            exc, audience=audience, method=method, target=target, mode=mode, size=size
        ),
    )


# ---------------------------------------------------------------- sealing a result
@dataclass(frozen=True, slots=True)
class BoundaryOptions:
    """What an adapter asks of the boundary: the one options object every adapter and the proxy take.

    ``codec`` seals and opens; ``audience``, ``principal`` and ``binding`` say what a
    token is bound to, in the shape of the adapter that uses them (a string or
    ``audience(ctx)``; ``principal(ctx)`` or ``principal(scope, headers)``;
    ``binding(ctx, default)``); ``retry_after`` paces a requestState-only round;
    ``max_hold`` bounds how long an early retry is held, ``max_holds`` and
    ``max_holds_per_token`` how many are held at once (:class:`Holds`).

    Validated once, here, when a server is assembled: a setting that cannot work is a
    ``ValueError`` (``TypeError`` for a codec that is not one) before any request, never
    a surprise on the first paced round. What the codec validated of its own arguments
    (its ``ttl``, ``max_token_bytes``) is not checked again.
    """

    codec: StateCodec
    audience: Any = None
    principal: Any = None
    binding: Any = None
    retry_after: float | None = None
    max_hold: float = DEFAULT_MAX_HOLD
    max_holds: int = DEFAULT_MAX_HOLDS
    max_holds_per_token: int = DEFAULT_MAX_HOLDS_PER_TOKEN

    def __post_init__(self) -> None:
        if not isinstance(self.codec, StateCodec):
            raise TypeError(f"codec must be a statecodec.StateCodec, not {type(self.codec).__name__}")
        retry_after, max_hold = self.retry_after, self.max_hold
        if retry_after is not None and not (
            isinstance(retry_after, int | float) and 0 < retry_after < self.codec.ttl
        ):
            raise ValueError(
                f"retry_after must be a number of seconds between 0 and the codec's ttl, got {retry_after!r}"
            )
        if not (isinstance(max_hold, int | float) and 0 <= max_hold <= MAX_HOLD_LIMIT):
            raise ValueError(f"max_hold must be between 0 and {MAX_HOLD_LIMIT} seconds, got {max_hold!r}")
        _check_hold_counts(self.max_holds, self.max_holds_per_token)

    def holds(self) -> Holds:
        """A fresh :class:`Holds` with these bounds (one per adapter instance)."""
        return Holds(self.max_holds, self.max_holds_per_token)

    @classmethod
    def of(cls, codec: StateCodec | BoundaryOptions, settings: Mapping[str, Any]) -> BoundaryOptions:
        """An adapter's options: ``codec`` itself when it is a :class:`BoundaryOptions` (held as it is,
        validated already), else options built from ``codec`` and the keyword ``settings``.

        Settings beside a :class:`BoundaryOptions` are a ``TypeError`` (they would be ignored),
        as is a codec without ``audience`` (every adapter must be told which service it is).
        """
        if isinstance(codec, BoundaryOptions):
            if settings:
                raise TypeError(f"{', '.join(settings)} given beside a BoundaryOptions: set them in it")
            return codec
        if "audience" not in settings:
            raise TypeError("audience= is required: the service the tokens are for (None binds none)")
        return cls(codec, **settings)


_Result = TypeVar("_Result")


class Boundary:
    """One adapter's boundary: its options, its holds, and each round from the verdict to the flow's end.

    The adapter supplies I/O only: how to judge its request again after a hold (it keeps
    what it chooses of the request meanwhile), how to wait while its client is there
    (:data:`ClientStays`), how to run the handler and write the answer.
    """

    __slots__ = ("holds", "options")

    def __init__(self, options: BoundaryOptions) -> None:
        self.options = options
        self.holds = options.holds()

    async def judge(
        self, judge: Callable[[float], Awaitable[_Verdict]], stays: ClientStays
    ) -> _Verdict | None:
        """``judge`` through :func:`hold_early` with these options and holds; ``None``: the client left."""
        return await hold_early(judge, max_hold=self.options.max_hold, holds=self.holds, stays=stays)

    def seal(self, judged: Judged | None, result: Mapping[str, Any]) -> Mapping[str, Any]:
        """:func:`seal_result` with these options (the codec, ``retry_after``)."""
        return seal_result(self.options.codec, judged, result, retry_after=self.options.retry_after)

    async def run(self, judged: Judged, run: Callable[[], Awaitable[_Result]]) -> _Result:
        """Run the round (the handler, the answer sealed by :meth:`seal`); then its flow ends,
        unless the answer carried the next state. Not when ``run`` raises: nothing was answered."""
        result = await run()
        judged.end_flow(self.options.codec)
        return result


class Bounded:
    """An adapter holding its :class:`Boundary` as ``boundary``: its settings read from the options.

    Read, never copied: the options are validated once and held (:meth:`BoundaryOptions.of`).
    """

    __slots__ = ()
    boundary: Boundary

    @property
    def options(self) -> BoundaryOptions:
        return self.boundary.options

    @property
    def holds(self) -> Holds:
        return self.boundary.holds

    @property
    def codec(self) -> StateCodec:
        return self.boundary.options.codec

    @property
    def audience(self) -> Any:
        """A string, ``None`` or (the SDK middleware) ``audience(ctx)``."""
        return self.boundary.options.audience

    @property
    def principal(self) -> Any:
        """The adapter's ``principal`` callable, or ``None``."""
        return self.boundary.options.principal

    @property
    def binding(self) -> Any:
        """The SDK middleware's ``binding(ctx, default)`` callable, or ``None``."""
        return self.boundary.options.binding

    @property
    def retry_after(self) -> float | None:
        return self.boundary.options.retry_after

    @property
    def max_hold(self) -> float:
        return self.boundary.options.max_hold

    def __repr__(self) -> str:
        return f"{type(self).__name__}(codec={self.codec!r}, audience={self.audience!r})"


def check_pacing(codec: StateCodec, retry_after: float | None, max_hold: float) -> None:
    """Refuse pacing settings that cannot work (``ValueError``): :class:`BoundaryOptions`' check."""
    BoundaryOptions(codec, retry_after=retry_after, max_hold=max_hold)


def is_state_only(result: Mapping[str, Any]) -> bool:
    """An ``input_required`` result without ``inputRequests``: "not ready yet, come back"."""
    return result.get("resultType") == INPUT_REQUIRED and not result.get("inputRequests")


def flow_fields(opened: OpenedState | None) -> dict[str, Any]:
    """The ``extra=`` fields naming a round's flow in log records (empty without a state)."""
    if opened is None:
        return {}
    return {"flow_id": opened.flow_id, "round": opened.round}


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
    aliases = _aliases(result, _RESULT_KEYS)
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
    _telemetry.record_seal(codec.mode.value, method, "ok", len(token))
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
    mode = codec.mode.value
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


def _target_of(method: str, params: Mapping[str, Any] | None) -> str | None:
    try:
        return request_target(method, params)
    except ValueError:
        return None
