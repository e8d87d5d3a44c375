"""Python and TypeScript instances share one Redis/Valkey replay store (real servers).

The TypeScript side runs in ``ts/dist/tools/interop.js`` (one Node process per batch) with
the package's RedisReplayStore; the Python side with statecodec's. Both write the same
key (prefix, namespace, token id) with the same retention, so a token consumed by one
language is refused as ``replayed`` by the other, in both directions; an outage fails
closed without consuming, and ``wait=1`` refuses (and takes back) a consume no replica
acknowledged. An entry of the other language that may still be undecided (a ``wait=1`` entry,
a PostgreSQL row, younger than the reader's settle window) fails closed (``store_unavailable``)
in both languages, and is a replay once older. The same holds for one PostgreSQL table.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from fixtures_postgres import DATABASE, PostgresServer
from fixtures_valkey import ValkeyServer, in_sync, wait_until
from ts_package import SKIPS, run_tool

import statecodec as sc
from statecodec.replay import PostgresReplayStore, RedisReplayStore

pytestmark = SKIPS

RING = sc.KeyRing.generate("shared-1")
BINDING = sc.Binding(principal="alice", method="tools/call", target="deploy", arguments={"v": 2})
TS_BINDING = {
    "principal": "alice",
    "audience": None,
    "method": "tools/call",
    "target": "deploy",
    "arguments": {"v": 2},
    "extra": {},
}
NAMESPACE = "svc"
WAIT_PREFIX = "w:"  # the wait=1 stores' (one primary and replica a test)


def ts_unseal(tokens: list[str], store: dict[str, Any]) -> list[dict[str, Any]]:
    spec = {
        "keyring": RING.to_dict(),
        "codec": {"mode": "encrypt", "namespace": NAMESPACE},
        "store": store,
        "ops": [{"op": "unseal", "token": t, "binding": TS_BINDING} for t in tokens],
    }
    return list(run_tool("interop", spec)["results"])


def py_codec(store: sc.ReplayStore) -> sc.StateCodec:
    return sc.StateCodec(RING, mode="encrypt", replay=store, namespace=NAMESPACE)


def py_reason(codec: sc.StateCodec, token: str) -> str | None:
    try:
        codec.unseal(token, BINDING)
    except sc.InvalidState as exc:
        return exc.reason
    return None


def test_a_token_consumed_by_one_language_is_replayed_in_the_other(valkey_url: str) -> None:
    prefix = f"ts-shared-{uuid.uuid4().hex[:8]}:"
    store = RedisReplayStore(valkey_url, prefix=prefix)
    codec = py_codec(store)
    by_python, by_ts = codec.seal(b"a", BINDING), codec.seal(b"b", BINDING)
    assert py_reason(codec, by_python) is None
    ts_store = {"kind": "redis", "url": valkey_url, "prefix": prefix}
    before = time.time()
    first, replayed = ts_unseal([by_ts, by_python], ts_store)
    assert first["payload_hex"] == b"b".hex()
    assert replayed["reason"] == "replayed"
    assert py_reason(codec, by_ts) == "replayed"
    # The same entry as Python writes: its key, kept exp + expiry_grace + max_skew - now
    # (now: when TypeScript consumed it, between `before` and the PTTL read).
    admin = redis.Redis.from_url(valkey_url, decode_responses=True)
    opened = codec.verify_unbound(by_ts)
    key = f"{prefix}{NAMESPACE}:{opened.token_id}"
    pttl = admin.pttl(key)
    after = time.time()
    kept_until = opened.expires_at + codec.expiry_grace + codec.max_skew
    assert (kept_until - after) * 1000 - 1 <= pttl <= (kept_until - before) * 1000 + 1
    assert sorted(admin.keys(prefix + "*")) == sorted(
        f"{prefix}{NAMESPACE}:{codec.verify_unbound(t).token_id}" for t in (by_python, by_ts)
    )
    store.close()


def test_an_outage_fails_closed_and_burns_nothing(valkey_outage: ValkeyServer) -> None:
    store = RedisReplayStore(valkey_outage.url, prefix="o:", socket_timeout=2)
    codec = py_codec(store)
    token = codec.seal(b"x", BINDING)
    valkey_outage.stop()
    ts_store = {"kind": "redis", "url": valkey_outage.url, "prefix": "o:", "connectTimeout": 1}
    (refused,) = ts_unseal([token], ts_store)
    assert refused["reason"] == "store_unavailable"
    valkey_outage.start()
    (accepted,) = ts_unseal([token], ts_store)
    assert accepted["payload_hex"] == b"x".hex()
    assert py_reason(codec, token) == "replayed"
    store.close()


@dataclass
class Waiting:
    """A primary and its replica, a Python store on the primary with wait=1, its codec, a token
    sealed by it (not consumed yet) and a client of the primary to look at the entries."""

    primary: ValkeyServer
    replica: ValkeyServer
    codec: sc.StateCodec
    token: str
    admin: redis.Redis

    def entries(self) -> list[bytes | str]:
        return self.admin.keys(WAIT_PREFIX + "*")

    def outlive_a_quick_window(self) -> None:
        """Wait until the one entry is older than a store's settle window of 0.05 + 1 s."""
        (name,) = self.entries()
        wait_until(lambda: self._age_ms(name) > 1050, "the entry is older than the quick store's window")

    def _age_ms(self, name: bytes | str) -> int:
        """A wait=N entry's age on the server's clock: the retention it holds minus its PTTL."""
        value = self.admin.get(name)
        assert isinstance(value, bytes)
        return int(value.rpartition(b"/")[2]) - int(self.admin.pttl(name))


@pytest.fixture
def waiting(valkey_primary_replica: tuple[ValkeyServer, ValkeyServer]) -> Iterator[Waiting]:
    primary, replica = valkey_primary_replica
    # A running replica acknowledges within 5 s on a loaded machine too; a stopped one never does.
    store = RedisReplayStore(primary.url, prefix=WAIT_PREFIX, wait=1, wait_timeout=5, socket_timeout=10)
    codec = py_codec(store)
    admin = redis.Redis.from_url(primary.url)
    try:
        yield Waiting(primary, replica, codec, codec.seal(b"waited", BINDING), admin)
    finally:
        admin.close()
        store.close()


def test_wait_refuses_what_no_replica_holds_and_takes_it_back(waiting: Waiting) -> None:
    replica, token, url = waiting.replica, waiting.token, waiting.primary.url
    ts_store = {"kind": "redis", "url": url, "prefix": WAIT_PREFIX, "wait": 1, "waitTimeout": 5}
    assert replica.pid is not None
    os.kill(replica.pid, signal.SIGSTOP)
    try:
        (refused,) = ts_unseal([token], ts_store)
        assert refused["reason"] == "store_unavailable"
        assert waiting.entries() == []  # taken back on the primary: the token is not burnt
    finally:
        os.kill(replica.pid, signal.SIGCONT)
    wait_until(lambda: in_sync(replica), "the replica is in sync again")
    (accepted,) = ts_unseal([token], ts_store)
    assert accepted["payload_hex"] == b"waited".hex()
    # Python meets TypeScript's <nonce>/<ms> entry as another instance's: undecided for its
    # settle window (5 + 10 x 2 s here), then a replay (a store with a 1.05 s window, waited out).
    assert py_reason(waiting.codec, token) in ("replayed", "store_unavailable")
    quick = RedisReplayStore(url, prefix=WAIT_PREFIX, wait_timeout=0.05, socket_timeout=1, retries=0)
    waiting.outlive_a_quick_window()
    assert py_reason(py_codec(quick), token) == "replayed"
    quick.close()


def test_an_undecided_wait_entry_of_python_is_an_outage_for_typescript(waiting: Waiting) -> None:
    token, url = waiting.token, waiting.primary.url
    assert py_reason(waiting.codec, token) is None
    assert py_reason(waiting.codec, token) == "replayed"  # accepted by this store: settled at once
    # TypeScript with a settle window of 30 + 2 s: the entry is younger when it looks.
    slow = {"kind": "redis", "url": url, "prefix": WAIT_PREFIX, "wait": 1, "waitTimeout": 30}
    (refused,) = ts_unseal([token], slow)
    assert refused["reason"] == "store_unavailable"
    # And with a window of 0.05 + 1 s, once the entry is older than that: a replay.
    quick = {"kind": "redis", "url": url, "prefix": WAIT_PREFIX, "waitTimeout": 0.05, "commandTimeout": 1}
    waiting.outlive_a_quick_window()
    (replayed,) = ts_unseal([token], quick)
    assert replayed["reason"] == "replayed"


@pytest.mark.parametrize("first", ["python", "typescript"])
def test_a_chained_flow_alternates_languages_on_one_store(valkey_url: str, first: str) -> None:
    """Round 1 opened by one language, round 2 sealed and opened by the other; each once."""
    prefix = f"ts-flow-{uuid.uuid4().hex[:8]}:"
    store = RedisReplayStore(valkey_url, prefix=prefix)
    codec = py_codec(store)
    ts_store = {"kind": "redis", "url": valkey_url, "prefix": prefix}
    token = codec.seal(b"r1", BINDING)
    if first == "python":
        parent = codec.unseal(token, BINDING)
        spec_parent = {"flow_id": parent.flow_id, "round": 1, "flow_started_at": parent.flow_started_at}
        spec = {
            "keyring": RING.to_dict(),
            "codec": {"mode": "encrypt", "namespace": NAMESPACE},
            "ops": [{"op": "seal", "payload_hex": b"r2".hex(), "binding": TS_BINDING, "parent": spec_parent}],
        }
        (sealed,) = run_tool("interop", spec)["results"]
        second = codec.unseal(sealed["token"], BINDING)
        assert (second.round, second.flow_id) == (2, parent.token_id)
        assert ts_unseal([sealed["token"], token], ts_store)[0]["reason"] == "replayed"
    else:
        (opened,) = ts_unseal([token], ts_store)
        parent_state = codec.verify_unbound(token)
        assert opened["token_id"] == parent_state.token_id
        sealed_token = codec.seal(b"r2", BINDING, parent=parent_state)
        (second_ts,) = ts_unseal([sealed_token], ts_store)
        assert (second_ts["round"], second_ts["flow_id"]) == (2, parent_state.token_id)
        assert py_reason(codec, token) == py_reason(codec, sealed_token) == "replayed"
    store.close()


def test_python_and_typescript_share_one_postgres_table(postgres_server: PostgresServer) -> None:
    table = f"ts_shared_{uuid.uuid4().hex[:8]}"
    store = PostgresReplayStore(postgres_server.url(), table=table)
    codec = py_codec(store)
    by_python, by_ts = codec.seal(b"a", BINDING), codec.seal(b"b", BINDING)
    assert py_reason(codec, by_python) is None
    ts_store = {"kind": "postgres", "url": postgres_server.url(), "table": table}
    first, replayed = ts_unseal([by_ts, by_python], ts_store)
    assert first["payload_hex"] == b"b".hex()
    # TypeScript meets Python's row as another instance's: undecided for its settle window.
    assert replayed["reason"] in ("replayed", "store_unavailable")
    # Python meets TypeScript's row as another instance's: undecided for the settle window,
    # then a replay (older than the window here).
    assert py_reason(codec, by_ts) in ("replayed", "store_unavailable")
    _age(postgres_server, table)
    assert py_reason(codec, by_ts) == "replayed"
    (again,) = ts_unseal([by_python], ts_store)
    assert again["reason"] == "replayed"
    # A fresh Python row is an outage for TypeScript (a settle window of 2 x 30 + 1 s).
    fresh = codec.seal(b"c", BINDING)
    assert py_reason(codec, fresh) is None
    (refused,) = ts_unseal([fresh], {**ts_store, "timeout": 30})
    assert refused["reason"] == "store_unavailable"
    assert len(store) == 3
    store.close()


def test_a_postgres_outage_fails_closed_and_burns_nothing(postgres_outage: PostgresServer) -> None:
    table = "ts_outage"
    store = PostgresReplayStore(postgres_outage.url(), table=table, timeout=2)
    codec = py_codec(store)
    token = codec.seal(b"x", BINDING)
    ts_store = {"kind": "postgres", "url": postgres_outage.url(), "table": table, "timeout": 1}
    postgres_outage.stop()
    (refused,) = ts_unseal([token], ts_store)
    assert refused["reason"] == "store_unavailable"
    postgres_outage.start()
    (accepted,) = ts_unseal([token], ts_store)
    assert accepted["payload_hex"] == b"x".hex()
    _age(postgres_outage, table)  # older than Python's settle window (see above)
    assert py_reason(codec, token) == "replayed"
    store.close()


def _age(server: PostgresServer, table: str) -> None:
    """Every row of ``table`` an hour older on the server's clock: settled for any instance."""
    server.sql(f"UPDATE {table} SET written_at = written_at - interval '1 hour'", DATABASE)
