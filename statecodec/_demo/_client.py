"""The client side of ``statecodec demo``: an alternating router and users at official ``mcp`` Clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import httpx2
import mcp_types as types
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from ._cluster import Deviation
from ._scenario import TOOL, user_answers

ROUTER_URL: Final = "http://deploy.router/mcp"  # never resolved: the router picks the instance
CALL_TIMEOUT: Final = 15.0


@dataclass(frozen=True)
class Routed:
    method: str
    instance: str
    body: dict[str, Any]


class Router(httpx2.AsyncBaseTransport):
    """A load balancer in front of A and B: round-robin per JSON-RPC method, so the rounds alternate."""

    def __init__(self, instances: dict[str, str]) -> None:
        self.instances = instances  # name -> URL
        self.routed: list[Routed] = []
        self._counts: defaultdict[str, int] = defaultdict(int)
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body: dict[str, Any] = {}
        if request.method == "POST":
            await request.aread()
            with contextlib.suppress(ValueError):
                body = json.loads(request.content or b"{}")
        method = str(body.get("method", request.method)) if isinstance(body, dict) else request.method
        names = sorted(self.instances)
        name = names[self._counts[method] % len(names)]
        self._counts[method] += 1
        target = httpx2.URL(self.instances[name])
        request.url = request.url.copy_with(scheme=target.scheme, host=target.host, port=target.port)
        request.headers["host"] = f"{target.host}:{target.port}"
        self.routed.append(Routed(method, name, body if isinstance(body, dict) else {}))
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def last_call(self) -> Routed:
        return [r for r in self.routed if r.method == "tools/call"][-1]


Answer = types.CallToolResult | types.InputRequiredResult | MCPError


@dataclass
class User:
    """One person at an official ``mcp`` Client, connected through a router or to one server."""

    name: str
    client: Client
    router: Router | None

    async def call(
        self, version: str, *, state: str | None = None, answers: types.InputResponses | None = None
    ) -> Answer:
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                return await self.client.session.call_tool(
                    TOOL,
                    {"version": version},
                    input_responses=answers,
                    request_state=state,
                    allow_input_required=True,
                )
        except MCPError as exc:
            return exc
        except TimeoutError:
            raise Deviation(f"{self.name}'s tools/call got no answer within {CALL_TIMEOUT:g}s") from None

    def routed(self) -> Routed:
        if self.router is None:
            raise Deviation("this client is not behind the router")
        return self.router.last_call()


@contextlib.asynccontextmanager
async def connect(
    name: str, bearer: str, *, url: str = ROUTER_URL, router: Router | None = None
) -> AsyncIterator[User]:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return user_answers(params)

    transport: httpx2.AsyncBaseTransport = router or httpx2.AsyncHTTPTransport()
    headers = {"Authorization": f"Bearer {bearer}"}
    async with (
        httpx2.AsyncClient(transport=transport, headers=headers, timeout=CALL_TIMEOUT) as http,
        Client(
            streamable_http_client(url, http_client=http), elicitation_callback=elicit, cache=None
        ) as client,
    ):
        yield User(name, client, router)
