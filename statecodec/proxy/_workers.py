"""Serve one listening socket from N worker processes, and keep them running.

A Python process serves on one core. ``statecodec proxy --workers N`` binds the socket
once, in the supervisor, and starts N workers that inherit it (multiprocessing's
``spawn``: a fresh interpreter each, no thread or connection copied across a fork);
the kernel hands each new connection to whichever worker accepts it first. Each worker
builds its own key manager, replay-store connection and upstream pool from the same
settings, so they share the keys (one key source) and single use (one replay store,
which is why a ``memory:`` store is refused with more than one worker).

The supervisor answers for the group: it is ready when every worker is, forwards
SIGTERM and SIGINT to the workers (each drains its open requests, as one process
would), and starts a worker again when one dies. A worker that dies before it is ready
stops the group with that worker's exit code: a configuration that cannot serve in one
worker cannot serve in the others either.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import queue
import signal
import socket
import time
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from typing import Any

from .. import _telemetry

logger = logging.getLogger("statecodec.proxy")

#: ``target(sock, announce)`` runs in a worker: it serves on ``sock`` and calls ``announce()``
#: once it accepts connections. It must be importable by name (a module-level function).
WorkerTarget = Callable[[socket.socket, Callable[[], None]], None]

_START_TIMEOUT = 120.0  # a worker loads keys and opens the store before it is ready
_RESPAWN_DELAY = 1.0  # between a worker's death and its replacement


def _worker_main(target: WorkerTarget, sock: socket.socket, ready: Any, index: int) -> None:
    target(sock, lambda: ready.put(index))


class Supervisor:
    """Start ``workers`` processes running ``target`` on ``sock``; see the module docstring."""

    def __init__(
        self, target: WorkerTarget, sock: socket.socket, workers: int, *, stop_timeout: float
    ) -> None:
        if workers < 2:
            raise ValueError("a supervisor is for two workers or more")
        self.target = target
        self.sock = sock
        self.workers = workers
        self.stop_timeout = stop_timeout
        self._context = multiprocessing.get_context("spawn")
        self._ready = self._context.Queue()
        self._procs: list[SpawnProcess | None] = [None] * workers
        self._stopping = False
        self.stopped_by: int | None = None  # the signal that stopped the workers, for the log

    def _start(self, index: int) -> SpawnProcess:
        proc = self._context.Process(
            target=_worker_main,
            args=(self.target, self.sock, self._ready, index),
            name=f"statecodec-proxy-worker-{index + 1}",
            daemon=False,
        )
        proc.start()
        self._procs[index] = proc
        return proc

    def run(self, on_ready: Callable[[], None]) -> int:
        """Serve until SIGTERM or SIGINT; the exit code for the command."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for index in range(self.workers):
                self._start(index)
            code = self._await_ready()
            if code is not None:
                return code
            on_ready()
            self._watch()
            return 0
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stopping = True
        self.stopped_by = signum

    def _await_ready(self) -> int | None:
        """None once every worker is ready; the exit code of one that died first."""
        pending = set(range(self.workers))
        deadline = time.monotonic() + _START_TIMEOUT
        while pending and not self._stopping:
            try:
                pending.discard(self._ready.get(timeout=0.2))
                continue
            except queue.Empty:
                pass
            for index in list(pending):
                proc = self._procs[index]
                if proc is not None and proc.exitcode is not None:
                    logger.error(
                        "worker %d exited with %d before it was ready",
                        index + 1,
                        proc.exitcode,
                        extra=_telemetry.fields("worker_failed", worker=index + 1, exit_code=proc.exitcode),
                    )
                    return proc.exitcode or 1
            if time.monotonic() > deadline:
                logger.error(
                    "workers not ready after %.0f s",
                    _START_TIMEOUT,
                    extra=_telemetry.fields("worker_failed", reason="start_timeout"),
                )
                return 1
        return 0 if self._stopping else None

    def _watch(self) -> None:
        while not self._stopping:
            sentinels = {proc.sentinel: index for index, proc in enumerate(self._procs) if proc is not None}
            for sentinel in multiprocessing.connection.wait(list(sentinels), timeout=0.5):
                index = sentinels[sentinel]  # type: ignore[index]
                proc = self._procs[index]
                if self._stopping or proc is None:
                    break
                logger.error(
                    "worker %d (pid %s) exited with %s; starting it again",
                    index + 1, proc.pid, proc.exitcode,
                    extra=_telemetry.fields(
                        "worker_restarted", worker=index + 1, pid=proc.pid, exit_code=proc.exitcode
                    ),
                )  # fmt: skip
                time.sleep(_RESPAWN_DELAY)  # a crash loop must not spin
                self._start(index)

    def _stop_all(self) -> None:
        procs = [proc for proc in self._procs if proc is not None]
        for proc in procs:
            if proc.exitcode is None:
                proc.terminate()  # SIGTERM: the worker drains like a single process
        deadline = time.monotonic() + self.stop_timeout + 5
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                logger.error(
                    "worker pid %s did not stop; killed",
                    proc.pid,
                    extra=_telemetry.fields("worker_killed", pid=proc.pid),
                )
                proc.kill()
                proc.join(5)
