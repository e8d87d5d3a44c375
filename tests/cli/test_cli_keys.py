"""`statecodec keys ...` through click's CliRunner, on real files, env vars and OpenBao.

The OpenBao test uses the real dev server from tests/fixtures_openbao.py; an unreachable
Vault is a loopback port where nothing listens.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result
from fixtures_openbao import OpenBao, clean_vault_env

from statecodec import Key, KeyRing
from statecodec.cli import main
from statecodec.cli._exit import ExitCode

ROOT = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "docs" / "cli-schema.json").read_text()))
T0 = 1_785_240_000  # 2026-07-28T12:00:00Z
# Settings from the developer's shell must not leak into the runs (None unsets).
CLEAN_ENV: dict[str, str | None] = {"STATECODEC_KEYS": None, "STATECODEC_DEBUG": None, "NO_COLOR": None}
DAY = 86400
POLICIES = ROOT / "docs" / "policies"
#: A services' timeline with a 3 s promotion delay, so retiring a primary waits seconds, not minutes.
FAST = ["--refresh-interval", "1s", "--max-skew", "0s", "--max-ttl", "10s", "--expiry-grace", "0s"]
FAST += ["--staleness-limit", "2s"]


def run(*args: str, env: dict[str, str | None] | None = None, answer: str | None = None) -> Result:
    result = CliRunner().invoke(main, list(args), env={**CLEAN_ENV, **(env or {})}, input=answer)
    assert "Traceback" not in result.output, result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {result.exception!r}: {result.output}")
    return result


def run_json(*args: str, env: dict[str, str | None] | None = None) -> dict[str, Any]:
    result = run(*args, "--json", env=env)
    doc = json.loads(result.stdout)
    VALIDATOR.validate(doc)
    assert doc["exit_code"] == result.exit_code
    return doc


def write_ring(path: Path, ring: KeyRing) -> str:
    path.write_text(ring.to_json())
    path.chmod(0o600)
    return f"file:{path}"


# ---------------------------------------------------------------- generate
def test_generate_prints_a_ring_that_loads() -> None:
    result = run("keys", "generate", "--kid", "first")
    assert result.exit_code == 0
    ring = KeyRing.from_json(result.stdout)
    assert ring.kids == ("first",) and ring.primary_kid == "first" and len(ring.primary.secret) == 32
    doc = run_json("keys", "generate")
    assert doc["path"] is None and KeyRing.from_dict(doc["keyring"]).primary_kid == doc["kid"]


def test_generate_writes_0600_and_never_overwrites_without_force(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    first = run_json("keys", "generate", "-o", str(path))
    assert first["ok"] and first["path"] == str(path) and "keyring" not in first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.read_text()
    assert KeyRing.from_json(before).primary_kid == first["kid"]

    refused = run("keys", "generate", "-o", str(path))
    assert refused.exit_code == ExitCode.IO
    assert (
        refused.stderr.strip()
        == f"statecodec: error: {path} exists; pass --force to replace it (its keys are lost)"
    )
    assert path.read_text() == before

    # --force replaces atomically, and a wider mode on the old file does not survive.
    path.chmod(0o644)
    forced = run_json("keys", "generate", "-o", str(path), "--force")
    assert forced["kid"] != first["kid"] and KeyRing.from_json(path.read_text()).primary_kid == forced["kid"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["keys.json"]  # no temporary file left behind


def test_generate_into_a_missing_directory_is_an_io_error(tmp_path: Path) -> None:
    doc = run_json("keys", "generate", "-o", str(tmp_path / "nope" / "keys.json"))
    assert doc["exit_code"] == ExitCode.IO and "No such file or directory" in doc["error"]["message"]


def _unreadable_key_paths(tmp_path: Path) -> dict[str, Path]:
    """Key paths that no retry can make readable (root reads a chmod-000 file, so not that)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("{}")
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    return {
        "a directory": tmp_path,
        "missing": tmp_path / "missing.json",
        "through a file": a_file / "keys.json",
        "a symlink loop": loop,
    }


@pytest.mark.parametrize("command", [["keys", "list"], ["verify", "sc1s.AAAA"]], ids=["keys-list", "verify"])
def test_a_key_file_that_is_a_directory_missing_or_unreadable_is_configuration(
    tmp_path: Path, command: list[str]
) -> None:
    # Exit 3 (fix the configuration), never 7 (unreachable, retry later): a scheduler would
    # retry a directory given as --keys forever.
    for what, path in _unreadable_key_paths(tmp_path).items():
        doc = run_json(*command, "--keys", f"file:{path}")
        assert doc["exit_code"] == ExitCode.KEYS, (what, doc)
        assert doc["error"]["message"].startswith(f"file:{path}: "), doc
    assert (
        "is a directory; give the path of the key file in it"
        in run_json(*command, "--keys", f"file:{tmp_path}")["error"]["message"]
    )


def test_a_read_a_retry_can_cure_is_key_source_down(tmp_path: Path) -> None:
    # The other side of the rule, on the same code path: an I/O error of a network file
    # system (EIO, ESTALE, ETIMEDOUT) is the source being down: exit 7. A real EIO cannot be
    # produced without a broken device or a FUSE mount, so the classification is checked.
    import errno  # noqa: PLC0415

    from statecodec.kms._local import _read_failure  # noqa: PLC0415

    for transient in (errno.EIO, errno.ESTALE, errno.ETIMEDOUT):
        assert _read_failure(OSError(transient, os.strerror(transient))) == "unreachable"
    for permanent in (errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG, errno.EISDIR, errno.EINVAL):
        assert _read_failure(OSError(permanent, os.strerror(permanent))) == "config"


def test_generate_rejects_a_bad_kid() -> None:
    result = run("keys", "generate", "--kid", "no spaces please")
    assert result.exit_code == ExitCode.USAGE and "invalid kid" in result.stderr


# -------------------------------------------------------------------- list
def test_list_shows_states_and_never_secrets(tmp_path: Path) -> None:
    old = Key.generate("old", created_at=T0 - 3 * DAY)
    current = Key.generate("current", created_at=T0 - 600)
    fresh = Key.generate("fresh", created_at=T0 - 30)
    gone = Key("gone", Key.generate(created_at=T0).secret, T0 - 9 * DAY, T0 - 5 * DAY)
    ring = KeyRing([gone, old, current, fresh], "current")
    spec = write_ring(tmp_path / "keys.json", ring)

    doc = run_json("keys", "list", "--keys", spec, "--at", str(T0))
    states = {k["kid"]: k["state"] for k in doc["keys"]}
    assert states == {"gone": "retired", "old": "verify-only", "current": "primary", "fresh": "pending"}
    assert doc["primary"] == "current"
    by_kid = {k["kid"]: k for k in doc["keys"]}
    promotion = doc["timeline"]["promotion_delay"]
    assert by_kid["fresh"]["promotes_at"]["unix"] == T0 - 30 + promotion
    assert by_kid["old"]["retires_at"]["unix"] == T0 - 600 + promotion + doc["timeline"]["retirement_margin"]

    out = run("keys", "list", "--keys", spec, "--at", str(T0)).stdout
    for key in ring.keys:
        assert key.secret.hex() not in out and KeyRing([key]).to_dict()["keys"][0]["secret"] not in out
    assert "minting with current" in out and "pending" in out and "retired" in out
    assert "secret" not in json.dumps(doc)


def test_list_timeline_options_move_the_promotion(tmp_path: Path) -> None:
    ring = KeyRing([Key.generate("a", created_at=T0 - DAY), Key.generate("b", created_at=T0 - 600)], "a")
    spec = write_ring(tmp_path / "keys.json", ring)
    default = run_json("keys", "list", "--keys", spec, "--at", str(T0))
    assert default["primary"] == "b"  # promoted after ~2 minutes with the default timeline
    slow = run_json(
        "keys", "list", "--keys", spec, "--at", str(T0), "--refresh-interval", "1h", "--staleness-limit", "2h"
    )
    assert slow["primary"] == "a" and {k["kid"]: k["state"] for k in slow["keys"]}["b"] == "pending"
    bad = run("keys", "list", "--keys", spec, "--refresh-interval", "1h")
    assert bad.exit_code == ExitCode.USAGE and "staleness_limit" in bad.stderr


def test_list_reads_env_specs_and_the_default_from_statecodec_keys() -> None:
    ring = KeyRing.generate("envkey", created_at=T0 - DAY)
    env = {"RING_JSON": ring.to_json(), "STATECODEC_KEYS": "env:RING_JSON"}
    doc = run_json("keys", "list", env=env)
    assert doc["source"] == "env:RING_JSON" and doc["primary"] == "envkey"


# -------------------------------------------------------------------- init
def test_init_creates_a_file_once(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    created = run_json("keys", "init", "--keys", f"file:{path}")
    assert created["ok"] and "created" in created["message"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.read_text()
    again = run_json("keys", "init", "--keys", f"file:{path}")
    assert again["ok"] and "already exists" in again["message"] and path.read_text() == before


def test_init_refuses_env_sources_with_the_fix() -> None:
    doc = run_json("keys", "init", "--keys", "env:ANYTHING")
    assert doc["exit_code"] == ExitCode.KEYS and "cannot create keys here" in doc["error"]["message"]


# ------------------------------------------------------------------ rotate
def test_rotate_dry_run_then_rotate_then_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    spec = write_ring(path, KeyRing.generate("k1", created_at=T0 - 2 * DAY))
    args = ["keys", "rotate", "--keys", spec, "--min-age", "24h", "--retire-after", "2h"]

    dry = run_json(*args, "--dry-run")
    assert dry["dry_run"] and dry["rotated"] and dry["changed"]
    assert KeyRing.from_json(path.read_text()).kids == ("k1",)  # nothing written
    assert "would create" in run(*args, "--dry-run").stdout

    done = run_json(*args)
    assert done["rotated"] and done["new_kid"] in KeyRing.from_json(path.read_text()).kids
    again = run_json(*args)
    assert again["ok"] and not again["rotated"] and not again["changed"]
    assert "no rotation needed" in run(*args).stdout


def test_rotate_refuses_a_retirement_shorter_than_the_timeline(tmp_path: Path) -> None:
    spec = write_ring(tmp_path / "keys.json", KeyRing.generate("k1", created_at=T0))
    result = run("keys", "rotate", "--keys", spec, "--min-age", "1h", "--retire-after", "10m")
    assert result.exit_code == ExitCode.KEYS
    assert result.stderr.startswith("statecodec: error: rotation refused: retire_after=10m is too short")


def test_rotate_options_are_required() -> None:
    result = run("keys", "rotate", "--keys", "file:x", "--min-age", "1h")
    assert result.exit_code == ExitCode.USAGE and "--retire-after" in result.stderr


def test_rotate_env_source_is_unsupported() -> None:
    env = {"R": KeyRing.generate().to_json()}
    doc = run_json("keys", "rotate", "--keys", "env:R", "--min-age", "1h", "--retire-after", "2h", env=env)
    assert doc["exit_code"] == ExitCode.KEYS and "cannot rotate" in doc["error"]["message"]


# ------------------------------------------------------------ vault / openbao
@pytest.mark.usefixtures("vault_env")
def test_keys_lifecycle_against_openbao() -> None:
    spec = f"vault-transit:transit/cli-{uuid.uuid4().hex[:8]}"
    created = run_json("keys", "init", "--keys", spec)
    assert created["ok"] and "created" in created["message"]
    listing = run_json("keys", "list", "--keys", spec)
    assert [k["state"] for k in listing["keys"]] == ["primary"]
    token = run("mint", "--keys", spec, "--principal", "alice", "hello").stdout.strip()
    assert token.startswith("sc1s.")
    verified = run_json("verify", token, "--keys", spec, "--principal", "alice")
    assert verified["valid"] and verified["claims"]["kid"] == listing["primary"]
    dry = run_json("keys", "rotate", "--keys", spec, "--min-age", "0s", "--retire-after", "2h", "--dry-run")
    assert dry["dry_run"] and dry["rotated"]
    assert len(run_json("keys", "list", "--keys", spec)["keys"]) == 1  # the dry run changed nothing


def test_vault_errors_name_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("VAULT_ADDR", "VAULT_TOKEN", "BAO_ADDR", "BAO_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    missing = run("keys", "list", "--keys", "vault-transit:transit/k")
    assert missing.exit_code == ExitCode.KEYS and "VAULT_ADDR is not set" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    bad_spec = run_json("keys", "list", "--keys", "vault-transit:nokeyname")
    assert bad_spec["exit_code"] == ExitCode.KEYS and "MOUNT/NAME" in bad_spec["error"]["message"]
    # Nothing listens on loopback port 1: the source is down, a retry may help (exit 7).
    monkeypatch.setenv("VAULT_ADDR", "http://127.0.0.1:1")
    monkeypatch.setenv("VAULT_TOKEN", "t")
    down = run_json("keys", "list", "--keys", "vault-transit:transit/k")
    assert down["exit_code"] == ExitCode.KEY_SOURCE_DOWN and down["error"]["class"] == "key_source_down"
    assert "connection refused" in down["error"]["message"]


# ------------------------------------------------------------------ retire
def test_retire_shows_the_plan_and_asks_first(tmp_path: Path) -> None:
    now = int(time.time())
    path = tmp_path / "keys.json"
    ring = KeyRing(
        [Key.generate("old", created_at=now - DAY), Key.generate("cur", created_at=now - 3600)], "cur"
    )
    spec = write_ring(path, ring)
    before = path.read_text()

    dry = run_json("keys", "retire", "old", "--keys", spec, "--dry-run")
    assert dry["ok"] and dry["dry_run"] and not dry["changed"] and dry["cut_at"] is None
    assert dry["retired"] == ["old"] and dry["primary"] == "cur" and not dry["new_key"] and dry["wait"] == 0
    assert path.read_text() == before

    declined = run("keys", "retire", "old", "--keys", spec, answer="n\n")
    assert declined.exit_code == ExitCode.USAGE
    assert "would retire old" in declined.stderr and "Retire old? [y/N]" in declined.stderr
    assert "not confirmed: nothing was retired (pass --yes" in declined.stderr
    unanswered = run("keys", "retire", "old", "--keys", spec, answer="")  # a script that forgot --yes
    assert unanswered.exit_code == ExitCode.USAGE and path.read_text() == before

    done = run("keys", "retire", "old", "--keys", spec, answer="y\n")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"file:{path}: retire old")
    assert "every instance rejects tokens of old within 1m06s" in done.stdout
    assert KeyRing.from_json(path.read_text()).kids == ("cur",)

    again = run_json("keys", "retire", "old", "--keys", spec, "--yes")
    assert again["exit_code"] == ExitCode.KEYS and "no key old (keys: cur)" in again["error"]["message"]


def test_retire_the_primary_makes_a_new_key_and_waits(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    spec = write_ring(path, KeyRing.generate("leaked", created_at=int(time.time()) - DAY))
    result = run("keys", "retire", "leaked", "--keys", spec, "--yes", "--json", *FAST)
    doc = json.loads(result.stdout)
    VALIDATOR.validate(doc)
    assert doc["ok"] and doc["changed"] and doc["new_key"] and doc["retired"] == ["leaked"]
    stored = KeyRing.from_json(path.read_text())
    assert doc["primary"] == "leaked" and stored.kids == (doc["successor"],)
    # Cut once the successor was promoted: 3 s (FAST's promotion delay) after its creation.
    assert 0 < doc["wait"] <= 3 and doc["cut_at"] >= stored.require(doc["successor"]).created_at + 3
    # Whole seconds left of the 3: fewer when the machine is slow between the creation and the wait.
    progress = f"waiting [0-3]s until every instance mints with {doc['successor']} before cutting leaked"
    assert re.search(progress, result.stderr)


def test_retire_refuses_env_sources() -> None:
    env = {"R": KeyRing.generate("e").to_json()}
    doc = run_json("keys", "retire", "e", "--keys", "env:R", "--yes", env=env)
    assert doc["exit_code"] == ExitCode.KEYS
    assert "cannot retire keys it does not store" in doc["error"]["message"]


def test_the_shipped_policies_run_list_rotate_and_retire(
    openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The rotation job's token lists, rotates and retires; the service's lists; neither sees more."""
    name = f"cli-{uuid.uuid4().hex[:8]}"
    root = openbao.client()
    root.secrets.transit.create_key(name, key_type="chacha20-poly1305", exportable=True)
    tokens = {}
    for file in ("statecodec-rotate.hcl", "statecodec-service.hcl"):
        policy = f"{file.removesuffix('.hcl')}-{name}"
        root.sys.create_or_update_policy(policy, (POLICIES / file).read_text().replace("mcp-state", name))
        tokens[file] = root.auth.token.create(policies=[policy], ttl="1h")["auth"]["client_token"]
    clean_vault_env(monkeypatch, tmp_path)
    spec = f"vault-transit:transit/{name}"
    job = {"VAULT_ADDR": openbao.addr, "VAULT_TOKEN": tokens["statecodec-rotate.hcl"]}
    service = {"VAULT_ADDR": openbao.addr, "VAULT_TOKEN": tokens["statecodec-service.hcl"]}

    listing = run_json("keys", "list", "--keys", spec, env=job)
    assert listing["ok"] and [k["kid"] for k in listing["keys"]] == [f"{name}-v1"]
    rotated = run_json("keys", "rotate", "--keys", spec, "--min-age", "0s", "--retire-after", "2h", env=job)
    assert rotated["ok"] and rotated["new_kid"] == f"{name}-v2"
    assert [k["state"] for k in run_json("keys", "list", "--keys", spec, env=service)["keys"]] == [
        "primary",
        "pending",
    ]

    # v1 mints until v2 is promoted (3 s after the rotation with FAST): if v1 still mints,
    # pending v2 takes over first; either way no new key is needed.
    retired = run_json("keys", "retire", f"{name}-v1", "--keys", spec, "--yes", *FAST, env=job)
    assert retired["ok"] and retired["retired"] == [f"{name}-v1"] and not retired["new_key"]
    assert (retired["primary"], retired["successor"]) in {(f"{name}-v1", f"{name}-v2"), (f"{name}-v2", None)}
    assert root.secrets.transit.read_key(name)["data"]["min_decryption_version"] == 2

    for args in (
        ["keys", "retire", f"{name}-v2", "--keys", spec, "--yes"],
        ["keys", "rotate", "--keys", spec, "--min-age", "0s", "--retire-after", "2h"],
    ):
        denied = run_json(*args, env=service)
        assert denied["exit_code"] == ExitCode.KEYS, denied  # a permission problem: fix, not retry
        assert "permission denied" in denied["error"]["message"]
    assert root.secrets.transit.read_key(name)["data"]["latest_version"] == 2


def test_retire_now_plans_a_cut_without_the_wait(tmp_path: Path) -> None:
    now = int(time.time())
    ring = KeyRing([Key.generate("a", created_at=now - 9000), Key.generate("b", created_at=now - 5000)], "b")
    spec = write_ring(tmp_path / "keys.json", ring)
    doc = run_json("keys", "retire", "b", "--keys", spec, "--now", "--dry-run")
    assert doc["exit_code"] == 0 and doc["at_once"] is True and doc["wait"] == 0 and doc["successor_in"] > 0
    human = run("keys", "retire", "b", "--keys", spec, "--now", "--dry-run").stdout
    assert "cut at once (--now)" in " ".join(human.split())
    assert "honest rounds minted with b meanwhile fail" in " ".join(human.split())
    done = run_json("keys", "retire", "b", "--keys", spec, "--now", "--yes")
    assert (
        done["changed"] is True
        and done["wait"] == 0
        and "b" not in KeyRing.from_json((tmp_path / "keys.json").read_text()).kids
    )
