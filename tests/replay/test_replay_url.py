"""store_from_url: every accepted form builds the right store, every bad one says what to write."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from fixtures_valkey import ValkeyServer

import statecodec.replay as replay
from statecodec import ReplayStoreError
from statecodec.replay import MemoryReplayStore, RedisReplayStore, SQLiteReplayStore, store_from_url
from statecodec.replay._url import OPEN_ERRORS, SCHEMA_SCHEMES, checked, scheme


def test_memory_forms() -> None:
    plain = store_from_url("memory:")
    assert isinstance(plain, MemoryReplayStore) and plain.max_entries == 100_000
    bounded = store_from_url("memory:?max_entries=7")
    assert isinstance(bounded, MemoryReplayStore) and bounded.max_entries == 7
    assert isinstance(store_from_url("MEMORY:"), MemoryReplayStore)
    assert store_from_url("memory:?max_entries=7", max_entries=9).max_entries == 9


def test_sqlite_relative_path_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    store = store_from_url("sqlite:data/replay.db")
    assert isinstance(store, SQLiteReplayStore)
    assert store.path == str(tmp_path / "data" / "replay.db")
    assert store.consume("k", 60)
    assert (tmp_path / "data" / "replay.db").exists()
    store.close()


@pytest.mark.parametrize("form", ["sqlite:{p}", "sqlite://{p}", "sqlite:///{p}"])
def test_sqlite_absolute_forms(tmp_path: Path, form: str) -> None:
    path = tmp_path / "abs.db"
    # {p} starts with "/": sqlite:/abs, sqlite:///abs (URI style, empty host) and
    # sqlite:////abs (SQLAlchemy's absolute form) all name the same file.
    store = store_from_url(form.format(p=str(path)))
    assert isinstance(store, SQLiteReplayStore)
    assert store.path == str(path)
    store.close()


def test_sqlite_options_and_percent_decoding(tmp_path: Path) -> None:
    (tmp_path / "with space").mkdir()
    url = f"sqlite://{tmp_path}/with%20space/r.db?busy_timeout=0.5&purge_interval=10&synchronous=full"
    store = store_from_url(url)
    assert isinstance(store, SQLiteReplayStore)
    assert store.path == str(tmp_path / "with space" / "r.db")
    assert (store.busy_timeout, store.purge_interval, store.synchronous) == (0.5, 10.0, "FULL")
    store.close()
    override = store_from_url(url, busy_timeout=3)
    assert override.busy_timeout == 3
    override.close()


def test_sqlite_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    store = store_from_url("sqlite:~/r.db")
    assert store.path == str(tmp_path / "r.db")
    store.close()


@pytest.mark.parametrize("scheme", ["redis", "valkey", "REDIS"])
def test_redis_forms(valkey_server: ValkeyServer, scheme: str) -> None:
    port = valkey_server.port
    store = store_from_url(f"{scheme}://127.0.0.1:{port}/0?prefix=myapp:&socket_timeout=1&retries=0")
    assert isinstance(store, RedisReplayStore)
    assert store.prefix == "myapp:"
    key = f"k-{time.time_ns()}"
    assert store.consume(key, 60) is True
    assert store.consume(key, 60) is False
    store.close()


def test_redis_db_and_redis_py_options_pass_through(valkey_server: ValkeyServer) -> None:
    port = valkey_server.port
    store = store_from_url(f"redis://127.0.0.1:{port}/3?client_name=replay-test&health_check_interval=5")
    key = f"k-{time.time_ns()}"
    assert store.consume(key, 60)
    raw = redis.Redis(port=port, db=3)
    assert raw.exists(f"statecodec:replay:{key}") == 1
    assert any(c["name"] == "replay-test" for c in raw.client_list())
    raw.close()
    store.close()


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "PostgreSQL"])
def test_postgres_forms_build_without_connecting(scheme: str) -> None:
    from statecodec.replay import PostgresReplayStore  # noqa: PLC0415

    url = f"{scheme}://app:pw@db1:5432,db2:5433/replay?sslmode=require&target_session_attrs=read-write"
    store = store_from_url(f"{url}&table=my_replay&timeout=0.5&pool_size=3&purge_interval=30")
    assert isinstance(store, PostgresReplayStore)
    assert (store.table, store.timeout, store.pool_size, store.purge_interval) == ("my_replay", 0.5, 3, 30.0)
    assert store._target.conninfo == url.replace(scheme, scheme.lower())  # as written, less our options
    assert "pw" not in repr(store)
    assert store_from_url(url, timeout=4).timeout == 4  # keyword arguments win


def test_rediss_builds_a_tls_store_without_connecting() -> None:
    store = store_from_url("rediss://:pw@cache.internal:6380/0?ssl_cert_reqs=required")
    assert isinstance(store, RedisReplayStore)
    assert "pw" not in repr(store)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "no scheme"),
        ("replay.db", "no scheme"),
        ("mysql://db/replay", "unknown scheme 'mysql'"),
        ("postgresql://db/replay?timeout=0", "bad value '0' for timeout"),
        ("postgresql://db/replay?pool_size=-2", "bad value '-2' for pool_size"),
        ("postgresql://db/replay?table=a&table=b", "'table' is given twice"),
        ("postgres://db/replay?table=Bad-Name", "lower-case SQL identifier"),
        ("postgres://db/replay?no_such_option=1", "libpq refuses it"),
        ("postgresql://db/replay#frag", "no '#fragment'"),
        ("memory://host", "takes no host"),
        ("memory:?max_entries=0", "bad value '0' for max_entries"),
        ("memory:?max_entries=lots", "bad value 'lots' for max_entries"),
        ("memory:?size=10", "unknown option 'size'; accepted: max_entries"),
        ("memory:?max_entries=1&max_entries=2", "given twice"),
        ("memory:?max_entries", "name=value"),
        ("sqlite:", "path is missing"),
        ("sqlite:?busy_timeout=1", "path is missing"),
        ("sqlite::memory:", "use memory:"),
        ("sqlite://host/replay.db", "would be a host"),
        ("sqlite:r.db#frag", "%23"),
        ("sqlite:r.db?busy_timeout=-1", "bad value '-1' for busy_timeout"),
        ("sqlite:r.db?busy_timeout=nan", "bad value 'nan' for busy_timeout"),
        ("sqlite:r.db?synchronous=OFF", "bad value 'OFF' for synchronous"),
        ("sqlite:r.db?wal=1", "unknown option 'wal'"),
        ("redis://localhost:99999/0", "Port out of range"),
        ("redis://localhost:6379/0?retries=-1", "bad value '-1' for retries"),
        ("redis://localhost:6379/0?pool=big", "unknown option 'pool'"),
        ("redis://localhost:6379/0?wiat=1", "unknown option 'wiat'"),
        ("redis://localhost:6379/0?wait=one", "bad value 'one' for wait"),
        ("redis://localhost:6379/0?wait=1&wait=2", "'wait' is given twice"),
        ("redis://localhost:6379/0?wait=1&wait_timeout=3", "wait_timeout (3 s) must be shorter"),
        ("redis://localhost:6379/0?socket_timeout=abc", "bad value 'abc' for socket_timeout"),
        ("redis://localhost:6379/0?health_check_interval=often", "Invalid value for 'health_check_interval'"),
        ("redis://localhost:6379/0#frag", "no '#fragment'"),
        ("redis://localhost:6379/0?sentinel_password=x", "redis+sentinel:// only"),
        ("redis://[::1/0", "Invalid IPv6"),
        ("unix:///run/valkey.sock?db=0&ssl_ca_certs=/ca.pem", "unknown option 'ssl_ca_certs'"),
        ("redis+cluster://h1:7000,h2:70x0", "bad host 'h2:70x0'"),
        ("redis+cluster://h1:7000,/0", "bad host ''"),
        ("redis+cluster://h1:7000/3", "db"),
        ("redis+cluster://h1:7000?health_check_interval=5", "not accepted by redis-py's cluster clients"),
        ("redis+sentinel://h1:26379", "service name is missing"),
        ("redis+sentinel://h1:26379/", "service name is missing"),
        ("valkeys+sentinel://h1:26379,h2/mymaster?wait=-1", "bad value '-1' for wait"),
    ],
)
def test_bad_urls_name_the_accepted_forms(url: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        store_from_url(url)
    message = str(info.value)
    assert says in message
    assert (
        "memory:" in message
        and "sqlite:PATH" in message
        and "redis://[USER:PASSWORD@]HOST:PORT/DB" in message
    )


def test_bad_urls_never_echo_a_password() -> None:
    with pytest.raises(ValueError) as info:
        store_from_url("redis://user:s3cret@localhost:6379/0?pool=big")
    assert "s3cret" not in str(info.value)
    assert "user:***@localhost" in str(info.value)
    with pytest.raises(ValueError) as info:
        store_from_url("redis://:s3cret@[::1/0")
    assert "s3cret" not in str(info.value)


def test_not_a_string() -> None:
    with pytest.raises(TypeError, match="must be a string"):
        store_from_url(None)  # type: ignore[arg-type]


def run_fresh(program: str) -> None:
    """``program`` (indented as a test writes it) in a fresh interpreter, which must exit 0.

    This test process has imported redis already; a fresh interpreter shows what an import does.
    """
    subprocess.run([sys.executable, "-c", textwrap.dedent(program)], check=True, timeout=60)


def test_importing_replay_does_not_import_redis() -> None:
    run_fresh("""
        import sys, statecodec, statecodec.replay as r
        r.store_from_url('memory:')
        assert 'redis' not in sys.modules, 'redis imported'
        r.RedisReplayStore
        assert 'redis' in sys.modules
    """)


def test_unknown_attribute() -> None:
    with pytest.raises(AttributeError):
        replay.NoSuchStore  # noqa: B018
    assert "RedisReplayStore" in dir(replay)


def test_without_the_redis_package_the_error_says_what_to_install() -> None:
    # `import redis` fails, as without the extra.
    run_fresh("""
        import sys
        sys.modules['redis'] = None
        import statecodec.replay as r
        assert r.store_from_url('memory:') is not None
        for attempt in (lambda: r.store_from_url('redis://:pw@localhost/0'), lambda: r.RedisReplayStore):
            try:
                attempt()
            except ModuleNotFoundError as exc:
                assert "pip install 'statecodec[redis]'" in str(exc), exc
                assert 'pw' not in str(exc), exc
            else:
                raise AssertionError('no error')
    """)


# ---------------------------------------------------------------- opening a store for a command
def test_scheme_is_what_picks_the_store() -> None:
    assert [scheme(url) for url in ("SQLite:x.db", "postgres://h/db", "memory:", "x", ":y")] == [
        "sqlite",
        "postgres",
        "memory",
        "x",
        "",
    ]
    assert set(SCHEMA_SCHEMES) == {"postgresql", "postgres"}  # only PostgreSQL has a schema to create


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("nope:", ValueError),  # an unknown scheme
        ("memory:?max_entries=0", ValueError),  # a bad option
        ("sqlite:{tmp}/missing/dir/r.db", ReplayStoreError),  # a file it cannot open, said by the store
    ],
)
def test_every_failure_to_open_is_an_open_error(tmp_path: Path, url: str, error: Any) -> None:
    with pytest.raises(OPEN_ERRORS) as info:
        store_from_url(url.format(tmp=tmp_path))
    assert isinstance(info.value, error)


class _Down(MemoryReplayStore):
    closed = False

    def check(self) -> None:
        raise ConnectionError("refused")

    def close(self) -> None:
        self.closed = True


def test_checked_returns_an_answering_store_and_closes_one_that_does_not() -> None:
    up = MemoryReplayStore()
    assert checked(up) is up
    down = _Down()
    with pytest.raises(ConnectionError, match="refused"):  # as the store raised it
        checked(down)
    assert down.closed
