"""``statecodec proxy --workers 2 --admin-listen ... --log-format json``: one admin listener for the group.

A real supervisor with two real workers in front of the unprotected Python server, a
SQLite replay store and a key file. The supervisor serves ``/livez``, ``/readyz`` and
``/metrics``; ``/metrics`` sums what both workers counted (prometheus-client's
multiprocess mode, through a directory the supervisor makes for the run). Every line the
group writes on stderr is a JSON object, the workers' included.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures_proxy import TOOL, messages, modern_request
from processes import await_line
from prometheus_client.parser import text_string_to_metric_families
from proxy_workers import spawned_group, until, workers_of

pytestmark = pytest.mark.slow


@pytest.fixture
def group(tmp_path: Path) -> Iterator[tuple[Any, str, str, Path]]:
    with spawned_group(tmp_path, "--admin-listen", "127.0.0.1:0", "--log-format", "json") as (proxy, log):
        admin = await_line(proxy, "admin on ", log)  # printed before "listening on"
        base = await_line(proxy, "listening on ", log)
        yield proxy, base + "/mcp", admin, log


def requests_counted(admin: str) -> float:
    text = httpx.get(f"{admin}/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "statecodec_proxy_requests_total" and sample.labels.get("code") == "200"
    )


def test_the_supervisor_serves_health_and_the_sum_of_every_workers_metrics(
    group: tuple[Any, str, str, Path],
) -> None:
    proxy, url, admin, log = group
    workers = until(lambda: len(workers_of(proxy.pid)) == 2 and workers_of(proxy.pid))
    assert httpx.get(f"{admin}/livez", timeout=30).status_code == 200
    assert httpx.get(f"{admin}/readyz", timeout=30).status_code == 200

    body, headers = modern_request("tools/call", {"name": TOOL, "arguments": {"version": "1.2.3"}})
    for _ in range(12):  # a new connection each: the kernel spreads them over both workers
        with httpx.Client(timeout=30) as http:
            response = http.post(url, content=body, headers=headers)
        assert "requestState" in messages(response)[-1]["result"]
    # Counted by whichever worker served each; the supervisor serves none, so what its
    # /metrics shows it read from the workers' files.
    until(lambda: requests_counted(admin) == 12)
    assert len(workers) == 2

    proxy.send_signal(signal.SIGTERM)
    assert proxy.wait(timeout=60) == 0, log.read_text()
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line, the workers' too, is one JSON object
    assert any(record.get("event") == "proxy_started" and record.get("workers") == 2 for record in records)
    assert any(record.get("event") == "admin_started" for record in records)
