"""Host and Origin validation: the proxy's own protection against DNS rebinding.

A browser on ``evil.example`` whose DNS name is made to resolve to 127.0.0.1 sends its
requests to a loopback server with ``Host: evil.example`` and, for a script's fetch,
``Origin: http://evil.example``. MCP 2026-07-28 says servers MUST validate ``Origin``;
the SDKs check ``Host`` and ``Origin`` against lists of loopback names when they serve on
loopback. The proxy does the same, first, before a request is judged (a token is never
consumed by a request that is then refused for its Host), and then forwards the
client's ``Host`` unchanged, so an upstream with its own check sees what the client sent
(docs/proxy.md, "How the two layers fit").

The policy (:class:`HostPolicy`):

- an allowed host is ``NAME`` (any port), ``NAME:PORT``, ``[IPv6]`` or ``[IPv6]:PORT``,
  compared case-insensitively; ``*`` allows any (the check is then someone else's);
- an allowed origin is ``SCHEME://NAME`` (any port) or ``SCHEME://NAME:PORT``; ``*``
  allows any. A request without ``Origin`` (every non-browser client) passes; one with
  an ``Origin`` not on the list is refused, and so is ``Origin: null`` unless listed;
- on loopback the defaults are the SDKs': ``localhost``, ``127.0.0.1`` and ``[::1]`` on
  any port, over ``http`` and ``https``. Anywhere else there is no safe default: the
  operator names the hosts (the CLI refuses to start without them).

A missing or repeated ``Host`` is HTTP 400, a host not on the list 421 (RFC 9110: not
meant for this server), an origin not on the list or a repeated ``Origin`` 403. Each
refusal is logged with its reason and counted with its status.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from .. import _telemetry
from ..adapters.asgi import ASGIApp, Receive, Scope, Send
from ..boundary import INVALID_REQUEST_CODE, WireError
from ._wire import respond_error

logger = logging.getLogger("statecodec.proxy")

ANY: Final = "*"
#: The names a loopback server answers to (the SDKs' DNS-rebinding lists).
LOOPBACK_HOSTS: Final = ("localhost", "127.0.0.1", "[::1]")
LOOPBACK_ORIGINS: Final = tuple(
    f"{scheme}://{host}" for scheme in ("http", "https") for host in LOOPBACK_HOSTS
)

# (name, port): port None matches any port.
_Entry = tuple[str, int | None]


def is_loopback(host: str) -> bool:
    """Whether a listen address only accepts connections from this machine."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _authority(text: str) -> _Entry:
    """``NAME[:PORT]`` or ``[IPv6][:PORT]`` as (lower-case name, port or None); ``ValueError`` if not."""
    text = text.strip().lower()
    if text.startswith("["):
        name, bracket, rest = text.partition("]")
        name += bracket
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r} is not [IPv6] or [IPv6]:PORT")
        port_text = rest[1:] if rest else None
    else:
        name, colon, port_text_or_empty = text.partition(":")
        port_text = port_text_or_empty if colon else None
    if not name or any(c in name for c in "/@?# \t"):
        raise ValueError(f"{text!r} is not a host name")
    if port_text is None:
        return name, None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r} has no valid port")
    return name, int(port_text)


def _origin(text: str) -> tuple[str, _Entry]:
    """``SCHEME://NAME[:PORT]`` as (scheme, (name, port or None)); ``ValueError`` if not."""
    url = urlsplit(text.strip().lower())
    if url.scheme not in ("http", "https") or not url.netloc or url.path not in ("", "/"):
        raise ValueError(f"{text!r} is not an origin (SCHEME://HOST[:PORT])")
    if url.query or url.fragment or "@" in url.netloc:
        raise ValueError(f"{text!r} is not an origin (SCHEME://HOST[:PORT])")
    return url.scheme, _authority(url.netloc)


def _matches(entries: Collection[_Entry], name: str, port: int | None) -> bool:
    return (name, port) in entries or (name, None) in entries


@dataclass(frozen=True)
class HostPolicy:
    """Which ``Host`` and ``Origin`` values the proxy answers; see the module docstring."""

    hosts: frozenset[_Entry]
    origins: frozenset[tuple[str, _Entry]]
    any_host: bool = False
    any_origin: bool = False
    allow_null_origin: bool = False

    @classmethod
    def of(cls, hosts: Iterable[str], origins: Iterable[str]) -> HostPolicy:
        """The policy of these lists; ``ValueError`` names an entry that is not a host or origin."""
        hosts, origins = list(hosts), list(origins)
        return cls(
            hosts=frozenset(_authority(host) for host in hosts if host != ANY),
            origins=frozenset(_origin(origin) for origin in origins if origin not in (ANY, "null")),
            any_host=ANY in hosts,
            any_origin=ANY in origins,
            allow_null_origin="null" in origins,
        )

    @classmethod
    def loopback(cls) -> HostPolicy:
        """The defaults for a proxy listening on loopback (the SDKs' own lists)."""
        return cls.of(LOOPBACK_HOSTS, LOOPBACK_ORIGINS)

    def refusal(self, host: bytes | None, origins: list[bytes]) -> tuple[int, str] | None:
        """``(status, reason)`` when a request with these headers must be refused, else None."""
        if host is None:
            return 400, "missing_host"
        if not self.any_host:
            try:
                name, port = _authority(host.decode("latin-1"))
            except ValueError:
                return 400, "malformed_host"
            if not _matches(self.hosts, name, port):
                return 421, "host_not_allowed"
        if not origins or self.any_origin:
            return None
        if len(origins) > 1:
            return 403, "repeated_origin"
        text = origins[0].decode("latin-1").strip()
        if text.lower() == "null":
            return None if self.allow_null_origin else (403, "origin_not_allowed")
        try:
            scheme, (name, port) = _origin(text)
        except ValueError:
            return 403, "origin_not_allowed"
        entries = {entry for entry_scheme, entry in self.origins if entry_scheme == scheme}
        return None if _matches(entries, name, port) else (403, "origin_not_allowed")


_MESSAGES: Final = {
    "missing_host": "Missing or repeated Host header",
    "malformed_host": "Invalid Host header",
    "host_not_allowed": "Host not allowed",
    "repeated_origin": "Repeated Origin header",
    "origin_not_allowed": "Origin not allowed",
}


# The most (Host, Origin) pairs whose acceptance is remembered; beyond it each is judged
# again. Only accepted pairs are kept: they come from the policy's short lists (a client
# sends the same pair on every request), and a flood of refused names never fills it.
_ALLOWED_CACHED: Final = 256
# ... and only pairs this short: with ``*`` any value is accepted, and the memory stays
# within 256 x 512 bytes whatever the clients send.
_CACHED_BYTES: Final = 512


class HostGuard:
    """``app``, answering only requests whose ``Host`` and ``Origin`` ``policy`` allows.

    The verdict is a function of the two header values alone, so a pair once accepted is
    remembered (as the bytes sent, at most :data:`_ALLOWED_CACHED` pairs of at most
    :data:`_CACHED_BYTES`) instead of being
    parsed again on every request: parsing the authority and the origin cost more than the
    rest of the guard (docs/performance.md, "The forwarder").
    """

    __slots__ = ("_allowed", "app", "policy")

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy
        self._allowed: set[tuple[bytes, bytes | None]] = set()

    def __repr__(self) -> str:
        return f"HostGuard({self.app!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host: bytes | None = None
        hosts = 0
        origins: list[bytes] = []
        for name, value in scope.get("headers", ()):
            lower = name.lower()
            if lower == b"host":
                host, hosts = value, hosts + 1
            elif lower == b"origin":
                origins.append(value)
        key = None
        if hosts == 1 and host is not None and len(origins) < 2:
            key = (host, origins[0] if origins else None)
            if len(host) + len(key[1] or b"") > _CACHED_BYTES:
                key = None
            if key in self._allowed:
                await self.app(scope, receive, send)
                return
        refused = self.policy.refusal(host if hosts == 1 else None, origins)
        if refused is None:
            if key is not None and len(self._allowed) < _ALLOWED_CACHED:
                self._allowed.add(key)
            await self.app(scope, receive, send)
            return
        status, reason = refused
        value = (host or b"") if "host" in reason else b", ".join(origins)
        sent = _telemetry.clip(value.decode("latin-1"))
        logger.warning(
            "refused a request with HTTP %d: %s (%r)",
            status,
            reason,
            sent,
            extra=_telemetry.fields("request_refused", reason=reason, status=status, detail=sent),
        )
        # Refused before the body is read: there is no id to answer with.
        await respond_error(send, None, WireError(INVALID_REQUEST_CODE, _MESSAGES[reason], status=status))
