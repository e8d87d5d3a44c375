"""A ``statecodec proxy --workers 2`` group for the tests of the supervisor and its workers.

A real Python upstream (examples/unprotected_server.py) and a real supervisor with two
workers before it, a key file and a SQLite replay store; and how a test finds the workers
and waits for what they do. Used by test_proxy_workers.py and test_proxy_workers_ops.py.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fixtures_proxy import upstream_command
from processes import await_line, spawn, stop

from statecodec import KeyRing


def workers_of(pid: int) -> set[int]:
    """The worker processes of a supervisor: its spawned children (not the resource tracker)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"spawn_main" in cmdline:
                found.add(int(child))
    return found


def until(condition: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
    return value


@contextlib.contextmanager
def spawned_group(tmp_path: Path, *extra: str) -> Iterator[tuple[Any, Path]]:
    """A Python upstream and a 2-worker proxy before it, stopped on exit; the caller reads its lines."""
    keys = tmp_path / "keys.json"
    keys.write_text(KeyRing.generate().to_json())
    keys.chmod(0o600)
    command, cwd = upstream_command("python", tmp_path / "record.jsonl")
    upstream = spawn(command, tmp_path / "upstream.log", cwd)
    proxy = None
    try:
        upstream_url = await_line(upstream, "READY ", tmp_path / "upstream.log")
        log = tmp_path / "proxy.log"
        proxy = spawn(
            [sys.executable, "-m", "statecodec.cli", "proxy", "--upstream", upstream_url,
             "--listen", "127.0.0.1:0", "--keys", f"file:{keys}", "--replay", f"sqlite:{tmp_path / 'r.db'}",
             "--audience", "deploy", "--workers", "2", "--graceful-timeout", "5s", *extra],
            log,
        )  # fmt: skip
        yield proxy, log
    finally:
        if proxy is not None:
            stop(proxy)
        stop(upstream)
