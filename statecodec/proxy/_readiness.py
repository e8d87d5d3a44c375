"""Does the upstream answer? A warning at start, and (``--ready-upstream``) a ``/readyz`` check.

The question is asked the way a client would find out, short of running a request: a
connection to the upstream's address (with its TLS handshake for ``https://``) and
``OPTIONS * HTTP/1.1``, a request that names no resource, so it opens no stream, runs no
tool and needs no session. Any HTTP answer, whatever its status (a server without
``OPTIONS`` answers 404, 405 or 501), means the upstream answers; a refused connection,
a failed handshake, a silence of ``timeout`` seconds or anything that is not HTTP means
it does not.

By default readiness leaves the upstream out: every instance of a fleet shares one
upstream, and taking them all out of the load balancer at once for an upstream that is
restarting turns a few 502s into no service at all. ``--ready-upstream`` adds the check
for a deployment where the upstream is per instance (a sidecar), where an instance whose
upstream is gone should leave.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Final
from urllib.parse import urlsplit

from .._humanize import one_line
from .._keys import KeyProvider
from ..ops import Check, Health, Readiness
from ..replay.base import ReplayStore

DEFAULT_TIMEOUT: Final = 2.0
DEFAULT_INTERVAL: Final = 1.0


def probe_upstream(url: str, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """None when the upstream at ``url`` answers HTTP within ``timeout`` seconds, else why not (one line)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    authority = f"[{host}]" if ":" in host else host
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            conn: socket.socket = raw
            if parts.scheme == "https":
                conn = ssl.create_default_context().wrap_socket(raw, server_hostname=host)
            conn.sendall(
                b"OPTIONS * HTTP/1.1\r\nHost: %b\r\nConnection: close\r\n\r\n" % authority.encode("idna")
            )
            first = conn.recv(16)
    except (OSError, UnicodeError) as exc:  # refused, unreachable, a timeout, a TLS failure
        return one_line(f"{type(exc).__name__}: {exc}")
    if not first.startswith(b"HTTP/"):
        return (
            "it answered something other than HTTP" if first else "it closed the connection without an answer"
        )
    return None


class UpstreamHealth(Health):
    """:class:`~statecodec.ops.Health` (keys, replay store) and an ``upstream`` check.

    The check is :func:`probe_upstream`.

    The upstream is asked at most once per ``upstream_interval`` seconds, in a thread, one
    probe at a time: readiness probes at any rate cost at most one connection a second.
    """

    def __init__(
        self,
        keys: KeyProvider,
        store: ReplayStore | None,
        upstream: str,
        *,
        upstream_timeout: float = DEFAULT_TIMEOUT,
        upstream_interval: float = DEFAULT_INTERVAL,
    ) -> None:
        super().__init__(keys, store)
        self.upstream = upstream
        self.upstream_timeout = upstream_timeout
        self.upstream_interval = upstream_interval
        self._probe: asyncio.Future[str | None] | None = None
        self._probed_at: float | None = None
        self._upstream = Check(False, f"the upstream {upstream} has not been asked yet")

    def check(self) -> Readiness:
        readiness = super().check()
        self._upstream = self._upstream_verdict(probe_upstream(self.upstream, self.upstream_timeout))
        return Readiness({**readiness.checks, "upstream": self._upstream})

    async def acheck(self) -> Readiness:
        readiness = await super().acheck()
        now = self.clock()
        if self._probe is None and (
            self._probed_at is None or now - self._probed_at >= self.upstream_interval
        ):
            self._probed_at = now
            self._probe = asyncio.ensure_future(
                asyncio.to_thread(probe_upstream, self.upstream, self.upstream_timeout)
            )
        probe = self._probe
        if probe is not None:  # one probe at a time: a probe meanwhile waits for the same answer
            why = await asyncio.shield(probe)
            if self._probe is probe:
                self._probe = None
            self._upstream = self._upstream_verdict(why)
        return Readiness({**readiness.checks, "upstream": self._upstream})

    def _upstream_verdict(self, why: str | None) -> Check:
        if why is None:
            return Check(True, f"the upstream {self.upstream} answers")
        return Check(False, one_line(f"the upstream {self.upstream} does not answer: {why}"))
