"""Shared by the TypeScript package's pytest wrappers: find Node, build ts/ once, run its tools.

``ts/`` is the TypeScript package (@statecodec/ts); its Node dependencies come from
``npm ci`` in ts/ (scripts/test does it through scripts/_node.sh). Without node/npm or
without ts/node_modules the tests that import this module are skipped with a message.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

from processes import node_marks

TS_DIR = Path(__file__).resolve().parents[2] / "ts"
NODE = shutil.which("node")

SKIPS = node_marks(TS_DIR, "typescript")

_built = False
_lock = threading.Lock()


def build() -> None:
    """Compile ts/ (src, test, tools) into ts/dist once per test session."""
    global _built
    with _lock:
        if _built:
            return
        assert NODE is not None
        proc = subprocess.run(
            [NODE, "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"],
            cwd=TS_DIR,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        _built = True


def run_tool(name: str, spec: dict[str, Any], *, timeout: float = 120) -> dict[str, Any]:
    """Run ``ts/dist/tools/<name>.js`` with ``spec`` as JSON on stdin; its JSON answer."""
    build()
    assert NODE is not None
    proc = subprocess.run(
        [NODE, f"dist/tools/{name}.js"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        cwd=TS_DIR,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer
