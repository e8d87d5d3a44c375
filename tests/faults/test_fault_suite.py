"""A short seeded run of the fault suite per store, judged by its checker (faults/checker.py).

Everything is real: the servers on loopback, the client and attacker processes, the
SIGKILLs, SIGSTOPs, held connections and clock jumps (faults/). Each store runs once per
session (about 30 s of load, plus its start); two tests read the verdict:

- no token is ever accepted twice, on every store, under every fault: never expected to fail;
- no false replay and no burnt token (beyond a killed process's in-flight consumes). The
  replicated stores still answer an unconfirmed entry as ``replayed`` (Redis while WAIT is
  pending, PostgreSQL for a row a failed-closed insert left), so that test is expected to
  fail for them until each store tells a confirmed entry from an unconfirmed one; the
  counts measured when the marks were set are in the reasons (docs/guarantees.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_postgres import bin_dir

from faults.checker import Verdict
from faults.run import run

pytestmark = pytest.mark.slow

SECONDS = 30.0
# 30 s draw four faults: the replicated stores' seeds are ones whose draw holds a fault that
# moves the primary and one of the partitions only that store has (split-sentinels, partition-bus).
RUNS = {
    "memory": ("clock", 11),
    "sqlite": ("kill-client,pause-client,clock", 12),
    "sentinel": ("kill-primary,pause-primary,partition-clients,partition-replicas,isolate-primary,"
                 "takeback-failover,split-sentinels,kill-client,clock,server-clock", 39),
    "cluster": ("kill-primary,pause-primary,partition-clients,partition-replicas,partition-bus,"
                "isolate-primary,kill-client,clock", 40),
    "postgres": ("kill-primary,pause-primary,pause-standby,partition-clients,partition-replicas,"
                 "takeback-failover,kill-client,server-clock", 15),
}  # fmt: skip
UNCONFIRMED_ENTRIES = (
    "an undecided entry is store_unavailable only within the store's settle window: a writer "
    "stopped or cut off for longer (or whose take-back cannot reach the promoted primary) leaves "
    "an entry that then reads as settled (docs/guarantees.md, finding 2); measured: {}"
)
FALSE_REPLAYS_TODAY = {  # this file's seeds, runs on a loaded 2-core machine
    "sentinel": "seed 39: 3 burnt tokens (no false replay to an honest client) in each of three "
    "runs before the Redis store's take-back timer, clean in one run after it",
    "cluster": "seed 40: clean in six runs since Redis tells an unsettled entry",
    "postgres": "seed 15: 0-3 false replays and 0-2 burnt tokens in five runs before PostgreSQL "
    "told an unsettled row, clean in one run after",
}

_verdicts: dict[str, Verdict] = {}


def verdict_of(store: str, tmp_path_factory: pytest.TempPathFactory) -> Verdict:
    """The verdict of this session's run against ``store`` (run on first use)."""
    if store == "postgres" and bin_dir() is None:
        pytest.skip("PostgreSQL 15 server binaries not found: apt-get install postgresql-15")
    if store not in _verdicts:
        faults, seed = RUNS[store]
        workdir: Path = tmp_path_factory.mktemp(f"faults-{store}")
        _verdicts[store] = run(store, faults.split(","), SECONDS, seed, workdir=workdir)
        print(_verdicts[store].summary())
    return _verdicts[store]


@pytest.mark.parametrize("store", list(RUNS))
def test_no_token_is_accepted_twice(store: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    verdict = verdict_of(store, tmp_path_factory)
    assert verdict.accepted_twice == [], verdict.summary()
    assert verdict.lost_without_kill == 0, verdict.summary()
    assert verdict.outcomes.get("accepted", 0) > 100, "the workload barely ran:\n" + verdict.summary()
    assert verdict.fault_errors == [], verdict.summary()


@pytest.mark.parametrize(
    "store",
    [
        store
        if store not in FALSE_REPLAYS_TODAY
        else pytest.param(store, marks=pytest.mark.xfail(
            strict=False, reason=UNCONFIRMED_ENTRIES.format(FALSE_REPLAYS_TODAY[store])))
        for store in RUNS
    ],
)  # fmt: skip
def test_no_false_replay_and_no_burnt_token(store: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    verdict = verdict_of(store, tmp_path_factory)
    assert verdict.false_replays == [], verdict.summary()
    assert verdict.burnt == [], verdict.summary()
