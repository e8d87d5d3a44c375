"""The servers of ``statecodec demo``: three independent MCP server objects on loopback.

A and B are two instances of the ``deploy`` service; ``staging`` is another service,
``deploy-staging``, on the same keys. Each has its own uvicorn on a free loopback port,
its own :class:`~statecodec.kms.KeyManager` and its own replay store opened from the same
URL, exactly as separate processes would: ``--replay memory:`` gives every instance a
store of its own, ``sqlite:PATH`` one shared file. They run in the demo's process because
one import of the SDK instead of three keeps the demo well under ten seconds on a small
machine, and share nothing a real deployment would not share.

The ``statecodec`` log records are captured, as records, with the instance that produced
them: a context variable is set around each server's ASGI app, and every task the app
starts (its lifespan included) inherits it. The demo reads their fields (``event``,
``reason``, ``detail``), never their text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

import uvicorn

from .._codec import Mode, StateCodec
from .._net import bind_socket, socket_url
from .._serving import EmbeddedServer, wait_started
from ..kms import KeyManager
from ..replay import ReplayStore, store_from_url
from ._scenario import SERVER_NAME
from ._servers import build_mcpserver

PRODUCTION: Final = ("A", "B")
STAGING: Final = "staging"
STAGING_SERVICE: Final = "deploy-staging"
START_TIMEOUT: Final = 20.0

_INSTANCE: ContextVar[str | None] = ContextVar("statecodec_demo_instance", default=None)


class Deviation(Exception):  # noqa: N818 - a finding of the demo, not a bug in it
    """A step did not behave as the demo says it does."""


@dataclass(frozen=True)
class Settings:
    """Where keys and the replay store come from, and how tokens are sealed."""

    mode: Mode
    keys: str  # a key source spec (statecodec.kms.source_from_url)
    replay: str  # a replay store URL, shown in the trace
    ttl: int = 600
    open_store: Callable[[str], ReplayStore] = store_from_url  # called once per instance


@dataclass(frozen=True)
class Instance:
    name: str
    service: str
    url: str


@dataclass(frozen=True)
class Setup:
    mode: Mode
    keys: str
    replay: str
    primary_kid: str | None
    instances: tuple[Instance, ...]


@dataclass(frozen=True)
class Logged:
    """One ``statecodec`` log record: where it came from, and its fields."""

    instance: str | None
    event: str | None
    reason: str | None
    detail: str | None
    #: The message and every field, as the log would show them: what must never hold a token.
    text: str


class Capture(logging.Handler):
    """Keeps the ``statecodec`` log records with the instance that produced them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[Logged] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = vars(record)
        self.records.append(
            Logged(
                _INSTANCE.get(),
                fields.get("event"),
                fields.get("reason"),
                fields.get("detail"),
                f"{record.getMessage()} {fields!r}",
            )
        )


@contextlib.contextmanager
def _captured_library_log() -> Iterator[Capture]:
    """The rejection lines go to the trace, not to the terminal: propagation is off meanwhile."""
    lib = logging.getLogger("statecodec")
    capture = Capture()
    saved = lib.propagate, lib.level
    lib.addHandler(capture)
    lib.propagate = False
    if lib.getEffectiveLevel() > logging.WARNING:
        lib.setLevel(logging.WARNING)  # the rejection lines are what the demo checks
    try:
        yield capture
    finally:
        lib.removeHandler(capture)
        lib.propagate, lib.level = saved


def _tagged(app: Any, name: str) -> Any:
    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        token = _INSTANCE.set(name)
        try:
            await app(scope, receive, send)
        finally:
            _INSTANCE.reset(token)

    return asgi


@dataclass
class _Running:
    instance: Instance
    server: EmbeddedServer
    task: asyncio.Task[None]


@dataclass
class Cluster:
    settings: Settings
    log: Capture
    running: list[_Running] = field(default_factory=list)
    managers: list[KeyManager] = field(default_factory=list)
    stores: list[ReplayStore] = field(default_factory=list)

    def url(self, name: str) -> str:
        return next(r.instance.url for r in self.running if r.instance.name == name)

    def setup(self) -> Setup:
        return Setup(
            self.settings.mode,
            self.settings.keys,
            self.settings.replay,
            self.managers[0].keyring().primary_kid,
            tuple(r.instance for r in self.running),
        )

    async def codec(self, service: str, *, clock: Callable[[], float]) -> StateCodec:
        """A codec on the service's keys, no replay store, to seal as the service did at ``clock()``."""
        manager = KeyManager(self.settings.keys)
        self.managers.append(manager)
        await asyncio.to_thread(manager.start, background=False)
        settings = self.settings
        return StateCodec(manager, mode=settings.mode, ttl=settings.ttl, namespace=service, clock=clock)

    async def start(self, name: str, service: str) -> None:
        manager = KeyManager(self.settings.keys)
        self.managers.append(manager)
        await asyncio.to_thread(manager.start)
        store = self.settings.open_store(self.settings.replay)
        self.stores.append(store)
        codec = StateCodec(
            manager, mode=self.settings.mode, ttl=self.settings.ttl, replay=store, namespace=service
        )
        # log_level: MCPServer configures root logging; INFO would print every request.
        app = build_mcpserver(codec, name, auth=True, name=service, log_level="WARNING").http_app()
        # log_config=None: uvicorn leaves the logging of the demo's process alone.
        config = uvicorn.Config(_tagged(app, name), log_config=None, access_log=False, lifespan="on")
        server = EmbeddedServer(config)  # the demo owns Ctrl-C and stops the servers itself
        sock = bind_socket("127.0.0.1", 0)  # a free loopback port, bound before serving
        url = f"{socket_url(sock)}/mcp"
        task = asyncio.create_task(server.serve(sockets=[sock]), name=f"statecodec-demo-{name}")
        self.running.append(_Running(Instance(name, service, url), server, task))

    async def wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        for run in self.running:
            what = f"server {run.instance.name}"
            await wait_started(
                run.server, run.task, timeout=START_TIMEOUT, what=what, failure=Deviation, deadline=deadline
            )

    async def close(self) -> None:
        for run in self.running:
            run.server.should_exit = True
        tasks = [r.task for r in self.running]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for store in self.stores:
            with contextlib.suppress(Exception):
                await store.aclose()
        for manager in self.managers:
            await asyncio.to_thread(manager.stop)


@contextlib.asynccontextmanager
async def cluster(settings: Settings) -> AsyncIterator[Cluster]:
    """A, B (service ``deploy``) and staging (service ``deploy-staging``), all on the same keys."""
    with _captured_library_log() as log:
        running = Cluster(settings, log)
        try:
            for name in PRODUCTION:
                await running.start(name, SERVER_NAME)
            await running.start(STAGING, STAGING_SERVICE)
            await running.wait_started()
            yield running
        finally:
            await running.close()
