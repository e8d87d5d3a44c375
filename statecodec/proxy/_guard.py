"""Client connections under a bound: deadlines for a request's head and body, and a cap on connections.

uvicorn bounds one thing on its own: an idle keep-alive connection is closed
``timeout_keep_alive`` seconds after its last answer. It puts no deadline on a connection
that never completes its first request head, nor on a body that stops arriving, and it
accepts connections until the process runs out of file descriptors; then the listening
socket (and the admin listener's, which shares the process) can accept nothing, and
nothing is logged. ``limit_concurrency`` does not help: it answers 503 to *complete*
requests once there are that many connections, half-open ones included, so a flood of
half-sent heads makes it refuse the legitimate requests.

:func:`guarded_protocol` is uvicorn's own httptools protocol with three additions, each
driven by a parser callback uvicorn already receives (no extra parsing, no timer per
request):

- **head deadline**: a connection waiting for a request head (just accepted, or idle
  after an answer) that has not completed one within ``head_timeout`` is closed;
- **body deadline**: a request whose body is not complete ``body_timeout`` seconds after
  its head gets ``408 Request Timeout`` (when no answer was started) and is closed;
- **connection cap**: beyond ``max_connections`` client connections, the *oldest
  connection with no request in flight* (idle, or still sending its head) is closed to
  make room for the new one; only when every connection has a request in flight is the
  new one refused. Fresh requests are therefore served while a flood of half-open
  connections is shed, and the cap (below the file-descriptor limit) leaves descriptors
  for the upstream pool, the admin listener and the replay store.

Deadlines are checked by one sweeper task per server, twice a second by default: the
per-request work is a clock read and two dictionary updates. Each shed is one WARNING
record (``event=connection_shed``, ``reason``, ``status``) and one increment of
``statecodec_shed_total{reason}``.

uvicorn documents none of this protocol class: it is a private seam (docs/architecture.md),
held by tests/core/test_seams.py and by the uvicorn range statecodec[proxy] allows.
:func:`guarded_protocol` refuses to build the class, naming what is missing, on a uvicorn
that no longer has what the guard extends and reads.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Any, Final

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .. import _telemetry

__all__ = [
    "ClientLimits",
    "Guard",
    "default_max_connections",
    "guarded_protocol",
    "missing_from_uvicorn",
    "raise_open_file_limit",
]

logger = logging.getLogger("statecodec.proxy")

#: Descriptors kept free beyond the client connections and the upstream's: the admin
#: listener and its scrapes, the replay store, key sources, log files, the interpreter.
FD_RESERVE: Final = 64
#: The soft open-file limit the proxy asks for at start-up (within the hard limit).
FD_WANTED: Final = 8192
_TIMEOUT_408: Final = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 22\r\nconnection: close\r\n\r\nrequest body timed out"
)


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What one client connection may take, in seconds and connections.

    ``max_connections`` ``None``: :func:`default_max_connections` (from the file limit).
    """

    head_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: float = 5.0
    max_connections: int | None = None

    def __post_init__(self) -> None:
        if not (self.head_timeout > 0 and self.body_timeout > 0 and self.idle_timeout > 0):
            raise ValueError("the head, body and idle timeouts must be positive")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")


def raise_open_file_limit(wanted: int = FD_WANTED) -> int:
    """Raise this process's soft open-file limit to ``wanted`` when the hard limit allows; the soft limit.

    Many systems start a process at 1024 descriptors (macOS at 256) while allowing far
    more; a server owning its process takes what it is allowed, so the connection cap
    derived from the limit is not needlessly small. Never lowers the limit; a refusal
    (a hard limit below, a kernel maximum) leaves it as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return soft
    return wanted


def default_max_connections(upstream_connections: int) -> int:
    """The open-file limit less the upstream's connections and :data:`FD_RESERVE`.

    Raises ``ValueError`` when that leaves fewer than 8: the limit is too low to serve.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    available = soft - upstream_connections - FD_RESERVE
    if available < 8:
        raise ValueError(
            f"the open-file limit ({soft}) leaves {available} descriptors for client connections once "
            f"{upstream_connections} upstream connections and {FD_RESERVE} for the proxy itself are "
            "counted: raise it (ulimit -n) or lower --max-connections/--max-streams"
        )
    return available


class Guard:
    """The connections of one server waiting on their client, by kind, oldest first."""

    def __init__(self, limits: ClientLimits, max_connections: int) -> None:
        self.limits = limits
        self.max_connections = max_connections
        # Insertion-ordered: the first entry is the one waiting longest.
        self.heads: dict[Any, float] = {}
        self.bodies: dict[Any, float] = {}

    def admit(self, conn: Any, connections: Any) -> bool:
        """Room for ``conn`` (just accepted): False when it must be refused."""
        if len(connections) <= self.max_connections:
            return True
        for oldest in self.heads:  # the oldest idle or half-open connection gives way
            if oldest is not conn:
                break
        else:
            return False
        self.shed(oldest, "connection_limit", "a new connection needed its place")
        return True

    def sweep(self, now: float) -> None:
        """Close every connection past its deadline."""
        for waiting, timeout, reason in (
            (self.heads, self.limits.head_timeout, "head_timeout"),
            (self.bodies, self.limits.body_timeout, "body_timeout"),
        ):
            expired = []
            for conn, since in waiting.items():
                if now - since < timeout:
                    break  # the rest came later
                expired.append(conn)
            for conn in expired:
                self.shed(conn, reason, f"no complete request {reason[:4]} within {timeout:g}s")

    def shed(self, conn: Any, reason: str, why: str) -> None:
        """Close ``conn`` to keep a bound; a body that timed out is answered 408 first."""
        self.heads.pop(conn, None)
        self.bodies.pop(conn, None)
        transport = conn.transport
        if transport is None or transport.is_closing():
            return
        status = None
        if reason == "body_timeout" and conn.cycle is not None and not conn.cycle.response_started:
            transport.write(_TIMEOUT_408)
            status = 408
        transport.close()
        client = conn.client
        _telemetry.record_shed(reason)
        logger.warning(
            "closed a client connection (%s): %s",
            reason,
            why,
            extra={
                **_telemetry.fields("connection_shed", reason=reason, detail=why, status=status),
                "client": f"{client[0]}:{client[1]}" if client else None,
            },
        )

    async def run(self, period: float) -> None:
        """Sweep every ``period`` seconds until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period)
            self.sweep(loop.time())


#: The protocol's callbacks the guard extends.
_CALLBACKS: Final = ("connection_made", "connection_lost", "on_headers_complete", "on_message_complete",
                     "on_response_complete")  # fmt: skip
#: The attributes the guard reads: (class, the method of uvicorn's that sets them, their names).
_ATTRIBUTES: Final = (
    ("HttpToolsProtocol", "__init__", ("loop", "connections", "pipeline", "cycle")),
    ("HttpToolsProtocol", "connection_made", ("transport", "client")),
    ("RequestResponseCycle", "__init__", ("response_started",)),
)


def missing_from_uvicorn(protocol: type, cycle: type) -> list[str]:
    """What the guard uses of uvicorn's httptools protocol that ``protocol`` and ``cycle`` lack.

    A callback must be there; an attribute must be set by the method that sets it in the
    uvicorn releases statecodec[proxy] allows (the names the method's code refers to).
    """
    classes = {"HttpToolsProtocol": protocol, "RequestResponseCycle": cycle}
    missing = [
        f"HttpToolsProtocol.{name}" for name in _CALLBACKS if not callable(getattr(protocol, name, None))
    ]
    for owner, method, names in _ATTRIBUTES:
        code = getattr(getattr(classes[owner], method, None), "__code__", None)
        missing += [
            f"{owner}.{method} sets {name}" for name in names if code is None or name not in code.co_names
        ]
    return missing


def guarded_protocol(guard: Guard) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class, its connections kept by ``guard``.

    Raises ``RuntimeError`` when this uvicorn lacks what the guard extends and reads.
    """
    missing = missing_from_uvicorn(HttpToolsProtocol, RequestResponseCycle)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise RuntimeError(  # the remedy first: the CLI shows the first 200 characters
            f"pip install 'statecodec[proxy]' for a uvicorn it supports: {uvicorn.__version__} "
            f"lacks what the proxy's connection guard builds on ({missing[0]}{more})"
        )

    class GuardedProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            guard.heads[self] = self.loop.time()
            if not guard.admit(self, self.connections):
                guard.shed(self, "busy", f"all {guard.max_connections} connections have a request in flight")

        def on_headers_complete(self) -> None:
            guard.heads.pop(self, None)
            guard.bodies[self] = self.loop.time()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            guard.bodies.pop(self, None)
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:
                guard.heads[self] = self.loop.time()  # waiting for the next head again

        def connection_lost(self, exc: Exception | None) -> None:
            guard.heads.pop(self, None)
            guard.bodies.pop(self, None)
            super().connection_lost(exc)

    return GuardedProtocol
