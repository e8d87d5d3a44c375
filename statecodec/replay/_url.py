"""Pick a replay store from one URL string (configuration files, the CLI, environment).

PostgreSQL URLs are libpq's to understand: :mod:`._postgres_url` takes statecodec's own
options out of the query and hands the rest to libpq as written.
Redis URLs are parsed by :mod:`._redis_url`, the messages' forms and secret scrubbing
live in :mod:`._url_text`: neither imports this module, so the Redis store, which this
module imports only when a Redis URL is used, never imports it back.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any, Final
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from .._errors import StateCodecError
from ._postgres_url import POSTGRES_SCHEMES, parse_postgres_url
from ._redis_url import REDIS_SCHEMES, parse_redis_url
from ._url_text import _bad, _convert, _Parser, _seconds, redact, scrub, url_secrets
from .base import ReplayStore
from .memory import MemoryReplayStore
from .sqlite import SQLiteReplayStore

# redact too: the CLI, tests and benchmarks import it from here.
__all__ = ["OPEN_ERRORS", "SCHEMA_SCHEMES", "checked", "redact", "scheme", "store_from_url"]

#: What :func:`store_from_url` raises when it cannot give a store: a malformed URL or option
#: (ValueError), a missing extra (ImportError), a file or database it cannot open (OSError,
#: sqlite3.Error), a store's own refusal (StateCodecError). Anything else is a bug.
OPEN_ERRORS: Final = (ValueError, ImportError, OSError, StateCodecError, sqlite3.Error)
#: The schemes whose store has a schema to create, once, as a role that may
#: (``statecodec replay init``): SQLite creates its table when the file is opened, memory
#: and Redis need none.
SCHEMA_SCHEMES: Final = POSTGRES_SCHEMES


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError
    return number


def _synchronous(value: str) -> str:
    if value.upper() not in ("NORMAL", "FULL"):
        raise ValueError
    return value.upper()


_MEMORY_OPTIONS: Final[dict[str, _Parser]] = {"max_entries": _positive_int}
_SQLITE_OPTIONS: Final[dict[str, _Parser]] = {
    "busy_timeout": _seconds,
    "purge_interval": _seconds,
    "synchronous": _synchronous,
}


def store_from_url(url: str, **opts: Any) -> ReplayStore:
    """Build a replay store from a URL; keyword arguments override query options.

    >>> store_from_url("memory:?max_entries=1000")
    MemoryReplayStore(max_entries=1000)

    Raises :class:`ValueError` naming the accepted forms when the URL is not one of them.
    The Redis store imports the ``redis`` package only when a Redis URL is used, and
    connects only when first used (or checked with :meth:`ReplayStore.check`).
    """
    if not isinstance(url, str):
        raise TypeError(f"the replay store URL must be a string, not {type(url).__name__}")
    kind = scheme(url)
    if ":" not in url:
        raise _bad(url, "it has no scheme")
    if kind == "memory":
        return _memory(url, opts)
    if kind == "sqlite":
        return _sqlite(url, opts)
    if kind in REDIS_SCHEMES:
        return _redis(url, opts)
    if kind in POSTGRES_SCHEMES:
        return _postgres(url, opts)
    raise _bad(url, f"unknown scheme {kind!r}")


def scheme(url: str) -> str:
    """What picks the store: the URL up to its first ``:``, lower-cased (``"sqlite"`` for ``SQLite:x.db``)."""
    return url.partition(":")[0].lower()


def checked(store: ReplayStore) -> ReplayStore:
    """``store`` once it answers (:meth:`ReplayStore.check`); closed, and the check's error raised, if not.

    For a start-up: an unreachable or misconfigured store stops it, instead of failing
    every request later, and leaves no connection or file open behind it. Whatever a
    custom store's ``check`` raises goes on as it came: the caller decides what it means.
    """
    try:
        store.check()
    except BaseException:
        store.close()
        raise
    return store


def _memory(url: str, opts: dict[str, Any]) -> ReplayStore:
    parts = _split(url)
    if parts.netloc or parts.path or parts.fragment:
        raise _bad(url, "memory: takes no host or path")
    return MemoryReplayStore(**{**_options(url, parts.query, _MEMORY_OPTIONS), **opts})


def _sqlite(url: str, opts: dict[str, Any]) -> ReplayStore:
    parts = _split(url)
    if parts.netloc:
        raise _bad(
            url,
            f"{parts.netloc!r} would be a host; write sqlite:relative/path.db or sqlite:///absolute/path.db",
        )
    if parts.fragment:
        raise _bad(url, "a '#' in the path must be written %23")
    path = unquote(parts.path)
    if not path:
        raise _bad(url, "the path is missing")
    if path == ":memory:":
        raise _bad(url, "an in-memory SQLite database is private to each thread; use memory:")
    if path.startswith("//"):  # sqlite:////abs/path, SQLAlchemy's absolute form
        path = "/" + path.lstrip("/")
    return SQLiteReplayStore(
        os.path.expanduser(path), **{**_options(url, parts.query, _SQLITE_OPTIONS), **opts}
    )


def _redis(url: str, opts: dict[str, Any]) -> ReplayStore:
    parse_redis_url(url)  # a malformed URL is a ValueError even without the redis package
    try:
        from .redis import RedisReplayStore  # noqa: PLC0415 - redis is an optional extra
    except ModuleNotFoundError as exc:
        if exc.name != "redis":
            raise
        raise ModuleNotFoundError(
            f"the replay store {redact(url)!r} needs the redis package: pip install 'statecodec[redis]'",
            name="redis",
        ) from exc
    try:
        return RedisReplayStore(url, **opts)
    except ValueError as exc:
        raise _bad(url, scrub(str(exc), url_secrets(url))) from None


def _postgres(url: str, opts: dict[str, Any]) -> ReplayStore:
    parse_postgres_url(url)  # a malformed URL is a ValueError even without psycopg
    try:
        from .postgres import PostgresReplayStore  # noqa: PLC0415 - psycopg is an optional extra
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in ("psycopg", "psycopg_pool"):
            raise
        raise ModuleNotFoundError(
            f"the replay store {redact(url)!r} needs psycopg: pip install 'statecodec[postgres]'",
            name=exc.name,
        ) from exc
    try:
        return PostgresReplayStore(url, **opts)
    except ValueError as exc:
        raise _bad(url, scrub(str(exc), url_secrets(url))) from None


# ---------------------------------------------------------------------------- helpers
def _split(url: str) -> SplitResult:
    try:
        return urlsplit(url)
    except ValueError as exc:
        raise _bad(url, str(exc)) from None


def _pairs(url: str, query: str) -> list[tuple[str, str]]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise _bad(url, "the query must be name=value pairs joined by '&'") from None
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise _bad(url, "an option is given twice")
    return pairs


def _options(url: str, query: str, known: dict[str, _Parser]) -> dict[str, Any]:
    options = {}
    for name, value in _pairs(url, query):
        if name not in known:
            raise _bad(url, f"unknown option {name!r}; accepted: {', '.join(sorted(known))}")
        options[name] = _convert(url, name, value, known[name])
    return options
