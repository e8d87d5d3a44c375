"""A replay-store outage during the SDK migration window gets the boundary's answer, as every token does.

The store is a real SQLite replay store made unavailable the way it is in production: another
writer holds the database's write lock (``BEGIN EXCLUSIVE`` on a second connection) and the
store's ``busy_timeout`` is 0, so its consume fails with SQLITE_BUSY. Nothing is mocked.

The answer must be the boundary's -32603 "retry the same request (its requestState was not
consumed)", for an SDK token exactly as for a statecodec one: a -32602 would tell a client
migrating off the SDK that its valid flow is over. Once the lock is released, the very same
request succeeds: the outage consumed nothing.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.request_state import RequestStateSecurity
from mcp.shared.exceptions import MCPError

from statecodec import KeyRing, StateCodec
from statecodec.adapters.mcp import protect
from statecodec.adapters.sdk_window import SDKStateWindow
from statecodec.boundary import INTERNAL_ERROR_CODE, STORE_UNAVAILABLE_DATA, STORE_UNAVAILABLE_MESSAGE
from statecodec.replay.sqlite import SQLiteReplayStore

SDK_KEY = b"the-secret-the-sdk-instances-were-given-0123"
NAME = "deploy"
TOOL = "deploy_production"
ARGS = {"version": "1.2.3"}


def build(security: RequestStateSecurity | None = None) -> MCPServer[Any]:
    """No state -> "step-1" -> done."""
    server: MCPServer[Any] = MCPServer(NAME, request_state_security=security)

    @server.tool(name=TOOL)
    async def deploy(version: str, ctx: Context) -> types.CallToolResult | types.InputRequiredResult:
        if ctx.request_state is None:
            return types.InputRequiredResult(request_state="step-1")
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"deployed {version}")])

    return server


async def call(server: MCPServer[Any], state: str | None) -> Any:
    async with Client(server) as client:
        return await client.session.call_tool(TOOL, ARGS, request_state=state, allow_input_required=True)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteReplayStore]:
    replay = SQLiteReplayStore(tmp_path / "replay.db", busy_timeout=0)
    yield replay
    replay.close()


class WriteLock:
    """Another writer holding the SQLite database's write lock while inside the block."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.connection = sqlite3.connect(self.path, isolation_level=None)
        self.connection.execute("BEGIN EXCLUSIVE")

    def __exit__(self, *_: object) -> None:
        self.connection.execute("ROLLBACK")
        self.connection.close()


@pytest.mark.parametrize("issuer", ["sdk", "statecodec"])
async def test_a_store_outage_is_retry_the_same_request_for_every_token(
    issuer: str, store: SQLiteReplayStore, caplog: pytest.LogCaptureFixture
) -> None:
    server = build()
    codec = StateCodec(KeyRing.generate(), replay=store)
    protect(server, codec, sdk_window=SDKStateWindow([SDK_KEY], until=codec.clock() + 3600))
    minted_by = build(RequestStateSecurity(keys=[SDK_KEY])) if issuer == "sdk" else server
    first = await call(minted_by, None)
    token = first.request_state
    assert token is not None and token.startswith("v1." if issuer == "sdk" else "sc1")

    with WriteLock(store.path), caplog.at_level(logging.WARNING, logger="statecodec"):
        async with Client(server) as client:
            with pytest.raises(MCPError) as outage:
                await client.session.call_tool(TOOL, ARGS, request_state=token, allow_input_required=True)
    assert {
        "code": outage.value.error.code,
        "message": outage.value.error.message,
        "data": outage.value.error.data,
    } == {
        "code": INTERNAL_ERROR_CODE,
        "message": STORE_UNAVAILABLE_MESSAGE,
        "data": dict(STORE_UNAVAILABLE_DATA),
    }
    rejected = [r for r in caplog.records if getattr(r, "event", None) == "token_rejected"]
    assert [r.reason for r in rejected] == ["store_unavailable"]  # type: ignore[attr-defined]

    # The store is back: the same request redeems the token, which the outage did not consume.
    done = await call(server, token)
    assert isinstance(done, types.CallToolResult)
    assert isinstance(done.content[0], types.TextContent) and done.content[0].text == "deployed 1.2.3"
