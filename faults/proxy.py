"""A TCP fault proxy: in front of a server, it forwards, holds or cuts connections on command.

Every connection to a store server goes through one (clients, sentinels, replicas, the
cluster bus), so the nemesis can partition without root: *hold* is a network partition
that heals before TCP gives up (bytes wait in the proxy, nothing is answered, then
everything flows again), *cut* resets every open connection and refuses new ones until
healed.

A partition can be one-sided, and can single out one peer: each connection gets a label
from the first bytes it sends. ``replication`` when it asks a Redis server for
``REPLCONF``/``PSYNC`` or opens a PostgreSQL replication session; ``sentinel-<id>`` when
a Sentinel names its link (``CLIENT SETNAME sentinel-<first 8 characters of its id>-...``,
on its links to the servers and to the other sentinels alike); ``bus-<node id>`` for a
cluster bus link (every bus message starts with ``RCmb`` and names its sender); else
``client``. A mode is set for label prefixes (``sentinel`` holds every sentinel,
``sentinel-1a2b3c4d`` one of them); when several prefixes match, cut beats hold beats
pass. A replica's link starts with a plain ``PING``, so it counts as a client until its
``REPLCONF`` arrives (a round trip later).

The proxies of a run share one event loop in a thread of the runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

MODES = ("pass", "hold", "cut")
_SNIFF = 2048
_SENTINEL = re.compile(rb"sentinel-([0-9a-z]{8})-", re.IGNORECASE)
# A cluster bus message: signature, then 36 bytes of lengths, type, epochs and offset, then
# the sender's 40-character node id.
_BUS_SIGNATURE, _BUS_SENDER = b"RCmb", slice(40, 80)
T = TypeVar("T")


def classify(first_bytes: bytes) -> str | None:
    """The label of a connection from what it sent so far, None while undecided."""
    upper = first_bytes.upper()
    if b"REPLCONF" in upper or b"PSYNC" in upper or b"REPLICATION\x00" in upper:
        return "replication"
    sentinel = _SENTINEL.search(first_bytes)
    if sentinel:
        return "sentinel-" + sentinel.group(1).decode().lower()
    if first_bytes.startswith(_BUS_SIGNATURE) and len(first_bytes) >= _BUS_SENDER.stop:
        return "bus-" + first_bytes[_BUS_SENDER].decode("ascii", "replace")
    return None if len(first_bytes) < _SNIFF else "client"


class FaultProxy:
    def __init__(self, host: ProxyHost, target_port: int, name: str) -> None:
        self.host, self.target_port, self.name = host, target_port, name
        self.port = 0
        #: Mode per label prefix; a label no prefix matches passes.
        self.modes: dict[str, str] = {}
        self._changed = asyncio.Event()
        self._connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._labels: dict[int, str] = {}
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def set(self, mode: str, prefixes: tuple[str, ...] = ("",)) -> None:
        """Set the mode of the connections whose label starts with one of ``prefixes`` (thread-safe)."""
        self.host.call(self._set(mode, prefixes))

    def mode_of(self, label: str) -> str:
        found = {mode for prefix, mode in self.modes.items() if label.startswith(prefix)}
        return next((mode for mode in ("cut", "hold") if mode in found), "pass")

    async def _set(self, mode: str, prefixes: tuple[str, ...]) -> None:
        for prefix in prefixes:
            if mode == "pass":
                self.modes = {p: m for p, m in self.modes.items() if not p.startswith(prefix)}
            else:
                self.modes[prefix] = mode
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        if mode == "cut":
            for client, upstream in list(self._connections):
                if self.mode_of(self._label_of(client)) == "cut":
                    for writer in (client, upstream):
                        writer.transport.abort()

    def _label_of(self, writer: asyncio.StreamWriter) -> str:
        return self._labels.get(id(writer), "client")

    async def _open(self, label: str) -> bool:
        """Wait while ``label`` is held; whether its bytes may flow (False: cut)."""
        while (mode := self.mode_of(label)) == "hold":
            await self._changed.wait()
        return mode == "pass"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.modes.get("") == "cut":
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        entry = (writer, up_writer)
        self._connections.add(entry)
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer, writer, True), self._pipe(up_reader, writer, writer, False)
            )
        finally:
            self._connections.discard(entry)
            self._labels.pop(id(writer), None)
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
                if from_client and id(client) not in self._labels:
                    seen += data[:_SNIFF]
                    found = classify(seen)
                    if found:
                        self._labels[id(client)] = found
                if not await self._open(self._label_of(client)):
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

    def close(self) -> None:
        """Stop the event loop (its thread ends; open connections are dropped with the process)."""
        self.loop.call_soon_threadsafe(self.loop.stop)

    def heal_all(self) -> None:
        for proxy in self.proxies:
            proxy.set("pass")
