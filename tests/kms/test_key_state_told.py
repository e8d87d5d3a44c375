"""Key state told the same way everywhere: ``keys list``, the start-up log, rotate and retire.

What ``keys list`` calls primary is what a service mints with now, and a pending key says
when it takes over; a service's first load says in one line which key mints now and which
next; a successful retire is not a warning and its plan's wait is one the run keeps to;
a rotation run while the key of an earlier one is still pending adds no key and says so.
Real key files, real commands; the clock is pinned with ``--at`` or a fixed ``clock``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from statecodec import Key, KeyRing
from statecodec.cli import main
from statecodec.kms import FileSource, KeyManager, Timeline, rotate

T0 = 1_800_000_000
DAY = 86_400
TL = Timeline()  # D = ceil(66 + 60 + 1) = 127 s
FAST = ["--refresh-interval", "1s", "--max-skew", "0s", "--max-ttl", "10s", "--expiry-grace", "0s"]
FAST += ["--staleness-limit", "2s"]


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env={"NO_COLOR": "1", "STATECODEC_KEYS": None})


def ring_file(tmp_path: Path, *keys: Key) -> str:
    path = tmp_path / "keys.json"
    path.write_text(KeyRing(list(keys), keys[-1].kid).to_json())
    path.chmod(0o600)
    return f"file:{path}"


def listed(spec: str, at: int) -> tuple[dict[str, Any], list[str]]:
    doc = json.loads(run("keys", "list", "--keys", spec, "--at", str(at), "--json").stdout)
    return doc, run("keys", "list", "--keys", spec, "--at", str(at)).stdout.splitlines()


def test_a_fresh_deployments_only_key_is_primary_and_mints_now(tmp_path: Path) -> None:
    spec = ring_file(tmp_path, Key.generate("first", created_at=T0))
    doc, lines = listed(spec, T0 + 5)
    (key,) = doc["keys"]
    assert doc["primary"] == "first" and key["state"] == "primary" and key["primary_from"] is None
    assert lines[0].startswith(f"{spec}: 1 key(s), minting with first, as of ")
    row = lines[2].split()
    assert row[:2] == ["first", "primary"] and row[3] == "now", lines
    # Its promotion lies ahead, but the table does not show a future time beside "primary".
    assert key["promotes_at"]["relative"].startswith("in ") and key["promotes_at"]["iso"] not in lines[2]


def test_a_pending_key_says_when_it_becomes_primary(tmp_path: Path) -> None:
    spec = ring_file(
        tmp_path, Key.generate("old", created_at=T0 - DAY), Key.generate("new", created_at=T0 - 7)
    )
    doc, lines = listed(spec, T0)
    by_kid = {k["kid"]: k for k in doc["keys"]}
    assert doc["primary"] == "old" and by_kid["new"]["state"] == "pending"
    takes_over = T0 - 7 + TL.promotion_delay
    assert by_kid["new"]["primary_from"]["unix"] == takes_over == by_kid["new"]["promotes_at"]["unix"]
    assert by_kid["old"]["primary_from"] is None
    (row,) = [line for line in lines if line.split()[0] == "new"]
    assert f"from {by_kid['new']['primary_from']['iso']} (in 2m)" in row
    # And it is what a service mints with, then.
    assert TL.plan(KeyRing.from_json(Path(spec[5:]).read_text()), takes_over).ring.primary_kid == "new"
    later, _ = listed(spec, takes_over)
    assert later["primary"] == "new"


def test_the_start_up_log_says_which_key_mints_now_and_which_next_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = ring_file(
        tmp_path, Key.generate("old", created_at=T0 - DAY), Key.generate("new", created_at=T0 - 7)
    )
    caplog.set_level(logging.DEBUG, logger="statecodec.kms")
    manager = KeyManager(FileSource(spec[5:]), clock=lambda: T0).start(background=False)
    manager.stop()
    (record,) = [r for r in caplog.records if r.name == "statecodec.kms"]
    assert record.getMessage() == (
        f"keys loaded from {spec} (old, new): minting with old now; new mints from "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(T0 - 7 + TL.promotion_delay))} (in 2m)"
    )
    assert record.event == "keys_loaded" and record.kid == "old"  # type: ignore[attr-defined]
    assert record.next_kid == "new" and record.next_primary_at == T0 - 7 + TL.promotion_delay  # type: ignore[attr-defined]


def test_a_fresh_deployments_start_up_line_does_not_contradict_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = ring_file(tmp_path, Key.generate("first", created_at=T0))
    caplog.set_level(logging.DEBUG, logger="statecodec.kms")
    manager = KeyManager(FileSource(spec[5:]), clock=lambda: T0 + 1).start(background=False)
    manager.stop()
    messages = [r.getMessage() for r in caplog.records if r.name == "statecodec.kms"]
    assert messages == [f"keys loaded from {spec} (first): minting with first now; no other key is pending"]


def test_a_key_published_later_says_when_it_mints(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = ring_file(tmp_path, Key.generate("old", created_at=T0 - DAY))
    clock = [float(T0)]
    manager = KeyManager(FileSource(spec[5:]), clock=lambda: clock[0]).start(background=False)
    rotate(spec, min_age=0, retire_after=TL.min_retire_after, clock=lambda: T0)
    caplog.set_level(logging.DEBUG, logger="statecodec.kms")
    manager.refresh_now()
    (new,) = [k for k in manager.keyring().kids if k != "old"]
    (published,) = [r.getMessage() for r in caplog.records]
    assert published.startswith(f"key {new} published by {spec}: verifies now, mints from ")
    assert published.endswith("(in 2m07s)")
    caplog.clear()
    clock[0] = T0 + TL.promotion_delay
    assert manager.signing_key().kid == new
    assert [r.getMessage() for r in caplog.records] == [f"minting with key {new} (was old)"]
    manager.stop()


def test_rotate_adds_no_key_while_an_earlier_rotation_is_pending(tmp_path: Path) -> None:
    spec = ring_file(tmp_path, Key.generate("old", created_at=int(time.time()) - DAY))
    args = ["keys", "rotate", "--keys", spec, "--min-age", "0s", "--retire-after", "2h"]
    first = run(*args)
    assert first.exit_code == 0 and "create" in first.stdout, first.output
    kids = KeyRing.from_json(Path(spec[5:]).read_text()).kids
    (new,) = [k for k in kids if k != "old"]

    again = run(*args)
    assert again.exit_code == 0, again.output
    assert "  no new key (see the note)" in again.stdout
    (note,) = [line for line in again.stdout.splitlines() if line.startswith("  note: ")]
    assert note.startswith(f"  note: no new key: {new}, made by an earlier rotation ")
    assert re.search(r"is still pending and becomes primary at \S+Z \(in 2m\d\ds\)", note), note
    assert note.endswith("(--force adds one anyway)")
    assert KeyRing.from_json(Path(spec[5:]).read_text()).kids == kids  # nothing changed
    doc = json.loads(run(*args, "--json").stdout)
    assert not doc["rotated"] and not doc["changed"] and doc["notes"] == [note[8:]]

    forced = run(*args, "--force")
    assert forced.exit_code == 0 and "create" in forced.stdout, forced.output
    assert len(KeyRing.from_json(Path(spec[5:]).read_text()).kids) == 3


def test_a_scheduled_rotation_goes_on_once_the_key_is_primary(tmp_path: Path) -> None:
    spec = ring_file(tmp_path, Key.generate("old", created_at=T0 - DAY))
    rotate(spec, min_age=3600, retire_after=TL.min_retire_after, clock=lambda: T0)
    at = T0 + TL.promotion_delay
    report = rotate(spec, min_age=0, retire_after=TL.min_retire_after, clock=lambda: at)
    assert report.rotated


def test_a_successful_retire_is_not_a_warning(tmp_path: Path) -> None:
    now = int(time.time())
    spec = ring_file(
        tmp_path, Key.generate("old", created_at=now - DAY), Key.generate("cur", created_at=now - 3600)
    )
    done = run("keys", "retire", "old", "--keys", spec, "--yes")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"{spec}: retire old") and done.stderr == ""


def _seconds(text: str) -> float:
    return sum(
        float(n) * {"h": 3600, "m": 60, "s": 1}[unit] for n, unit in re.findall(r"([\d.]+)([hms])", text)
    )


def test_the_retire_plans_wait_is_the_most_the_run_waits(tmp_path: Path) -> None:
    spec = ring_file(tmp_path, Key.generate("leaked", created_at=int(time.time()) - DAY))
    plan = run("keys", "retire", "leaked", "--keys", spec, "--dry-run", *FAST)
    planned = re.search(r"\(a wait of at most (\S+)\)", plan.stdout)
    assert planned, plan.stdout
    done = run("keys", "retire", "leaked", "--keys", spec, "--yes", *FAST)
    assert done.exit_code == 0, done.output
    waited = re.search(r"statecodec: waiting (\S+) until every instance mints", done.stderr)
    assert waited, done.stderr
    assert 0 < _seconds(waited.group(1)) <= _seconds(planned.group(1))
    assert "warning" not in done.stderr
