"""Judging a request: the shape checks, the binding, the codec (or another format's
:class:`TokenReader`), the verdict."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol

from .. import _format, _telemetry
from .._binding import Binding
from .._codec import OpenedState, StateCodec
from .._errors import InvalidState
from ._bound import Binder, flow_fields, state_aliases, target_or_none
from ._holds import DEFAULT_MAX_HOLD, Hold, Holds, Waiter, hold_early, log_early, staying, wait_until
from ._wire import INPUT_REQUIRED, REQUEST_STATE, WireError

logger = logging.getLogger("statecodec")


_NO_PARAMS: Final[Mapping[str, Any]] = MappingProxyType({})


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


@dataclass(slots=True, eq=False, repr=False)
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

    method: str
    params: Mapping[str, Any]
    _bind: Binder
    opened: OpenedState | None = None
    _binding: Binding | None = None
    _: KW_ONLY
    early: Mapping[str, Any] | None = None
    hold: Hold | None = None
    #: Whether this round's answer was seen to continue or end its flow.
    _flow_told: bool = field(default=False, init=False)

    def __repr__(self) -> str:
        opened = self.opened.token_id[:8] if self.opened else None
        return f"Judged(method={self.method!r}, opened={opened!r}, early={self.early is not None})"

    def end_flow(self, codec: StateCodec) -> None:
        """Count the flow as ended by this round's answer, unless a new state continued it.

        Called for an answer without a state (:func:`seal_result` does), and once the round
        is over (:meth:`Boundary.end`), for adapters that do not show every answer to
        :func:`seal_result`. Counted once: a round that came in with a state ends its flow
        or continues it, not both.
        """
        if self.opened is not None and not self._flow_told:
            self._flow_told = True
            # str() of the StrEnum is its value, read without enum's Python-level property.
            _telemetry.record_flow_rounds(str(codec.mode), self.opened.round)

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
    if wait is not None:
        return await _judge_holding(
            codec, method, params, bind, max_hold=max_hold, holds=holds, wait=wait, reader=reader
        )
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
            _telemetry.record_unseal(str(codec.mode), method, "too_early", len(token))
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
    _telemetry.record_unseal(str(codec.mode), method, "ok", len(token))
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "redeemed requestState on %s: flow=%s round=%d",
            method,
            opened.flow_id[:8],
            opened.round,
            extra=_telemetry.fields("token_redeemed", method=method, **flow_fields(opened)),
        )
    return Judged(method, {**params, REQUEST_STATE: plaintext}, bind, opened, binding)


async def _judge_holding(
    codec: StateCodec,
    method: str,
    params: Mapping[str, Any] | None,
    bind: Binder,
    *,
    max_hold: float,
    holds: Holds | None,
    wait: Waiter,
    reader: TokenReader | None,
) -> Judged:
    """:func:`judge_request` with its hold: judged without one, and again after each wait."""

    async def judge(left: float) -> tuple[Judged]:
        return (await judge_request(codec, method, params, bind, max_hold=left, wait=None, reader=reader),)

    verdict = await hold_early(judge, max_hold=max_hold, holds=holds, stays=staying(wait))
    if verdict is None:  # a Waiter raises when its client leaves: it never says so
        raise RuntimeError("a hold without a client to watch ended as if its client had left")
    return verdict[0]


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
        seconds = wait_until(codec, exc)
        if seconds > max_hold:
            log_early(
                logging.INFO, "early_retry_answered", exc, seconds,
                "answered with the same state (%.3fs early)", seconds,
            )  # fmt: skip
            return None
        # The verdict, not its traceback: the traceback's frames keep the request's parse
        # alive for the whole hold (several copies of the body).
        return Hold(seconds, exc.with_traceback(None))


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
    mode = str(codec.mode) if reader is None else reader.label
    _telemetry.record_unseal(mode, method, exc.reason, size)
    target = target_or_none(method, params)
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
