"""The read-only replay check: ``ReplayStore.is_consumed`` answers without writing anything.

Every built-in store on a real backend (an SQLite file, a real Valkey server, cluster and
Sentinel-managed primary, a real PostgreSQL): absent before a consume, present after it,
and asking never consumes (the first consume after any number of checks still wins) nor
writes (the backend holds exactly what it held before). A store written without the
method says so with a typed error rather than guess. ``statecodec verify --replay`` uses
it: ``not_redeemed`` or ``replayed`` (exit 5), the token still redeemable afterwards.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from fixtures_postgres import DATABASE, PostgresServer
from fixtures_valkey import ValkeyCluster, ValkeySentinels, ValkeyServer

import statecodec as sc
from statecodec.cli import main
from statecodec.cli._exit import ExitCode
from statecodec.replay import (
    MemoryReplayStore,
    PostgresReplayStore,
    RedisReplayStore,
    ReplayCheckUnsupported,
    ReplayStore,
    SQLiteReplayStore,
    store_from_url,
)

STORES = ["memory", "sqlite", "redis", "redis+cluster", "redis+sentinel", "postgres"]


def _key() -> str:
    return f"ns:{uuid.uuid4().hex}"


@pytest.fixture(params=STORES)
def made(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ReplayStore, Callable[[], int]]]:
    """A store, and how many entries its backend holds (to show a check writes nothing)."""
    prefix = f"ro-{uuid.uuid4().hex[:8]}:"
    kind = request.param
    store: ReplayStore
    if kind == "memory":
        store = MemoryReplayStore()
        size: Callable[[], int] = store.__len__
    elif kind == "sqlite":
        store = SQLiteReplayStore(tmp_path / "replay.db")
        size = store.__len__
    elif kind == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        table = f"ro_{uuid.uuid4().hex[:12]}"
        store = PostgresReplayStore(server.url(), table=table)
        store.check()  # creates the table: the read-only check never does
        size = store.__len__
    else:
        if kind == "redis":
            valkey: ValkeyServer = request.getfixturevalue("valkey_server")
            url, ports = valkey.url, [valkey.port]
        elif kind == "redis+cluster":
            cluster: ValkeyCluster = request.getfixturevalue("valkey_cluster")
            url, ports = cluster.url, cluster.primaries()
        else:
            sentinels: ValkeySentinels = request.getfixturevalue("valkey_sentinels")
            url, ports = sentinels.url, [sentinels.primary_port()]
        store = RedisReplayStore(url, prefix=prefix)

        def size() -> int:
            total = 0
            for port in ports:
                with redis.Redis(port=port) as node:
                    total += sum(1 for _ in node.scan_iter(match=f"{prefix}*"))
            return total

    try:
        yield store, size
    finally:
        store.close()


def test_is_consumed_reads_without_writing_and_never_consumes(
    made: tuple[ReplayStore, Callable[[], int]],
) -> None:
    store, size = made
    key, before = _key(), size()
    for _ in range(3):
        assert store.is_consumed(key) is False
    assert size() == before  # nothing written by asking
    assert store.consume(key, 60) is True  # asking consumed nothing: the first consume wins
    assert store.is_consumed(key) is True
    assert store.is_consumed(_key()) is False
    assert size() == before + 1
    assert store.consume(key, 60) is False


def test_ais_consumed_agrees(made: tuple[ReplayStore, Callable[[], int]]) -> None:
    store, _ = made
    key = _key()

    async def go() -> list[bool]:
        try:
            answers = [await store.ais_consumed(key)]
            answers.append(await store.aconsume(key, 60))
            answers.append(await store.ais_consumed(key))
        finally:
            await store.aclose()
        return answers

    assert asyncio.run(go()) == [False, True, True]


def test_an_expired_entry_is_not_consumed(made: tuple[ReplayStore, Callable[[], int]]) -> None:
    store, _ = made
    key = _key()
    recorded = time.monotonic()
    assert store.consume(key, 1.2) is True
    assert store.is_consumed(key) is True or time.monotonic() - recorded >= 1.2  # (a slow machine's look)
    until = time.monotonic() + 30
    while store.is_consumed(key):  # the store's own clock decides; wait for it, bounded
        assert time.monotonic() < until, "the entry never expired"
        time.sleep(0.1)
    assert store.consume(key, 60) is True


class _ThirdParty(ReplayStore):
    """A store written before the read-only check existed: only consume."""

    def consume(self, key: str, retention: float) -> bool:
        return True


def test_a_store_without_the_check_says_so_with_a_typed_error() -> None:
    store = _ThirdParty()
    with pytest.raises(ReplayCheckUnsupported) as info:
        store.is_consumed("k")
    assert isinstance(info.value, sc.ReplayStoreError)
    assert "no read-only check" in str(info.value)
    with pytest.raises(ReplayCheckUnsupported):
        asyncio.run(store.ais_consumed("k"))


def test_postgres_check_does_not_create_a_missing_table(postgres_server: PostgresServer) -> None:
    table = f"ro_missing_{uuid.uuid4().hex[:8]}"
    with store_from_url(postgres_server.url(table=table)) as store:
        with pytest.raises(sc.ReplayStoreError) as info:
            store.is_consumed(_key())
        assert "does not exist" in str(info.value)
    assert postgres_server.sql(f"SELECT to_regclass('{table}') IS NULL", DATABASE) == [(True,)]


# ---------------------------------------------------------------- statecodec verify --replay
def _verify(keys: str, token: str, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["verify", token, "--keys", keys, "--unbound", *extra])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_cli_verify_replay_reports_without_consuming(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    ring = sc.KeyRing.generate("k1")
    keys = tmp_path / "keys.json"
    keys.write_text(ring.to_json())
    keys.chmod(0o600)
    token = sc.StateCodec(ring).seal(b"x", None)
    if kind == "sqlite":
        url = f"sqlite:{tmp_path / 'replay.db'}"
    else:
        url = request.getfixturevalue("valkey_server").url + f"?prefix=ro-{uuid.uuid4().hex[:8]}:"
    spec = f"file:{keys}"
    for _ in range(2):
        code, output = _verify(spec, token, "--replay", url)
        assert code == 0 and "not yet redeemed" in output, output
    code, output = _verify(
        spec, token, "--replay", url, "--consume"
    )  # still redeemable: the checks consumed nothing
    assert code == 0 and "consumed now" in output, output
    code, output = _verify(spec, token, "--replay", url)
    assert code == ExitCode.REPLAYED and "replayed" in output, output
