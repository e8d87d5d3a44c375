"""Redis URLs: what redis-py parses and what statecodec takes out of them.

Redis URLs are redis-py's to understand. This module only recognises the scheme (which
says: one server, a cluster, or a Sentinel-managed primary), takes statecodec's own
options out of the query, and splits a list of seed hosts, which redis-py's URL parser
does not know; the rest of the URL reaches redis-py as the user wrote it. It imports
neither redis-py nor the store, so a malformed URL is a ValueError without the extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import unquote, unquote_plus, urlsplit

from ._url_text import StoreOption, _bad, _convert, _positive_seconds, redact, url_secrets

Topology = Literal["server", "cluster", "sentinel"]


def _count(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError
    return number


#: statecodec's own options in a Redis URL, with their defaults (also those of the
#: store's keyword arguments); every other query option is redis-py's.
REDIS_STORE_OPTIONS: Final[dict[str, StoreOption]] = {
    "prefix": StoreOption(str, "statecodec:replay:"),
    "wait": StoreOption(_count, 0),
    "wait_timeout": StoreOption(_positive_seconds, 1.0),
    "socket_timeout": StoreOption(_positive_seconds, 2.0),
    "connect_timeout": StoreOption(_positive_seconds, 2.0),
    "socket_connect_timeout": StoreOption(_positive_seconds),  # spells connect_timeout
    "retries": StoreOption(_count, 1),
    "sentinel_username": StoreOption(str),
    "sentinel_password": StoreOption(str),
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
        ours[key] = _convert(url, name, unquote_plus(raw_value), REDIS_STORE_OPTIONS[name].parse)
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
