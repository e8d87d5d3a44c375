"""The fault suite's checker on small hand-written histories: each anomaly found, each clean case clean.

The checker reads nothing but the history, so these histories are the whole input: no
store and no process is involved.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from faults.checker import check

ROOT = Path(__file__).resolve().parents[2]


def attempt(token: str, start: float, end: float, outcome: str, *, role: str = "honest",
            client: str = "c1", process: int = 100, reason: str = "") -> dict[str, Any]:  # fmt: skip
    return {"type": "attempt", "token": token, "client": client, "role": role, "api": "sync",
            "process": process, "start": start, "end": end, "outcome": outcome, "reason": reason}  # fmt: skip


def invoke(token: str, start: float, *, client: str = "c1", process: int = 100) -> dict[str, Any]:
    return {"type": "invoke", "token": token, "client": client, "role": "honest", "process": process,
            "start": start}  # fmt: skip


def kill(pid: int) -> dict[str, Any]:
    return {"type": "event", "kind": "kill", "pid": pid, "at": 0.0}


def test_a_clean_history_is_clean() -> None:
    verdict = check([
        invoke("t1", 1.0), attempt("t1", 1.0, 1.1, "accepted"),
        attempt("t1", 1.05, 1.2, "replayed", role="attacker", client="a1", process=200),
        attempt("t2", 2.0, 4.0, "store_unavailable"), attempt("t2", 4.5, 4.6, "accepted"),
        attempt("t2", 5.0, 5.1, "replayed", role="attacker", client="a1", process=200),
    ])  # fmt: skip
    assert verdict.broken() == []
    assert verdict.attempts == 5 and verdict.tokens == 2
    assert verdict.failed_closed == 1 and verdict.fail_closed_latency["max"] == 2.0


def test_a_token_accepted_twice_is_broken() -> None:
    verdict = check([attempt("t1", 1.0, 1.1, "accepted"),
                     attempt("t1", 2.0, 2.1, "accepted", role="attacker", client="a1")])  # fmt: skip
    assert verdict.accepted_twice == ["t1"]
    assert "accepted twice" in verdict.broken()[0]


def test_an_attacker_winning_the_race_is_no_false_replay() -> None:
    """The attacker's accepted attempt started before the honest one ended: it may have come first."""
    verdict = check([attempt("t1", 1.0, 1.5, "replayed"),
                     attempt("t1", 1.4, 1.6, "accepted", role="attacker", client="a1")])  # fmt: skip
    assert verdict.broken() == []


def test_replayed_before_any_acceptance_started_is_a_false_replay() -> None:
    verdict = check([attempt("t1", 1.0, 1.5, "replayed"),
                     attempt("t1", 1.5, 1.6, "accepted", role="attacker", client="a1")])  # fmt: skip
    assert [f["token"] for f in verdict.false_replays] == ["t1"]
    assert verdict.burnt == []  # accepted later by someone: not burnt, but the honest flow was lost
    assert "false replay" in verdict.broken()[0]


def test_an_entry_left_by_a_failed_closed_call_excuses_nothing() -> None:
    """store_unavailable promises the token stays unconsumed: a replay after it is false, and burns it."""
    verdict = check([attempt("t1", 1.0, 3.0, "store_unavailable"), attempt("t1", 3.5, 3.6, "replayed")])
    assert len(verdict.false_replays) == 1
    assert verdict.burnt == ["t1"]


def test_a_false_replay_told_to_an_attacker_is_counted_apart() -> None:
    verdict = check([attempt("t1", 1.0, 1.1, "replayed", role="attacker", client="a1"),
                     attempt("t1", 1.2, 1.3, "accepted")])  # fmt: skip
    assert verdict.false_replays == [] and verdict.attacker_false_replays == 1
    assert verdict.broken() == []


def test_a_burnt_token_is_broken() -> None:
    verdict = check([attempt("t1", 1.0, 1.1, "replayed", role="attacker", client="a1"),
                     attempt("t1", 1.2, 1.3, "replayed")])  # fmt: skip
    assert verdict.burnt == ["t1"]
    assert any("burnt" in line for line in verdict.broken())


def test_a_consume_lost_with_its_killed_process_excuses_the_burn() -> None:
    verdict = check([
        invoke("t1", 1.0, process=100), kill(100),
        attempt("t1", 1.5, 1.6, "replayed", role="attacker", client="a1", process=200),
    ])  # fmt: skip
    assert verdict.burnt == [] and verdict.burnt_excused == ["t1"]
    assert verdict.lost_consumes == 1
    assert verdict.broken() == []


def test_a_lost_consume_excuses_only_replays_that_ended_after_it_started() -> None:
    verdict = check([
        attempt("t1", 0.5, 0.9, "replayed", client="c2", process=300),
        invoke("t1", 1.0, process=100), kill(100),
    ])  # fmt: skip
    assert len(verdict.false_replays) == 1


def test_a_consume_without_outcome_in_a_live_process_is_broken() -> None:
    verdict = check([invoke("t1", 1.0, process=100)])
    assert verdict.lost_without_kill == 1 and verdict.lost_consumes == 0
    assert verdict.broken()


def test_an_invoke_with_its_attempt_is_not_lost() -> None:
    verdict = check([invoke("t1", 1.0), kill(100), attempt("t1", 1.0, 1.2, "accepted")])
    assert verdict.lost_consumes == 0 and verdict.broken() == []


def test_other_errors_are_counted_by_reason() -> None:
    verdict = check([attempt("t1", 1.0, 1.1, "error", reason="expired"), attempt("t2", 1.0, 1.1, "accepted")])
    assert verdict.errors == {"expired": 1}
    assert verdict.never_resolved == 1
    assert verdict.broken() == []


def test_the_command_line_exits_1_on_a_broken_promise(tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    lines = [attempt("t1", 1.0, 1.1, "accepted"), attempt("t1", 2.0, 2.1, "accepted"), {"type": "att"}]
    history.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"cut short')
    done = subprocess.run([sys.executable, "-m", "faults", "check", str(history)],
                          capture_output=True, text=True, cwd=ROOT, check=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "accepted twice: 1" in done.stdout and "VERDICT: BROKEN" in done.stdout
    history.write_text(json.dumps(attempt("t1", 1.0, 1.1, "accepted")) + "\n")
    done = subprocess.run([sys.executable, "-m", "faults", "check", str(history)],
                          capture_output=True, text=True, cwd=ROOT, check=False)  # fmt: skip
    assert done.returncode == 0 and "VERDICT: ok" in done.stdout


def test_the_time_a_client_spent_stopped_is_not_the_store_s_latency() -> None:
    paused = [{"type": "event", "kind": "pause", "pid": 100, "at": 1.5},
              {"type": "event", "kind": "resume", "pid": 100, "at": 6.0}]  # fmt: skip
    verdict = check([
        *paused,
        attempt("t1", 1.0, 7.0, "store_unavailable", process=100),
        attempt("t1", 1.0, 3.0, "store_unavailable", client="a1", role="attacker", process=200),
        attempt("t1", 8.0, 8.1, "accepted"),
    ])  # fmt: skip
    assert verdict.failed_closed == 2 and verdict.failed_closed_while_paused == 1
    assert verdict.fail_closed_latency["max"] == 2.0


def gave_up(token: str, at: float, *, client: str = "c1") -> dict[str, Any]:
    return {"type": "event", "kind": "gave_up", "token": token, "client": client, "pid": 100, "at": at}


def test_a_token_refused_as_unavailable_while_others_are_accepted_is_stuck() -> None:
    """Never accepted, never replayed, given up on while the store answered the others: stuck, not burnt."""
    verdict = check([
        attempt("t1", 1.0, 2.0, "store_unavailable"), attempt("t1", 20.0, 21.0, "store_unavailable"),
        attempt("t2", 25.0, 25.1, "accepted", client="c2", process=300),
        attempt("t1", 30.0, 31.0, "store_unavailable"), gave_up("t1", 31.0),
    ])  # fmt: skip
    assert verdict.stuck == ["t1"] and verdict.burnt == []
    assert verdict.broken() == []  # reported beside burnt, not a broken promise
    assert "stuck" in verdict.summary() and verdict.row().count("|") == 9


def test_a_token_given_up_on_while_the_store_was_down_is_not_stuck() -> None:
    """No other token accepted in the last seconds of retries: the store was out, not only for this token."""
    verdict = check([
        attempt("t2", 1.0, 1.1, "accepted", client="c2", process=300),
        attempt("t1", 2.0, 3.0, "store_unavailable"), attempt("t1", 30.0, 31.0, "store_unavailable"),
        gave_up("t1", 31.0),
    ])  # fmt: skip
    assert verdict.stuck == [] and verdict.never_resolved == 1


def test_a_token_whose_retries_the_run_ended_is_not_stuck() -> None:
    verdict = check([attempt("t1", 1.0, 2.0, "store_unavailable"),
                     attempt("t2", 2.5, 2.6, "accepted", client="c2", process=300)])  # fmt: skip
    assert verdict.stuck == []


def test_a_stuck_token_with_a_lost_consume_is_excused() -> None:
    verdict = check([
        invoke("t1", 0.5, client="a1", process=200), kill(200),
        attempt("t1", 1.0, 2.0, "store_unavailable"), attempt("t2", 20.0, 20.1, "accepted", client="c2"),
        attempt("t1", 25.0, 26.0, "store_unavailable"), gave_up("t1", 26.0),
    ])  # fmt: skip
    assert verdict.stuck == [] and verdict.stuck_excused == ["t1"]
