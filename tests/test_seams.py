"""Every private seam of a dependency, with its public fallback forced.

statecodec reaches below four dependencies' public APIs for speed (PyNaCl's cffi handle,
OpenSSL's HMAC object inside ``hmac.HMAC``, a copy of the SDK context's instance
dictionary, redis-py's connection-level calls) and leans on two private handles of the
MCP SDKs (fastmcp's ``server._mcp_server``; the SDK's default middleware, which lives in
the private ``mcp.server._otel``) and on one provisional hook (``Server.middleware``).
Each test here takes the seam away the way a future release would, by monkeypatching
the dependency's private attribute or module out of reach (the honest simulation of a
release that does not exist yet), and shows that the public path gives the same bytes
and verdicts, or that ``protect()`` refuses at once with an actionable error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.connection
import test_adapters_mcp as adapters
import test_vectors as vectors
from fastmcp import FastMCP
from fixtures_valkey import ValkeyServer
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from nacl.exceptions import CryptoError

from statecodec import Key, _aead, _keys
from statecodec.adapters import fastmcp as fastmcp_adapter
from statecodec.adapters import mcp as mcp_adapter
from statecodec.replay import redis as redis_store


# ------------------------------------------------------------------ PyNaCl and hmac
def test_no_libsodium_handle_means_the_public_wrappers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nacl._sodium", None)  # `import nacl._sodium` raises ImportError
    assert _aead._libsodium() is None
    monkeypatch.setitem(sys.modules, "nacl._sodium", types.ModuleType("nacl._sodium"))  # no ffi, no lib
    assert _aead._libsodium() is None


def test_private_hmac_missing_means_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Python without OpenSSL's HMAC builds hmac.HMAC from two hashes: no `_hmac` object.
    monkeypatch.setattr(hmac, "_hashopenssl", None)
    key = Key.generate("k1")
    assert type(key._sign_mac) is hmac.HMAC and type(key._bind) is hmac.HMAC
    assert key.sign_mac(b"header.payload") == hmac.digest(key.mac_key, b"sc1s.header.payload", "sha256")


def test_a_private_hmac_computing_something_else_is_not_used() -> None:
    key = b"k" * 32
    wrapper = hmac.new(key, b"prefix", "sha256")
    # The same private object type, keyed otherwise: what a changed meaning would look like.
    wrapper._hmac = hmac.new(b"another key", b"prefix", "sha256")._hmac  # type: ignore[attr-defined]
    assert _keys._openssl_state(wrapper, key, b"prefix") is None
    assert _keys._openssl_state(hmac.new(key, b"prefix", "sha256"), key, b"prefix") is not None


@pytest.fixture
def public_crypto(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both crypto seams gone: libsodium through PyNaCl's wrappers, HMAC through hmac.HMAC."""
    monkeypatch.setattr(_aead, "_ffi", None)
    monkeypatch.setattr(hmac, "_hashopenssl", None)
    assert type(Key.generate()._sign_mac) is hmac.HMAC


@pytest.mark.parametrize(("file", "case"), vectors.CASES, ids=[c["name"] for _, c in vectors.CASES])
def test_every_vector_through_the_public_fallbacks(
    public_crypto: None, file: str, case: dict[str, Any]
) -> None:
    vectors.test_vector(file, case)


def test_both_aead_paths_make_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    key, nonce, aad = b"k" * 32, b"n" * 24, b"aad"
    fast = _aead.encrypt(b"state", aad, nonce, key)
    monkeypatch.setattr(_aead, "_ffi", None)
    assert _aead.encrypt(b"state", aad, nonce, key) == fast
    assert _aead.decrypt(fast, aad, nonce, key) == b"state"
    for bad in (fast[:-1] + bytes([fast[-1] ^ 1]), fast[:15]):
        with pytest.raises(CryptoError):
            _aead.decrypt(bad, aad, nonce, key)


# ------------------------------------------------------------------ the mcp SDK
@dataclasses.dataclass(slots=True)
class _Slotted:
    params: Any = None


@dataclasses.dataclass(frozen=True)
class _Frozen:
    params: Any = None


@dataclasses.dataclass
class _Checked:
    params: Any = None

    def __post_init__(self) -> None:
        pass


def test_a_context_class_that_changed_shape_is_copied_with_replace() -> None:
    assert mcp_adapter._plain_dataclass(ServerRequestContext) is mcp_adapter._PLAIN_CONTEXT
    for changed in (_Slotted, _Frozen, _Checked, object):
        assert mcp_adapter._plain_dataclass(changed) is False, changed


@pytest.mark.parametrize("mode", ["sign", "encrypt"])
@pytest.mark.parametrize("method", adapters.METHODS)
async def test_every_method_with_the_context_copied_by_replace(
    monkeypatch: pytest.MonkeyPatch, method: str, mode: str
) -> None:
    monkeypatch.setattr(mcp_adapter, "_PLAIN_CONTEXT", False)
    await adapters.test_each_method_is_sealed_and_unsealed(method, mode)


def test_a_context_subclass_goes_through_replace() -> None:
    @dataclasses.dataclass
    class Sub(ServerRequestContext[Any, Any]):
        note: str = "kept"

    fields = {f.name: None for f in dataclasses.fields(ServerRequestContext) if f.init}
    original = Sub(**{**fields, "method": "tools/call", "params": {"a": 1}})
    copy = mcp_adapter._with_params(original, {"b": 2})
    assert type(copy) is Sub and copy.note == "kept" and copy.params == {"b": 2}
    assert original.params == {"a": 1}


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
@pytest.fixture
def without_connection_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # A redis-py release without the connection-level call _Sender sends batches with.
    monkeypatch.delattr(redis.asyncio.connection.AbstractConnection, "send_packed_command")
    assert not redis_store._batching_possible()
    yield


def test_batching_needs_every_connection_level_call() -> None:
    # On every supported redis-py (CI: .ci/lowest.txt and the newest) the fast path is there;
    # a release that drops a call fails here, which says the batching must be redone.
    assert redis_store._batching_possible()


async def test_aconsume_without_batching_is_still_exactly_once(
    without_connection_calls: None, valkey_server: ValkeyServer
) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    store = redis_store.RedisReplayStore(valkey_server.url, prefix=prefix)
    try:
        results = await asyncio.gather(*(store.aconsume("k", 60) for _ in range(20)))
        assert sorted(results) == [False] * 19 + [True]
        assert await store.aconsume("other", 60) is True
        assert store._senders == {}  # no batch sender was built: the public sync path served
    finally:
        await store.aclose()


async def test_an_async_client_passed_in_is_not_used_without_batching(
    without_connection_calls: None, valkey_server: ValkeyServer
) -> None:
    prefix = f"t-{uuid.uuid4().hex[:8]}:"
    aclient = redis.asyncio.Redis.from_url(valkey_server.url)
    store = redis_store.RedisReplayStore(valkey_server.url, prefix=prefix, async_client=aclient)
    try:
        assert await store.aconsume("k", 60) is True
        assert await store.aconsume("k", 60) is False
    finally:
        await store.aclose()
        await aclient.aclose()
