"""Every private seam of a dependency, with its public fallback forced.

statecodec reaches below one dependency's public API for speed (redis-py's
connection-level calls, which the Redis store's batcher sends its pipelines with) and
leans on two private handles of the MCP SDKs (fastmcp's ``server._mcp_server``; the
SDK's default middleware, which lives in the private ``mcp.server._otel``) and on one
provisional hook (``Server.middleware``). Each test here takes the seam away the way a
future release would, by monkeypatching the dependency's private attribute or module out
of reach (the honest simulation of a release that does not exist yet), and shows that the
public path gives the same verdicts, or that ``protect()`` refuses at once with an
actionable error; tests/test_replay_redis_public.py runs the Redis store's failover and
``WAIT`` tests on its public path too. (PyNaCl's ``_sodium``, OpenSSL's
``hmac.HMAC._hmac`` and the SDK context's ``__dict__`` are no longer used: each saved
under 1% of a request's instructions, docs/performance.md.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid
from typing import Any

import pytest
import redis.asyncio.connection
import redis.cluster
import redis.connection
import test_adapters_mcp as adapters
from fastmcp import FastMCP
from fixtures_valkey import ValkeyServer
from mcp.server.lowlevel import Server

from statecodec.adapters import fastmcp as fastmcp_adapter
from statecodec.adapters import mcp as mcp_adapter
from statecodec.replay import RedisReplayStore
from statecodec.replay import redis as redis_store


# ------------------------------------------------------------------ the mcp SDK
def test_protect_does_not_import_the_private_otel_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp.server._otel", None)  # as if the SDK moved it
    mcp_adapter._sdk_default_middleware.cache_clear()
    try:
        server: Server[Any] = Server("low")
        default = list(server.middleware)
        installed = mcp_adapter.protect(server, adapters.make_codec())
        assert default and server.middleware == [*default, installed]
    finally:
        mcp_adapter._sdk_default_middleware.cache_clear()


def test_protect_fails_at_once_without_the_provisional_middleware_list() -> None:
    server: Server[Any] = Server("low")
    del server.middleware  # as if a release renamed the provisional hook
    with pytest.raises(RuntimeError, match=r"provisional in mcp 2\.3.*RequestStateMiddleware"):
        mcp_adapter.protect(server, adapters.make_codec())


def test_protect_fails_at_once_if_the_context_loses_its_params(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass
    class Renamed:
        method: str
        arguments: Any  # what a release renaming `params` would hand the middleware

    monkeypatch.setattr(mcp_adapter, "ServerRequestContext", Renamed)
    with pytest.raises(RuntimeError, match="method and params"):
        mcp_adapter.protect(Server("low"), adapters.make_codec())
    monkeypatch.setattr(mcp_adapter, "ServerRequestContext", type("Plain", (), {}))  # not a dataclass
    with pytest.raises(RuntimeError, match="dataclass context"):
        mcp_adapter.protect(Server("low"), adapters.make_codec())


def test_fastmcp_without_its_private_lowlevel_server_fails_at_protect() -> None:
    server: FastMCP[Any] = FastMCP("deploy")
    server._mcp_server = object()  # type: ignore[assignment]  # as if FastMCP kept it elsewhere
    with pytest.raises(RuntimeError, match=r"server\._mcp_server.*http_app"):
        fastmcp_adapter.protect(server, adapters.make_codec())


# ------------------------------------------------------------------ redis-py
def test_the_batcher_needs_every_connection_level_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # On every supported redis-py (CI: .ci/lowest.txt and the newest) the direct path is
    # there; a release that drops one of its calls gets the public pipelines instead.
    assert redis_store._direct_calls_available()
    monkeypatch.delattr(redis.asyncio.connection.AbstractConnection, "send_packed_command")
    assert not redis_store._direct_calls_available()


async def test_the_public_pipelines_consume_each_key_once(
    monkeypatch: pytest.MonkeyPatch, valkey_server: ValkeyServer
) -> None:
    # The calls themselves must stay (redis-py's own pipeline sends with them): the check
    # says "absent", as it would on such a release.
    monkeypatch.setattr(redis_store, "_direct_calls_available", lambda: False)
    store = RedisReplayStore(valkey_server.url, prefix=f"t-{uuid.uuid4().hex[:8]}:")
    try:
        results = await asyncio.gather(*(store.aconsume("k", 60) for _ in range(20)))
        assert sorted(results) == [False] * 19 + [True]
        assert await store.aconsume("other", 60) is True
        (sender,) = store._senders.values()
        assert sender._direct is False  # the public path served
    finally:
        await store.aclose()


# ------------------------------------------------------------------ redis-py's option tables
@pytest.mark.parametrize(
    ("module", "table", "url"),
    [
        (redis.connection, "URL_QUERY_ARGUMENT_PARSERS", "redis://127.0.0.1:6379/0"),
        (redis.cluster, "REDIS_ALLOWED_KEYS", "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"),
    ],
)
def test_the_option_check_fails_clearly_without_redis_pys_tables(
    monkeypatch: pytest.MonkeyPatch, module: object, table: str, url: str
) -> None:
    """A redis-py without the table the option check reads: the store refuses to open, naming the fix."""
    from statecodec.replay import store_from_url  # noqa: PLC0415

    assert isinstance(getattr(module, table), dict | set | frozenset | list | tuple)  # this redis-py has it
    store_from_url(url).close()  # and opens the store (no connection yet)
    monkeypatch.delattr(module, table)
    with pytest.raises(ImportError, match=f"has no .*{table}.*install a tested redis-py"):
        store_from_url(url)
