"""Processes the tests start (servers, proxies) and stop by their own PID.

One place for spawning with a log file, waiting for the line a process prints once it
listens (``READY <url>``, ``listening on <url>``), and stopping it.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 60.0


def spawn(command: Sequence[str], log_path: Path, cwd: Path = ROOT) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", NODE_NO_WARNINGS="1")
    with log_path.open("w", encoding="utf-8") as log:
        return subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=cwd,
        )


def await_line(proc: subprocess.Popen[str], prefix: str, log_path: Path) -> str:
    """The rest of the first stdout line starting with ``prefix``; stops the process on failure."""
    assert proc.stdout is not None
    deadline = time.monotonic() + START_TIMEOUT
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=0.2):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
            if not line and proc.poll() is not None:
                break
    stop(proc)
    log = log_path.read_text(encoding="utf-8", errors="replace")
    raise RuntimeError(f"{proc.args!r} did not start (exit {proc.returncode}):\n{log[-3000:]}")


def stop(proc: subprocess.Popen[str]) -> int | None:
    """Stop one process we started, by its PID: SIGTERM, then SIGKILL. Returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode
