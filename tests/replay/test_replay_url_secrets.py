"""No secret of a replay-store URL in a repr, an error, a log line or CLI output.

A Redis URL can carry secrets in its userinfo (``redis://user:PASSWORD@...``) and in its
query (``password=``, ``ssl_password=``, ``sentinel_password=``). Each is replaced by
``***`` wherever statecodec shows the URL or an error about it: the store's repr, the
``store_unavailable`` detail and the codec's warning, URL errors, ``statecodec verify``
and the proxy's start-up log and exit message. The scan looks for each secret as
written and percent-decoded.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from fixtures_valkey import ValkeyServer
from processes import await_line, running, spawn, stop
from replay_outcomes import assert_hidden, shown_when_unavailable, verify_consume_args
from replicas import keys_file

import statecodec as sc
from statecodec.cli import main
from statecodec.cli._exit import ExitCode
from statecodec.replay import store_from_url
from statecodec.replay._url import redact

USER_PW = "Us3r:P@ss/w#rd"  # ':', '@', '/' and '#' must be percent-encoded in a URL
QUERY_PW = "Qu3ry-Pa55w0rd"
SSL_PW = "Ssl-Pa55phrase"
SENTINEL_PW = "S3ntinel-Pa55"
UPSTREAM_PW = "Up5tream-Pa55"
SECRETS = [USER_PW, QUERY_PW, SSL_PW, SENTINEL_PW, UPSTREAM_PW]
BINDING = sc.Binding(principal="alice", audience="svc", method="tools/call", target="pay")


def assert_no_secret(*texts: str) -> None:
    assert_hidden(SECRETS, *texts)


def urls(port: int) -> list[str]:
    user = quote(USER_PW, safe="")
    return [
        f"redis://app:{user}@127.0.0.1:{port}/0?retries=0",
        f"redis://127.0.0.1:{port}/0?password={QUERY_PW}&retries=0",
        f"rediss://app:{user}@127.0.0.1:{port}/0?ssl_password={SSL_PW}&retries=0",
        # redis-py's async cluster client takes no ssl_password: a cluster URL refuses it.
        f"valkeys+cluster://app:{user}@127.0.0.1:{port},127.0.0.1:{port}?password={QUERY_PW}&retries=0",
        f"redis+sentinel://:{user}@127.0.0.1:{port}/mymaster/0?sentinel_password={SENTINEL_PW}&retries=0",
        f"unix://app:{user}@/tmp/no-such.sock?db=0&password={QUERY_PW}",
    ]


def test_redact_replaces_every_secret_and_keeps_the_rest() -> None:
    user = quote(USER_PW, safe="")
    url = f"redis+sentinel://u:{user}@h1:1,h2:2/svc/0?sentinel_password={SENTINEL_PW}&prefix=p:"
    assert redact(url) == "redis+sentinel://u:***@h1:1,h2:2/svc/0?sentinel_password=***&prefix=p:"
    # A password written without percent-encoding still counts as one.
    assert redact(f"redis://u:{USER_PW}@host:6379/0") == "redis://u:***@host:6379/0"
    assert redact("rediss://host/0?ssl_password=x&Password=y&auth_token=z&client_name=c") == (
        "rediss://host/0?ssl_password=***&Password=***&auth_token=***&client_name=c"
    )
    assert redact("redis://host/0#a-fragment") == "redis://host/0#***"


def test_reprs_and_store_unavailable_details_and_warnings(
    caplog: pytest.LogCaptureFixture, refused_port: int
) -> None:
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    for url in urls(refused_port):  # every consume fails
        shown += shown_when_unavailable(url, BINDING)
    shown += [record.getMessage() for record in caplog.records]
    assert any("store unavailable" in line for line in shown)  # the scan saw real messages
    assert_no_secret(*shown)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://app:{quote(USER_PW, safe='')}@localhost:6379/0?pool=big",
        f"redis://app:{quote(USER_PW, safe='')}@localhost:99999/0",
        f"redis://localhost:6379/0?password={QUERY_PW}&wait=x",
        f"rediss://localhost:6379/0?ssl_password={SSL_PW}&wiat=1",
        f"redis+sentinel://:{quote(USER_PW, safe='')}@h1?sentinel_password={SENTINEL_PW}",
        f"redis://app:{USER_PW}@localhost:6379/0",  # unencoded: '#' starts a fragment
        f"redis+cluster://app:{quote(USER_PW, safe='')}@h1:1,h2:x?password={QUERY_PW}",
        f"redis://localhost:6379/0?sentinel_password={SENTINEL_PW}",
    ],
)
def test_url_errors(url: str) -> None:
    with pytest.raises(ValueError) as info:
        store_from_url(url)
    assert "invalid replay store URL" in str(info.value)
    assert_no_secret(str(info.value))


def test_cli_verify_output(tmp_path: Path, refused_port: int) -> None:
    ring = sc.KeyRing.generate("k1")
    keys = keys_file(tmp_path, ring)
    token = sc.StateCodec(ring).seal(b"x", None)
    runner = CliRunner()
    outputs = []
    with running(lambda: ValkeyServer(extra_args=["--requirepass", USER_PW])) as server:
        good = f"redis://:{quote(USER_PW, safe='')}@127.0.0.1:{server.port}/0?client_name=verify"
        for url in [good, *urls(refused_port)]:
            for extra in ([], ["--json"]):
                result = runner.invoke(main, verify_consume_args(token, keys, url, *extra))
                outputs += [result.stdout, result.stderr]
                assert result.exit_code in (0, ExitCode.STORE, ExitCode.REPLAYED), result.output
    assert "consumed now in redis://:***@127.0.0.1" in "".join(outputs)
    assert json.loads(outputs[2])["exit_code"] == ExitCode.REPLAYED  # the second run, with --json
    assert_no_secret(*outputs)


def test_proxy_start_up_log_and_exit_message(tmp_path: Path, refused_port: int) -> None:
    keys = keys_file(tmp_path)
    upstream = f"http://127.0.0.1:{refused_port}/mcp?token={UPSTREAM_PW}"  # (credentials are refused)
    base = [sys.executable, "-m", "statecodec.cli", "proxy", "--upstream", upstream, "--audience", "svc",
            "--keys", f"file:{keys}", "--listen", "127.0.0.1:0", "--log-level", "debug"]  # fmt: skip
    logs = []
    with running(lambda: ValkeyServer(extra_args=["--requirepass", USER_PW])) as server:
        user = quote(USER_PW, safe="")
        log = tmp_path / "started.log"
        proc = spawn(
            [*base, "--replay", f"redis://default:{user}@127.0.0.1:{server.port}/0?client_name=proxy"], log
        )
        try:
            await_line(proc, "listening on ", log)
        finally:
            stop(proc)
        logs.append(log.read_text())
        assert "replay=redis://default:***@127.0.0.1" in logs[-1] and "/mcp?token=***" in logs[-1]
    for url in urls(refused_port):
        log = tmp_path / "refused.log"
        proc = spawn([*base, "--replay", url], log)
        try:
            assert proc.wait(timeout=60) == ExitCode.STORE
        finally:
            stop(proc)
        logs.append(log.read_text())
        assert "statecodec: error:" in logs[-1]
    assert_no_secret(*logs)


# PostgreSQL URLs are read by libpq, which ends the userinfo at the FIRST '@' (urllib and
# Redis at the last): an unencoded '@' would leave the password's tail in a host name,
# which libpq's errors and psycopg's pool logs repeat on every retry.
PG_PW = "pa@ss9X"
PG_OPTIONS_PW = "Opt10ns-Pa55"
PG_SECRETS = [PG_PW, PG_PW.partition("@")[2], PG_OPTIONS_PW]


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{PG_PW}@127.0.0.1:5432/db",
        f"postgres://app:{PG_PW}@h1:5432,h2:5432/db?target_session_attrs=read-write",
        "postgresql://app:pa/ss9X@127.0.0.1/db",  # libpq: host 'app', port 'pa'
        "postgresql://app:pa/s?s9X@127.0.0.1",
    ],
)
def test_postgres_url_libpq_would_misread_is_refused_naming_the_fix(url: str) -> None:
    with pytest.raises(ValueError) as info:
        store_from_url(url)
    message = str(info.value)
    assert "percent-encode '@' as %40" in message
    assert_hidden([*PG_SECRETS, "pa/ss9X", "pa/s?s9X", "ss9X"], message)


@pytest.mark.parametrize("password", ["p%40ss9X", "pa?ss9X", "plain9X", "p%2Fss9X"])
def test_postgres_redaction_hides_what_libpq_reads_as_the_password(password: str) -> None:
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415 - the postgres extra

    options = quote(f"-c app.password={PG_OPTIONS_PW}", safe="")
    url = f"postgresql://app:{password}@127.0.0.1:5432/db?application_name=a@b&options={options}"
    read = conninfo_to_dict(url)  # libpq's own reading
    shown = redact(url)
    assert shown == "postgresql://app:***@127.0.0.1:5432/db?application_name=a@b&options=***"
    assert_hidden([read["password"], PG_OPTIONS_PW], shown, repr(store_from_url(url)))


def test_postgres_options_secret_hidden_in_errors_and_logs(
    caplog: pytest.LogCaptureFixture, refused_port: int
) -> None:
    caplog.set_level(logging.DEBUG)
    options = quote(f"-c app.password={PG_OPTIONS_PW}", safe="")
    password = quote(USER_PW, safe="")
    url = f"postgresql://app:{password}@127.0.0.1:{refused_port}/db?options={options}&timeout=1"
    shown = shown_when_unavailable(url, BINDING)
    shown += [record.getMessage() for record in caplog.records]
    assert any("unavailable" in line for line in shown)  # the scan saw real messages
    assert_hidden([USER_PW, PG_OPTIONS_PW], *shown)
    with pytest.raises(ValueError) as info:
        store_from_url(f"postgresql://app@127.0.0.1/db?options={options}&timeout=never")
    assert "options=***" in str(info.value)
    assert_hidden([PG_OPTIONS_PW], str(info.value))
