"""statecodec: tamper-proof, bound, expiring, single-use requestState for MCP.

The public surface is re-exported here; everything in ``_modules`` is private.
Optional integrations live in subpackages and import their dependencies lazily:
``statecodec.replay`` (memory, SQLite, Redis/Valkey), ``statecodec.kms`` (files,
environment, Vault/OpenBao), ``statecodec.adapters`` (mcp, fastmcp, ASGI),
``statecodec.compat`` (the MCP SDKs' own formats).
"""

from ._binding import UNBOUND, Binding, argument_digest, canonical_json
from ._codec import Mode, OpenedState, StateCodec
from ._errors import (
    REASONS,
    FlowBudgetExceeded,
    InvalidState,
    KeyUnavailable,
    ReplayStoreError,
    StateCodecError,
)
from ._keys import Key, KeyProvider, KeyRing
from .replay.base import ReplayStore

__version__ = "0.1.0"

__all__ = [
    "REASONS",
    "UNBOUND",
    "Binding",
    "FlowBudgetExceeded",
    "InvalidState",
    "Key",
    "KeyProvider",
    "KeyRing",
    "KeyUnavailable",
    "Mode",
    "OpenedState",
    "ReplayStore",
    "ReplayStoreError",
    "StateCodec",
    "StateCodecError",
    "argument_digest",
    "canonical_json",
]
