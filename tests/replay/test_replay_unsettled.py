"""The take-back list every shared store keeps (statecodec.replay._unsettled)."""

from __future__ import annotations

import threading
import time

import pytest

from statecodec.replay._unsettled import Entry, Unsettled


def pairs(entries: list[Entry]) -> set[tuple[str, str]]:
    return {(e.key, e.nonce) for e in entries}


def test_an_empty_list_sends_nothing() -> None:
    unsettled = Unsettled()
    assert unsettled.pending(["k"]) == []
    assert unsettled.nonces("k") == []
    assert not unsettled.holds("k", "n")
    assert len(unsettled) == 0


def test_a_consume_takes_back_every_entry_of_its_key_and_the_oldest_others() -> None:
    unsettled = Unsettled()
    for i in range(5):
        unsettled.note(f"other{i}", "n", 60)
    unsettled.note("k", "a", 60)
    unsettled.note("k", "b", 60)

    assert pairs(unsettled.pending(["k"], spare=2)) == {
        ("other0", "n"),
        ("other1", "n"),
        ("k", "a"),
        ("k", "b"),
    }
    assert pairs(unsettled.pending(["k"], spare=0)) == {("k", "a"), ("k", "b")}
    assert pairs(unsettled.pending(["nothing"], spare=0)) == set()
    # Pending is not settled: everything is still listed.
    assert len(unsettled) == 7
    assert sorted(unsettled.nonces("k")) == ["a", "b"]
    assert unsettled.holds("k", "a") and not unsettled.holds("k", "c") and not unsettled.holds("x", "a")


def test_settled_entries_are_forgotten_and_the_others_stay() -> None:
    unsettled = Unsettled()
    unsettled.note("k", "a", 60)
    unsettled.note("k", "b", 60)
    unsettled.note("j", "c", 60)

    unsettled.settle([e for e in unsettled.pending(["k"], spare=0) if e.nonce == "a"])
    unsettled.settle([("j", "c")])

    assert unsettled.nonces("k") == ["b"]
    assert unsettled.nonces("j") == []
    assert len(unsettled) == 1
    unsettled.settle([("k", "b"), ("k", "b"), ("never", "listed")])  # idempotent
    assert len(unsettled) == 0


def test_an_entry_past_its_retention_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    unsettled = Unsettled()
    unsettled.note("short", "a", 1)
    unsettled.note("long", "b", 100)

    now[0] += 2  # the store has dropped "short" itself by now
    assert pairs(unsettled.pending([])) == {("long", "b")}
    assert unsettled.nonces("short") == []
    assert len(unsettled) == 1


def test_the_list_is_bounded_and_forgets_the_oldest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Unsettled, "LIMIT", 3)
    unsettled = Unsettled()
    for i in range(5):
        unsettled.note(f"k{i}", "n", 60)
    assert len(unsettled) == 3
    assert pairs(unsettled.pending([], spare=10)) == {("k2", "n"), ("k3", "n"), ("k4", "n")}


def test_noting_again_moves_the_entry_to_the_end_with_its_new_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    unsettled = Unsettled()
    unsettled.note("k", "a", 1)
    unsettled.note("j", "b", 5)
    unsettled.note("k", "a", 10)  # the same attempt's entry, listed again with a longer retention

    now[0] = 6  # "j" has expired; "k" was re-listed with 10 s, so it stays
    assert pairs(unsettled.pending([], spare=10)) == {("k", "a")}


def test_threads_noting_and_settling_at_once_leave_a_consistent_list() -> None:
    unsettled = Unsettled()

    def work(n: int) -> None:
        for i in range(2000):
            unsettled.note(f"k{i % 50}", f"{n}-{i}", 60)
            if i % 2:
                unsettled.settle([(f"k{i % 50}", f"{n}-{i}")])
            unsettled.pending([f"k{i % 50}"], spare=4)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    listed = unsettled.pending([f"k{i}" for i in range(50)], spare=0)
    assert len(listed) == len(unsettled) == 4 * 1000
    assert all(int(e.nonce.split("-")[1]) % 2 == 0 for e in listed)
