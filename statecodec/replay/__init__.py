"""Replay stores: remember consumed token ids so each requestState redeems only once.

Pick one by URL with :func:`store_from_url`, or build one directly:

* :class:`MemoryReplayStore` (``memory:``): one process, tests.
* :class:`SQLiteReplayStore` (``sqlite:PATH``): one machine, any number of worker processes.
* :class:`RedisReplayStore` (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
  ``redis+sentinel://``; ``valkey`` spells ``redis``): many machines.
* :class:`PostgresReplayStore` (``postgresql://``, ``postgres://``): many machines, on the
  database the fleet already runs.

``redis`` and ``psycopg`` are imported only when :class:`RedisReplayStore` or
:class:`PostgresReplayStore` is first used, so that ``import statecodec`` works without
the ``redis`` or ``postgres`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._url import store_from_url
from .base import ReplayCheckUnsupported, ReplayStore
from .memory import MemoryReplayStore
from .sqlite import SQLiteReplayStore

if TYPE_CHECKING:
    from .postgres import PostgresReplayStore
    from .redis import RedisReplayStore

__all__ = [
    "MemoryReplayStore",
    "PostgresReplayStore",
    "RedisReplayStore",
    "ReplayCheckUnsupported",
    "ReplayStore",
    "SQLiteReplayStore",
    "store_from_url",
]


def __getattr__(name: str) -> Any:
    if name == "RedisReplayStore":
        try:
            from .redis import RedisReplayStore  # noqa: PLC0415 - redis is an optional extra
        except ModuleNotFoundError as exc:
            if exc.name != "redis":
                raise
            raise ModuleNotFoundError(
                "RedisReplayStore needs the redis package: pip install 'statecodec[redis]'", name="redis"
            ) from exc
        return RedisReplayStore
    if name == "PostgresReplayStore":
        try:
            from .postgres import PostgresReplayStore  # noqa: PLC0415 - psycopg is an optional extra
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] not in ("psycopg", "psycopg_pool"):
                raise
            raise ModuleNotFoundError(
                "PostgresReplayStore needs psycopg: pip install 'statecodec[postgres]'", name=exc.name
            ) from exc
        return PostgresReplayStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
