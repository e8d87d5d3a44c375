"""Real MCP servers and clients for the adapter tests (nothing here is mocked).

Servers: examples/deploy_server.py as processes.

A *cluster* is two instances of one flavour (lowlevel Server, MCPServer or FastMCP) and
one mode (SIGN or ENCRYPT), started as separate processes over Streamable HTTP on free
loopback ports (each binds port 0 and reports ``READY <url>``), sharing one key ring
file and one SQLite replay store, as two replicas behind a load balancer would. They are
stopped by their own PIDs. Each instance's stderr goes to a log file the tests read to
check the precise rejection reason.

Clusters are module-scoped and parametrized, so pytest runs every test of one
(flavour, mode) against the same two processes before starting the next pair.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from processes import ROOT, Spawned, start_all, wait_for_log
from replicas import Replicas

from statecodec import KeyRing

EXAMPLE = ROOT / "examples" / "deploy_server.py"
FLAVORS = ("lowlevel", "mcpserver", "fastmcp")
MODES = ("sign", "encrypt")
TOOL = "deploy_production"
ISSUER = "https://idp.example"
CLIENT_ID = "deploy-cli"
AUDIENCE = "deploy"


class Instance(Spawned):
    """One server process; it announces its MCP endpoint."""

    @property
    def url(self) -> str:
        return self.announced

    @property
    def base(self) -> str:
        return self.url.rsplit("/", 1)[0]


@dataclass
class Cluster(Replicas[Instance]):
    """Two instances of one flavour sharing keys and a replay store."""

    flavor: str
    instances: list[Instance] = field(default_factory=list)

    def members(self) -> list[Instance]:
        return self.instances

    def by_url(self, url: str) -> Instance:
        return next(i for i in self.instances if url.startswith(i.base))

    def wait_for_log(self, instance: Instance, needle: str, timeout: float = 60.0) -> str:
        """The instance's log once it contains ``needle`` (logs are flushed a bit later)."""
        return wait_for_log(instance.log_path, needle, timeout)


def server_command(
    *, flavor: str, mode: str, keys: Path, replay: str, name: str, transport: str = "http"
) -> list[str]:
    return [
        sys.executable,
        str(EXAMPLE),
        "--flavor", flavor,
        "--mode", mode,
        "--keys", str(keys),
        "--replay", replay,
        "--instance", name,
        "--transport", transport,
        "--port", "0",
    ]  # fmt: skip


def start_cluster(tmp: Path, flavor: str, mode: str, names: Sequence[str] = ("A", "B")) -> Cluster:
    tmp.mkdir(parents=True, exist_ok=True)
    keys = tmp / "keys.json"
    keys.write_text(KeyRing.generate().to_json(), encoding="utf-8")
    cluster = Cluster(mode=mode, keys_path=keys, replay_url=f"sqlite:{tmp / 'replay.sqlite3'}", flavor=flavor)
    commands = [
        (name, server_command(flavor=flavor, mode=mode, keys=keys, replay=cluster.replay_url, name=name),
         tmp / f"{name}.log")
        for name in names
    ]  # fmt: skip
    cluster.instances = [Instance(*started) for started in start_all(commands, "READY ")]
    return cluster


@contextlib.contextmanager
def running_cluster(tmp: Path, flavor: str, mode: str) -> Iterator[Cluster]:
    cluster = start_cluster(tmp, flavor, mode)
    try:
        yield cluster
    finally:
        for instance in cluster.instances:
            instance.stop()


@pytest.fixture(
    scope="module",
    params=[(flavor, mode) for flavor in FLAVORS for mode in MODES],
    ids=[f"{flavor}-{mode}" for flavor in FLAVORS for mode in MODES],
)
def deploy_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Two instances of examples/deploy_server.py, for every flavour and mode."""
    flavor, mode = request.param
    with running_cluster(tmp_path_factory.mktemp(f"cluster-{flavor}-{mode}"), flavor, mode) as cluster:
        yield cluster


# ------------------------------------------------------------------ clients
# The official ``mcp`` Python client. The "load balancer" is an httpx transport that
# sends each request to one of the instances (round-robin per JSON-RPC method, so the
# first ``tools/call`` goes to A and the second to B) and records what went where.


@dataclass
class Routed:
    method: str
    instance: str
    body: dict[str, Any]


@dataclass
class Balancer(httpx2.AsyncBaseTransport):
    """Round-robin per JSON-RPC method over ``bases`` (``http://host:port``), or pinned."""

    bases: dict[str, str]  # instance name -> base URL
    pin: str | None = None
    routed: list[Routed] = field(default_factory=list)
    _counts: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    _inner: httpx2.AsyncHTTPTransport = field(default_factory=httpx2.AsyncHTTPTransport)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body: dict[str, Any] = {}
        if request.method == "POST":
            await request.aread()
            body = json.loads(request.content or b"{}")
        method = str(body.get("method", request.method))
        names = sorted(self.bases)
        name = self.pin or names[self._counts[method] % len(names)]
        self._counts[method] += 1
        target = httpx2.URL(self.bases[name])
        request.url = request.url.copy_with(host=target.host, port=target.port)
        request.headers["host"] = f"{target.host}:{target.port}"
        self.routed.append(Routed(method, name, body))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def calls(self, method: str = "tools/call") -> list[Routed]:
        return [r for r in self.routed if r.method == method]


async def answer_elicitation(
    context: ClientRequestContext, params: types.ElicitRequestParams
) -> types.ElicitResult:
    """The user: confirms the deployment and gives a change ticket."""
    properties = getattr(params, "requested_schema", {}).get("properties", {})
    if "confirm" in properties:
        return types.ElicitResult(action="accept", content={"confirm": True})
    return types.ElicitResult(action="accept", content={"ticket": "CHG-1234"})


ANSWERS: dict[str, types.InputResponse] = {
    "confirm_deploy": types.ElicitResult(action="accept", content={"confirm": True}),
    "change_ticket": types.ElicitResult(action="accept", content={"ticket": "CHG-1234"}),
}


@asynccontextmanager
async def connect(balancer: Balancer, bearer: str | None = "alice-token") -> AsyncIterator[Client]:
    """An official ``mcp`` Client (auto negotiation) whose HTTP goes through ``balancer``."""
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    url = next(iter(balancer.bases.values())) + "/mcp"
    async with (
        httpx2.AsyncClient(transport=balancer, headers=headers, timeout=30) as http,
        Client(
            streamable_http_client(url, http_client=http), elicitation_callback=answer_elicitation, cache=None
        ) as client,
    ):
        yield client


async def round_one(client: Client, version: str = "1.2.3") -> types.InputRequiredResult:
    result = await client.session.call_tool(TOOL, {"version": version}, allow_input_required=True)
    assert isinstance(result, types.InputRequiredResult), result
    assert result.request_state is not None
    assert set(result.input_requests or {}) == {"confirm_deploy", "change_ticket"}
    return result


async def round_two(
    client: Client, state: str, version: str = "1.2.3"
) -> types.CallToolResult | types.InputRequiredResult:
    return await client.session.call_tool(
        TOOL, {"version": version}, input_responses=ANSWERS, request_state=state, allow_input_required=True
    )
