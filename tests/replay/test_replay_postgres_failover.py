"""Exactly once across a PostgreSQL failover: a real primary, a real synchronous streaming standby.

The standby is made with ``pg_basebackup -R``; once the roles and the table exist, the
primary gets ``synchronous_standby_names = '*'`` (with ``synchronous_commit = on``), so a
commit is acknowledged only once the standby has flushed it. Clients redeem fresh tokens
through a multi-host URL (``host=primary,standby`` and ``target_session_attrs=read-write``)
and retry every token that failed closed. The primary is SIGKILLed mid-traffic and the
standby promoted with ``pg_ctl promote``: libpq then finds the new primary by itself.

Every token is accepted exactly once, before or after the switch: none twice (no double
acceptance), none never (nothing burnt by a failed call), and every token accepted by the
old primary is refused as replayed by the new one. A failed call's insert that commits
after the client's retry began (late work, a late commit) must not burn the token either:
the clients (tests/replay_traffic.py) retry at once, so their retries race both.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterator

import pytest
from fixtures_postgres import APP_PASSWORD, APP_USER, DATABASE, PostgresServer, synchronous_pair, wait_until
from replay_traffic import Pace, Traffic

import statecodec as sc
from statecodec.replay import PostgresReplayStore, store_from_url

pytestmark = pytest.mark.slow

RING = sc.KeyRing.generate("k1")
BINDING = sc.Binding(principal="alice", audience="svc", method="tools/call", target="pay")
BOUND = 120.0
#: A client retries a token that failed closed at once: its retry then races the failed
#: call's late work and late commits, the harshest case for the store's take-backs.
PACE = Pace()


@pytest.fixture
def pair() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    with synchronous_pair() as servers:
        yield servers


def multi_host_url(primary: PostgresServer, standby: PostgresServer, table: str) -> str:
    from urllib.parse import quote  # noqa: PLC0415

    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    return (
        f"postgresql://{APP_USER}:{quote(APP_PASSWORD, safe='')}@{hosts}"
        f"/{DATABASE}?target_session_attrs=read-write&connect_timeout=2&timeout=1&table={table}"
    )


def test_kill_the_primary_promote_the_standby_zero_double_acceptances(
    pair: tuple[PostgresServer, PostgresServer],
) -> None:
    primary, standby = pair
    table = f"t_{uuid.uuid4().hex[:12]}"
    url = multi_host_url(primary, standby, table)
    store = store_from_url(url)
    store.check()  # creates the table on the primary (and so, synchronously, on the standby)
    traffic = Traffic(sc.StateCodec(RING, replay=store), BINDING, pace=PACE, bound=BOUND)
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

    # The new primary knows every token the old one accepted: none redeems again. Asked by
    # another instance, once every row is older than the settle window (younger, a row of
    # someone else's is answered as possibly undecided: store_unavailable, retry).
    after = store_from_url(url)
    assert isinstance(after, PostgresReplayStore)
    youngest = f"SELECT min(extract(epoch FROM clock_timestamp() - written_at)) FROM {table}"
    wait_until(
        lambda: float(standby.sql(youngest, DATABASE)[0][0]) >= after._settle,
        "every row is older than the settle window",
    )
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
