"""Processes the tests start (servers, proxies) and stop by their own PID.

One place for spawning with a log file, waiting for the line a process prints once it
listens (``READY <url>``, ``listening on <url>``), starting several at once (all stopped
if one fails), polling for a condition with a bound, and stopping what was started.

Ports: a server that can bind port 0 does, and reports the port it got. One that needs a
number on its command line (Valkey, PostgreSQL, OpenBao) gets one from :func:`pick_port`,
is held ready only once :func:`listens` shows that very process listening there, and is
started again on new ports when it could not bind (:func:`started`). No port is probed by
binding it and closing the socket: another process could take the number in between.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "tests" / "node"
START_TIMEOUT = 60.0


def pick_port() -> int:
    """A loopback port number for a server that takes one on its command line: picked, not probed.

    It lies outside the kernel's ephemeral range, where every port-0 bind and every outgoing
    connection's port lands, so the only servers that can hold it are others started on a
    picked number; a start that finds it taken fails, and is made again on a new one.
    """
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    if low > 11_000:
        return random.SystemRandom().randrange(10_000, low)
    return random.SystemRandom().randrange(high + 1, 65_536)


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself holds a listening TCP socket on loopback ``port``.

    A server whose bind failed may answer a readiness check for a moment through whatever
    else listens on that port; this tells them apart (Linux's /proc).
    """
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    sockets.add(f"socket:[{fields[9]}]")
    if not sockets:
        return False
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed since it was listed
                if os.readlink(fd) in sockets:
                    return True
    return False


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


def lines_until(proc: subprocess.Popen[str], prefix: str, timeout: float) -> tuple[list[str], bool]:
    """Stdout lines up to the first that starts with ``prefix`` (True), or to the end or ``timeout`` (False).

    A thread reads with plain ``readline``: a selector on the pipe cannot see lines that
    the text wrapper has already buffered, so of two lines that arrive in one write (a
    proxy's ``admin on`` and ``listening on``, the demo's narration) the second stayed
    unseen until more output, or the end, came. The thread stops at the line it was
    looking for, so the caller can go on reading the pipe.
    """
    stdout = proc.stdout
    assert stdout is not None
    lines: list[str] = []

    def read() -> None:
        with contextlib.suppress(ValueError, OSError):  # the pipe closed by a caller that gave up
            for line in stdout:
                lines.append(line)
                if line.startswith(prefix):
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while reader.is_alive() and time.monotonic() < deadline:
        reader.join(0.2)
        if proc.poll() is not None:  # ended: what it wrote is read, even if a child keeps the pipe
            reader.join(1.0)
            break
    return lines, not reader.is_alive() and bool(lines) and lines[-1].startswith(prefix)


def await_line(proc: subprocess.Popen[str], prefix: str, log_path: Path) -> str:
    """The rest of the first stdout line starting with ``prefix``; stops the process on failure."""
    lines, found = lines_until(proc, prefix, START_TIMEOUT)
    if found:
        return lines[-1][len(prefix) :].strip()
    stop(proc)
    log = log_path.read_text(encoding="utf-8", errors="replace")
    raise RuntimeError(f"{proc.args!r} did not start (exit {proc.returncode}):\n{log[-3000:]}")


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
    """Stop one process we started, by its PID: ``sig``, then SIGKILL after ``timeout`` s. Its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
    return proc.returncode


def start_all(
    commands: Sequence[tuple[str, Sequence[str], Path]], prefix: str, cwd: Path = ROOT
) -> list[tuple[str, str, subprocess.Popen[str], Path]]:
    """Start every ``(name, command, log path)``, then wait for each one's ``prefix`` line.

    All start before any is waited for, so their imports run in parallel. Returns
    ``(name, announced rest of the line, process, log path)`` each; if one does not
    start, every one of them is stopped before the error propagates.
    """
    spawned = []
    try:
        for name, command, log_path in commands:
            spawned.append((name, spawn(command, log_path, cwd), log_path))
        return [
            (name, await_line(proc, prefix, log_path), proc, log_path) for name, proc, log_path in spawned
        ]
    except BaseException:
        for _, proc, _ in spawned:
            stop(proc)
        raise


def wait_for_log(log_path: Path, needle: str, timeout: float = 60.0) -> str:
    """The text of ``log_path`` once it holds ``needle``, or as it is at ``timeout`` (logs flush late)."""
    deadline = time.monotonic() + timeout
    while True:
        text = log_path.read_text(encoding="utf-8", errors="replace")
        if needle in text or time.monotonic() > deadline:
            return text
        time.sleep(0.05)


@dataclass
class Spawned:
    """A server process a test started: its name, what its ready line announced (its URL), its log file."""

    name: str
    announced: str
    proc: subprocess.Popen[str]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 60.0) -> str:
        return wait_for_log(self.log_path, needle, timeout)

    def stop(self) -> None:
        stop(self.proc)


def wait_until(
    condition: Callable[[], object],
    what: str,
    timeout: float = 60.0,
    *,
    tolerate: tuple[type[BaseException], ...] = (Exception,),
) -> None:
    """Poll ``condition`` until it is true; a bounded wait, never a fixed sleep.

    An exception of ``tolerate`` counts as "not yet" (a server still starting).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except tolerate:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting until {what}")
        time.sleep(0.05)


class Startable(Protocol):
    def start(self) -> object: ...

    def cleanup(self) -> None: ...


Made = TypeVar("Made", bound=Startable)


def started(make: Callable[[], Made]) -> Made:
    """A server made by ``make`` and started, on fresh ports if one it picked was taken.

    A picked port (:func:`pick_port`) may be held by another server: such a start fails
    with RuntimeError, and a new server (new ports) is tried, three times at most.
    """
    for attempt in range(3):
        made = make()
        try:
            made.start()
        except RuntimeError:
            made.cleanup()
            if attempt == 2:
                raise
        else:
            return made
    raise AssertionError("unreachable")


@contextlib.contextmanager
def running(make: Callable[[], Made]) -> Iterator[Made]:
    """:func:`started`, then cleaned up after, whatever happens."""
    made = started(make)
    try:
        yield made
    finally:
        made.cleanup()


def node_marks(package_dir: Path, installed: str) -> list[pytest.MarkDecorator]:
    """The marks of tests that run Node on the packages ``npm ci`` installs in ``package_dir``.

    They are skipped, saying what is missing and how to install it, without node/npm or without
    ``package_dir/node_modules/installed``.
    """
    where = package_dir.relative_to(ROOT).as_posix()
    return [
        pytest.mark.node,
        pytest.mark.skipif(
            shutil.which("node") is None or shutil.which("npm") is None,
            reason=f"node/npm not found: the tests of {where} need Node 20+",
        ),
        pytest.mark.skipif(
            not (package_dir / "node_modules" / installed).is_dir(),
            reason=f"{where}/node_modules is absent: run `npm ci` in {where} (scripts/test does)",
        ),
    ]


def node_or_skip(package: str = "server") -> str:
    """The ``node`` binary, or a skip saying what is missing; ``package``: the SDK package needed."""
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("node/npm are not installed: the TypeScript SDK tests need Node 20+")
    if not (NODE_DIR / "node_modules" / "@modelcontextprotocol" / package).is_dir():
        pytest.skip("tests/node/node_modules is missing: run `npm ci` in tests/node (scripts/test does)")
    return node
