"""``statecodec probe``: audit any MCP server's requestState from the outside.

Needs the ``mcp`` extra; nothing here is imported by ``import statecodec``. The public
model (verdicts, results, the report, :class:`ProbeError`) is :mod:`._model`'s ``__all__``.
"""

from . import _model
from ._engine import Settings, probe
from ._model import *  # noqa: F403 - the model's public names, listed once in its __all__

__all__ = ["Settings", "probe"]
__all__ += _model.__all__
