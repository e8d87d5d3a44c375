"""What every replay store URL's messages share: the accepted forms, and no secret in them.

Apart from :mod:`._url` (which picks a store) so that the Redis URL parser
(:mod:`._redis_url`) and the Redis store use it without importing the module that
imports them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NamedTuple
from urllib.parse import unquote, unquote_plus

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

_Parser = Callable[[str], Any]


class StoreOption(NamedTuple):
    """One of statecodec's own options of a shared store: how a URL's text is read, and the default.

    The name, the parser and the default live in one table per store (``REDIS_STORE_OPTIONS``,
    ``POSTGRES_STORE_OPTIONS``), so a new option cannot get a parser without a default
    or the reverse. ``default`` None: the option has none (a spelling, or an optional secret).
    """

    parse: _Parser
    default: Any = None


def option_defaults(options: Mapping[str, StoreOption]) -> dict[str, Any]:
    """The defaults of a store's options table, for :func:`.base.store_settings`."""
    return {name: option.default for name, option in options.items() if option.default is not None}


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


#: Query options that are secret by name alone: libpq's ``options`` carries ``-c`` settings,
#: which is where ``-c app.password=...`` or a key for an extension ends up.
_SECRET_NAMES: Final = ("options",)
#: The schemes whose URL libpq reads (not urllib): their userinfo ends at the FIRST '@'.
LIBPQ_SCHEMES: Final = ("postgresql", "postgres")


def _is_secret_name(name: str) -> bool:
    lowered = unquote_plus(name).lower()
    return lowered in _SECRET_NAMES or any(word in lowered for word in _SECRET_WORDS)


def _userinfo_split(url: str) -> tuple[str, str, str] | None:
    """(before the password, the password, from the '@' on) or None without a password.

    A URL that libpq reads and would read as written (:func:`libpq_misreading` finds
    nothing) is split as libpq splits it; any other is split conservatively on purpose:
    the userinfo ends at the LAST '@' of the URL, so a password holding an unencoded
    '@', '/', '?' or '#' is still hidden whole.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return None
    if scheme.lower() in LIBPQ_SCHEMES and libpq_misreading(url) is None:
        at = _libpq_userinfo_end(rest)
        userinfo, after = (rest[:at], rest[at:]) if at is not None else ("", "")
    else:
        userinfo, at_sign, tail = rest.rpartition("@")
        userinfo, after = (userinfo, f"@{tail}") if at_sign else ("", "")
    user, colon, password = userinfo.partition(":")
    if not colon:
        return None
    return f"{scheme}://{user}:", password, after


def _libpq_userinfo_end(rest: str) -> int | None:
    """Where libpq's userinfo ends in a URL's text after ``://``: its first '@' before any '/'."""
    for index, char in enumerate(rest):
        if char == "/":
            return None
        if char == "@":
            return index
    return None


def libpq_misreading(url: str) -> str | None:
    """Why libpq would not read a PostgreSQL URL as its author meant, or None.

    libpq ends the userinfo at the first '@' (before any '/'), where a browser or urllib
    ends it at the last: with an unencoded '@' in the password, libpq takes the rest of
    the password for a host name and its errors (which psycopg's pool logs on every
    retry) show it; with an unencoded '/', the user name becomes a host and the password
    a port. Both are refused with the fix, rather than sent to the server half-read.
    """
    rest = url.partition("://")[2]
    at = _libpq_userinfo_end(rest)
    after = rest[at + 1 :] if at is not None else rest
    location, _, query = after.partition("?")
    hosts = location.partition("/")[0]
    fix = "percent-encode '@' as %40 and '/' as %2F in the user name and password"
    if "@" in location:
        return f"an unencoded '@' in the user name, password or database name; {fix}"
    for host in hosts.split(","):
        port = host.rpartition("]")[2].partition(":")[2] if host.startswith("[") else host.partition(":")[2]
        if port and not port.isdigit():
            return f"a port must be a number (a user name and password without their '@'?); {fix}"
    if any("@" in piece.partition("=")[0] for piece in query.split("&") if query):
        return f"an unencoded '@' before the query's '='; {fix}"
    return None


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
