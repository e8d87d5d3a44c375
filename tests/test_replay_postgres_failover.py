"""Exactly once across a PostgreSQL failover: a real primary, a real synchronous streaming standby.

The standby is made with ``pg_basebackup -R``; once the roles and the table exist, the
primary gets ``synchronous_standby_names = '*'`` (with ``synchronous_commit = on``), so a
commit is acknowledged only once the standby has flushed it. Clients redeem fresh tokens
through a multi-host URL (``host=primary,standby`` and ``target_session_attrs=read-write``)
and retry every token that failed closed. The primary is SIGKILLed mid-traffic and the
standby promoted with ``pg_ctl promote``: libpq then finds the new primary by itself.

Every token is accepted exactly once, before or after the switch: none twice (no double
acceptance), none never (nothing burnt by a failed call), and every token accepted by the
old primary is refused as replayed by the new one.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from fixtures_postgres import APP_PASSWORD, APP_USER, DATABASE, PostgresServer, running, wait_until

import statecodec as sc
from statecodec.replay import store_from_url

pytestmark = pytest.mark.slow

RING = sc.KeyRing.generate("k1")
BINDING = sc.Binding(principal="alice", audience="svc", method="tools/call", target="pay")
BOUND = 120.0


@pytest.fixture
def pair() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    with running(PostgresServer) as primary:
        primary.create_app()
        standby = primary.standby()
        try:
            # Only now: with a synchronous standby named, CREATE ROLE would have waited for it too.
            primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.sql("SELECT pg_reload_conf()")
            wait_until(
                lambda: primary.sql("SELECT sync_state FROM pg_stat_replication") == [("sync",)],
                "the standby is synchronous",
            )
            yield primary, standby
        finally:
            standby.cleanup()


def multi_host_url(primary: PostgresServer, standby: PostgresServer, table: str) -> str:
    from urllib.parse import quote  # noqa: PLC0415

    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    return (
        f"postgresql://{APP_USER}:{quote(APP_PASSWORD, safe='')}@{hosts}"
        f"/{DATABASE}?target_session_attrs=read-write&connect_timeout=2&timeout=1&table={table}"
    )


class Traffic:
    """Sync clients in threads and async ones on a loop, each failed-closed token retried later."""

    def __init__(self, codec: sc.StateCodec, threads: int = 3, tasks: int = 3) -> None:
        self.codec = codec
        self.outcomes: dict[str, list[str]] = {}
        self._retry: collections.deque[str] = collections.deque()
        self._in_flight = 0
        self._lock = threading.Lock()
        self._producing = True
        self._stop = threading.Event()
        self._workers = [threading.Thread(target=self._sync_client) for _ in range(threads)]
        self._workers.append(threading.Thread(target=asyncio.run, args=(self._async_clients(tasks),)))
        for worker in self._workers:
            worker.start()

    def count(self, outcome: str) -> int:
        with self._lock:
            return sum(o.count(outcome) for o in self.outcomes.values())

    def accepted(self) -> list[str]:
        with self._lock:
            return [token for token, outcomes in self.outcomes.items() if "ok" in outcomes]

    def finish(self) -> None:
        with self._lock:
            self._producing = False

        def settled() -> bool:
            with self._lock:
                return not self._retry and not self._in_flight

        try:
            wait_until(settled, "every token that failed closed is accepted", BOUND)
        finally:
            self._stop.set()
            for worker in self._workers:
                worker.join(timeout=BOUND)

    def _next(self) -> str | None:
        with self._lock:
            if self._retry:
                self._in_flight += 1
                return self._retry.popleft()
            if not self._producing:
                return None
            token = self.codec.seal(uuid.uuid4().bytes, BINDING)
            self.outcomes[token] = []
            self._in_flight += 1
            return token

    def _record(self, token: str, outcome: str) -> None:
        with self._lock:
            self._in_flight -= 1
            self.outcomes[token].append(outcome)
            if outcome == "store_unavailable":
                self._retry.append(token)

    def _sync_client(self) -> None:
        while not self._stop.is_set():
            token = self._next()
            if token is None:
                time.sleep(0.01)
                continue
            try:
                self.codec.unseal(token, BINDING)
                outcome = "ok"
            except sc.InvalidState as exc:
                outcome = exc.reason
            self._record(token, outcome)
            if outcome == "store_unavailable":
                time.sleep(0.05)

    async def _async_clients(self, tasks: int) -> None:
        async def client() -> None:
            while not self._stop.is_set():
                token = self._next()
                if token is None:
                    await asyncio.sleep(0.01)
                    continue
                try:
                    await self.codec.aunseal(token, BINDING)
                    outcome = "ok"
                except sc.InvalidState as exc:
                    outcome = exc.reason
                self._record(token, outcome)
                if outcome == "store_unavailable":
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(client() for _ in range(tasks)))
        assert self.codec.replay is not None
        await self.codec.replay.aclose()


def test_kill_the_primary_promote_the_standby_zero_double_acceptances(
    pair: tuple[PostgresServer, PostgresServer],
) -> None:
    primary, standby = pair
    table = f"t_{uuid.uuid4().hex[:12]}"
    url = multi_host_url(primary, standby, table)
    store = store_from_url(url)
    store.check()  # creates the table on the primary (and so, synchronously, on the standby)
    traffic = Traffic(sc.StateCodec(RING, replay=store))
    try:
        wait_until(lambda: traffic.count("ok") >= 100, "tokens are redeemed on the primary", BOUND)
        before_kill = set(traffic.accepted())
        primary.kill()  # SIGKILL by PID, mid-traffic: acknowledged commits are on the standby
        wait_until(lambda: traffic.count("store_unavailable") >= 5, "clients fail closed", BOUND)
        standby.promote()
        at_promotion = traffic.count("ok")
        wait_until(lambda: traffic.count("ok") >= at_promotion + 100, "the new primary serves", BOUND)
    finally:
        traffic.finish()
    store.close()

    doubles = {t: o for t, o in traffic.outcomes.items() if o.count("ok") > 1}
    assert doubles == {}  # 0 double acceptances
    burnt = {t: o for t, o in traffic.outcomes.items() if o.count("ok") != 1}
    assert burnt == {}  # every token accepted once: none lost to a call that failed closed
    for outcomes in traffic.outcomes.values():  # failed closed, then accepted; never "replayed"
        assert outcomes[-1] == "ok" and set(outcomes[:-1]) <= {"store_unavailable"}, outcomes
    assert traffic.count("store_unavailable") >= 5  # the switch was crossed by the clients

    # The new primary knows every token the old one accepted: none redeems again.
    after = store_from_url(url)
    codec = sc.StateCodec(RING, replay=after)
    reasons = collections.Counter()
    for token in traffic.accepted():
        try:
            codec.unseal(token, BINDING)
            reasons["ok"] += 1
        except sc.InvalidState as exc:
            reasons[exc.reason] += 1
    after.close()
    assert reasons == {"replayed": len(traffic.outcomes)}
    assert len(before_kill) >= 100
    rows = standby.sql(f"SELECT count(*) FROM {table}", DATABASE)[0][0]
    assert rows == len(traffic.outcomes)
