"""file: and env: key sources, URL parsing, and rotate()/init_keys() on real files."""

from __future__ import annotations

import functools
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from statecodec import KeyRing, StateCodec
from statecodec._format import b64encode
from statecodec.kms import (
    EnvSource,
    FileSource,
    KeyManager,
    KeySourceError,
    Timeline,
    init_keys,
    rotate,
    source_from_url,
)

TL = Timeline(refresh_interval=10, jitter=0.1, max_skew=5, max_ttl=300, staleness_limit=100)
DAY = 86400


# ------------------------------------------------------------------------------ URLs
@pytest.mark.parametrize(
    ("url", "kind", "describe"),
    [
        ("file:/etc/statecodec/ring.json", FileSource, "file:/etc/statecodec/ring.json"),
        ("file:///etc/statecodec/ring.json", FileSource, "file:/etc/statecodec/ring.json"),
        ("file:ring.json", FileSource, "file:ring.json"),
        ("env:STATECODEC_KEYS", EnvSource, "env:STATECODEC_KEYS"),
    ],
)
def test_local_urls(url: str, kind: type, describe: str) -> None:
    src = source_from_url(url)
    assert isinstance(src, kind)
    assert src.describe() == describe


def test_vault_urls_describe_the_server_not_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAULT_ADDR", "http://127.0.0.1:8200")
    monkeypatch.setenv("VAULT_TOKEN", "s.supersecret")
    transit = source_from_url("vault-transit:team/transit/mcp-state")
    assert transit.describe() == "vault-transit:team/transit/mcp-state at http://127.0.0.1:8200"
    kv = source_from_url("vault-kv:secret/statecodec/mcp-state", namespace="ns1")
    assert kv.describe() == "vault-kv:secret/statecodec/mcp-state at http://127.0.0.1:8200 namespace ns1"
    assert "supersecret" not in repr(transit) + repr(kv) + repr(getattr(kv, "settings", ""))


@pytest.mark.parametrize(
    "url",
    [
        "ring.json",
        "file:",
        "env:",
        "vault-transit:mcp-state",
        "vault-transit:transit/",
        "vault-kv:/x",
        "vault-kv:secret",
        "s3:bucket/key",
        "vault-transit:a//b",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(KeySourceError) as info:
        source_from_url(url)
    assert info.value.kind == "config"
    assert "file:PATH" in str(info.value)


# ------------------------------------------------------------------------------ file:
def test_file_init_load_and_permissions(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    message = init_keys(f"file:{path}", clock=lambda: 1000)
    assert "created" in message
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ring = FileSource(path).load()
    assert len(ring) == 1 and ring.keys[0].created_at == 1000
    assert "already exists" in init_keys(f"file:{path}")
    assert FileSource(path).load() == ring  # never overwritten


def test_file_errors_are_actionable(tmp_path: Path) -> None:
    missing = FileSource(tmp_path / "nope.json")
    with pytest.raises(KeySourceError, match=r"no such file .*statecodec keys init") as info:
        missing.load()
    assert info.value.kind == "missing"
    bad = tmp_path / "bad.json"
    bad.write_text('{"statecodec_keyring": 1, "keys": [{"kid": "a", "secret": "not base64!"}]}')
    with pytest.raises(KeySourceError, match="canonical base64url") as info:
        FileSource(bad).load()
    assert info.value.kind == "invalid"
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"statecodec_keyring": 1, "keys": []}))
    with pytest.raises(KeySourceError, match="empty"):
        FileSource(empty).load()


def test_world_readable_file_is_warned_about_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "ring.json"
    path.write_text(KeyRing.generate().to_json())
    path.chmod(0o644)
    src = FileSource(path)
    src.load()
    src.load()
    warnings = [r.getMessage() for r in caplog.records if "readable by group or others" in r.getMessage()]
    assert len(warnings) == 1 and "644" in warnings[0]


def test_file_rotate_is_idempotent_and_retires(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    first = FileSource(path).load().keys[0].kid

    report = rotate(f"file:{path}", min_age=DAY, retire_after=2 * 3600, clock=lambda: DAY, timeline=TL)
    assert report.rotated and report.new_kid and report.newest_age == DAY
    second = report.new_kid
    again = rotate(f"file:{path}", min_age=DAY, retire_after=2 * 3600, clock=lambda: DAY + 10, timeline=TL)
    assert not again.rotated and not again.changed  # idempotent
    ring = FileSource(path).load()
    assert ring.kids == (first, second)
    assert ring.primary_kid == first  # the new key is not promoted yet (D = 17 s)
    rotate(f"file:{path}", min_age=DAY, retire_after=2 * 3600, clock=lambda: DAY + 17, timeline=TL)
    assert FileSource(path).load().primary_kid == second  # the document follows the timeline

    # Two hours after the second key appeared, the first retires (and the doc's primary moves on).
    report = rotate(f"file:{path}", min_age=DAY, retire_after=2 * 3600, clock=lambda: DAY + 7200, timeline=TL)
    assert report.retired == (first,) and not report.rotated
    ring = FileSource(path).load()
    assert ring.require(first).retires_at == DAY + 7200
    # A retire_after later the tombstone goes, secret and all.
    report = rotate(
        f"file:{path}", min_age=DAY, retire_after=2 * 3600, clock=lambda: DAY + 4 * 3600, timeline=TL
    )
    assert report.removed == (first,)
    assert FileSource(path).load().kids == (second,)


def test_rotate_dry_run_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    before = path.read_bytes()
    report = rotate(
        f"file:{path}", min_age=DAY, retire_after=3600, clock=lambda: 2 * DAY, dry_run=True, timeline=TL
    )
    assert report.rotated and report.dry_run
    assert "would create" in str(report)
    assert path.read_bytes() == before


def test_rotate_refuses_a_retire_after_shorter_than_the_window(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    with pytest.raises(ValueError, match="too short"):
        rotate(f"file:{path}", min_age=DAY, retire_after=60)  # default timeline needs ~28 min
    with pytest.raises(ValueError, match="min_age"):
        rotate(f"file:{path}", min_age=-1, retire_after=DAY)


def test_rotate_keeps_the_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    path.chmod(0o640)
    rotate(f"file:{path}", min_age=0, retire_after=DAY, timeline=TL)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_two_concurrent_file_rotations_add_one_key(tmp_path: Path) -> None:
    """Real processes racing on the same file: the lock serialises them, the second is a no-op."""
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    script = (
        "import sys; from statecodec.kms import rotate, Timeline; "
        "tl = Timeline(refresh_interval=10, max_skew=5, max_ttl=300, staleness_limit=100); "
        f"r = rotate('file:{path}', min_age=3600, retire_after=3600, timeline=tl); print(r.rotated)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(4)
    ]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(outputs) == ["False", "False", "False", "True"]
    assert len(FileSource(path).load()) == 2


def test_concurrent_threads_with_readers_never_see_half_a_file(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    errors: list[Exception] = []
    stop = threading.Event()

    def reader() -> None:
        src = FileSource(path)
        while not stop.is_set():
            try:
                src.load()
            except Exception as exc:  # any torn read would surface here
                errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(30):
        rotate(
            f"file:{path}",
            min_age=0,
            retire_after=TL.min_retire_after,
            clock=functools.partial(float, 1000 + i),  # rotation i happens at instant 1000+i
            timeline=TL,
            force=True,  # one rotation a second, each while the last key is still pending
        )
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert len(FileSource(path).load()) == 31


# ------------------------------------------------------------------------------- env:
def test_env_keyring_json(monkeypatch: pytest.MonkeyPatch) -> None:
    ring = KeyRing.generate(created_at=5)
    monkeypatch.setenv("SC_TEST_KEYS", ring.to_json())
    assert EnvSource("SC_TEST_KEYS").load() == ring


def test_env_single_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = os.urandom(32)
    monkeypatch.setenv("SC_TEST_KEYS", b64encode(secret) + "\n")
    ring = EnvSource("SC_TEST_KEYS").load()
    assert ring.kids == ("k0",) and ring.primary.secret == secret and ring.primary.created_at == 0
    # Two instances reading the same variable agree: one mints, the other verifies.
    a = StateCodec(KeyManager("env:SC_TEST_KEYS").start(background=False))
    b = StateCodec(KeyManager("env:SC_TEST_KEYS").start(background=False))
    assert b.unseal(a.seal(b"hello")).payload == b"hello"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "SC_TEST_KEYS is not set"),
        ("", "SC_TEST_KEYS is not set"),
        (b64encode(os.urandom(16)), "at least 32 bytes"),
        ("c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0==", "at least 32 bytes"),  # padded
        ('{"statecodec_keyring": 2}', "not a statecodec key ring"),
        ("{not json", "not valid JSON"),
    ],
)
def test_env_errors(monkeypatch: pytest.MonkeyPatch, value: str | None, message: str) -> None:
    if value is None:
        monkeypatch.delenv("SC_TEST_KEYS", raising=False)
    else:
        monkeypatch.setenv("SC_TEST_KEYS", value)
    with pytest.raises(KeySourceError, match=message) as info:
        EnvSource("SC_TEST_KEYS").load()
    if value:
        assert value not in str(info.value), "the value (a secret) must never be echoed"


def test_env_cannot_rotate_or_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_TEST_KEYS", b64encode(os.urandom(32)))
    with pytest.raises(KeySourceError) as info:
        rotate("env:SC_TEST_KEYS", min_age=0, retire_after=DAY)
    assert info.value.kind == "unsupported"
    with pytest.raises(KeySourceError, match="token_urlsafe") as info:
        init_keys("env:SC_TEST_KEYS")
    assert info.value.kind == "unsupported"


# ----------------------------------------------------------------- manager, real threads
def test_background_refresh_picks_up_a_rotated_file(tmp_path: Path) -> None:
    """The refresh thread (0.05 s) sees a new key without any call from the test."""
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    tl = Timeline(refresh_interval=0.05, jitter=0.1, max_skew=0, max_ttl=60, staleness_limit=5)
    with KeyManager(f"file:{path}", refresh_interval=0.05, max_skew=0, max_ttl=60, staleness_limit=5) as mgr:
        assert mgr.status()["running"]
        report = rotate(f"file:{path}", min_age=0, retire_after=tl.min_retire_after, timeline=tl)
        deadline = threading.Event()
        for _ in range(200):  # up to 10 s on a loaded machine; normally 0.1 s
            if report.new_kid in mgr.keyring().kids:
                break
            deadline.wait(0.05)
        assert report.new_kid in mgr.keyring().kids
    assert not mgr.status()["running"]


async def test_async_context_manager(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    init_keys(f"file:{path}", clock=lambda: 0)
    async with KeyManager(f"file:{path}", refresh_interval=0.05, staleness_limit=1) as keys:
        codec = StateCodec(keys)
        assert (await codec.aunseal(codec.seal(b"async"))).payload == b"async"
        assert keys.status()["running"]
    assert not keys.status()["running"]


def test_importing_kms_does_not_import_hvac() -> None:
    code = "import sys, statecodec.kms; print(sorted(m for m in ('hvac', 'requests') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_key_source_error_says_whether_a_retry_may_cure_it() -> None:
    """Down or busy (retry later, exit 7 at the command line) versus something to fix (exit 3)."""
    from statecodec.kms import KINDS  # noqa: PLC0415

    transient = {kind for kind in KINDS if KeySourceError("x", kind=kind).transient}
    assert transient == {"unreachable", "conflict"}


class _Counted(FileSource):
    closes = 0

    def close(self) -> None:
        self.closes += 1


def test_a_source_used_in_a_with_block_is_closed_however_the_block_ends(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(KeyRing.generate("k1").to_json())
    path.chmod(0o600)
    with _Counted(path) as source:
        assert source.load().primary.kid == "k1"
    assert source.closes == 1
    with pytest.raises(RuntimeError), _Counted(path) as failing:
        raise RuntimeError("the job failed")
    assert failing.closes == 1
