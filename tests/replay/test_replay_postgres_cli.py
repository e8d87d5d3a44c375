"""A PostgreSQL replay store everywhere a replay URL goes: verify, replay init, the proxy, and no password.

Real PostgreSQL 15 (tests/fixtures_postgres.py) and real ``statecodec proxy`` processes
in front of the unprotected example server. The application role's password holds
``:``, ``@`` and ``/``; every output is scanned for it as written and percent-encoded.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import jsonschema
import pytest
from click.testing import CliRunner
from fixtures_postgres import APP_PASSWORD, DATABASE, SUPERUSER_PASSWORD, PostgresServer
from fixtures_proxy import ANSWERS, TOOL, Upstream, messages, modern_request, proxy_command, running_upstream
from processes import await_line, spawn, stop
from prometheus_client.parser import text_string_to_metric_families
from replay_outcomes import assert_hidden, shown_when_unavailable

import statecodec as sc
from statecodec.cli import main
from statecodec.cli._exit import ExitCode
from statecodec.replay import store_from_url

ROOT = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "docs" / "cli-schema.json").read_text()))
QUERY_PW = "Qu3ry-Pa55w0rd"
SECRETS = [APP_PASSWORD, QUERY_PW, SUPERUSER_PASSWORD]
BINDING = sc.Binding(principal="alice", audience="svc", method="tools/call", target="pay")


def assert_no_secret(*texts: str) -> None:
    assert_hidden(SECRETS, *texts)


def _table() -> str:
    return f"t_{os.urandom(6).hex()}"


def _keys(tmp: Path, ring: sc.KeyRing | None = None) -> Path:
    keys = tmp / "keys.json"
    keys.write_text((ring or sc.KeyRing.generate("k1")).to_json())
    keys.chmod(0o600)
    return keys


def _unreachable(port: int) -> list[str]:
    """URLs of a server that refuses connections on ``port`` (the ``refused_port`` fixture)."""
    return [
        f"postgresql://statecodec_app:{quote(APP_PASSWORD, safe='')}@127.0.0.1:{port}/{DATABASE}?timeout=1",
        f"postgres://statecodec_app@127.0.0.1:{port}/{DATABASE}?password={QUERY_PW}&timeout=1",
    ]


# ---------------------------------------------------------------- verify --consume
def test_verify_consume_redeems_once_in_postgres(
    postgres_server: PostgresServer, tmp_path: Path, refused_port: int
) -> None:
    ring = sc.KeyRing.generate("k1")
    keys = _keys(tmp_path, ring)
    token = sc.StateCodec(ring).seal(b"x", None)
    table = _table()
    url = postgres_server.url(table=table)
    runner = CliRunner()
    args = ["verify", token, "--keys", f"file:{keys}", "--unbound", "--replay", url, "--consume"]
    first = runner.invoke(main, args)
    assert first.exit_code == ExitCode.OK, first.output
    assert f"consumed now in postgresql://statecodec_app:***@127.0.0.1:{postgres_server.port}" in first.stdout
    # Another store object meets a row written moments ago by someone else: within the
    # settle window it may be undecided (exit 4, retry); older, it is a replay.
    early = runner.invoke(main, args)
    assert early.exit_code in (ExitCode.REPLAYED, ExitCode.STORE), early.output
    assert early.exit_code == ExitCode.REPLAYED or "not settled yet" in early.output
    postgres_server.sql(f"UPDATE {table} SET written_at = written_at - interval '1 hour'", DATABASE)
    second = runner.invoke(main, [*args, "--json"])
    assert second.exit_code == ExitCode.REPLAYED
    doc = json.loads(second.stdout)
    VALIDATOR.validate(doc)
    assert doc["error"]["reason"] == "replayed"
    outputs = [first.stdout, first.stderr, second.stdout, second.stderr]
    for bad in _unreachable(refused_port):
        for extra in ([], ["--json"]):
            fresh = sc.StateCodec(ring).seal(b"y", None)
            result = runner.invoke(
                main,
                [
                    "verify",
                    fresh,
                    "--keys",
                    f"file:{keys}",
                    "--unbound",
                    "--replay",
                    bad,
                    "--consume",
                    *extra,
                ],
            )
            assert result.exit_code == ExitCode.STORE, result.output
            outputs += [result.stdout, result.stderr]
    assert "does not answer" in "".join(outputs)
    assert_no_secret(*outputs)


# ---------------------------------------------------------------- replay init
def test_replay_init_prints_applies_and_grants(postgres_server: PostgresServer, refused_port: int) -> None:
    table = _table()
    owner_url = postgres_server.url(table=table)
    runner = CliRunner()
    printed = runner.invoke(main, ["replay", "init", "--replay", owner_url, "--print", "--grant", "svc_role"])
    assert printed.exit_code == 0, printed.output
    assert printed.stdout.splitlines() == [
        f'CREATE TABLE IF NOT EXISTS {table} (key text COLLATE "C" PRIMARY KEY, nonce text NOT NULL, '
        "expires_at timestamptz NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp());",
        f"CREATE INDEX IF NOT EXISTS {table}_expires_at ON {table} (expires_at);",
        f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS written_at timestamptz NOT NULL DEFAULT 'epoch';",
        f"ALTER TABLE {table} ALTER COLUMN written_at SET DEFAULT clock_timestamp();",
        f'GRANT SELECT, INSERT, DELETE ON {table} TO "svc_role";',
    ]
    assert postgres_server.sql(f"SELECT to_regclass('{table}')", DATABASE) == [
        (None,)
    ]  # --print runs nothing
    postgres_server.sql("DROP ROLE IF EXISTS svc_role")
    postgres_server.sql("CREATE ROLE svc_role LOGIN PASSWORD 'Svc-Pa55'")
    postgres_server.sql(f"GRANT CONNECT ON DATABASE {DATABASE} TO svc_role")
    applied = runner.invoke(main, ["replay", "init", "--replay", owner_url, "--grant", "svc_role", "--json"])
    assert applied.exit_code == 0, applied.output
    doc = json.loads(applied.stdout)
    VALIDATOR.validate(doc)
    assert doc["applied"] is True and doc["table"] == table and doc["grant"] == "svc_role"
    assert_no_secret(applied.stdout, printed.stdout)
    again = runner.invoke(main, ["replay", "init", "--replay", owner_url])  # idempotent
    assert again.exit_code == 0 and f"created table {table}" in again.stdout
    # The service's role, which may create nothing, now uses it.
    service = postgres_server.url(user="svc_role", password="Svc-Pa55", table=table)
    with store_from_url(service) as store:
        store.check()
        assert store.consume("k", 60) is True
    # Errors: unreachable is exit 4, a store with no schema is a usage error.
    for bad in _unreachable(refused_port):
        failed = runner.invoke(main, ["replay", "init", "--replay", bad])
        assert failed.exit_code == ExitCode.STORE, failed.output
        assert_no_secret(failed.stdout, failed.stderr)
    assert runner.invoke(main, ["replay", "init", "--replay", "sqlite:x.db"]).exit_code == ExitCode.USAGE
    env = {"STATECODEC_REPLAY": owner_url}
    assert runner.invoke(main, ["replay", "init", "--print"], env=env).exit_code == 0


# ---------------------------------------------------------------- secrets
def test_reprs_errors_and_logs_show_no_password(caplog: pytest.LogCaptureFixture, refused_port: int) -> None:
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    for url in _unreachable(refused_port):
        shown += shown_when_unavailable(url, BINDING)
    for bad in (
        f"postgresql://u:{quote(APP_PASSWORD, safe='')}@h/db?pool_size=x",
        f"postgresql://u@h/db?password={QUERY_PW}&no_such_option=1",
    ):
        with pytest.raises(ValueError) as info:
            store_from_url(bad)
        shown.append(str(info.value))
    with pytest.raises(ValueError) as misread:  # an unencoded '@' libpq would misread: refused, still hidden
        store_from_url(f"postgresql://u:{APP_PASSWORD}@h/db")
    assert "percent-encode" in str(misread.value)
    shown.append(str(misread.value))
    shown += [record.getMessage() for record in caplog.records]
    assert any("postgres replay store unavailable" in line.lower() for line in shown)
    assert_no_secret(*shown)


# ---------------------------------------------------------------- the proxy
@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    tmp = tmp_path_factory.mktemp("pg-upstream")
    with running_upstream("python", tmp) as upstream:
        yield upstream


def _call(url: str, params: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    body, headers = modern_request(
        "tools/call", {"name": TOOL, "arguments": {"version": "1.2.3"}, **params}, request_id
    )
    response = httpx.post(url, content=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    (message,) = messages(response)
    return message


def _metrics(admin: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{admin}/metrics", timeout=30).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _until(condition: Any, what: str, timeout: float = 60.0) -> None:
    import time  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_proxy_with_a_postgres_store_readyz_metrics_and_an_outage(
    postgres_outage: PostgresServer, upstream: Upstream, tmp_path: Path
) -> None:
    server = postgres_outage
    url = server.url(table=_table(), timeout="1")
    log_path = tmp_path / "proxy.log"
    args = proxy_command(
        upstream.url, keys=_keys(tmp_path), replay="from-the-environment", mode="encrypt", jwks=None,
        extra=["--admin-listen", "127.0.0.1:0", "--log-format", "json"],
    )  # fmt: skip
    at = args.index("--replay")
    del args[at : at + 2]  # STATECODEC_REPLAY instead: the way a container passes a secret-bearing URL
    os.environ["STATECODEC_REPLAY"] = url
    try:
        proc = spawn(args, log_path)
    finally:
        del os.environ["STATECODEC_REPLAY"]
    try:
        admin = await_line(proc, "admin on ", log_path)
        mcp = await_line(proc, "listening on ", log_path) + "/mcp"
        readyz = lambda: httpx.get(f"{admin}/readyz", timeout=30)  # noqa: E731
        _until(lambda: readyz().status_code == 200, "the proxy is ready")
        assert "postgres replay store answered" in readyz().json()["checks"]["replay_store"]["detail"]
        before = _metrics(admin)
        token = _call(mcp, {})["result"]["requestState"]
        assert _call(mcp, {"inputResponses": ANSWERS, "requestState": token}, 2)["result"][
            "structuredContent"
        ]
        assert _call(mcp, {"inputResponses": ANSWERS, "requestState": token}, 3)["error"]["code"] == -32602
        after = _metrics(admin)
        unseals = "statecodec_unseals_total"
        assert (
            after.get((unseals, (("outcome", "ok"),)), 0) - before.get((unseals, (("outcome", "ok"),)), 0)
            == 1
        )
        replayed = (unseals, (("outcome", "replayed"),))
        assert after.get(replayed, 0) - before.get(replayed, 0) == 1

        server.stop()
        try:
            _until(lambda: readyz().status_code == 503, "/readyz reports the stopped database")
            document = readyz().json()
            assert document["failing"] == ["replay_store"]
            detail = document["checks"]["replay_store"]["detail"]
            assert "postgres replay store failed its last check" in detail
            fresh = _call(mcp, {})["result"]["requestState"]
            refused = _call(mcp, {"inputResponses": ANSWERS, "requestState": fresh}, 4)
            # an outage is not a forgery: retry the same request (issue 29)
            assert refused["error"]["code"] == -32603
            assert refused["error"]["data"]["reason"] == "temporarily_unavailable"
            down = _metrics(admin)
            errors = ("statecodec_replay_store_errors_total", ())
            assert down.get(errors, 0) - after.get(errors, 0) >= 1
        finally:
            server.start()
        _until(lambda: readyz().status_code == 200, "/readyz sees the database again")

        def redeemed() -> bool:
            answer = _call(mcp, {"inputResponses": ANSWERS, "requestState": fresh}, 5)
            return "result" in answer  # refused unconsumed while down: it redeems now

        _until(redeemed, "the refused token redeems")
        assert _call(mcp, {"inputResponses": ANSWERS, "requestState": fresh}, 6)["error"]["code"] == -32602
    finally:
        stop(proc)
    log = log_path.read_text()
    assert f"replay=postgresql://statecodec_app:***@127.0.0.1:{server.port}" in log
    assert_no_secret(log)


def test_proxy_exits_4_before_listening_when_postgres_is_unreachable(
    tmp_path: Path, refused_port: int
) -> None:
    keys = _keys(tmp_path)
    for url in _unreachable(refused_port):
        proc = subprocess.run(
            [sys.executable, "-m", "statecodec.cli", "proxy", "--upstream", "http://127.0.0.1:9/mcp",
             "--audience", "svc", "--listen", "127.0.0.1:0", "--keys", f"file:{keys}", "--replay", url],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == ExitCode.STORE, proc.stderr
        assert proc.stdout == ""  # it never listened
        assert "Traceback" not in proc.stderr and "is the --replay URL right?" in proc.stderr
        assert_no_secret(proc.stdout, proc.stderr)
