"""The TypeScript package's own suite (ts/test: the shared vectors, the codec, the stores),
built with tsc and run with Node's test runner, as part of the Python suite.

The store tests need real servers: this wrapper hands them the session's Valkey, a
Valkey primary with one replica (for ``wait: 1``) and PostgreSQL (tests/fixtures_valkey.py,
tests/fixtures_postgres.py) through the environment, and fails if the suite skips anything.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from fixtures_postgres import PostgresServer
from fixtures_valkey import ValkeyServer
from ts_package import NODE, SKIPS, TS_DIR, build

pytestmark = SKIPS


def test_the_typescript_suite_passes(
    valkey_url: str,
    valkey_primary_replica: tuple[ValkeyServer, ValkeyServer],
    postgres_server: PostgresServer,
) -> None:
    build()
    files = sorted(str(p.relative_to(TS_DIR)) for p in (TS_DIR / "dist" / "test").glob("*.test.js"))
    assert "dist/test/vectors.test.js" in files
    assert NODE is not None
    proc = subprocess.run(
        [NODE, "--test", "--test-reporter=tap", *files],
        cwd=TS_DIR,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "STATECODEC_TEST_REDIS_URL": valkey_url,
            "STATECODEC_TEST_REDIS_REPLICATED_URL": valkey_primary_replica[0].url,
            "STATECODEC_TEST_POSTGRES_URL": postgres_server.url(),
        },
    )
    failed = re.findall(r"^\s*not ok \d+ - (.*)$", proc.stdout, re.MULTILINE)
    assert proc.returncode == 0 and not failed, (
        "\n".join(diagnostics(proc.stdout) or failed) or proc.stdout[-4000:] + proc.stderr[-4000:]
    )
    passed = re.search(r"^# pass (\d+)$", proc.stdout, re.MULTILINE)
    assert passed is not None and int(passed.group(1)) >= 170, proc.stdout[-2000:]
    if re.search(r"^# skipped [1-9]", proc.stdout, re.MULTILINE):
        pytest.fail("the TypeScript suite skipped tests:\n" + proc.stdout[-2000:])


def diagnostics(tap: str) -> list[str]:
    """Each failed test's TAP line with its diagnostics (the indented YAML block up to ``...``):
    the error and where it was raised, not only the name."""
    blocks = re.findall(r"^( *)(not ok \d+ - .*\n(?:\1  .*\n)*?\1  \.\.\.)$", tap, re.MULTILINE)
    return [block for _, block in blocks]
