"""Which extra to install when an optional module is missing, told in one line.

The one place that maps a missing module to the extra of pyproject.toml that brings it:
the CLI, the key sources and the adapters turn a :class:`ModuleNotFoundError` into
``... needs the proxy extra (httptools is missing): pip install 'statecodec[proxy]'``
through :func:`missing_extra`. ``tests/cli/test_missing_extras.py`` holds the table to
pyproject.toml's extras, package by package.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Final

#: The top-level modules each extra's own packages install (not those of the extras it includes).
EXTRA_MODULES: Final[Mapping[str, tuple[str, ...]]] = {
    "mcp": ("mcp", "mcp_types", "pydantic", "httpx2", "anyio", "uvicorn"),
    "fastmcp": ("fastmcp",),
    "proxy": ("httptools", "uvloop", "httpx", "jwt", "uvicorn", "anyio"),
    "vault": ("hvac", "requests"),
    "redis": ("redis", "hiredis"),
    "postgres": ("psycopg", "psycopg_pool"),
    "ops": ("prometheus_client", "pythonjsonlogger"),
    "otel": ("opentelemetry",),
}
#: The extras an extra installs with its own packages (``fastmcp = [..., "statecodec[mcp]"]``).
EXTRA_INCLUDES: Final[Mapping[str, tuple[str, ...]]] = {"fastmcp": ("mcp",), "proxy": ("ops",)}


def install_command(extra: str) -> str:
    return f"pip install 'statecodec[{extra}]'"


def modules_of(extra: str) -> frozenset[str]:
    """The top-level modules installing ``extra`` brings: its own and those of the extras it includes."""
    inner = (modules_of(included) for included in EXTRA_INCLUDES.get(extra, ()))
    return frozenset(EXTRA_MODULES[extra]).union(*inner)


def extra_for(module: str | None, needed: str | None = None) -> str | None:
    """The extra to install for the missing ``module``; ``None`` when no extra brings it (a bug).

    ``needed`` is the extra the code being loaded needs: a missing module that is neither
    statecodec's own nor the standard library's is one of its packages or one they need
    (scripts/deps holds every import of that code to the extra's packages), so installing
    it is the fix. Without ``needed``, the first extra that lists the module.
    """
    top = (module or "").partition(".")[0]
    if not top or top == "statecodec" or top in sys.stdlib_module_names:
        return None
    if needed is not None:
        return needed
    return next((extra for extra, modules in EXTRA_MODULES.items() if top in modules), None)


def missing_extra(exc: ImportError, needed: str | None, what: str) -> ModuleNotFoundError | None:
    """The one-line error for ``exc``, a failed import of ``what``'s code; ``None`` if no extra is to blame.

    >>> str(missing_extra(ModuleNotFoundError(name="hvac"), "vault", "the key source 'vault-kv:kv/x'"))
    "the key source 'vault-kv:kv/x' needs the vault extra (hvac is missing): pip install 'statecodec[vault]'"
    """
    if (extra := extra_for(exc.name, needed)) is None:
        return None
    return ModuleNotFoundError(
        f"{what} needs the {extra} extra ({exc.name} is missing): {install_command(extra)}", name=exc.name
    )
