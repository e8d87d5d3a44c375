"""The one exception a key source raises, with a stable ``kind`` callers may switch on."""

from __future__ import annotations

from typing import Final, Literal

from .._errors import StateCodecError

Kind = Literal["config", "unreachable", "denied", "missing", "invalid", "conflict", "unsupported", "internal"]

KINDS: Final[tuple[Kind, ...]] = (
    "config",  # a bad URL, a missing VAULT_ADDR or credential: fix the deployment
    "unreachable",  # connection refused, timeout, sealed, 5xx: usually transient
    "denied",  # the token's policy does not allow the call, or the login failed
    "missing",  # no such file, variable, transit key or KV document
    "invalid",  # the source answered, but not with usable keys
    "conflict",  # a concurrent writer kept winning the check-and-set race
    "unsupported",  # the operation makes no sense for this source (rotating env:)
    "internal",  # anything unexpected; fail closed
)
#: The kinds a retry may cure (the source is down or busy), as opposed to configuration or
#: content that someone has to fix.
TRANSIENT_KINDS: Final[frozenset[Kind]] = frozenset({"unreachable", "conflict"})


class KeySourceError(StateCodecError):
    """Keys could not be loaded, rotated or created.

    The message is one line and says what to do ("VAULT_ADDR is not set", "permission denied reading
    transit/export/encryption-key/mcp-state"); it never contains key material or tokens.
    ``kind`` is one of :data:`KINDS`; ``source`` describes where the keys were sought.
    """

    def __init__(self, message: str, *, kind: Kind = "invalid", source: str | None = None) -> None:
        # One line, always: it ends up in a log line, a CLI error, a JSON "message".
        message = " ".join(part for line in message.splitlines() if (part := line.strip()))
        self.kind: Kind = kind
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)
        self.message = message

    @property
    def transient(self) -> bool:
        """Whether a retry may cure this (:data:`TRANSIENT_KINDS`): retry later, rather than fix something."""
        return self.kind in TRANSIENT_KINDS
