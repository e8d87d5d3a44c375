"""Real PostgreSQL 15 servers for the replay-store tests (Debian's ``postgresql-15``).

PostgreSQL refuses to run as root, and CI runs as root: the server binaries then run as
the ``postgres`` system user through ``setpriv`` (which execs, so the PID we hold is the
postmaster's own and the server is stopped by it). Each server gets a temp directory of
its own under /tmp (not pytest's tmp_path, which is private to root), owned by the user
that runs it, holding the data directory and the Unix socket; it listens on a picked
loopback port only (a postmaster that cannot bind it exits, and is started on another),
with ``HOME`` pointing there so no ``.pgpass`` of root's is read, and every ``PG*``
variable of the environment is dropped. TCP logins need a password
(scram-sha-256); the Unix socket trusts the local superuser.

:class:`PostgresServer` is one server (a primary); :meth:`PostgresServer.standby` makes a
streaming standby of it with ``pg_basebackup -R``. Without the binaries the tests that
need them skip, saying how to install them. benchmarks/bench_replay.py imports it too.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from processes import pick_port, running, stop, wait_until

SUPERUSER = "postgres"
SUPERUSER_PASSWORD = "Sup3r-Secret"
APP_USER = "statecodec_app"
#: Has '@', ':' and '/' (percent-encoded in URLs): redaction must cope with them.
APP_PASSWORD = "App:P@ss/w0rd"
DATABASE = "statecodec"
INSTALL_HINT = "PostgreSQL 15 server binaries not found: apt-get install postgresql-15"


def bin_dir() -> Path | None:
    """The directory holding initdb, pg_ctl, postgres and pg_basebackup, or None."""
    given = os.environ.get("STATECODEC_PG_BIN")
    candidates = [given] if given else sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    preferred = [c for c in candidates if c and "/15/" in c + "/"] + candidates
    for candidate in preferred:
        if candidate and all(os.access(Path(candidate) / b, os.X_OK) for b in ("initdb", "postgres")):
            return Path(candidate)
    return None


def require_binaries() -> Path:
    found = bin_dir()
    if found is None:
        pytest.skip(INSTALL_HINT)
    return found


def _run_as() -> list[str]:
    """The prefix that runs a server binary as an unprivileged user (none unless root)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


def _owner() -> tuple[int, int]:
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    entry = pwd.getpwnam("postgres")
    return entry.pw_uid, entry.pw_gid


class PostgresServer:
    """One postmaster on a picked loopback port, with its data and socket in a temp dir it owns."""

    def __init__(self, *, settings: dict[str, str] | None = None, data: Path | None = None) -> None:
        self.bin = require_binaries()
        self.port = pick_port()
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "max_connections": "200",
            "fsync": "off",  # a test server; the benchmark turns it back on
            "synchronous_commit": "on",
            "log_min_messages": "warning",
            "shared_buffers": "32MB",
            **(settings or {}),
        }
        if data is None:
            self.root = Path(tempfile.mkdtemp(prefix="statecodec-pg-", dir="/tmp"))
            os.chown(self.root, *_owner())
            self.data = self.root / "data"
        else:
            self.root, self.data = data.parent, data
        self.socket_dir = self.root
        self.process: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ addresses
    def url(self, user: str = APP_USER, password: str = APP_PASSWORD, database: str = DATABASE,
            **query: str) -> str:  # fmt: skip
        auth = f"{quote(user, safe='')}:{quote(password, safe='')}@"
        suffix = "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
        return f"postgresql://{auth}127.0.0.1:{self.port}/{database}" + (f"?{suffix}" if suffix else "")

    @property
    def admin_conninfo(self) -> str:
        """The superuser over the Unix socket (trusted): for the fixtures' own set-up."""
        return f"host={self.socket_dir} port={self.port} user={SUPERUSER} dbname=postgres"

    def admin(self, database: str = "postgres") -> object:
        import psycopg  # noqa: PLC0415

        return psycopg.connect(
            f"host={self.socket_dir} port={self.port} user={SUPERUSER} dbname={database}",
            autocommit=True,
            connect_timeout=5,
        )

    def sql(self, statement: str, database: str = "postgres") -> list[tuple[object, ...]]:
        """Run one statement as the superuser; the rows it returns (none for a command)."""
        with self.admin(database) as conn:  # type: ignore[attr-defined]
            cursor = conn.execute(statement)
            return list(cursor.fetchall()) if cursor.description else []

    # ------------------------------------------------------------------ life
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(HOME=str(self.root), LC_ALL="C.UTF-8", LANG="C.UTF-8")
        return env

    def _run(self, binary: str, *args: str, extra_env: dict[str, str] | None = None) -> None:
        done = subprocess.run(
            [*_run_as(), str(self.bin / binary), *args],
            cwd=self.root, env={**self._env(), **(extra_env or {})},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"{binary} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )

    def init(self) -> PostgresServer:
        """A fresh cluster: a copy (``cp -a``: owner and modes kept) of one initdb per test process."""
        subprocess.run(["cp", "-a", str(_template(self)), str(self.data)], check=True, timeout=120)
        return self

    def initdb(self) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(SUPERUSER_PASSWORD + "\n")
        os.chown(pwfile, *_owner())
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, f"--pwfile={pwfile}",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")  # fmt: skip
        pwfile.unlink()

    def start(self, timeout: float = 60.0) -> PostgresServer:
        if self.process is not None:
            raise RuntimeError("server already running")
        if not (self.data / "PG_VERSION").exists():
            self.init()
        options = [arg for name, value in self.settings.items() for arg in ("-c", f"{name}={value}")]
        log = (self.root / "server.log").open("ab")
        self.process = subprocess.Popen(
            [*_run_as(), str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
             "-k", str(self.socket_dir), *options],
            cwd=self.root, env=self._env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        log.close()
        try:
            wait_until(self._accepts, f"postgres accepts connections on {self.port}", timeout)
        except RuntimeError:
            self.stop()
            output = (self.root / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"postgres did not start on port {self.port}:\n{output}") from None
        return self

    def _accepts(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError("postgres exited")  # not swallowed: stops the wait at once
        self.sql("SELECT 1")
        return True

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def backends(self) -> list[int]:
        """PIDs of the postmaster's children (backends, WAL writer...), from /proc."""
        if self.pid is None:
            return []
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(pid) for pid in text.split()]

    def freeze(self) -> None:
        """SIGSTOP the postmaster and every child: a stuck server, sockets open, nothing answers."""
        assert self.pid is not None
        for pid in [self.pid, *self.backends()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.pid is not None
        for pid in [self.pid, *self.backends()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        """Fast shutdown by the postmaster's PID (SIGINT), SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)  # a frozen server cannot shut down
        for pid in self._children_of(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        stop(process, signal.SIGINT, timeout=30)  # SIGINT: PostgreSQL's fast shutdown

    @staticmethod
    def _children_of(pid: int) -> list[int]:
        try:
            return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            return []

    def kill(self) -> None:
        """SIGKILL the postmaster by its PID: it dies without a word; its backends follow it."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            children = self._children_of(process.pid)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            # The backends notice the postmaster's death and exit; wait so none lingers.
            for pid in children:
                wait_until(lambda pid=pid: not Path(f"/proc/{pid}").exists(), f"backend {pid} exits", 30)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ roles
    def create_app(self, *, schema_owner: bool = True) -> None:
        """The application's role and database; the role owns the database (may create the table)."""
        user, password = APP_USER, APP_PASSWORD.replace("'", "''")
        self.sql(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
        self.sql(f"CREATE DATABASE {DATABASE} OWNER {user if schema_owner else SUPERUSER}")
        self.sql(f"GRANT CREATE ON SCHEMA public TO {user}", DATABASE)

    # ------------------------------------------------------------------ replication
    def standby(self) -> PostgresServer:
        """A streaming standby of this server (``pg_basebackup -R``), started, in sync."""
        replica = PostgresServer(settings=dict(self.settings))
        replica._run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER,
            "-D", str(replica.data),
            "-R", "-X", "stream", "--checkpoint=fast", "--no-sync",
            extra_env={"PGPASSWORD": SUPERUSER_PASSWORD},
        )  # fmt: skip
        for attempt in range(3):  # the postmaster exits if another process holds its picked port
            try:
                replica.start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                replica.port = pick_port()
        wait_until(
            lambda: self.sql("SELECT state FROM pg_stat_replication") == [("streaming",)],
            "the standby streams",
        )
        return replica

    def promote(self) -> None:
        self._run("pg_ctl", "promote", "-D", str(self.data), "-w", "-t", "60")


@contextlib.contextmanager
def synchronous_pair() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """A primary with the application's role and database, and a synchronous standby of it.

    ``synchronous_standby_names = '*'`` is set only once the roles and database exist:
    with a synchronous standby named, CREATE ROLE would have waited for it too.
    """
    with running(PostgresServer) as primary:
        primary.create_app()
        standby = primary.standby()
        try:
            primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.sql("SELECT pg_reload_conf()")
            wait_until(
                lambda: primary.sql("SELECT sync_state FROM pg_stat_replication") == [("sync",)],
                "the standby is synchronous",
            )
            yield primary, standby
        finally:
            standby.cleanup()


_TEMPLATE: list[PostgresServer] = []


def _template(server: PostgresServer) -> Path:
    """The data directory of one initdb, made on first use and removed when the process exits."""
    if not _TEMPLATE:
        template = PostgresServer(settings=server.settings)
        template.initdb()
        _TEMPLATE.append(template)
        atexit.register(lambda: shutil.rmtree(template.root, ignore_errors=True))
    return _TEMPLATE[0].data


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL 15 for the session, with the application's role and database.

    Tests must not stop it (use postgres_outage); they keep apart by table names of their own.
    """
    require_binaries()
    with running(PostgresServer) as server:
        server.create_app()
        yield server


@pytest.fixture
def postgres_outage() -> Iterator[PostgresServer]:
    """A server of this test's own, which the test may stop(), freeze() and start() at will."""
    require_binaries()
    with running(PostgresServer) as server:
        server.create_app()
        yield server
