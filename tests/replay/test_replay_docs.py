"""The custom-store example in docs/replay.md keeps the ReplayStore contract.

tests/docs/test_docs.py runs every block of the page; this runs the page too (so the example
is exactly what readers see) and then puts its ``SQLReplayStore`` through the contract
the built-in stores are held to: first use only, expiry, racing threads, fail-closed.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import statecodec as sc

DOC = Path(__file__).resolve().parents[2] / "docs" / "replay.md"


@pytest.fixture
def example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "docs_replay"}
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert any("class SQLReplayStore(ReplayStore)" in block for block in blocks)
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    return namespace


def test_the_example_store_is_a_replay_store(example: dict[str, Any], tmp_path: Path) -> None:
    store = example["SQLReplayStore"](lambda: sqlite3.connect(tmp_path / "c.db", timeout=5))
    assert isinstance(store, sc.ReplayStore)
    assert store.consume("k", 60) is True
    assert store.consume("k", 60) is False
    assert store.consume("other", 60) is True


def test_the_example_store_forgets_at_expiry_and_purges(example: dict[str, Any], tmp_path: Path) -> None:
    store = example["SQLReplayStore"](lambda: sqlite3.connect(tmp_path / "c.db", timeout=5))
    assert store.consume("short", 0.2) is True
    assert store.consume("long", 60) is True
    time.sleep(0.3)
    assert store.purge() == 1
    assert store.consume("short", 60) is True
    assert store.consume("long", 60) is False


def test_the_example_store_has_one_winner_among_racing_threads(
    example: dict[str, Any], tmp_path: Path
) -> None:
    store = example["SQLReplayStore"](lambda: sqlite3.connect(tmp_path / "c.db", timeout=10))
    codec = sc.StateCodec(sc.KeyRing.generate("k1"), replay=store)
    tokens = [codec.seal(b"t", None) for _ in range(5)]
    barrier = threading.Barrier(20)
    outcomes: list[str] = []

    def race() -> None:
        barrier.wait()
        for token in tokens:
            try:
                codec.unseal(token)
                outcomes.append("ok")
            except sc.InvalidState as exc:
                outcomes.append(exc.reason)

    threads = [threading.Thread(target=race) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("ok") == 5
    assert outcomes.count("replayed") == 95


async def test_the_example_store_works_with_aunseal(example: dict[str, Any], tmp_path: Path) -> None:
    store = example["SQLReplayStore"](lambda: sqlite3.connect(tmp_path / "c.db", timeout=5))
    codec = sc.StateCodec(sc.KeyRing.generate("k1"), replay=store)
    token = codec.seal(b"t", None)
    assert (await codec.aunseal(token)).payload == b"t"  # the default aconsume: a worker thread
    with pytest.raises(sc.InvalidState, match="replayed"):
        await codec.aunseal(token)


def test_the_example_store_fails_closed(example: dict[str, Any], tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    store = example["SQLReplayStore"](lambda: sqlite3.connect(db, timeout=0.1))
    codec = sc.StateCodec(sc.KeyRing.generate("k1"), replay=store)
    token = codec.seal(b"t", None)
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    with pytest.raises(sc.InvalidState) as info:
        codec.unseal(token)
    assert info.value.reason == "store_unavailable"
    assert "replay table unavailable" in info.value.detail
    blocker.execute("ROLLBACK")
    blocker.close()
    assert codec.unseal(token).payload == b"t"  # not consumed by the failed attempt
