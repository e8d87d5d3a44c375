"""Vault/OpenBao sources against a real OpenBao dev server: transit, KV v2, logins, policies, rotation."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hvac.exceptions
import pytest
from fixtures_openbao import OpenBao, clean_vault_env, load_policy, service_key, token_with, unique
from loopback import Loopback, Quiet
from pki import make_ca

from statecodec import KeyRing, StateCodec
from statecodec.kms import (
    KeyManager,
    KeySourceError,
    Timeline,
    VaultSettings,
    init_keys,
    rotate,
    source_from_url,
)
from statecodec.kms._transit import TransitSource

DAY = 86400
TL = Timeline(refresh_interval=1, jitter=0.1, max_skew=1, max_ttl=10, staleness_limit=5)


# ------------------------------------------------------------------------------ transit
@pytest.mark.parametrize("key_type", ["chacha20-poly1305", "xchacha20-poly1305", "aes256-gcm96", "hmac"])
def test_init_and_load_transit(vault_env: OpenBao, key_type: str) -> None:
    name = unique()
    url = f"vault-transit:transit/{name}"
    assert "created an exportable" in init_keys(url, key_type=key_type)
    assert "already exists" in init_keys(url, key_type=key_type)
    root = vault_env.client()
    root.secrets.transit.rotate_key(name)
    root.secrets.transit.rotate_key(name)
    export = "hmac-key" if key_type == "hmac" else "encryption-key"
    exported = root.secrets.transit.export_key(name, key_type=export)["data"]["keys"]

    ring = source_from_url(url).load()
    assert ring.kids == (f"{name}-v1", f"{name}-v2", f"{name}-v3")
    for version, text in exported.items():
        assert ring.require(f"{name}-v{version}").secret == base64.b64decode(text)
    assert ring.primary_kid is None  # the manager's timeline picks the primary
    meta = root.secrets.transit.read_key(name)["data"]
    if key_type == "hmac":
        # No timestamps in hmac metadata: the older versions count as old, the newest as new.
        assert "keys" not in meta or not meta["keys"]
        created = [k.created_at for k in ring.keys]
        assert created[:2] == [0, 0] and abs(created[2] - time.time()) < 60
    else:
        assert [k.created_at for k in ring.keys] == [meta["keys"][str(v)] for v in (1, 2, 3)]


def test_hmac_versions_are_dated_when_first_seen(vault_env: OpenBao) -> None:
    name = unique()
    init_keys(f"vault-transit:transit/{name}", key_type="hmac")
    clock = [1_000_000.0]
    src = TransitSource("transit", name, VaultSettings.from_env(), clock=lambda: clock[0])
    assert [k.created_at for k in src.load().keys] == [0]  # the only key: nobody can lack it
    vault_env.client().secrets.transit.rotate_key(name)
    clock[0] += 100
    assert [k.created_at for k in src.load().keys] == [0, 1_000_100]
    clock[0] += 100
    assert [k.created_at for k in src.load().keys] == [0, 1_000_100]  # stable across loads
    with pytest.raises(KeySourceError, match="record no creation times") as info:
        rotate(src, min_age=0, retire_after=DAY)
    assert info.value.kind == "unsupported"


def test_long_key_names_fall_back_to_short_kids(vault_env: OpenBao) -> None:
    name = "statecodec-state-for-the-mcp-fleet-" + unique()
    init_keys(f"vault-transit:transit/{name}")
    assert source_from_url(f"vault-transit:transit/{name}").load().kids == ("v1",)


def test_transit_errors_are_actionable(vault_env: OpenBao, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = source_from_url(f"vault-transit:transit/{unique()}")
    with pytest.raises(KeySourceError, match=r"no transit key .* `statecodec keys init") as info:
        missing.load()
    assert info.value.kind == "missing"

    name = unique()
    vault_env.client().secrets.transit.create_key(name, key_type="chacha20-poly1305", exportable=False)
    with pytest.raises(KeySourceError, match=r"not exportable.*exportable=true") as info:
        source_from_url(f"vault-transit:transit/{name}").load()
    assert info.value.kind == "invalid"

    with pytest.raises(KeySourceError, match="no transit engine is mounted at nowhere/"):
        init_keys(f"vault-transit:nowhere/{unique()}")

    monkeypatch.setenv("VAULT_TOKEN", "s.not-a-real-token")
    with pytest.raises(KeySourceError, match="permission denied") as info:
        source_from_url(f"vault-transit:transit/{name}").load()
    assert info.value.kind == "denied"
    assert "s.not-a-real-token" not in str(info.value)


def test_missing_address_and_credentials(
    openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clean_vault_env(monkeypatch, tmp_path)
    with pytest.raises(KeySourceError, match="VAULT_ADDR is not set") as info:
        source_from_url("vault-transit:transit/mcp-state").load()
    assert info.value.kind == "config"
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    with pytest.raises(KeySourceError, match="no Vault credentials: set VAULT_TOKEN"):
        source_from_url("vault-transit:transit/mcp-state").load()
    # ~/.vault-token (what `bao login` leaves behind) is the last resort.
    (tmp_path / ".vault-token").write_text(openbao.token + "\n")
    name = unique()
    openbao.client().secrets.transit.create_key(name, exportable=True)
    assert len(source_from_url(f"vault-transit:transit/{name}").load()) == 1


def test_unreachable_vault_retries_then_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, refused_port: int
) -> None:
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("VAULT_ADDR", f"http://127.0.0.1:{refused_port}")
    monkeypatch.setenv("VAULT_TOKEN", "root")
    src = source_from_url("vault-kv:secret/x", retries=2, backoff=0.01)
    with pytest.raises(KeySourceError, match=r"cannot connect to Vault at .* \(connection refused\)") as info:
        src.load()
    assert info.value.kind == "unreachable"


# ------------------------------------------------------------------------------ KV v2
def test_kv_init_load_and_string_form(vault_env: OpenBao) -> None:
    path = f"statecodec/{unique()}"
    url = f"vault-kv:secret/{path}"
    assert "created a key ring" in init_keys(url)
    assert "already holds a key ring" in init_keys(url)
    ring = source_from_url(url).load()
    assert len(ring) == 1 and ring.primary_kid == ring.kids[0]

    other = KeyRing.generate(created_at=7)
    vault_env.client().secrets.kv.v2.create_or_update_secret(
        f"{path}-text", secret={"keyring": other.to_json()}, mount_point="secret"
    )
    assert source_from_url(f"{url}-text").load() == other


def test_kv_errors(vault_env: OpenBao) -> None:
    with pytest.raises(KeySourceError, match=r"no keyring document .* `statecodec keys init") as info:
        source_from_url(f"vault-kv:secret/statecodec/{unique()}").load()
    assert info.value.kind == "missing"
    path = f"statecodec/{unique()}"
    vault_env.client().secrets.kv.v2.create_or_update_secret(
        path, secret={"hello": "world"}, mount_point="secret"
    )
    with pytest.raises(KeySourceError, match="version 1: not a statecodec key ring") as info:
        source_from_url(f"vault-kv:secret/{path}").load()
    assert info.value.kind == "invalid"


def test_kv_rotate_is_idempotent_and_uses_check_and_set(vault_env: OpenBao) -> None:
    url = f"vault-kv:secret/statecodec/{unique()}"
    t0 = time.time()
    init_keys(url, clock=lambda: t0)
    first = source_from_url(url).load().kids[0]
    # Four jobs at once, a day later: exactly one new key (the losers re-read and stand down).
    reports: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda: reports.append(rotate(url, min_age=DAY, retire_after=3600, clock=lambda: t0 + DAY))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.rotated for r in reports) == 1
    ring = source_from_url(url).load()
    assert len(ring) == 2
    second = next(k for k in ring.kids if k != first)
    # Two hours on, the first key is marked retired.
    report = rotate(url, min_age=DAY, retire_after=7200, clock=lambda: t0 + DAY + 7200)
    assert report.retired == (first,) and not report.rotated
    assert source_from_url(url).load().require(first).retires_at is not None
    assert source_from_url(url).load().primary_kid == second


# ----------------------------------------------------------------------- transit rotate
def test_transit_rotate_idempotent_then_retires(vault_env: OpenBao) -> None:
    # Vault stamps versions with the real time, so every version made here is about "t0"
    # old and the job's ``now`` moves the whole key through time at once.
    name = unique()
    url = f"vault-transit:transit/{name}"
    init_keys(url)
    t0 = time.time()
    assert not rotate(url, min_age=DAY, retire_after=2 * DAY, clock=lambda: t0).rotated  # v1 is fresh
    report = rotate(url, min_age=DAY, retire_after=2 * DAY, clock=lambda: t0 + DAY + 5)
    assert report.rotated and report.new_kid == f"{name}-v2" and report.retired == ()
    assert not rotate(url, min_age=DAY, retire_after=2 * DAY, clock=lambda: t0 + 5).rotated  # v2 is fresh

    dry = rotate(url, min_age=DAY, retire_after=2 * DAY, clock=lambda: t0 + 2 * DAY + 5, dry_run=True)
    assert dry.rotated and dry.new_kid == f"{name}-v3" and dry.retired == (f"{name}-v1",)
    meta = vault_env.client().secrets.transit.read_key(name)["data"]
    assert (meta["latest_version"], meta["min_decryption_version"]) == (2, 1)

    # v2 is two days old: v1 goes (min_decryption_version 2); no rotation with a 10-day min-age.
    report = rotate(url, min_age=10 * DAY, retire_after=2 * DAY, clock=lambda: t0 + 2 * DAY + 5)
    assert not report.rotated and report.retired == (f"{name}-v1",)
    meta = vault_env.client().secrets.transit.read_key(name)["data"]
    assert meta["min_decryption_version"] == 2 and meta["latest_version"] == 2
    assert source_from_url(url).load().kids == (f"{name}-v2",)
    # Idempotent: nothing more to retire; the newest version never retires.
    again = rotate(url, min_age=10 * DAY, retire_after=2 * DAY, clock=lambda: t0 + 9 * DAY)
    assert not again.changed


def test_concurrent_transit_rotations_make_at_most_one_extra_version_each(vault_env: OpenBao) -> None:
    # OpenBao fails some racing transit writes with a 500; every job must still end
    # with a fresh key, and no job may add more than its own one version.
    name = unique()
    url = f"vault-transit:transit/{name}"
    init_keys(url)
    later = time.time() + DAY
    reports: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def job() -> None:
        barrier.wait()
        try:
            # retire_after a minute under min_age: the version made now is retire_after old
            # at `later` however long the jobs take to start (timestamps are whole seconds).
            reports.append(rotate(url, min_age=DAY, retire_after=DAY - 60, clock=lambda: later))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=job) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    latest = vault_env.client().secrets.transit.read_key(name)["data"]["latest_version"]
    assert 2 <= latest <= 4
    # A job that starts after another's rotation finds a fresh key and leaves it.
    assert len(reports) == 3 and any(r.rotated for r in reports)
    assert all(r.newest_kid != f"{name}-v1" for r in reports)
    assert {r.newest_kid for r in reports} <= {f"{name}-v{v}" for v in range(2, latest + 1)}
    # The newest version is exported (it mints, whichever job made it); v1 was retired.
    kids = set(source_from_url(url).load().kids)
    assert f"{name}-v{latest}" in kids
    assert kids <= {f"{name}-v{v}" for v in range(2, latest + 1)}


def test_transit_write_that_failed_and_did_not_happen_is_tried_again(
    vault_env: OpenBao, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real OpenBao; the 500 is injected (OpenBao gives one only under a race we cannot
    # schedule): the first rotate call fails before reaching the server.
    calls: list[str] = []

    def flaky(real: Callable[[], Any]) -> Any:
        calls.append("rotate")
        if len(calls) == 1:
            raise hvac.exceptions.InternalServerError("transaction commit failed")
        return real()

    name, report = _rotate_with_fault(vault_env, monkeypatch, flaky)
    assert calls == ["rotate", "rotate"]
    assert report.rotated and report.new_kid == f"{name}-v2"


def test_transit_write_whose_reply_was_lost_is_not_repeated(
    vault_env: OpenBao, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rotate reaches OpenBao and happens, then the reply is lost (injected): the job
    # must see the new version on re-reading and not rotate a second time.
    def lost_reply(real: Callable[[], Any]) -> Any:
        real()
        raise hvac.exceptions.InternalServerError("reply lost")

    name, report = _rotate_with_fault(vault_env, monkeypatch, lost_reply)
    assert report.rotated and report.new_kid == f"{name}-v2"
    assert any("shows it done" in n for n in report.notes)


def _rotate_with_fault(
    server: OpenBao, monkeypatch: pytest.MonkeyPatch, fault: Callable[[Callable[[], Any]], Any]
) -> tuple[str, Any]:
    """Rotate a fresh transit key with every rotate call going through ``fault(real_call)``.

    Returns the key's name and the report; asserts that exactly one version was added.
    """
    name = unique()
    url = f"vault-transit:transit/{name}"
    init_keys(url)
    real = hvac.api.secrets_engines.Transit.rotate_key

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fault(lambda: real(self, *args, **kwargs))

    monkeypatch.setattr(hvac.api.secrets_engines.Transit, "rotate_key", patched)
    report = rotate(url, min_age=0, retire_after=DAY)
    assert server.client().secrets.transit.read_key(name)["data"]["latest_version"] == 2
    return name, report


# ---------------------------------------------------------------------------- policies
def test_service_policy_reads_one_key_and_nothing_more(
    openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name, other = unique(), unique()
    root = openbao.client()
    for n in (name, other):
        root.secrets.transit.create_key(n, key_type="chacha20-poly1305", exportable=True)
    service = token_with(openbao, load_policy(openbao, "statecodec-service.hcl", name))
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    monkeypatch.setenv("VAULT_TOKEN", service)

    assert len(source_from_url(f"vault-transit:transit/{name}").load()) == 1
    with pytest.raises(KeySourceError, match="permission denied rotating") as info:
        rotate(f"vault-transit:transit/{name}", min_age=0, retire_after=DAY)
    assert info.value.kind == "denied"
    with pytest.raises(KeySourceError, match="permission denied reading transit/keys/"):
        source_from_url(f"vault-transit:transit/{other}").load()
    as_service = openbao.client(service)
    with pytest.raises(hvac.exceptions.Forbidden):
        as_service.secrets.transit.export_key(other, key_type="encryption-key")
    with pytest.raises(hvac.exceptions.Forbidden):
        as_service.secrets.transit.export_key(name, key_type="hmac-key")
    with pytest.raises(hvac.exceptions.Forbidden):
        as_service.secrets.transit.update_key_configuration(name, min_decryption_version=1)
    with pytest.raises(hvac.exceptions.Forbidden):
        as_service.secrets.transit.rotate_key(name)
    assert root.secrets.transit.read_key(name)["data"]["latest_version"] == 1


def test_rotation_policy_rotates_but_never_sees_keys(
    openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = unique()
    root = openbao.client()
    root.secrets.transit.create_key(name, key_type="chacha20-poly1305", exportable=True)
    job = token_with(openbao, load_policy(openbao, "statecodec-rotate.hcl", name))
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    monkeypatch.setenv("VAULT_TOKEN", job)
    url = f"vault-transit:transit/{name}"
    t0 = time.time()
    assert rotate(url, min_age=DAY, retire_after=2 * DAY, clock=lambda: t0 + DAY + 5).rotated
    report = rotate(url, min_age=10 * DAY, retire_after=2 * DAY, clock=lambda: t0 + 2 * DAY + 5)
    assert report.retired == (f"{name}-v1",)
    with pytest.raises(KeySourceError, match="permission denied reading transit/export/encryption-key/"):
        source_from_url(url).load()
    with pytest.raises(hvac.exceptions.Forbidden):
        openbao.client(job).secrets.transit.delete_key(name)


def test_kv_policies(openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    name = unique()
    path = f"statecodec/{name}"
    service = token_with(openbao, load_policy(openbao, "statecodec-service-kv.hcl", name))
    job = token_with(openbao, load_policy(openbao, "statecodec-rotate-kv.hcl", name))
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    url = f"vault-kv:secret/{path}"

    monkeypatch.setenv("VAULT_TOKEN", job)
    assert "created" in init_keys(url)
    assert rotate(url, min_age=0, retire_after=DAY).rotated
    monkeypatch.setenv("VAULT_TOKEN", service)
    assert len(source_from_url(url).load()) == 2
    with pytest.raises(KeySourceError, match="permission denied writing"):
        rotate(url, min_age=0, retire_after=DAY, force=True)  # the first rotation's key is still pending
    with pytest.raises(KeySourceError, match="permission denied"):
        source_from_url(f"vault-kv:secret/statecodec/{unique()}").load()


# ---------------------------------------------------------------------------- AppRole
def test_approle_login_renews_and_logs_in_again(
    openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Short token TTLs: the session renews at 2/3 of the lease, re-logs in at max TTL and after a revoke."""
    name, policy = service_key(openbao)
    root = openbao.client()
    mount = unique("approle")
    root.sys.enable_auth_method("approle", path=mount)
    root.auth.approle.create_or_update_approle(
        "svc", token_policies=[policy], token_ttl="3s", token_max_ttl="5s", mount_point=mount
    )
    role_id = root.auth.approle.read_role_id("svc", mount_point=mount)["data"]["role_id"]
    secret_id = root.auth.approle.generate_secret_id("svc", mount_point=mount)["data"]["secret_id"]
    clean_vault_env(monkeypatch, tmp_path)
    monkeypatch.setenv("VAULT_ADDR", openbao.addr)
    monkeypatch.setenv("VAULT_ROLE_ID", role_id)
    monkeypatch.setenv("VAULT_SECRET_ID", secret_id)
    monkeypatch.setenv("VAULT_APPROLE_MOUNT", mount)

    src: Any = source_from_url(f"vault-transit:transit/{name}")
    assert secret_id not in repr(src.settings)
    deadline = time.monotonic() + 7
    while time.monotonic() < deadline:
        assert len(src.load()) == 1
        time.sleep(0.25)
    assert src.session.renewals >= 1, "renewed at 2/3 of the 3 s lease"
    assert src.session.logins >= 2, "logged in again when the 5 s max TTL capped the lease"

    logins = src.session.logins
    root.auth.token.revoke(src.session._client.token)
    assert len(src.load()) == 1  # 403, then a fresh login, then success
    assert src.session.logins == logins + 1

    monkeypatch.setenv("VAULT_SECRET_ID", "not-the-secret-id")
    with pytest.raises(KeySourceError, match="approle login failed") as info:
        source_from_url(f"vault-transit:transit/{name}").load()
    assert info.value.kind == "denied"


# ----------------------------------------------------------------------- manager basics
def test_manager_over_transit_promotes_after_the_delay(vault_env: OpenBao) -> None:
    name = unique()
    url = f"vault-transit:transit/{name}"
    init_keys(url)
    clock = [time.time()]
    mgr = KeyManager(
        url,
        refresh_interval=1,
        jitter=0.1,
        max_skew=1,
        max_ttl=10,
        staleness_limit=5,
        clock=lambda: clock[0],
    ).start(background=False)
    codec = StateCodec(mgr, ttl=10, max_skew=1, clock=lambda: clock[0])
    assert codec.unseal(codec.seal(b"a")).kid == f"{name}-v1"
    vault_env.client().secrets.transit.rotate_key(name)
    mgr.refresh_now()
    assert codec.unseal(codec.seal(b"b")).kid == f"{name}-v1"  # v2 verifies, not yet mints
    created = vault_env.client().secrets.transit.read_key(name)["data"]["keys"]["2"]
    clock[0] = created + TL.promotion_delay
    assert codec.unseal(codec.seal(b"c")).kid == f"{name}-v2"
    states = {s["kid"]: s["state"] for s in mgr.status()["keys"]}
    assert states == {f"{name}-v1": "verify-only", f"{name}-v2": "primary"}
    mgr.stop()


# ------------------------------------------------------------------------- Kubernetes
def _fake_kubernetes_api() -> tuple[Loopback, list[str]]:
    """A TokenReview endpoint standing in for the Kubernetes API server.

    This is the one stand-in in these tests: OpenBao's real kubernetes auth method calls
    it, and there is no Kubernetes cluster to call instead. Tokens ending in ``.sig``
    review as service account mcp/statecodec; anything else is refused.
    """
    reviewed: list[str] = []

    class TokenReview(Quiet):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            token = body["spec"]["token"]
            reviewed.append(token)
            status: dict[str, Any] = {"authenticated": token.endswith(".sig")}
            if status["authenticated"]:
                status["user"] = {"username": "system:serviceaccount:mcp:statecodec", "uid": "uid-1"}
            self.reply_json(
                201, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "status": status}
            )

    return Loopback(TokenReview), reviewed


def _service_account_jwt(serial: int) -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    claims = {
        "iss": "kubernetes/serviceaccount",
        "sub": "system:serviceaccount:mcp:statecodec",
        "kubernetes.io/serviceaccount/namespace": "mcp",
        "kubernetes.io/serviceaccount/service-account.name": "statecodec",
        "kubernetes.io/serviceaccount/service-account.uid": "uid-1",
        "serial": serial,
    }
    return f"{part({'alg': 'RS256'})}.{part(claims)}.sig"


def test_kubernetes_login_rereads_the_service_account_token(
    openbao: OpenBao, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    api, reviewed = _fake_kubernetes_api()
    try:
        name, policy = service_key(openbao)
        root = openbao.client()
        mount = unique("k8s")
        root.sys.enable_auth_method("kubernetes", path=mount)
        root.auth.kubernetes.configure(
            kubernetes_host=api.base,
            kubernetes_ca_cert=make_ca("test-kubernetes-ca").cert_pem,
            token_reviewer_jwt="reviewer",
            disable_local_ca_jwt=True,
            mount_point=mount,
        )
        root.auth.kubernetes.create_role(
            "svc",
            bound_service_account_names=["statecodec"],
            bound_service_account_namespaces=["mcp"],
            policies=[policy],
            ttl="1h",
            mount_point=mount,
        )
        jwt_file = tmp_path / "token"
        jwt_file.write_text(_service_account_jwt(1))
        clean_vault_env(monkeypatch, tmp_path)
        monkeypatch.setenv("VAULT_ADDR", openbao.addr)
        monkeypatch.setenv("VAULT_K8S_ROLE", "svc")
        monkeypatch.setenv("VAULT_K8S_JWT_PATH", str(jwt_file))
        monkeypatch.setenv("VAULT_K8S_MOUNT", mount)

        src: Any = source_from_url(f"vault-transit:transit/{name}")
        assert len(src.load()) == 1
        assert reviewed == [_service_account_jwt(1)]
        # kubelet rotates the projected token; a re-login (after a 403) must use the new one.
        jwt_file.write_text(_service_account_jwt(2))
        root.auth.token.revoke(src.session._client.token)
        assert len(src.load()) == 1
        assert reviewed[-1] == _service_account_jwt(2)

        jwt_file.write_text("not-a-service-account-token")
        with pytest.raises(KeySourceError, match="kubernetes login failed") as info:
            source_from_url(f"vault-transit:transit/{name}").load()
        assert info.value.kind == "denied"
        jwt_file.unlink()
        with pytest.raises(KeySourceError, match="cannot read the Kubernetes service account token") as info:
            source_from_url(f"vault-transit:transit/{name}").load()
        assert info.value.kind == "config"
    finally:
        api.close()
