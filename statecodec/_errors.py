"""The one exception every rejected token raises, and its stable reasons.

Following Fernet and the MCP SDK boundary, every way a token can be wrong ends in a
single exception type, :class:`InvalidState`. The *reason* is a short stable string
that code may switch on and metrics may count; the *detail* is a human sentence for
logs and the CLI. Neither ever contains key material, and adapters never put either on
the wire: what clients see is the adapters' business (``statecodec.boundary``),
and this module knows nothing of MCP.

Every exception a user can catch derives from :class:`StateCodecError`, so one
``except StateCodecError`` catches all of statecodec's refusals and nothing else::

    StateCodecError
    ├── InvalidState            a requestState token was rejected (``reason`` in REASONS)
    ├── FlowBudgetExceeded      sealing the next round refused (also a ValueError)
    ├── KeyUnavailable          no key can mint right now
    ├── ReplayStoreError        a replay store could not answer; unseal fails closed
    │   └── ReplayCheckUnsupported   the store cannot tell "consumed?" without consuming
    ├── KeySourceError          statecodec.kms: a key source failed (``kind`` in kms.KINDS)
    ├── WireError               statecodec.boundary: a request the boundary refuses
    ├── ProbeError              statecodec.probe: the probe could not run
    └── Unauthenticated         statecodec.proxy: credentials presented but not verifiable

``tests/core/test_errors_tree.py`` walks every public module and holds every exception it
exports to this tree; exceptions of private modules (``_name``) never leave them.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any, Final, Literal, get_args

Reason = Literal[
    "malformed",
    "too_large",
    "unsupported_version",
    "wrong_mode",
    "unknown_key",
    "tampered",
    "expired",
    "not_yet_valid",
    "binding_mismatch",
    "round_limit",
    "flow_expired",
    "too_early",
    "replayed",
    "store_unavailable",
    "internal_error",
]

REASONS: Final[tuple[Reason, ...]] = get_args(Reason)


class StateCodecError(Exception):
    """Base class of every exception statecodec raises on purpose."""


@dataclass(eq=False, repr=False)  # fields declared, not copied; identity and repr stay an exception's
class InvalidState(StateCodecError):  # noqa: N818 - the name is the public contract
    """A requestState token was rejected.

    ``reason`` is one of :data:`REASONS`; ``detail`` says what exactly was wrong
    (for example ``"expired 3m12s ago"``), and ``kid`` / ``token_id`` identify the token
    when the header could be read; ``flow_id`` and ``round`` its flow once the header is
    authentic. ``too_early`` is not an attack but a retry ahead of the server's pacing:
    ``retry_at`` (Unix time) says when the token becomes redeemable. Safe to log; never
    shown to MCP clients.
    """

    reason: Reason
    detail: str = ""
    _: KW_ONLY
    kid: str | None = None
    token_id: str | None = None
    flow_id: str | None = None
    round: int | None = None
    retry_at: float | None = None

    def __post_init__(self) -> None:
        super().__init__(f"{self.reason}: {self.detail}" if self.detail else self.reason)

    @property
    def ids(self) -> dict[str, Any]:
        """What names the token and its flow: ``kid``, ``token_id``, ``flow_id``, ``round`` (None if unread).

        The one list of them: log records, the CLI's ``--json`` and pickling all take it.
        """
        return {"kid": self.kid, "token_id": self.token_id, "flow_id": self.flow_id, "round": self.round}

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments need help to survive pickling (process pools, logging queues).
        return (_rebuild, (self.reason, self.detail, {**self.ids, "retry_at": self.retry_at}))


def _rebuild(reason: Reason, detail: str, fields: dict[str, Any]) -> InvalidState:
    return InvalidState(reason, detail, **fields)


class FlowBudgetExceeded(StateCodecError, ValueError):  # noqa: N818 - says what happened
    """Sealing the next round of a flow was refused: past ``max_rounds`` or ``max_flow_age``.

    ``reason`` is ``"round_limit"`` or ``"flow_expired"`` (the reasons a verifier would give
    the token), ``flow_id`` and ``round`` name the round that was refused. A ``ValueError``
    too, like every other refusal to seal.
    """

    def __init__(self, reason: Reason, detail: str, *, flow_id: str, round: int) -> None:
        self.reason: Reason = reason
        self.detail = detail
        self.flow_id = flow_id
        self.round = round
        super().__init__(f"{reason}: {detail}")


class KeyUnavailable(StateCodecError):  # noqa: N818
    """No key can mint right now (empty ring, no primary, or a key manager gone stale)."""


class ReplayStoreError(StateCodecError):
    """A replay store could not answer (unreachable, locked, full). Unseal fails closed."""


class ReplayCheckUnsupported(ReplayStoreError):  # noqa: N818 - says what happened
    """The store has no read-only check (:meth:`ReplayStore.is_consumed`): a third-party store's default."""
