"""``statecodec probe``: audit any MCP server's requestState from the outside.

Needs the ``mcp`` extra; nothing here is imported by ``import statecodec``.
"""

from ._engine import Settings, probe
from ._model import (
    CHECK_TITLES,
    CHECKS,
    Attempt,
    Baseline,
    CheckResult,
    Outcome,
    ProbeError,
    Reply,
    Report,
    Verdict,
)

__all__ = [
    "CHECKS",
    "CHECK_TITLES",
    "Attempt",
    "Baseline",
    "CheckResult",
    "Outcome",
    "ProbeError",
    "Reply",
    "Report",
    "Settings",
    "Verdict",
    "probe",
]
