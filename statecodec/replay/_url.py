"""Pick a replay store from one URL string (configuration files, the CLI, environment)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import SplitResult, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from .base import ReplayStore
from .memory import MemoryReplayStore
from .sqlite import SQLiteReplayStore

FORMS: Final = (
    "memory: or memory:?max_entries=N (one process); "
    "sqlite:PATH or sqlite:///ABSOLUTE/PATH, options busy_timeout, purge_interval, synchronous "
    "(one machine); "
    "redis://HOST:PORT/DB, redis://USER:PASSWORD@HOST:PORT/DB, rediss://... (TLS), valkey://..., "
    "valkeys://..., options prefix, socket_timeout, connect_timeout, retries (many machines)"
)

_Parser = Callable[[str], Any]


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if not number >= 0 or number == float("inf"):
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
_REDIS_OPTIONS: Final[dict[str, _Parser]] = {
    "prefix": str,
    "socket_timeout": _seconds,
    "connect_timeout": _seconds,
    "socket_connect_timeout": _seconds,
    "retries": lambda value: _positive_int(value) if value != "0" else 0,
}
_REDIS_SCHEMES: Final = ("redis", "rediss", "valkey", "valkeys", "unix")


def store_from_url(url: str, **opts: Any) -> ReplayStore:
    """Build a replay store from a URL; keyword arguments override query options.

    >>> store_from_url("memory:?max_entries=1000")
    MemoryReplayStore(max_entries=1000)

    Raises :class:`ValueError` naming the accepted forms when the URL is not one of them.
    The Redis store imports the ``redis`` package only when a Redis URL is used.
    """
    if not isinstance(url, str):
        raise TypeError(f"the replay store URL must be a string, not {type(url).__name__}")
    scheme, colon, _ = url.partition(":")
    scheme = scheme.lower()
    if not colon:
        raise _bad(url, "it has no scheme")
    if scheme == "memory":
        return _memory(url, opts)
    if scheme == "sqlite":
        return _sqlite(url, opts)
    if scheme in _REDIS_SCHEMES:
        return _redis(url, opts)
    raise _bad(url, f"unknown scheme {scheme!r}")


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
    # Imported here: redis is an optional extra, needed only for these URLs.
    try:
        from redis.connection import URL_QUERY_ARGUMENT_PARSERS  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"the replay store {redact(url)!r} needs the redis package: pip install 'statecodec[redis]'",
            name="redis",
        ) from exc

    from .redis import RedisReplayStore, normalize_url  # noqa: PLC0415

    try:
        parts = urlsplit(normalize_url(url))
    except ValueError as exc:
        raise _bad(url, str(exc).partition(";")[0]) from None
    if parts.fragment:
        raise _bad(url, "a Redis URL has no '#fragment'")
    if parts.scheme != "unix" and not parts.hostname:
        raise _bad(url, "the host is missing")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port lazily
    except ValueError:
        raise _bad(url, "the port is not a number between 0 and 65535") from None
    db = parts.path.strip("/")
    if parts.scheme != "unix" and db and not db.isdigit():
        raise _bad(url, f"the database must be a number, not {db!r}")
    ours: dict[str, Any] = {}
    theirs: list[tuple[str, str]] = []
    for name, value in _pairs(url, parts.query):
        if name in _REDIS_OPTIONS:
            ours["connect_timeout" if name == "socket_connect_timeout" else name] = _convert(
                url, name, value, _REDIS_OPTIONS[name]
            )
        elif name in URL_QUERY_ARGUMENT_PARSERS or name.startswith("ssl_") or name == "client_name":
            theirs.append((name, value))  # redis-py parses these itself
        else:
            raise _bad(url, f"unknown option {name!r}; {_accepted(_REDIS_OPTIONS)} or a redis-py URL option")
    rebuilt = urlunsplit(parts._replace(query=urlencode(theirs)))
    try:
        return RedisReplayStore(rebuilt, **{**ours, **opts})
    except ValueError as exc:
        raise ValueError(f"invalid replay store URL {redact(url)!r}: {exc}") from None


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
            raise _bad(url, f"unknown option {name!r}; {_accepted(known)}")
        options[name] = _convert(url, name, value, known[name])
    return options


def _convert(url: str, name: str, value: str, parse: _Parser) -> Any:
    try:
        return parse(value)
    except ValueError:
        raise _bad(url, f"bad value {value!r} for {name}") from None


def _accepted(known: dict[str, _Parser]) -> str:
    return "accepted: " + ", ".join(sorted(known))


def _bad(url: str, why: str) -> ValueError:
    return ValueError(f"invalid replay store URL {redact(url)!r}: {why}. Accepted forms: {FORMS}")


def redact(url: str) -> str:
    """The URL without its password, for error messages and logs."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # unparseable: show only what cannot be a secret
        return url.partition(":")[0] + ":<unparseable>"
    if password is None:
        return url
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + parts.netloc.rpartition("@")[2]))
