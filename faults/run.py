"""One run: start the store, the clients and the nemesis; stop; judge the history.

The nemesis draws its schedule from ``--seed``: how many faults (about one per 8 seconds
of run, at least two), which kinds (from ``--faults``), when each starts and how
long it lasts; faults may overlap. Besides the store's own faults (stores.py) every store
has the clients' faults: ``kill-client`` (SIGKILL of a client process mid-load; a fresh one
replaces it), ``pause-client`` (SIGSTOP, then SIGCONT) and ``clock`` (a jump of one
process's codec clock by up to ``max_skew`` either way, then back).
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from statecodec import KeyRing

from .checker import Verdict, check_file
from .history import HistoryWriter, read
from .stores import MAX_CLOCK_JUMP, STORES, Store, signal_pid

CLIENT_FAULTS = ("kill_client", "pause_client", "clock")


@dataclass
class Fault:
    at: float
    kind: str
    duration: float

    def describe(self) -> str:
        return f"{self.at:6.1f}s {self.kind} for {self.duration:.1f}s"


def schedule(kinds: list[str], seconds: float, seed: int) -> list[Fault]:
    """The seeded nemesis schedule: faults start in [2 s, seconds - 4 s], overlap allowed."""
    rng = random.Random(f"{seed}:schedule")
    count = max(2, round(seconds / 8))
    latest = max(2.5, seconds - 4.0)
    faults = [Fault(round(rng.uniform(2.0, latest), 1), rng.choice(kinds), round(rng.uniform(1.0, 6.0), 1))
              for _ in range(count)]  # fmt: skip
    return sorted(faults, key=lambda f: f.at)


@dataclass
class Client:
    name: str
    roles: list[str]
    process: subprocess.Popen[bytes]


@dataclass
class Runner:
    store: Store
    workdir: Path
    seed: int
    honest: int
    attackers: int
    clients: list[Client] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    generation: int = 0

    @property
    def events(self) -> HistoryWriter:
        return self.store.events

    def spawn(self, name: str, roles: list[str]) -> Client:
        log = (self.workdir / f"client-{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "faults.client", "--workdir", str(self.workdir), "--store", self.store.url,
             "--seed", str(self.seed), "--name", name, *roles],
            stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
        log.close()
        client = Client(name, roles, process)
        with self.lock:
            self.clients.append(client)
        self.events.event("spawn", name=name, pid=process.pid, roles=roles)
        return client

    def start_clients(self) -> None:
        roles = [f"honest:{('sync', 'async')[i % 2]}:c{i + 1}" for i in range(self.honest)]
        roles += [f"attacker:{('async', 'sync')[i % 2]}:a{i + 1}" for i in range(self.attackers)]
        if self.store.one_process:
            self.spawn("all", roles)
        else:
            for role in roles:
                self.spawn(role.rsplit(":", 1)[1], [role])

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until every client process has started (imports done, store built): the run's time 0."""
        names = {c.name for c in self.clients}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = {r.get("name") for r in read(self.workdir / "history.jsonl") if r.get("kind") == "ready"}
            if names <= ready:
                return
            if any(c.process.poll() is not None for c in self.clients):
                raise RuntimeError(f"a client process exited at start: see {self.workdir}/client-*.log")
            time.sleep(0.2)
        raise RuntimeError(f"client processes not ready after {timeout:.0f} s (logs: {self.workdir})")

    def live_clients(self) -> list[Client]:
        with self.lock:
            return [c for c in self.clients if c.process.poll() is None]

    # ------------------------------------------------------------------ client faults
    def fault_kill_client(self, rng: random.Random, duration: float) -> None:
        """SIGKILL a client process mid-consume; a fresh one takes its roles.

        The victim is stopped (SIGSTOP) and killed if its last line in the history is an
        ``invoke`` (a consume in flight), else let run a few milliseconds and tried again
        (at most 50 times; then killed wherever it is).
        """
        live = self.live_clients()
        if not live or self.store.one_process:
            return
        victim = rng.choice(live)
        for _ in range(50):
            signal_pid(victim.process.pid, signal.SIGSTOP)
            if self.in_flight(victim.process.pid):
                break
            signal_pid(victim.process.pid, signal.SIGCONT)
            time.sleep(rng.uniform(0.001, 0.01))
        self.events.event("kill", pid=victim.process.pid, name=victim.name)
        victim.process.kill()
        victim.process.wait()
        time.sleep(min(duration, 1.0))
        self.generation += 1
        roles = [r.rsplit(":", 1)[0] + f":{r.rsplit(':', 1)[1]}g{self.generation}" for r in victim.roles]
        self.spawn(f"{victim.name}g{self.generation}", roles)

    def in_flight(self, pid: int) -> bool:
        """Whether the last line ``pid`` wrote to the history (in its last 512 KiB) is an invoke."""
        with (self.workdir / "history.jsonl").open("rb") as history:
            history.seek(0, 2)
            history.seek(max(0, history.tell() - 512 * 1024))
            tail = history.read().split(b"\n")
        mark = f'"process":{pid},'.encode()
        last = next((line for line in reversed(tail) if mark in line), b"")
        return b'"type":"invoke"' in last

    def fault_pause_client(self, rng: random.Random, duration: float) -> None:
        """SIGSTOP a client process (holding whatever it held: a connection, SQLite's write lock)."""
        live = self.live_clients()
        if live:
            pid = rng.choice(live).process.pid
            self.events.event("pause", pid=pid)
            self.store.pause([pid], duration)
            self.events.event("resume", pid=pid)

    def fault_clock(self, rng: random.Random, duration: float) -> None:
        """Jump one client process's codec clock by up to max_skew, either way, then back."""
        live = self.live_clients()
        if not live:
            return
        clock = self.workdir / "clock" / rng.choice(live).name
        jump = rng.choice((-1, 1)) * rng.uniform(1, MAX_CLOCK_JUMP)
        clock.write_text(f"{jump:.3f}")
        time.sleep(duration)
        clock.write_text("0")

    # ------------------------------------------------------------------ nemesis
    def inject(self, fault: Fault, started: float) -> None:
        time.sleep(max(0.0, started + fault.at - time.monotonic()))
        target = self if fault.kind in CLIENT_FAULTS else self.store
        rng = random.Random(f"{self.seed}:{fault.at}:{fault.kind}")
        self.events.event("fault", fault=fault.kind, phase="start", duration=fault.duration)
        try:
            getattr(target, f"fault_{fault.kind}")(rng, fault.duration)
        except Exception as exc:  # a fault that could not be injected is reported, the run goes on
            self.events.event("fault_error", fault=fault.kind, error=f"{type(exc).__name__}: {exc}")
        self.events.event("fault", fault=fault.kind, phase="end")

    def stop_clients(self, timeout: float) -> None:
        (self.workdir / "stop").touch()
        deadline = time.monotonic() + timeout
        for client in list(self.clients):
            with contextlib.suppress(subprocess.TimeoutExpired):
                client.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            if client.process.poll() is None:
                signal_pid(client.process.pid, signal.SIGCONT)
                self.events.event("kill", pid=client.process.pid, name=client.name, why="did not stop")
                client.process.kill()
                client.process.wait()


def refuse_unknown(store_name: str, fault_kinds: list[str], pg_standby: str) -> list[str]:
    """The fault kinds as method names; exits naming what the store has when it lacks one asked for."""
    if pg_standby != "sync" and store_name != "postgres":
        raise SystemExit(f"--pg-standby {pg_standby} is a setting of the postgres store, not of {store_name}")
    kinds = [k.replace("-", "_") for k in fault_kinds]
    known = (*CLIENT_FAULTS, *STORES[store_name].faults())
    unknown = [k for k in kinds if k not in known]
    if unknown:
        wrong, has = (",".join(k.replace("_", "-") for k in names) for names in (unknown, known))
        raise SystemExit(f"store {store_name} has no fault {wrong}; its faults: {has}")
    return kinds


#: After the faults, the workload goes on until this many redemptions were accepted in the
#: whole run (or RECOVERY_SECONDS pass): a schedule whose faults leave the store failing
#: closed to its last second (a quorum split right before the end, on a loaded machine)
#: still shows whether the store comes back, rather than a run that says nothing.
RECOVERED_AT = 101
RECOVERY_SECONDS = 90.0


def recover(history: Path, events: HistoryWriter, accepted: int, timeout: float) -> None:
    """Let the clients go on, faults healed, until ``accepted`` redemptions are in the history."""
    deadline = time.monotonic() + timeout
    started = time.monotonic()
    while (count := history.read_bytes().count(b'"outcome":"accepted"')) < accepted:
        if time.monotonic() > deadline:
            events.event("note", what="not recovered", accepted=count, seconds=timeout)
            return
        time.sleep(0.5)
    if time.monotonic() - started > 0.5:
        events.event("note", what="recovered", accepted=count, seconds=round(time.monotonic() - started, 1))


def run(store_name: str, fault_kinds: list[str], seconds: float, seed: int, *, honest: int = 4,
        attackers: int = 2, wait: int | None = None, pg_standby: str = "sync", workdir: Path | None = None,
        history: Path | None = None, log: Callable[[str], None] = print) -> Verdict:  # fmt: skip
    """Run one seeded schedule against one store; the checker's verdict on its history."""
    kinds = refuse_unknown(store_name, fault_kinds, pg_standby)
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"statecodec-faults-{store_name}-{seed}-"))
    (workdir / "clock").mkdir(parents=True, exist_ok=True)
    (workdir / "keys.json").write_text(KeyRing.generate("faults").to_json())
    events = HistoryWriter(workdir / "history.jsonl")
    store = STORES[store_name](workdir, events, wait, pg_standby)
    plan = schedule(kinds, seconds, seed) if kinds else []
    events.event("run", store=store_name, faults=kinds, seconds=seconds, seed=seed, honest=honest,
                 attackers=attackers, wait=wait, pg_standby=pg_standby,
                 schedule=[f.__dict__ for f in plan])  # fmt: skip
    log(f"workdir {workdir}")
    for fault in plan:
        log(f"  scheduled {fault.describe()}")
    runner = Runner(store, workdir, seed, honest, attackers)
    try:
        store.start()
        log(f"store {store_name}: {store.url}")
        runner.start_clients()
        runner.wait_ready()
        started = time.monotonic()
        threads = [threading.Thread(target=runner.inject, args=(f, started), daemon=True) for f in plan]
        for thread in threads:
            thread.start()
        time.sleep(seconds)
        for thread in threads:
            thread.join(timeout=60)
        store.heal()
        recover(workdir / "history.jsonl", events, RECOVERED_AT, RECOVERY_SECONDS)
        runner.stop_clients(timeout=45)
    finally:
        # Whatever failed, no client or server outlives the run: a heal that fails must not
        # keep the stopped clients stopped and the servers running.
        (workdir / "stop").touch()
        try:
            store.heal()
        finally:
            for client in runner.clients:
                if client.process.poll() is None:
                    signal_pid(client.process.pid, signal.SIGCONT)
                    client.process.kill()
                    client.process.wait()
            store.cleanup()
            events.close()
    if history is not None:
        shutil.copyfile(workdir / "history.jsonl", history)
    verdict = check_file(workdir / "history.jsonl")
    (workdir / "verdict.json").write_text(verdict.to_json())
    log(json.dumps({"store": store_name, "faults": kinds, "seconds": seconds, "seed": seed}))
    return verdict
