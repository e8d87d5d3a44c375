"""Every private seam of a dependency, with its public fallback forced.

statecodec reaches below one dependency's public API for speed (redis-py's
connection-level calls, which the Redis store's batcher sends its pipelines with) and
leans on two private handles of the MCP SDKs (fastmcp's ``server._mcp_server``; the
SDK's default middleware, which lives in the private ``mcp.server._otel``) and on one
provisional hook (``Server.middleware``); the proxy's connection guard extends uvicorn's
undocumented httptools protocol (no public alternative: a clear failure at start-up
instead, and uvicorn capped at the releases tested), and the embedded uvicorn server
replaces uvicorn's undocumented ``Server.capture_signals``. Each test here takes the seam away the way a
future release would, by monkeypatching the dependency's private attribute or module out
of reach (the honest simulation of a release that does not exist yet), and shows that the
public path gives the same verdicts, or that ``protect()`` refuses at once with an
actionable error; the Redis store's failover and ``WAIT`` tests run on its public path too
(the ``redis_pipelines`` fixture of tests/replay/conftest.py). (PyNaCl's ``_sodium``, OpenSSL's
``hmac.HMAC._hmac`` and the SDK context's ``__dict__`` are no longer used: each saved
under 1% of a request's instructions, docs/performance.md.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import socket
import sys
import threading
import uuid
from typing import Any

import pytest
import redis.asyncio.connection
import redis.cluster
import redis.connection
import uvicorn
from fastmcp import FastMCP
from fixtures_valkey import ValkeyServer
from mcp.server.lowlevel import Server
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from statecodec import KeyRing, StateCodec
from statecodec._serving import EmbeddedServer, quiet_config, wait_started
from statecodec.adapters import fastmcp as fastmcp_adapter
from statecodec.adapters import mcp as mcp_adapter
from statecodec.proxy import _guard
from statecodec.replay import RedisReplayStore
from statecodec.replay import redis as redis_store
from statecodec.replay.memory import MemoryReplayStore


# ------------------------------------------------------------------ the mcp SDK
def _codec() -> StateCodec:
    return StateCodec(KeyRing.generate(), replay=MemoryReplayStore())


def test_protect_does_not_import_the_private_otel_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp.server._otel", None)  # as if the SDK moved it
    mcp_adapter._sdk_default_middleware.cache_clear()
    try:
        server: Server[Any] = Server("low")
        default = list(server.middleware)
        installed = mcp_adapter.protect(server, _codec())
        assert default and server.middleware == [*default, installed]
    finally:
        mcp_adapter._sdk_default_middleware.cache_clear()


def test_protect_fails_at_once_without_the_provisional_middleware_list() -> None:
    server: Server[Any] = Server("low")
    del server.middleware  # as if a release renamed the provisional hook
    with pytest.raises(RuntimeError, match=r"provisional in mcp 2\.3.*RequestStateMiddleware"):
        mcp_adapter.protect(server, _codec())


def test_protect_fails_at_once_if_the_context_loses_its_params(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass
    class Renamed:
        method: str
        arguments: Any  # what a release renaming `params` would hand the middleware

    monkeypatch.setattr(mcp_adapter, "ServerRequestContext", Renamed)
    with pytest.raises(RuntimeError, match="method and params"):
        mcp_adapter.protect(Server("low"), _codec())
    monkeypatch.setattr(mcp_adapter, "ServerRequestContext", type("Plain", (), {}))  # not a dataclass
    with pytest.raises(RuntimeError, match="dataclass context"):
        mcp_adapter.protect(Server("low"), _codec())


def test_fastmcp_without_its_private_lowlevel_server_fails_at_protect() -> None:
    server: FastMCP[Any] = FastMCP("deploy")
    server._mcp_server = object()  # type: ignore[assignment]  # as if FastMCP kept it elsewhere
    with pytest.raises(RuntimeError, match=r"server\._mcp_server.*http_app"):
        fastmcp_adapter.protect(server, _codec())


# ------------------------------------------------------------------ uvicorn
# The proxy's connection guard (statecodec/proxy/_guard.py) extends uvicorn's httptools
# protocol, which uvicorn does not document: its callbacks, and the attributes connections,
# pipeline, cycle (its response_started), transport, client and loop.
def test_this_uvicorn_has_all_the_guard_builds_on() -> None:
    assert _guard.missing_from_uvicorn(HttpToolsProtocol, RequestResponseCycle) == []


def test_the_guard_is_not_built_on_a_uvicorn_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    class Renamed(HttpToolsProtocol):  # as if a release set its state under other names
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_guard, "HttpToolsProtocol", Renamed)
    with pytest.raises(RuntimeError, match=r"statecodec\[proxy\].* lacks .*__init__ sets loop and 3 more"):
        _guard.guarded_protocol(_guard.Guard(_guard.ClientLimits(), 8))
    renamed = _guard.missing_from_uvicorn(Renamed, RequestResponseCycle)
    assert "HttpToolsProtocol.__init__ sets pipeline" in renamed
    no_callbacks = _guard.missing_from_uvicorn(object, RequestResponseCycle)
    assert "HttpToolsProtocol.on_response_complete" in no_callbacks
    assert _guard.missing_from_uvicorn(HttpToolsProtocol, object) == [
        "RequestResponseCycle.__init__ sets response_started"
    ]


async def _served(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):
        pass  # the whole body, or the client gone
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"6")]})
    await send({"type": "http.response.body", "body": b"served"})


async def test_the_attributes_the_guard_reads_mean_what_it_takes_them_for() -> None:
    """A real uvicorn server with the guarded protocol, one connection allowed."""
    guard = _guard.Guard(_guard.ClientLimits(head_timeout=60, body_timeout=0.3), max_connections=1)
    config = uvicorn.Config(
        _served, http=_guard.guarded_protocol(guard), ws="none", lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        sweeping = asyncio.create_task(guard.run(0.05))
        try:
            await _until(lambda: server.started)
            first = await asyncio.open_connection("127.0.0.1", port)
            first[1].write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            assert (await asyncio.wait_for(first[0].readuntil(b"served"), 30)).startswith(b"HTTP/1.1 200")
            await _until(lambda: len(guard.heads) == 1)  # pipeline empty: waiting for a head again
            second = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(first[0].read(), 30) == b""  # connections: the idle one gave way
            second[1].write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nx")
            answer = await asyncio.wait_for(second[0].read(), 30)  # cycle.response_started: nothing yet
            assert answer.startswith(b"HTTP/1.1 408"), answer
            for _, writer in (first, second):
                writer.close()
        finally:
            sweeping.cancel()
            server.should_exit = True
            await asyncio.wait_for(serving, 30)


# statecodec/_serving.py's EmbeddedServer replaces uvicorn's Server.capture_signals, which
# uvicorn does not document, so that a server embedded beside other work (the proxy's admin
# listener, the demo's instances) leaves SIGINT/SIGTERM to its owner.
def test_this_uvicorn_has_the_signal_hook_the_embedded_server_replaces() -> None:
    assert callable(vars(uvicorn.Server).get("capture_signals")), (
        f"uvicorn {uvicorn.__version__}'s Server has no capture_signals: EmbeddedServer "
        "(statecodec/_serving.py) no longer keeps uvicorn's signal handlers out "
        '(docs/architecture.md, "Private seams of dependencies")'
    )


@pytest.mark.parametrize(
    ("server_class", "takes_signals"),
    [(uvicorn.Server, True), (EmbeddedServer, False)],
    ids=["uvicorn", "embedded"],
)
async def test_only_capture_signals_installs_uvicorns_signal_handlers(
    server_class: type[uvicorn.Server], takes_signals: bool
) -> None:
    """uvicorn's own Server takes SIGINT/SIGTERM while it serves (on the main thread, as here),
    through capture_signals: so replacing it is what keeps an EmbeddedServer's handlers out."""
    assert threading.current_thread() is threading.main_thread()  # uvicorn installs none elsewhere
    handled = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.getsignal(sig) for sig in handled}
    server = server_class(quiet_config(_served, lifespan="off"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            await wait_started(server, serving, timeout=30, what="the server")
            during = {sig: signal.getsignal(sig) for sig in handled}
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)
    assert during == ({sig: server.handle_exit for sig in handled} if takes_signals else before)
    assert {sig: signal.getsignal(sig) for sig in handled} == before


async def _until(condition: Any, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


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
