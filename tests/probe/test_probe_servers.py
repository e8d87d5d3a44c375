"""``statecodec probe`` against five real servers, with the verdicts each set-up earns.

1. the TypeScript SDK 2.4.0 server with plaintext state and no verify hook
   (tests/node/ts_upstream_server.mjs);
2. the same server with the SDK's ``createRequestStateCodec`` as its verify hook (``--codec``);
3. a Python ``MCPServer`` (mcp 2.3) with its default boundary
   (examples/deploy_server.py ``--boundary sdk``);
4. a Python ``MCPServer`` with ``statecodec.adapters.mcp.protect`` and a SQLite replay store;
5. server 1 behind ``statecodec proxy`` (bearer JWTs checked against a loopback JWKS).

Every server also serves ``deploy_staging`` (the same flow under another name) and, where it
has users, knows alice and bob. The probe runs as a subprocess, the real command with
``--json``; each document is validated against docs/cli-schema.json. The last test renders
the five documents as the table in docs/probe.md and compares it with the committed one
(``STATECODEC_UPDATE_DOCS=1`` rewrites it). Nothing is mocked.

Lifetimes are 10 s where a server lets us choose one, and the probe waits past it (statecodec
expires a state strictly at its TTL), so the expiry check really runs; that wait overlaps the
other checks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fixtures_mcp import server_command
from fixtures_proxy import NODE_DIR, JWKSServer, node_or_skip, proxy_command
from processes import ROOT, await_line, spawn, stop

from statecodec import KeyRing
from statecodec.probe import CHECKS
from tools.probe_table import render

pytestmark = pytest.mark.node

VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "docs" / "cli-schema.json").read_text()))
DOC = ROOT / "docs" / "probe.md"
TTL = 10
PROBE = [
    "--tool",
    "deploy_production",
    "--arguments",
    '{"version": "1.2.3"}',
    "--other-tool",
    "deploy_staging",
]
STATIC_USERS = [
    "--header",
    "Authorization: Bearer alice-token",
    "--other-header",
    "Authorization: Bearer bob-token",
]


@dataclass(frozen=True)
class Target:
    title: str  # the column in docs/probe.md
    url: str
    options: Sequence[str]


EXPECTED = {
    "ts-plain": {
        "readable": "FAIL", "forge": "FAIL", "tamper": "FAIL", "replay": "FAIL", "arguments": "FAIL",
        "cross-tool": "FAIL", "cross-user": "FAIL", "garbage": "FAIL", "expiry": "FAIL",
    },
    "ts-codec": {
        "readable": "FAIL", "forge": "PASS", "tamper": "PASS", "replay": "FAIL", "arguments": "FAIL",
        "cross-tool": "FAIL", "cross-user": "FAIL", "garbage": "PASS", "expiry": "PASS",
    },
    "py-sdk": {
        "readable": "PASS", "forge": "PASS", "tamper": "PASS", "replay": "FAIL", "arguments": "PASS",
        "cross-tool": "PASS", "cross-user": "PASS", "garbage": "PASS", "expiry": "SKIP",
    },
    "py-statecodec": dict.fromkeys(CHECKS, "PASS"),
    "proxied": dict.fromkeys(CHECKS, "PASS"),
}  # fmt: skip
ORDER = list(EXPECTED)


def serve(command: list[str], log: Path, cwd: Path = ROOT, ready: str = "READY ") -> Iterator[str]:
    proc = spawn(command, log, cwd)
    try:
        yield await_line(proc, ready, log)
    finally:
        stop(proc)


def ts_server(tmp: Path, *flags: str) -> Iterator[str]:
    command = [node_or_skip(), str(NODE_DIR / "ts_upstream_server.mjs"), "--second-tool", *flags]
    yield from serve(command, tmp / "server.log", NODE_DIR)


def deploy_server(tmp: Path, replay: str, *flags: str) -> Iterator[str]:
    keys = tmp / "keys.json"
    keys.write_text(KeyRing.generate().to_json(), encoding="utf-8")
    command = server_command(flavor="mcpserver", mode="encrypt", keys=keys, replay=replay, name="P")
    yield from serve([*command, "--staging-tool", *flags], tmp / "server.log")


@pytest.fixture(scope="module")
def server_ts_plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    for url in ts_server(tmp_path_factory.mktemp("ts-plain")):
        yield Target(
            "1. TypeScript SDK 2.4.0, no verify hook",
            url,
            [*PROBE, *STATIC_USERS, "--wait", "3s"],  # no users: the other header changes nothing
        )


@pytest.fixture(scope="module")
def server_ts_codec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    for url in ts_server(tmp_path_factory.mktemp("ts-codec"), "--codec", "--ttl", str(TTL)):
        yield Target(
            "2. TypeScript SDK 2.4.0, `createRequestStateCodec`",
            url,
            [*PROBE, *STATIC_USERS, "--wait", f"{TTL + 2}s"],
        )


@pytest.fixture(scope="module")
def server_py_sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("py-sdk")
    for url in deploy_server(tmp, "memory:", "--boundary", "sdk"):
        # Its lifetime is the SDK's 600 s default: no --wait, the expiry check is skipped.
        yield Target("3. Python `MCPServer`, default boundary", url, [*PROBE, *STATIC_USERS])


@pytest.fixture(scope="module")
def server_py_statecodec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("py-statecodec")
    flags = ("--ttl", str(TTL))
    for url in deploy_server(tmp, f"sqlite:{tmp / 'replay.sqlite3'}", *flags):
        yield Target(
            "4. Python `MCPServer` + statecodec `protect()`",
            url,
            [*PROBE, *STATIC_USERS, "--wait", f"{TTL + 2}s"],
        )


@pytest.fixture(scope="module")
def server_proxied(tmp_path_factory: pytest.TempPathFactory, jwks_server: JWKSServer) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp("proxied")
    keys = tmp / "keys.json"
    keys.write_text(KeyRing.generate().to_json(), encoding="utf-8")
    keys.chmod(0o600)
    for upstream in ts_server(tmp):
        command = proxy_command(
            upstream,
            keys=keys,
            replay=f"sqlite:{tmp / 'replay.sqlite3'}",
            mode="encrypt",
            jwks=jwks_server.url,
            extra=["--ttl", f"{TTL}s"],
        )
        for base in serve(command, tmp / "proxy.log", ready="listening on "):
            users = [
                "--header", f"Authorization: Bearer {jwks_server.mint('alice', lifetime=3600)}",
                "--other-header", f"Authorization: Bearer {jwks_server.mint('bob', lifetime=3600)}",
            ]  # fmt: skip
            yield Target(
                "5. server 1 behind `statecodec proxy`",
                base + "/mcp",
                [*PROBE, *users, "--wait", f"{TTL + 2}s"],
            )


@pytest.fixture(scope="module")
def reports(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The probe's JSON document for each server; the five probes run at the same time.

    Each is the real command in its own process; most of their time is the expiry wait.
    """
    targets: dict[str, Target] = {
        name: request.getfixturevalue("server_" + name.replace("-", "_")) for name in ORDER
    }
    tmp = tmp_path_factory.mktemp("probes")
    running = {}
    for name, target in targets.items():
        command = [
            sys.executable, "-m", "statecodec.cli", "probe", target.url, *target.options,
            "--i-understand-side-effects", "--timeout", "30s", "--json",
        ]  # fmt: skip
        out = (tmp / f"{name}.json").open("w")
        running[name] = (
            subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, text=True, cwd=ROOT),
            out,
        )
    docs = {}
    for name, (proc, out) in running.items():
        try:
            _, stderr = proc.communicate(timeout=300)
        finally:
            out.close()
            stop(proc)
        doc = json.loads((tmp / f"{name}.json").read_text(encoding="utf-8"))
        VALIDATOR.validate(doc)
        assert doc["exit_code"] == proc.returncode, stderr
        docs[name] = {**doc, "title": targets[name].title}
    return docs


def verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {c["check"]: c["verdict"] for c in doc["checks"]}


def attempts(doc: dict[str, Any], check: str) -> dict[str, dict[str, Any]]:
    return {a["attempt"]: a for c in doc["checks"] if c["check"] == check for a in c["attempts"]}


@pytest.mark.parametrize("name", ORDER)
def test_verdicts(reports: dict[str, Any], name: str) -> None:
    doc = reports[name]
    assert verdicts(doc) == EXPECTED[name], json.dumps(doc["checks"], indent=1)
    failed = any(v == "FAIL" for v in EXPECTED[name].values())
    assert doc["ok"] is not failed and doc["exit_code"] == (1 if failed else 0)
    assert doc["target"]["protocol_version"] == "2026-07-28"
    assert doc["baseline"]["completed"] is True and doc["baseline"]["rounds"] == 1
    assert doc["baseline"]["input_requests"] == {
        "confirm_deploy": "elicitation/create",
        "change_ticket": "elicitation/create",
    }
    for check in doc["checks"]:
        for attempt in check["attempts"]:
            evidence = attempt["evidence"]
            if attempt["verdict"] == "PASS" and evidence is not None:
                # A rejection is an error with no result: here always the SDKs' uniform one.
                assert evidence["outcome"] == "rejected" and not evidence["result_came_back"]
                assert evidence["error"]["code"] == -32602, attempt
            if attempt["verdict"] == "FAIL" and evidence is not None:
                assert evidence["outcome"] in ("completed", "tool_error", "input_required"), attempt


def test_plaintext_server_runs_whatever_the_client_sends(reports: dict[str, Any]) -> None:
    doc = reports["ts-plain"]
    readable = next(c for c in doc["checks"] if c["check"] == "readable")
    assert readable["facts"]["format_name"] == "plaintext JSON"
    assert readable["facts"]["fields"] == [
        "version: string", "plan_id: string", "planned_on: string", "steps: array of 3",
    ]  # fmt: skip
    assert "1.2.3" not in json.dumps(readable), "field values must be redacted"
    edited = attempts(doc, "forge")["edited"]["evidence"]
    assert edited["outcome"] == "completed" and "deployed 1.2.3-forged" in edited["detail"]
    invented = attempts(doc, "forge")["invented"]["evidence"]
    assert "deployed statecodec-probe" in invented["detail"]
    assert "to staging" in attempts(doc, "cross-tool")["sent to deploy_staging"]["evidence"]["detail"]


def test_codec_server_signs_but_does_not_bind_or_redeem(reports: dict[str, Any]) -> None:
    doc = reports["ts-codec"]
    readable = next(c for c in doc["checks"] if c["check"] == "readable")
    assert readable["facts"]["format"] == "ts-v1" and readable["facts"]["mode"] == "sign"
    tamper = attempts(doc, "tamper")
    assert {name: a["verdict"] for name, a in tamper.items()} == {
        "one character changed": "PASS", "truncated": "PASS", "payload swapped": "PASS",
    }  # fmt: skip
    assert attempts(doc, "forge")["edited"]["sent"].startswith("field p.version changed")
    replayed = attempts(doc, "replay")["replayed"]["evidence"]
    assert replayed["outcome"] == "completed" and replayed["http_status"] == 200


def test_python_sdk_boundary_stops_all_but_replay(reports: dict[str, Any]) -> None:
    doc = reports["py-sdk"]
    facts = next(c for c in doc["checks"] if c["check"] == "readable")["facts"]
    # The Ruby SDK's tokens have the same shape: without the key, both formats are candidates.
    assert facts["format"] is None and facts["format_name"].startswith("Python SDK v1 or Ruby SDK v1")
    assert attempts(doc, "replay")["replayed"]["evidence"]["result_came_back"] is True
    expiry = attempts(doc, "expiry")["expiry"]
    assert expiry["verdict"] == "SKIP" and "--wait" in expiry["note"]


@pytest.mark.parametrize("name", ["py-statecodec", "proxied"])
def test_statecodec_stops_every_attack(reports: dict[str, Any], name: str) -> None:
    doc = reports[name]
    readable = next(c for c in doc["checks"] if c["check"] == "readable")
    assert readable["facts"]["format"] == "sc1" and readable["facts"]["mode"] == "encrypt"
    assert attempts(doc, "forge")["invented"]["sent"].startswith("a well-formed statecodec token")
    expiry = next(c for c in doc["checks"] if c["check"] == "expiry")
    assert expiry["facts"]["waited_seconds"] > TTL


def test_docs_table_is_generated_from_these_runs(reports: dict[str, Any]) -> None:
    table = render([(reports[name]["title"], reports[name]) for name in ORDER])
    text = DOC.read_text(encoding="utf-8")
    start, end = "<!-- probe-table:start -->\n", "<!-- probe-table:end -->"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    assert pattern.search(text), f"{DOC} has no {start.strip()} ... {end} block"
    if os.environ.get("STATECODEC_UPDATE_DOCS") == "1":
        text = pattern.sub(lambda _: start + table + end, text)
        DOC.write_text(text, encoding="utf-8")
    assert pattern.search(text).group(0) == start + table + end, (  # type: ignore[union-attr]
        "docs/probe.md is stale: regenerate it with "
        "STATECODEC_UPDATE_DOCS=1 .venv/bin/pytest tests/probe/test_probe_servers.py"
    )
