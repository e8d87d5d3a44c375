"""``statecodec probe``: audit any MCP server's requestState from the outside.

Needs the ``mcp`` extra for :func:`probe` and :class:`Settings` only: they are imported
when first used, so the model (verdicts, results, the report, :class:`ProbeError`, which
checks have side effects), :mod:`._model`'s ``__all__``, loads without it, and the CLI
refuses a run it may not make before it imports the ``mcp`` client.
"""

from typing import TYPE_CHECKING, Any

from . import _model
from ._model import *  # noqa: F403 - the model's public names, listed once in its __all__

if TYPE_CHECKING:
    from ._engine import Settings, probe

__all__ = ["Settings", "probe"]
__all__ += _model.__all__


def __getattr__(name: str) -> Any:
    if name in ("Settings", "probe"):
        from . import _engine  # noqa: PLC0415 - the mcp client, only when a probe runs

        value = globals()[name] = getattr(_engine, name)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
