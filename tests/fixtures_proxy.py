"""Real unprotected MCP servers behind real ``statecodec proxy`` processes (nothing mocked).

A *proxied service* is one upstream that has NO requestState protection of its own
(the TypeScript SDK server, tests/node/ts_upstream_server.mjs, or the low-level Python
``Server``, examples/unprotected_server.py), fronted by two ``statecodec proxy``
processes that share a key ring file and a SQLite replay store, as two replicas behind a
load balancer would. Both upstreams record every ``requestState`` they issued and every
one they received (read from the raw HTTP body), so tests can prove that nothing but
their own plaintext ever reached them.

The proxies bind principals from bearer JWTs checked against a JWKS document served on
loopback by :class:`JWKSServer` (an RSA key made per test session), so "alice" and "bob"
are real, verified identities. Every process binds port 0 and reports its URL; all are
stopped by their own PIDs.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from loopback import Loopback, Quiet
from processes import NODE_DIR, ROOT, Spawned, await_line, node_or_skip, spawn, start_all, stop
from replicas import Replicas, keys_file

from statecodec import Binding, boundary

ISSUER = "https://idp.test"
JWT_AUDIENCE = "https://deploy.test/mcp"
CLIENT_ID = "deploy-cli"
AUDIENCE = "deploy"
TOOL = "deploy_production"
#: Which upstream runs in which mode (both modes covered without doubling the processes).
SERVICES = {"python": "encrypt", "typescript": "sign"}
MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "proxy-test", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
}
#: The deploy tool's two questions, answered (round 2 of the deploy flow).
ANSWERS = {
    "confirm_deploy": {"action": "accept", "content": {"confirm": True}},
    "change_ticket": {"action": "accept", "content": {"ticket": "CHG-1234"}},
}


def modern_request(method: str, params: dict[str, Any], request_id: int = 1) -> tuple[bytes, dict[str, str]]:
    """A 2026-07-28 request as raw JSON-RPC: the body, and the headers a client sends with it."""
    body = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": method, "params": {**params, "_meta": META}}
    )
    return body.encode(), modern_headers(method, params["name"] if method == "tools/call" else None)


def modern_headers(method: str, tool: str | None = None) -> dict[str, str]:
    """The headers a 2026-07-28 client sends with a JSON-RPC request (``tool``: a call's ``Mcp-Name``)."""
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
    }
    if tool is not None:
        headers["mcp-name"] = tool
    return headers


def messages(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON-RPC messages of a JSON or SSE response."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        found = []
        for block in response.text.replace("\r\n", "\n").split("\n\n"):
            data = "\n".join(line[5:].lstrip(" ") for line in block.split("\n") if line.startswith("data:"))
            if data:
                document = json.loads(data)
                found.extend(document if isinstance(document, list) else [document])
        return found
    document = response.json()
    return document if isinstance(document, list) else [document]


# ------------------------------------------------------------------ identity provider
class JWKSServer:
    """An identity provider's JWKS endpoint on loopback, and the key to mint its JWTs."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "test-key-1"
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        document = json.dumps({"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]}).encode()
        self.hits = 0  # how often the JWKS was fetched
        outer = self

        class Handler(Quiet):
            def do_GET(self) -> None:
                outer.hits += 1
                self.reply(200, document)

        self._server = Loopback(Handler)
        self.url = f"{self._server.base}/jwks.json"

    def mint(self, subject: str, *, lifetime: int = 600, key: Any = None, **claims: Any) -> str:
        now = int(time.time())
        payload = {
            "iss": ISSUER,
            "aud": JWT_AUDIENCE,
            "sub": subject,
            "client_id": CLIENT_ID,
            "iat": now,
            "exp": now + lifetime,
            **claims,
        }
        return jwt.encode(payload, key or self.key, algorithm="RS256", headers={"kid": self.kid})

    def close(self) -> None:
        self._server.close()


def principal(subject: str) -> str:
    """The principal string the proxy derives from a JWT minted by :class:`JWKSServer`."""
    return boundary.principal_string(CLIENT_ID, ISSUER, subject)


@pytest.fixture(scope="session")
def jwks_server() -> Iterator[JWKSServer]:
    server = JWKSServer()
    try:
        yield server
    finally:
        server.close()


@dataclass
class Upstream:
    """An MCP server without protection, and the file it records requestState values in."""

    kind: str
    url: str
    proc: subprocess.Popen[str]
    record: Path
    log_path: Path

    def entries(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text(encoding="utf-8").splitlines() if line]

    def issued(self) -> list[str]:
        return [e["issued"] for e in self.entries() if "issued" in e]

    def received(self) -> list[Any]:
        return [e["received"] for e in self.entries() if "received" in e]


class Proxy(Spawned):
    """One ``statecodec proxy`` process; it announces the base URL it listens on."""

    @property
    def base(self) -> str:
        return self.announced

    @property
    def url(self) -> str:
        return self.base + "/mcp"

    def records(self) -> list[dict[str, Any]]:
        """The log of a proxy run with ``--log-format json``: every line one JSON object."""
        return [json.loads(line) for line in self.log().splitlines() if line.strip()]


@dataclass
class Service(Replicas[Proxy]):
    """One unprotected upstream behind two proxy instances sharing keys and a replay store."""

    kind: str
    upstream: Upstream
    proxies: list[Proxy] = field(default_factory=list)
    #: Plaintext states a test sealed itself as a legitimate server would (see :meth:`seal`).
    vouched: set[str] = field(default_factory=set)

    def members(self) -> list[Proxy]:
        return self.proxies

    def bases(self) -> dict[str, str]:
        return {p.name: p.base for p in self.proxies}

    def binding(self, subject: str | None, version: str = "1.2.3") -> Binding:
        """What the proxies bind a deploy_production call of ``subject`` to."""
        return boundary.binding_for(
            "tools/call",
            {"name": TOOL, "arguments": {"version": version}},
            principal=principal(subject) if subject else None,
            audience=AUDIENCE,
        )

    def seal(self, plaintext: str, subject: str | None, version: str = "1.2.3") -> str:
        """A valid token for ``plaintext``, as if the upstream had issued it through a proxy."""
        self.vouched.add(plaintext)
        return self.codec().seal(plaintext.encode(), self.binding(subject, version))

    def foreign_states(self) -> list[Any]:
        """Every requestState the upstream received that neither it nor a test's :meth:`seal` issued."""
        issued = set(self.upstream.issued()) | self.vouched
        return [state for state in self.upstream.received() if state not in issued]


def upstream_command(kind: str, record: Path) -> tuple[list[str], Path]:
    if kind == "typescript":
        return [node_or_skip(), str(NODE_DIR / "ts_upstream_server.mjs"), "--record", str(record)], NODE_DIR
    example = ROOT / "examples" / "unprotected_server.py"
    return [sys.executable, str(example), "--port", "0", "--record", str(record)], ROOT


@contextlib.contextmanager
def running_upstream(kind: str, directory: Path, *flags: str) -> Iterator[Upstream]:
    """The ``kind`` upstream (with ``flags``), recording to ``directory/states.jsonl``, stopped by its PID."""
    record, log_path = directory / "states.jsonl", directory / "upstream.log"
    command, cwd = upstream_command(kind, record)
    proc = spawn([*command, *flags], log_path, cwd)
    try:
        yield Upstream(kind, await_line(proc, "READY ", log_path), proc, record, log_path)
    finally:
        stop(proc)


def proxy_command(
    upstream: str, *, keys: Path, replay: str, mode: str, jwks: str | None, extra: Sequence[str] = ()
) -> list[str]:
    """A ``statecodec proxy`` command line; principals from JWTs checked against ``jwks``, or none."""
    if jwks is None:
        principal = ["--principal-from", "none"]
    else:
        principal = [
            "--principal-from", "jwt-sub", "--jwks", jwks, "--issuer", ISSUER, "--jwt-audience", JWT_AUDIENCE
        ]  # fmt: skip
    return [
        sys.executable, "-m", "statecodec.cli", "proxy",
        "--upstream", upstream,
        "--listen", "127.0.0.1:0",
        "--keys", f"file:{keys}",
        "--replay", replay,
        "--audience", AUDIENCE,
        "--mode", mode,
        *principal,
        "--graceful-timeout", "5s",
        *extra,
    ]  # fmt: skip


def start_proxies(
    tmp: Path,
    upstream: str,
    *,
    keys: Path,
    replay: str,
    mode: str,
    jwks: str | None,
    names: Sequence[str] = ("A", "B"),
    extra: Sequence[str] = (),
) -> list[Proxy]:
    commands = [
        (name, proxy_command(upstream, keys=keys, replay=replay, mode=mode, jwks=jwks, extra=extra),
         tmp / f"proxy-{name}.log")
        for name in names
    ]  # fmt: skip
    return [Proxy(*started) for started in start_all(commands, "listening on ")]


@pytest.fixture(scope="module", params=sorted(SERVICES), ids=lambda kind: f"{kind}-upstream")
def proxied(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, jwks_server: JWKSServer
) -> Iterator[Service]:
    """An unprotected upstream (TypeScript SDK or lowlevel Python Server) behind two proxies."""
    kind: str = request.param
    mode = SERVICES[kind]
    tmp = tmp_path_factory.mktemp(f"proxied-{kind}")
    keys = keys_file(tmp)
    with running_upstream(kind, tmp) as upstream:
        service = Service(
            mode=mode,
            keys_path=keys,
            replay_url=f"sqlite:{tmp / 'replay.sqlite3'}",
            kind=kind,
            upstream=upstream,
        )
        service.proxies = start_proxies(
            tmp, upstream.url, keys=keys, replay=service.replay_url, mode=mode, jwks=jwks_server.url,
            extra=["--log-format", "json"],
        )  # fmt: skip
        try:
            yield service
        finally:
            for proxy in service.proxies:
                proxy.stop()
