"""Pick a replay store from one URL string (configuration files, the CLI, environment).

PostgreSQL URLs are libpq's to understand: this module takes statecodec's own options
out of the query and hands the rest to libpq as written.

Redis URLs are redis-py's to understand. This module only recognises the scheme (which
says: one server, a cluster, or a Sentinel-managed primary), takes statecodec's own
options out of the query, and splits a list of seed hosts, which redis-py's URL parser
does not know; the rest of the URL reaches redis-py as the user wrote it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import SplitResult, parse_qsl, unquote, unquote_plus, urlsplit

from .base import ReplayStore
from .memory import MemoryReplayStore
from .sqlite import SQLiteReplayStore

FORMS: Final = (
    "memory: or memory:?max_entries=N (one process); "
    "sqlite:PATH or sqlite:///ABSOLUTE/PATH, options busy_timeout, purge_interval, synchronous "
    "(one machine); "
    "redis://[USER:PASSWORD@]HOST:PORT/DB, rediss://... (TLS), unix:///PATH?db=N, "
    "redis+cluster://HOST:PORT[,HOST:PORT...], redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB], "
    "rediss+cluster://..., rediss+sentinel://... (valkey/valkeys spell redis/rediss), options prefix, "
    "wait, wait_timeout, socket_timeout, connect_timeout, retries and redis-py's own (many machines); "
    "postgresql://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/DB (postgres:// too), options table, "
    "timeout, pool_size, purge_interval and libpq's own (many machines)"
)

Topology = Literal["server", "cluster", "sentinel"]

_Parser = Callable[[str], Any]


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError
    return number


def _count(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError
    return number


def _seconds(value: str) -> float:
    number = float(value)
    if not number >= 0 or number == math.inf:
        raise ValueError
    return number


def _positive_seconds(value: str) -> float:
    number = _seconds(value)
    if number == 0:
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
#: statecodec's own options in a Redis URL; every other query option is redis-py's.
REDIS_STORE_OPTIONS: Final[dict[str, _Parser]] = {
    "prefix": str,
    "wait": _count,
    "wait_timeout": _positive_seconds,
    "socket_timeout": _positive_seconds,
    "connect_timeout": _positive_seconds,
    "socket_connect_timeout": _positive_seconds,
    "retries": _count,
    "sentinel_username": str,
    "sentinel_password": str,
}
_ALIASES: Final = {"socket_connect_timeout": "connect_timeout"}

#: scheme -> (the scheme redis-py parses, the topology). valkey spells redis.
_SPELLINGS: Final = (("redis", "redis"), ("valkey", "redis"), ("rediss", "rediss"), ("valkeys", "rediss"))
_SUFFIXES: Final[tuple[tuple[str, Topology], ...]] = (
    ("", "server"),
    ("+cluster", "cluster"),
    ("+sentinel", "sentinel"),
)
REDIS_SCHEMES: Final[dict[str, tuple[str, Topology]]] = {
    **{
        spelling + suffix: (base, topology) for spelling, base in _SPELLINGS for suffix, topology in _SUFFIXES
    },
    "unix": ("unix", "server"),
}
_DEFAULT_PORTS: Final[dict[Topology, int]] = {"server": 6379, "cluster": 6379, "sentinel": 26379}


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
    scheme, colon, _ = url.partition(":")
    scheme = scheme.lower()
    if not colon:
        raise _bad(url, "it has no scheme")
    if scheme == "memory":
        return _memory(url, opts)
    if scheme == "sqlite":
        return _sqlite(url, opts)
    if scheme in REDIS_SCHEMES:
        return _redis(url, opts)
    if scheme in POSTGRES_SCHEMES:
        return _postgres(url, opts)
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


# ---------------------------------------------------------------------------- PostgreSQL URLs
POSTGRES_SCHEMES: Final = ("postgresql", "postgres")
#: statecodec's own options in a PostgreSQL URL; every other query option is libpq's.
POSTGRES_STORE_OPTIONS: Final[dict[str, _Parser]] = {
    "table": str,
    "timeout": _positive_seconds,
    "pool_size": _positive_int,
    "purge_interval": _positive_seconds,
}


@dataclass(frozen=True)
class PostgresTarget:
    """What a PostgreSQL URL names: the conninfo for libpq, and statecodec's options.

    ``conninfo`` is the user's URL without statecodec's options, everything else as
    written (libpq parses it: hosts, ports, ``host=a,b``, ``sslmode``, ``options``...).
    """

    conninfo: str
    options: Mapping[str, Any]
    #: libpq's query parameter names present in the URL (to know which defaults to add).
    libpq_keys: frozenset[str]
    #: The URL as given, with every secret replaced (:func:`redact`).
    where: str
    #: The secret values in the URL, to scrub from any message (:func:`scrub`).
    secrets: tuple[str, ...]


def parse_postgres_url(url: str) -> PostgresTarget:
    """Split a PostgreSQL URL into what libpq parses and statecodec's own options."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in POSTGRES_SCHEMES:
        raise _bad(url, "not a PostgreSQL URL (postgresql://...)")
    rest, hash_sign, _ = rest.partition("#")
    if hash_sign:
        raise _bad(url, "a PostgreSQL URL has no '#fragment'; write a '#' in a password as %23")
    location, _, query = rest.partition("?")
    theirs: list[str] = []
    ours: dict[str, Any] = {}
    keys: set[str] = set()
    for piece in query.split("&") if query else []:
        raw_name, _, raw_value = piece.partition("=")
        name = unquote_plus(raw_name)
        if name not in POSTGRES_STORE_OPTIONS:
            theirs.append(piece)
            keys.add(name)
            continue
        if name in ours:
            raise _bad(url, f"the option {name!r} is given twice")
        ours[name] = _convert(url, name, unquote_plus(raw_value), POSTGRES_STORE_OPTIONS[name])
    suffix = "?" + "&".join(theirs) if theirs else ""
    return PostgresTarget(
        f"{scheme.lower()}://{location}{suffix}", ours, frozenset(keys), redact(url), url_secrets(url)
    )


# ---------------------------------------------------------------------------- Redis URLs
@dataclass(frozen=True)
class RedisTarget:
    """What a Redis URL names, split only where redis-py's own URL parser cannot go.

    ``url`` is the user's URL for redis-py: the scheme without its topology suffix
    (``redis``, ``rediss`` or ``unix``), the first host only, and the query without
    statecodec's options; everything else as written.
    """

    topology: Topology
    url: str
    seeds: tuple[tuple[str, int], ...]
    service: str | None
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The URL as given, with every secret replaced (:func:`redact`).
    where: str = ""
    #: The secret values in the URL, to scrub from any message (:func:`scrub`).
    secrets: tuple[str, ...] = ()


def parse_redis_url(url: str) -> RedisTarget:
    """Split a Redis URL into what redis-py parses and what statecodec handles itself."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in REDIS_SCHEMES:
        raise _bad(url, "not a Redis URL")
    base, topology = REDIS_SCHEMES[scheme.lower()]
    rest, hash_sign, _ = rest.partition("#")
    if hash_sign:
        raise _bad(url, "a Redis URL has no '#fragment'; write a '#' in a password as %23")
    location, _, query = rest.partition("?")
    theirs, ours = _split_query(url, query)
    if topology != "sentinel" and ours.keys() & {"sentinel_username", "sentinel_password"}:
        raise _bad(url, "sentinel_username and sentinel_password go with redis+sentinel:// only")
    suffix = "?" + "&".join(theirs) if theirs else ""
    where, secrets = redact(url), url_secrets(url)
    if topology == "server":
        return RedisTarget(topology, f"{base}://{location}{suffix}", (), None, ours, where, secrets)
    netloc, slash, path = location.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    seeds = tuple(_host_port(url, host, _DEFAULT_PORTS[topology]) for host in hosts.split(","))
    first = f"{base}://{userinfo}{at}{hosts.split(',')[0]}"
    if topology == "cluster":
        return RedisTarget(topology, f"{first}{slash}{path}{suffix}", seeds, None, ours, where, secrets)
    service, _, db = path.partition("/")
    if not service:
        raise _bad(
            url,
            "the Sentinel service name is missing: redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE[/DB]",
        )
    path = f"/{db}" if db else ""
    return RedisTarget(topology, f"{first}{path}{suffix}", seeds, unquote(service), ours, where, secrets)


def _split_query(url: str, query: str) -> tuple[list[str], dict[str, Any]]:
    """redis-py's options (as written) and statecodec's (parsed)."""
    theirs: list[str] = []
    ours: dict[str, Any] = {}
    for piece in query.split("&") if query else []:
        raw_name, _, raw_value = piece.partition("=")
        name = unquote_plus(raw_name)
        if name not in REDIS_STORE_OPTIONS:
            theirs.append(piece)
            continue
        key = _ALIASES.get(name, name)
        if key in ours:
            raise _bad(url, f"the option {name!r} is given twice")
        ours[key] = _convert(url, name, unquote_plus(raw_value), REDIS_STORE_OPTIONS[name])
    return theirs, ours


def _host_port(url: str, host: str, default: int) -> tuple[str, int]:
    try:
        parts = urlsplit("//" + host)
        port = parts.port
    except ValueError as exc:
        raise _bad(url, f"bad host {host!r}: {exc}") from None
    if not parts.hostname or parts.path or parts.query:
        raise _bad(url, f"bad host {host!r}: write HOST:PORT")
    return parts.hostname, port or default


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


def _convert(url: str, name: str, value: str, parse: _Parser) -> Any:
    try:
        return parse(value)
    except ValueError:
        shown = "***" if _is_secret_name(name) else repr(value)
        raise _bad(url, f"bad value {shown} for {name}") from None


def _bad(url: str, why: str) -> ValueError:
    return ValueError(f"invalid replay store URL {redact(url)!r}: {why}. Accepted forms: {FORMS}")


# ---------------------------------------------------------------------------- secrets
_SECRET_WORDS: Final = ("password", "passwd", "pwd", "secret", "token", "credential", "auth")
REDACTED: Final = "***"


def _is_secret_name(name: str) -> bool:
    lowered = unquote_plus(name).lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _userinfo_split(url: str) -> tuple[str, str, str] | None:
    """(before the password, the password, from the '@' on) or None without a password.

    Conservative on purpose: the userinfo ends at the LAST '@' of the URL, so a password
    holding an unencoded '/', '?' or '#' is still recognised as one.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    userinfo, at, after = rest.rpartition("@")
    if not at:
        return None
    user, colon, password = userinfo.partition(":")
    if not colon:
        return None
    return f"{scheme}://{user}:", password, f"@{after}"


def redact(url: str) -> str:
    """The URL with every secret-bearing part replaced by ``***``, for messages and logs.

    The password of the userinfo and the value of every query option whose name says it
    carries a secret (``password``, ``ssl_password``, ``sentinel_password``, a ``token``...)
    go; the scheme, user name, hosts, path and other options stay, so the message still
    says which store it is about. A fragment is dropped too: in a Redis URL it can only
    come from an unencoded '#' inside a password.
    """
    split = _userinfo_split(url)
    if split is not None:
        head, _, tail = split
        url = f"{head}{REDACTED}{tail}"
    url, hash_sign, _ = url.partition("#")
    location, question, query = url.partition("?")
    if question:
        pieces = []
        for piece in query.split("&"):
            name, eq, _ = piece.partition("=")
            pieces.append(f"{name}={REDACTED}" if eq and _is_secret_name(name) else piece)
        location += "?" + "&".join(pieces)
    return location + (f"#{REDACTED}" if hash_sign else "")


def url_secrets(url: str) -> tuple[str, ...]:
    """Every secret value the URL carries, as written and percent-decoded."""
    found: set[str] = set()
    split = _userinfo_split(url)
    if split is not None:
        found |= {split[1], unquote(split[1])}
    _, hash_sign, fragment = url.partition("#")
    if hash_sign:
        found.add(fragment)
    for piece in url.partition("#")[0].partition("?")[2].split("&"):
        name, eq, value = piece.partition("=")
        if eq and _is_secret_name(name):
            found |= {value, unquote_plus(value)}
    return tuple(sorted((s for s in found if s), key=len, reverse=True))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` (an error message, a log line) without any of ``secrets`` (see :func:`url_secrets`)."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text
