"""statecodec.ops in a Python server: readiness, the endpoints, /metrics, JSON logs, the shipped rules.

The proxy's admin listener serves the same app (tests/proxy/test_proxy_ops.py runs the real
proxy); here the pieces are driven in-process, with real stores, a real key manager
over a key file, real HTTP through uvicorn for the mounted app, and prometheus-client's
own parser reading every exposition.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.routing import Mount

from statecodec import KeyRing, StateCodec, _telemetry, boundary, ops
from statecodec._net import bind_socket
from statecodec.kms import KeyManager
from statecodec.replay import MemoryReplayStore, ReplayStore

ROOT = Path(__file__).resolve().parents[2]
OPS_DOCS = ROOT / "docs" / "ops"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus exposition, keyed by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


class FailingStore(ReplayStore):
    """A store whose server is down: every call raises (a real Redis outage is in test_proxy_ops)."""

    kind = "failing"

    def __init__(self) -> None:
        self.down = True
        self.checks = 0

    def consume(self, key: str, retention: float) -> bool:
        raise ConnectionError("connection refused")

    def check(self) -> None:
        self.checks += 1
        if self.down:
            raise ConnectionError("connection refused\n(on two lines)")


class HangingStore(ReplayStore):
    """A store whose every check hangs until released: a SIGSTOPped server, in-process."""

    kind = "hanging"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def consume(self, key: str, retention: float) -> bool:
        return True

    def check(self) -> None:
        self.calls += 1
        self.release.wait(30)


# ------------------------------------------------------------------ readiness
def test_ready_with_keys_that_mint_and_a_store_that_answers() -> None:
    health = ops.Health(KeyRing.generate("k1"), MemoryReplayStore())
    readiness = health.check()
    assert readiness.ready and readiness.status == 200 and readiness.failing == []
    assert readiness.to_dict()["checks"]["keys"] == {"ok": True, "detail": "minting with k1"}
    assert ops.Health(KeyRing.generate("k1")).check().ready  # no store: nothing to wait for


def test_a_store_that_does_not_answer_fails_readiness_with_its_reason() -> None:
    store = FailingStore()
    health = ops.Health(KeyRing.generate("k1"), store, interval=0.05, max_silence=0.2)
    readiness = health.check()
    assert not readiness.ready and readiness.status == 503 and readiness.failing == ["replay_store"]
    detail = readiness.to_dict()["checks"]["replay_store"]["detail"]
    assert "failing replay store has not answered" in detail and "connection refused (on two lines)" in detail
    assert "\n" not in detail
    store.down = False
    deadline = time.monotonic() + 60
    while not health.check().ready:  # asked again once the interval has passed
        assert time.monotonic() < deadline
        time.sleep(0.01)
    store.down = True
    while health.check().ready:  # ready until the last answer is older than max_silence
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_store_that_refuses_is_not_ready_at_its_next_check_not_after_max_silence() -> None:
    # A refusal (connection refused) is not silence: every redemption fails now, so the
    # instance is not ready as soon as a check sees it, though it answered moments ago.
    now = [1000.0]
    store = FailingStore()
    store.down = False
    health = ops.Health(KeyRing.generate("k1"), store, interval=1, max_silence=5, clock=lambda: now[0])
    assert health.check().ready
    store.down = True
    now[0] += 0.5
    assert health.check().ready  # not asked again within the interval: the answer 0.5 s ago stands
    now[0] += 0.5
    refused = health.check()  # asked (1 s since the last check), refused: not ready, 4 s before max_silence
    assert not refused.ready and refused.failing == ["replay_store"]
    detail = refused.checks["replay_store"].detail
    assert detail.startswith("the failing replay store failed its last check: connection refused")
    assert "(last answer 1.0s ago)" in detail
    store.down = False
    now[0] += 1
    assert health.check().ready  # and ready again at the first check it answers


def test_store_is_asked_at_most_once_per_interval() -> None:
    store = FailingStore()
    health = ops.Health(KeyRing.generate("k1"), store, interval=60, max_silence=60)
    for _ in range(20):
        health.check()
    assert store.checks == 1


async def test_a_hanging_store_delays_a_probe_by_the_timeout_and_never_piles_up_threads() -> None:
    store = HangingStore()
    health = ops.Health(KeyRing.generate("k1"), store, interval=0.01, max_silence=5, timeout=0.2)
    try:
        started = time.monotonic()
        results = await asyncio.gather(*(health.acheck() for _ in range(5)))
        assert time.monotonic() - started < 10  # bounded by the timeout, not by the store
        assert all(r.failing == ["replay_store"] for r in results)
        assert "has not answered yet" in results[0].checks["replay_store"].detail
        await asyncio.sleep(0.05)
        await health.acheck()
        assert store.calls == 1  # one call in flight at most, whatever the probe rate
        store.release.set()
        deadline = time.monotonic() + 10
        while not (await health.acheck()).ready:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
    finally:
        store.release.set()
        health.close()


def test_keys_that_cannot_mint_fail_readiness(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate("k1").to_json(), encoding="utf-8")
    keys.chmod(0o600)
    now = [time.time()]
    manager = KeyManager(f"file:{keys}", clock=lambda: now[0])
    assert not ops.Health(manager).check().ready  # not started: nothing loaded
    manager.start(background=False)
    try:
        health = ops.Health(manager)
        assert health.check().ready
        keys.unlink()  # the source fails from now on
        now[0] += 100
        with pytest.raises(Exception, match="no such file"):
            manager.refresh_now()
        check = health.keys_check()
        assert check.ok and "refreshes fail" in check.detail and "minting stops in 800s" in check.detail
        status = manager.status()
        assert status["state"] == "degraded" and status["minting_stops_in"] == pytest.approx(800)
        now[0] += 1000  # past the 900 s staleness limit
        readiness = health.check()
        assert readiness.failing == ["keys"]
        assert "minting stopped" in readiness.checks["keys"].detail
        assert manager.status()["state"] == "stale"
        # The gauges an alert reads: minting stopped, a ring older than three refresh intervals.
        gauges = samples(ops.exposition(health)[0].decode())
        assert gauges[("statecodec_minting", ())] == 0
        assert gauges[("statecodec_key_ring_age_seconds", ())] == pytest.approx(1100)
        assert gauges[("statecodec_key_refresh_interval_seconds", ())] == 60
    finally:
        manager.stop()


# ------------------------------------------------------------------ the endpoints
async def call(app: Any, method: str, path: str, root_path: str = "") -> tuple[int, dict[str, str], bytes]:
    """One request through an ASGI app, as a server would make it."""
    scope = {
        "type": "http", "method": method, "path": path, "root_path": root_path, "headers": [],
        "query_string": b"",
    }  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


async def test_livez_readyz_metrics_404_405_head() -> None:
    store = FailingStore()
    app = ops.app(ops.Health(KeyRing.generate("k1"), store))
    assert (await call(app, "GET", "/livez"))[::2] == (200, b"ok\n")
    status, headers, body = await call(app, "GET", "/readyz")
    assert status == 503 and headers["content-type"] == "application/json"
    document = json.loads(body)
    assert document["ready"] is False and document["failing"] == ["replay_store"]
    assert document["checks"]["keys"]["ok"] is True
    status, headers, body = await call(app, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert sample(body.decode(), "statecodec_minting") == 1.0
    assert (await call(app, "GET", "/nope"))[0] == 404
    assert (await call(app, "POST", "/livez"))[0] == 405
    status, headers, body = await call(app, "HEAD", "/livez")
    assert status == 200 and body == b"" and headers["content-length"] == "3"
    assert (await call(ops.app(ops.Health(KeyRing.generate()), metrics=False), "GET", "/metrics"))[0] == 404


@pytest.fixture
def mounted() -> Iterator[str]:
    """A Starlette server with the endpoints mounted at /ops, served by uvicorn on loopback."""
    health = ops.Health(KeyRing.generate("k1"), MemoryReplayStore())
    app = Starlette(routes=[Mount("/ops", app=ops.app(health))])
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/ops"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def test_mounted_under_a_prefix_in_a_real_server(mounted: str) -> None:
    with httpx.Client(timeout=30) as http:
        assert http.get(f"{mounted}/livez").text == "ok\n"
        assert http.get(f"{mounted}/readyz").json()["ready"] is True
        scraped = http.get(f"{mounted}/metrics", headers={"accept": "application/openmetrics-text"})
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    assert scraped.text.rstrip().endswith("# EOF")


# ------------------------------------------------------------------ metrics
async def test_unseal_outcomes_are_counted_with_fixed_labels_only() -> None:
    codec = StateCodec(KeyRing.generate("k1"), mode="sign", replay=MemoryReplayStore())
    binding = boundary.binding_for("tools/call", {"name": "t"}, principal=None, audience="a")
    before, _ = ops.exposition(ops.Health(codec.keys))
    token = codec.seal(b"s", binding)
    params = {"name": "t", "requestState": token}
    await boundary.judge_request(codec, "tools/call", params, lambda: binding)
    for _ in range(2):
        with pytest.raises(boundary.WireError):
            await boundary.judge_request(codec, "tools/call", params, lambda: binding)
    after, _ = ops.exposition(ops.Health(codec.keys))
    text_before, text_after = before.decode(), after.decode()
    for outcome, delta in (("ok", 1), ("replayed", 2), ("tampered", 0)):
        moved = sample(text_after, "statecodec_unseals_total", outcome=outcome)
        assert moved - sample(text_before, "statecodec_unseals_total", outcome=outcome) == delta
    # Every label is one of the documented ones: never a kid, token, principal or target.
    for family in text_string_to_metric_families(text_after):
        if not family.name.startswith("statecodec_") or family.name.endswith("_created"):
            continue  # _created: prometheus-client's creation times (the proxy turns them off)
        name = family.name + ("_total" if family.type == "counter" else "")
        assert name in _telemetry.PROMETHEUS, name
        for s in family.samples:
            assert set(s.labels) - {"le"} <= set(_telemetry.PROMETHEUS[name]), s
            assert "k1" not in s.labels.values() and token not in str(s.labels)


def test_several_processes_are_summed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prometheus-client's multiprocess mode: two worker processes count, one exposition sums."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    worker = textwrap.dedent(
        """
        from statecodec import _telemetry, ops  # a worker of the proxy imports ops, as the proxy does
        for _ in range(3):
            _telemetry.record_unseal("encrypt", "tools/call", "tampered", 400)
        _telemetry.record_proxy_request(200, 0.01)
        """
    )
    env = {**os.environ, ops.MULTIPROCESS_ENV: str(directory)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", worker], env=env, check=True, timeout=60)
    assert len(list(directory.glob("*.db"))) >= 2  # one file per process and kind
    monkeypatch.setenv(ops.MULTIPROCESS_ENV, str(directory))
    body, _ = ops.exposition(ops.Health(KeyRing.generate()))
    text = body.decode()
    assert sample(text, "statecodec_unseals_total", outcome="tampered") == 6
    assert sample(text, "statecodec_proxy_requests_total", code="200") == 2
    assert sample(text, "statecodec_token_size_bytes_count") == 6
    assert sample(text, "statecodec_minting") == 1  # read from this process's keys at scrape time


def test_the_opentelemetry_instruments_translate_to_the_prometheus_names() -> None:
    """Through OpenTelemetry's own Prometheus exporter (no statecodec.ops): the documented names."""
    pytest.importorskip("opentelemetry.exporter.prometheus", reason="it is in the test dependency group")
    script = textwrap.dedent(
        """
        import asyncio
        from opentelemetry import metrics
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from prometheus_client import REGISTRY, generate_latest
        metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))

        from statecodec import KeyRing, StateCodec, _telemetry
        from statecodec import boundary
        from statecodec.replay import MemoryReplayStore

        async def accepted_then_replayed():
            codec = StateCodec(KeyRing.generate(), mode="encrypt", replay=MemoryReplayStore())
            binding = boundary.binding_for("tools/call", {"name": "t"}, principal=None, audience="a")
            judged = boundary.Judged("tools/call", {"name": "t"}, lambda: binding)
            asking = {"resultType": "input_required", "requestState": "s"}
            sealed = boundary.seal_result(codec, judged, asking)
            params = {"name": "t", "requestState": sealed["requestState"]}
            await boundary.judge_request(codec, "tools/call", params, lambda: binding)
            try:
                await boundary.judge_request(codec, "tools/call", params, lambda: binding)
            except boundary.WireError:
                pass

        asyncio.run(accepted_then_replayed())
        _telemetry.record_store_error("redis")
        _telemetry.record_key_refresh_failure()
        print(generate_latest(REGISTRY).decode())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    families = [f for f in text_string_to_metric_families(out.stdout) if f.name.startswith("statecodec_")]
    exported = {s.name for family in families for s in family.samples}
    assert {re.sub(r"_(bucket|count|sum)$", "", name) for name in exported} <= set(_telemetry.PROMETHEUS)

    def value(name: str, **labels: str) -> float:
        return sum(
            s.value
            for family in families
            for s in family.samples
            if s.name == name and labels.items() <= s.labels.items()
        )

    assert value("statecodec_unseals_total", outcome="ok") == 1
    assert value("statecodec_unseals_total", outcome="replayed") == 1
    assert value("statecodec_seals_total", mode="encrypt") == 1
    assert value("statecodec_token_size_bytes_count") == 3
    assert value("statecodec_replay_store_errors_total") == 1
    assert value("statecodec_key_refresh_failures_total") == 1


def test_prometheus_counting_starts_with_statecodec_ops() -> None:
    """A server that never imports statecodec.ops pays nothing for Prometheus (not even the import)."""
    script = textwrap.dedent(
        """
        import sys
        from statecodec import _telemetry
        _telemetry.record_unseal("sign", "tools/call", "ok", 100)
        print("before", "prometheus_client" in sys.modules, _telemetry._registry is None)
        from statecodec import ops
        _telemetry.record_unseal("sign", "tools/call", "tampered", 100)
        body, _ = ops.exposition()
        print("after", body.count(b'statecodec_unseals_total{outcome="tampered"} 1.0'),
              body.count(b'statecodec_unseals_total{outcome="ok"} 0.0'))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["before", "False", "True", "after", "1", "1"]


# ------------------------------------------------------------------ logs
def test_fields_never_carry_a_whole_token_id_or_an_unbounded_target() -> None:
    facts = _telemetry.fields("token_rejected", token_id="ab" * 16, target="x" * 500, kid=None)
    assert facts == {"event": "token_rejected", "token_id": "abababab", "target": "x" * 120 + "..."}


_LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def _library_log_calls() -> Iterator[tuple[str, ast.Call]]:
    """Every ``logger.<level>(...)`` call in the package's source, with where it is."""
    for path in sorted((ROOT / "statecodec").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LEVELS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "logger"
            ):
                yield f"{path.relative_to(ROOT)}:{node.lineno}", node


def test_every_library_log_call_carries_an_event_field_and_no_logger_name_in_its_message() -> None:
    """Read from the source: a log call added later (another module, another branch) keeps the rule."""
    calls = list(_library_log_calls())
    assert len(calls) > 30  # the scan finds the package's log calls
    problems = []
    for where, call in calls:
        extra = next((k.value for k in call.keywords if k.arg == "extra"), None)
        if extra is None:
            problems.append(f"{where}: no extra= fields")
        elif (
            isinstance(extra, ast.Dict)
            and not any(isinstance(k, ast.Constant) and k.value == "event" for k in extra.keys)
            and not any(k is None for k in extra.keys)
        ):  # {**_telemetry.fields(...), ...} is fine
            problems.append(f"{where}: extra= without an event")
        message = call.args[0] if call.args else None
        if isinstance(message, ast.Constant) and str(message.value).lower().startswith("statecodec"):
            problems.append(f"{where}: the message repeats the logger name: {message.value[:40]!r}")
    assert not problems, "\n".join(problems)


def test_json_formatter_writes_one_object_per_line_with_the_fields() -> None:
    record = logging.LogRecord("statecodec", logging.WARNING, __file__, 1, "rejected %s\nsecond line",
                               ("x",), None)  # fmt: skip
    for name, value in _telemetry.fields("token_rejected", reason="tampered", kid="k1").items():
        setattr(record, name, value)
    line = ops.json_formatter().format(record)
    assert "\n" not in line
    document = json.loads(line)
    assert document["level"] == "WARNING" and document["logger"] == "statecodec"
    assert document["message"] == "rejected x\nsecond line"
    assert (document["event"], document["reason"], document["kid"]) == ("token_rejected", "tampered", "k1")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00", document["time"])


# ------------------------------------------------------------------ shipped rules and dashboard
def exported_names() -> set[str]:
    """Every sample name a statecodec server exports, from a real exposition after real traffic."""
    _telemetry.record_proxy_request(200, 0.01)  # the proxy's families exist once it answered
    manager_like = KeyRing.generate()
    body, _ = ops.exposition(ops.Health(manager_like))
    names = {s.name for family in text_string_to_metric_families(body.decode()) for s in family.samples}
    # A KeyManager only (test_proxy_ops checks them there).
    return names | {"statecodec_key_ring_age_seconds", "statecodec_key_refresh_interval_seconds"}


def used_metrics(text: str) -> set[str]:
    return set(re.findall(r"\bstatecodec_[a-z_]+", text))


def test_alert_rules_are_valid_and_use_only_exported_metrics() -> None:
    rules = yaml.safe_load((OPS_DOCS / "alerts.yml").read_text(encoding="utf-8"))
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    names = {rule["alert"] for rule in alerts}
    assert {"StatecodecMintingStopped", "StatecodecKeyRingStale", "StatecodecReplayStoreErrors",
            "StatecodecRejectionSpike"} <= names  # fmt: skip
    for rule in alerts:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("critical", "warning") and rule["annotations"]["summary"]
        assert used_metrics(rule["expr"]), rule["alert"]
        assert used_metrics(rule["expr"]) <= exported_names(), rule["alert"]


def test_grafana_dashboard_is_valid_and_uses_only_exported_metrics() -> None:
    dashboard = json.loads((OPS_DOCS / "grafana-dashboard.json").read_text(encoding="utf-8"))
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(expressions) >= 10 and len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    used = set().union(*map(used_metrics, expressions))
    assert used <= exported_names()
    # Every family statecodec exports has a panel.
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in used}
    assert families >= set(_telemetry.PROMETHEUS)
