"""A TCP fault proxy: in front of a server, it forwards, holds or cuts connections on command.

Every connection to a store server goes through one (clients, sentinels, replicas), so the
nemesis can partition without root: *hold* is a network partition that heals before TCP
gives up (bytes wait in the proxy, nothing is answered, then everything flows again), *cut*
resets every open connection and refuses new ones until healed.

A partition can be one-sided: each connection gets a class from the first bytes it sends
(``replication`` when it asks a Redis server for ``REPLCONF``/``PSYNC`` or opens a
PostgreSQL replication session, ``sentinel`` when a Sentinel names its link, else
``client``), and each class has its own mode. A replica's link starts with a plain
``PING``, so it counts as a client until its ``REPLCONF`` arrives (a round trip later).

The proxies of a run share one event loop in a thread of the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

CLASSES = ("client", "replication", "sentinel")
MODES = ("pass", "hold", "cut")
_SNIFF = 2048
T = TypeVar("T")


def classify(first_bytes: bytes) -> str | None:
    """The class of a connection from what it sent so far, None while undecided."""
    upper = first_bytes.upper()
    if b"REPLCONF" in upper or b"PSYNC" in upper or b"REPLICATION\x00" in upper:
        return "replication"
    if b"SENTINEL-" in upper:
        return "sentinel"
    return None if len(first_bytes) < _SNIFF else "client"


class FaultProxy:
    def __init__(self, host: ProxyHost, target_port: int, name: str) -> None:
        self.host, self.target_port, self.name = host, target_port, name
        self.port = 0
        self.modes = dict.fromkeys(CLASSES, "pass")
        self._open = {cls: asyncio.Event() for cls in CLASSES}
        for event in self._open.values():
            event.set()
        self._connections: set[tuple[str, asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._classes: dict[int, str] = {}
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def set(self, mode: str, classes: tuple[str, ...] = CLASSES) -> None:
        """Set the mode of the given classes of connection (thread-safe)."""
        self.host.call(self._set(mode, classes))

    async def _set(self, mode: str, classes: tuple[str, ...]) -> None:
        for cls in classes:
            self.modes[cls] = mode
            (self._open[cls].set if mode == "pass" else self._open[cls].clear)()
        if mode == "cut":
            for _, client, upstream in list(self._connections):
                if self._class_of(client) in classes:
                    for writer in (client, upstream):
                        writer.transport.abort()

    def _class_of(self, writer: asyncio.StreamWriter) -> str:
        return self._classes.get(id(writer), "client")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.modes["client"] == "cut" and self.modes["replication"] == "cut":
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        entry = ("", writer, up_writer)
        self._connections.add(entry)
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, writer, True), self._pipe(up_reader, writer, writer, False)
            )
        finally:
            self._connections.discard(entry)
            self._classes.pop(id(writer), None)
            for w in (writer, up_writer):
                w.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        to: asyncio.StreamWriter,
        client: asyncio.StreamWriter,
        from_client: bool,
    ) -> None:
        seen = b""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ConnectionError):
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if from_client and id(client) not in self._classes:
                    seen += data[:_SNIFF]
                    found = classify(seen)
                    if found:
                        self._classes[id(client)] = found
                cls = self._class_of(client)
                if self.modes[cls] == "cut":
                    break
                await self._open[cls].wait()
                if self.modes[cls] == "cut":
                    break
                to.write(data)
                await to.drain()
        to.transport.abort()


class ProxyHost:
    """One event loop in a daemon thread, running every proxy of a run."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxies: list[FaultProxy] = []
        threading.Thread(target=self.loop.run_forever, name="fault-proxies", daemon=True).start()

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    def proxy(self, target_port: int, name: str) -> FaultProxy:
        async def build() -> FaultProxy:
            proxy = FaultProxy(self, target_port, name)
            await proxy.start()
            return proxy

        proxy = self.call(build())
        self.proxies.append(proxy)
        return proxy

    def heal_all(self) -> None:
        for proxy in self.proxies:
            proxy.set("pass")
