"""Emergency retire on file, KV v2 and transit sources while two services verify and mint.

Each scenario runs two real KeyManagers (background refresh, as in a deployment) over
the same source, and a traffic thread that mints on one service and verifies on the
other, both ways, as a load balancer spreads a multi-round-trip flow. The retire runs
with the rotation job's credentials (the shipped policies, for Vault). What must hold:

* every service stops accepting the retired keys within one refresh interval of the cut
  (plus the time one refresh takes on a loaded machine, REFRESH_SLACK);
* no other token fails, at any moment: not in the traffic, not tokens minted earlier
  with keys that stay;
* when the primary is retired, its successor mints on both services before the cut.

OpenBao is the real dev server (tests/fixtures_openbao.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures_openbao import OpenBao, load_policy, token_with, unique

from statecodec import InvalidState, Key, KeyRing, StateCodec
from statecodec.kms import (
    FileSource,
    KeyManager,
    KeySource,
    KeySourceError,
    RetirementReport,
    Timeline,
    retire,
    source_from_url,
)

TIMING = {
    "refresh_interval": 1.0,
    "jitter": 0.1,
    "max_skew": 0.5,
    "max_ttl": 30.0,
    "expiry_grace": 0.0,
    "staleness_limit": 3.0,
}
TL = Timeline(**TIMING)  # promotion delay 3 s; retiring the primary waits 3.5 s
#: One refresh on a loaded 2-core machine, on top of the refresh interval: the refresher
#: thread's wake-up and the load itself (a file read, or two calls to OpenBao).
REFRESH_SLACK = 1.0


def policy_token(server: OpenBao, file: str, name: str) -> str:
    return token_with(server, load_policy(server, file, name))


# ------------------------------------------------------------------ the deployment
@dataclass
class Verified:
    minter: str
    verifier: str
    kid: str | None
    at: float
    reason: str | None  # None: valid


class Service:
    """One instance: a KeyManager refreshing in the background, and a codec on it."""

    def __init__(self, name: str, source: KeySource) -> None:
        self.name = name
        self.manager = KeyManager(source, **TIMING).start()
        self.codec = StateCodec(self.manager, ttl=30)

    def verify(self, token: str) -> tuple[str | None, str | None]:
        try:
            return self.codec.unseal(token).kid, None
        except InvalidState as exc:
            return exc.kid, exc.reason


class Traffic(threading.Thread):
    """Mints on each service and verifies on the other, until stopped."""

    def __init__(self, a: Service, b: Service) -> None:
        super().__init__(name="traffic", daemon=True)
        self.services = (a, b)
        self.results: list[Verified] = []
        self.minted: list[str] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        a, b = self.services
        try:
            while not self.halt.is_set():
                for minter, verifier in ((a, b), (b, a)):
                    token = minter.codec.seal(b'{"step": 2}')
                    kid, reason = verifier.verify(token)
                    self.results.append(Verified(minter.name, verifier.name, kid, time.time(), reason))
                    self.minted.append(token)
                self.halt.wait(0.005)  # pacing: a few hundred flows a second is plenty
        except BaseException as exc:  # surfaced by the test, never swallowed
            self.error = exc

    def count(self) -> int:
        return len(self.results)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def deployment() -> Iterator[Callable[[Callable[[], KeySource]], tuple[Service, Service, Traffic]]]:
    started: list[tuple[Service, Service, Traffic]] = []

    def start(make_source: Callable[[], KeySource]) -> tuple[Service, Service, Traffic]:
        a, b = Service("A", make_source()), Service("B", make_source())
        traffic = Traffic(a, b)
        started.append((a, b, traffic))
        traffic.start()
        wait_for(lambda: traffic.count() >= 20, 30, "the first flows")
        return a, b, traffic

    yield start
    for a, b, traffic in started:
        traffic.halt.set()
        traffic.join(timeout=30)
        a.manager.stop()
        b.manager.stop()


def retire_during_traffic(
    a: Service, b: Service, traffic: Traffic, source: KeySource, kid: str, earlier: list[str]
) -> RetirementReport:
    """Retire ``kid`` while the traffic runs; check every promise; return the report."""
    report = retire(source, kid, timeline=TL)
    assert report.cut_at is not None and report.changed
    gone = set(report.retired)

    # Every service drops the retired keys within one refresh interval of the cut.
    dropped: dict[str, float] = {}

    def both_dropped() -> bool:
        for service in (a, b):
            if service.name not in dropped and not gone & set(service.manager.keyring().kids):
                dropped[service.name] = time.time()
        return len(dropped) == 2

    wait_for(both_dropped, TL.max_refresh_gap + REFRESH_SLACK + 10, "both services to drop the keys")
    for name, at in dropped.items():
        assert at - report.cut_at <= TL.max_refresh_gap + REFRESH_SLACK, (name, at - report.cut_at)

    # Traffic keeps flowing on the successor for a while after both dropped the keys.
    settled = traffic.count()
    wait_for(lambda: traffic.count() >= settled + 40, 30, "traffic after the cut")
    traffic.halt.set()
    traffic.join(timeout=30)
    assert traffic.error is None, traffic.error

    # No token failed in the traffic, before, during or after the cut.
    failed = [r for r in traffic.results if r.reason is not None]
    assert not failed, failed[:5]
    used = {r.kid for r in traffic.results}
    assert report.successor in used or report.successor is None
    if report.primary in gone:
        assert report.primary in used, "the retired primary minted until its successor took over"
        assert traffic.results[-1].kid == report.successor

    # Afterwards, on both services: tokens of the retired keys are refused as unknown,
    # every other token minted at any time still verifies.
    for token in [*earlier, *traffic.minted]:
        for service in (a, b):
            kid, reason = service.verify(token)
            if kid in gone:
                assert reason == "unknown_key", (service.name, kid, reason)
            else:
                assert reason is None, (service.name, kid, reason)
    for service in (a, b):
        assert service.codec.unseal(service.codec.seal(b"after")).kid not in gone
    return report


def two_key_ring(now: float) -> tuple[KeyRing, list[str]]:
    """Ring: "a" replaced 10 s ago (verify-only), "b" the primary; tokens minted with "a" before."""
    a = Key.generate("a", created_at=int(now) - 20)
    b = Key.generate("b", created_at=int(now) - 10)
    ring = KeyRing([a, b], "b")
    assert TL.plan(ring, now).ring.primary_kid == "b"
    by_a = StateCodec(KeyRing([a], "a"), ttl=30)
    return ring, [by_a.seal(b"minted with a, when it was the primary") for _ in range(3)]


def ring_file(tmp_path: Path) -> tuple[Path, list[str]]:
    path = tmp_path / "ring.json"
    ring, earlier = two_key_ring(time.time())
    path.write_text(ring.to_json())
    path.chmod(0o600)
    return path, earlier


# ------------------------------------------------------------------------ sources
def test_retire_the_primary_of_a_key_file_while_two_services_run(
    tmp_path: Path, deployment: Callable[..., tuple[Service, Service, Traffic]]
) -> None:
    path, earlier = ring_file(tmp_path)
    a, b, traffic = deployment(lambda: FileSource(path))

    report = retire_during_traffic(a, b, traffic, FileSource(path), "b", earlier)
    assert report.retired == ("b",) and report.primary == "b" and report.new_key
    stored = KeyRing.from_json(path.read_text())
    # Cut once the successor was promoted (3 s after its creation) on every clock (+0.5 s).
    assert report.successor is not None and report.cut_at is not None
    assert report.cut_at >= stored.require(report.successor).created_at + TL.promotion_delay + TL.max_skew
    assert 0 < report.wait <= TL.promotion_delay + TL.max_skew
    assert set(stored.kids) == {"a", report.successor}  # exactly "b" left; "a" stays as it was
    assert stored.require("a").retires_at is None and stored.primary_kid == report.successor


def test_retire_a_verify_only_key_cuts_at_once(
    tmp_path: Path, deployment: Callable[..., tuple[Service, Service, Traffic]]
) -> None:
    path, earlier = ring_file(tmp_path)
    a, b, traffic = deployment(lambda: FileSource(path))
    started = time.time()
    report = retire_during_traffic(a, b, traffic, FileSource(path), "a", earlier)
    assert report.retired == ("a",) and report.primary == "b" and not report.new_key
    assert report.successor is None and report.wait == 0
    assert report.cut_at is not None and report.cut_at - started < 2  # no waiting for anyone
    assert KeyRing.from_json(path.read_text()).kids == ("b",)


def test_retire_the_primary_of_a_kv_ring_with_the_rotation_policy(
    vault_env: OpenBao, deployment: Callable[..., tuple[Service, Service, Traffic]]
) -> None:
    name = unique()
    url = f"vault-kv:secret/statecodec/{name}"
    ring, earlier = two_key_ring(time.time())
    vault_env.client().secrets.kv.v2.create_or_update_secret(f"statecodec/{name}", secret=ring.to_dict())
    job = policy_token(vault_env, "statecodec-rotate-kv.hcl", name)
    a, b, traffic = deployment(lambda: source_from_url(url))

    report = retire_during_traffic(a, b, traffic, source_from_url(url, token=job), "b", earlier)
    assert report.retired == ("b",) and report.new_key
    assert set(source_from_url(url).load().kids) == {"a", report.successor}


def test_retire_on_transit_cuts_the_version_and_every_older_one(
    vault_env: OpenBao, deployment: Callable[..., tuple[Service, Service, Traffic]]
) -> None:
    """Transit can only cut from the bottom: retiring v2 retires v1 (the primary) as well, and says so."""
    name = unique()
    url = f"vault-transit:transit/{name}"
    root = vault_env.client()
    root.secrets.transit.create_key(name, key_type="chacha20-poly1305", exportable=True)
    root.secrets.transit.rotate_key(name)  # v1 mints until v2 is promoted (3 s), then v2
    job = policy_token(vault_env, "statecodec-rotate.hcl", name)
    a, b, traffic = deployment(lambda: source_from_url(url))
    v1, v2, v3 = (f"{name}-v{n}" for n in (1, 2, 3))

    plan = retire(source_from_url(url, token=job), v2, timeline=TL, dry_run=True)
    assert plan.retired == (v1, v2) and plan.primary in plan.retired and plan.new_key
    assert (
        f"transit retires {v2} by raising min_decryption_version, which cuts every older version: "
        f"the older version {v1} is retired with it" in plan.notes
    )
    assert f"would retire {v2} and {v1}" in str(plan)

    report = retire_during_traffic(a, b, traffic, source_from_url(url, token=job), v2, [])
    assert report.retired == (v1, v2) and report.successor == v3
    meta = root.secrets.transit.read_key(name)["data"]
    assert meta["min_decryption_version"] == 3 and meta["latest_version"] == 3


# ---------------------------------------------------------------------- the plan
def test_dry_run_changes_nothing_and_a_pending_key_takes_over(tmp_path: Path) -> None:
    now = time.time()
    path = tmp_path / "ring.json"
    b = Key.generate("b", created_at=int(now) - 100)
    c = Key.generate("c", created_at=int(now) - 1)  # published a second ago: pending
    path.write_text(KeyRing([b, c], "b").to_json())
    before = path.read_text()
    plan = retire(f"file:{path}", "b", timeline=TL, dry_run=True)
    assert plan.dry_run and not plan.changed and plan.cut_at is None
    assert plan.primary == "b" and plan.successor == "c" and not plan.new_key
    # c is promoted at its creation + 3 s; the cut waits for every clock to agree (+0.5 s).
    assert 0 < plan.wait <= c.created_at + 3.5 - now
    assert "b mints now: first c would take over, once every instance mints with it" in str(plan)
    assert path.read_text() == before


def test_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ring.json"
    path.write_text(
        KeyRing([Key.generate("a", created_at=0), Key.generate("b", created_at=1)], "b").to_json()
    )
    with pytest.raises(KeySourceError, match=r"no key nope \(keys: a, b\); nothing retired") as info:
        retire(f"file:{path}", "nope", timeline=TL)
    assert info.value.kind == "missing"
    with pytest.raises(KeySourceError, match="the keys changed since the plan was shown") as info:
        retire(f"file:{path}", "a", timeline=TL, expect=["b"])
    assert info.value.kind == "conflict" and len(KeyRing.from_json(path.read_text())) == 2
    monkeypatch.setenv("RING", KeyRing.generate("e").to_json())
    with pytest.raises(KeySourceError, match="cannot retire keys it does not store") as info:
        retire("env:RING", "e", timeline=TL)
    assert info.value.kind == "unsupported"


def test_a_change_during_the_wait_stops_the_cut(tmp_path: Path) -> None:
    """If the successor vanishes while waiting (an operator, a restore), the primary is not cut."""
    path = tmp_path / "ring.json"
    path.write_text(KeyRing([Key.generate("b", created_at=int(time.time()) - 100)], "b").to_json())
    progress: list[str] = []

    def meanwhile(seconds: float) -> None:
        ring = KeyRing.from_json(path.read_text())
        path.write_text(KeyRing([ring.require("b")], "b").to_json())  # the new key is gone again
        time.sleep(seconds)

    with pytest.raises(KeySourceError, match="the keys changed while waiting") as info:
        retire(f"file:{path}", "b", timeline=TL, sleep=meanwhile, progress=progress.append)
    assert info.value.kind == "conflict"
    assert KeyRing.from_json(path.read_text()).kids == ("b",)
    assert len(progress) == 1 and "until every instance mints with" in progress[0]


def test_transit_hmac_keys_cannot_be_planned(vault_env: OpenBao) -> None:
    name = unique()
    vault_env.client().adapter.post(
        f"/v1/transit/keys/{name}", json={"type": "hmac", "key_size": 32, "exportable": True}
    )
    with pytest.raises(KeySourceError, match="record no creation times") as info:
        retire(f"vault-transit:transit/{name}", f"{name}-v1", timeline=TL, dry_run=True)
    assert info.value.kind == "unsupported"


def test_retire_now_cuts_the_primary_at_once_and_the_plan_says_what_fails(tmp_path: Path) -> None:
    # After a leak the wait for the successor (promotion delay + skew) is exposure: --now
    # cuts at once. The successor is still made; tokens minted with the key fail at once.
    path = tmp_path / "ring.json"
    now = time.time()
    a, b = Key.generate("a", created_at=int(now) - 200), Key.generate("b", created_at=int(now) - 100)
    path.write_text(KeyRing([a, b], "b").to_json())
    manager = KeyManager(FileSource(path), **TIMING)
    manager.start()
    try:
        codec = StateCodec(manager)
        leaked = codec.seal(b"minted with b", None)
        assert codec.unseal(leaked, None).kid == "b"
        plan = retire(f"file:{path}", "b", timeline=TL, dry_run=True, at_once=True)
        assert plan.at_once and plan.wait == 0 and plan.new_key
        assert 0 < plan.successor_in <= TL.promotion_delay + TL.max_skew
        text = str(plan)
        assert "cut at once (--now)" in text and "honest rounds minted with b meanwhile fail" in text

        def no_waiting(seconds: float) -> None:
            raise AssertionError(f"--now must not wait ({seconds}s)")

        started = time.time()
        report = retire(f"file:{path}", "b", timeline=TL, at_once=True, sleep=no_waiting)
        assert report.at_once and report.cut_at is not None and report.cut_at - started < 2
        assert report.wait == 0 and report.successor is not None
        stored = KeyRing.from_json(path.read_text())
        assert set(stored.kids) == {"a", report.successor}
        deadline = time.monotonic() + TL.max_refresh_gap + REFRESH_SLACK
        while True:  # every service drops it at its next refresh
            try:
                codec.unseal(leaked, None)
            except InvalidState as exc:
                assert exc.reason == "unknown_key"
                break
            assert time.monotonic() < deadline, "the retired key still verifies"
            time.sleep(0.05)
    finally:
        manager.stop()
