"""A round from start to end: the adapters' options, and :class:`Boundary`, which judges,
holds, seals and ends a flow."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._codec import StateCodec
from ._holds import (
    DEFAULT_MAX_HOLD,
    DEFAULT_MAX_HOLDS,
    DEFAULT_MAX_HOLDS_PER_TOKEN,
    MAX_HOLD_LIMIT,
    ClientStays,
    Holds,
    Verdict,
    check_hold_counts,
    hold_early,
)
from ._judge import Judged
from ._seal import seal_result


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
        check_hold_counts(self.max_holds, self.max_holds_per_token)

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

    def judge(
        self, judge: Callable[[float], Awaitable[Verdict]], stays: ClientStays
    ) -> Awaitable[Verdict | None]:
        """``judge`` through :func:`hold_early` with these options and holds; ``None``: the client left."""
        return hold_early(judge, max_hold=self.options.max_hold, holds=self.holds, stays=stays)

    def seal(self, judged: Judged | None, result: Mapping[str, Any]) -> Mapping[str, Any]:
        """:func:`seal_result` with these options (the codec, ``retry_after``)."""
        return seal_result(self.options.codec, judged, result, retry_after=self.options.retry_after)

    def end(self, judged: Judged) -> None:
        """The round of ``judged`` is over, its answer written: its flow ends unless that answer
        carried the next state (:meth:`Judged.end_flow`). Not called when the round raised:
        nothing was answered."""
        judged.end_flow(self.options.codec)


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
