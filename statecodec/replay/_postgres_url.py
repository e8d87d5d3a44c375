"""PostgreSQL replay-store URLs: statecodec's own options out, the rest to libpq as written.

Apart from :mod:`._url` (which picks a store) so that the PostgreSQL store uses it without
importing the module that imports it, as :mod:`._redis_url` is for Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote_plus

from ._url_text import (
    LIBPQ_SCHEMES,
    StoreOption,
    _bad,
    _convert,
    _libpq_userinfo_end,
    _positive_seconds,
    libpq_misreading,
    redact,
    url_secrets,
)


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError
    return number


POSTGRES_SCHEMES: Final = LIBPQ_SCHEMES
#: statecodec's own options in a PostgreSQL URL and their defaults, which are the store's
#: too; every other query option is libpq's, passed on as written.
POSTGRES_STORE_OPTIONS: Final[dict[str, StoreOption]] = {
    "table": StoreOption(str, "statecodec_replay"),
    "timeout": StoreOption(_positive_seconds, 2.0),
    "pool_size": StoreOption(_positive_int, 8),
    "purge_interval": StoreOption(_positive_seconds, 10.0),
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
    misreading = libpq_misreading(url)
    if misreading is not None:
        raise _bad(url, misreading)
    # The query starts at the first '?' after libpq's userinfo: a '?' in a password is libpq's too.
    at = _libpq_userinfo_end(rest)
    userinfo = rest[: at + 1] if at is not None else ""
    location, _, query = rest[len(userinfo) :].partition("?")
    location = userinfo + location
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
        ours[name] = _convert(url, name, unquote_plus(raw_value), POSTGRES_STORE_OPTIONS[name].parse)
    suffix = "?" + "&".join(theirs) if theirs else ""
    return PostgresTarget(
        f"{scheme.lower()}://{location}{suffix}", ours, frozenset(keys), redact(url), url_secrets(url)
    )
