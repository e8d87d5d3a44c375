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
