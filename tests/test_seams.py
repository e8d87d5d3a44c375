"""Every private seam of a dependency, with its public fallback forced.

statecodec leans on two private handles of the MCP SDKs (fastmcp's
``server._mcp_server``; the SDK's default middleware, which lives in the private
``mcp.server._otel``) and on one provisional hook (``Server.middleware``). Each test
here takes the seam away the way a future release would, by monkeypatching the
dependency's private attribute or module out of reach (the honest simulation of a
release that does not exist yet), and shows that the public path gives the same
verdicts, or that ``protect()`` refuses at once with an actionable error. (PyNaCl's
``_sodium``, OpenSSL's ``hmac.HMAC._hmac``, the SDK context's ``__dict__`` and the
Redis batcher's connection-level calls below redis-py's pipeline are no longer used:
docs/performance.md, "Private seams of dependencies".)
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
import test_adapters_mcp as adapters
from fastmcp import FastMCP
from mcp.server.lowlevel import Server

from statecodec.adapters import fastmcp as fastmcp_adapter
from statecodec.adapters import mcp as mcp_adapter


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
