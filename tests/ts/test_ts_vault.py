"""The TypeScript package reads Vault/OpenBao keys as the Python library does (a real OpenBao).

Transit (every exported version one kid, dated by the key's metadata, versions below
``min_decryption_version`` gone) and KV v2 (the key ring document), with a token and with an
AppRole login: the TypeScript ring equals the one ``statecodec.kms`` loads from the same
source, before and after a rotation.
"""

from __future__ import annotations

import uuid
from typing import Any

from fixtures_openbao import OpenBao
from ts_package import SKIPS, run_tool

import statecodec as sc
from statecodec.kms import VaultSettings
from statecodec.kms._kv import KVSource
from statecodec.kms._transit import TransitSource

pytestmark = SKIPS


def ts_load(op: dict[str, Any]) -> dict[str, Any]:
    spec = {"keyring": sc.KeyRing.generate("x").to_dict(), "ops": [{"op": "vault", **op}]}
    (result,) = run_tool("interop", spec)["results"]
    assert "ring" in result, result
    ring: dict[str, Any] = result["ring"]
    return ring


def settings(openbao: OpenBao) -> VaultSettings:
    return VaultSettings(addr=openbao.addr, token=openbao.token)


def test_transit_versions_are_the_same_keys_before_and_after_a_rotation(openbao: OpenBao) -> None:
    name = f"ts-{uuid.uuid4().hex[:8]}"
    root = openbao.client()
    root.secrets.transit.create_key(name, key_type="chacha20-poly1305", exportable=True)
    python = TransitSource("transit", name, settings(openbao))
    op = {
        "kind": "transit",
        "mount": "transit",
        "name": name,
        "options": {"address": openbao.addr, "token": openbao.token},
    }
    assert ts_load(op) == python.load().to_dict()
    root.secrets.transit.rotate_key(name)
    root.secrets.transit.rotate_key(name)
    root.secrets.transit.update_key_configuration(name, min_decryption_version=2)
    ring = ts_load(op)
    assert ring == python.load().to_dict()
    assert [k["kid"] for k in ring["keys"]] == [f"{name}-v2", f"{name}-v3"]


def test_kv_document_and_approle_login(openbao: OpenBao) -> None:
    root = openbao.client()
    mount = f"kv{uuid.uuid4().hex[:6]}"
    root.sys.enable_secrets_engine("kv", path=mount, options={"version": "2"})
    ring = sc.KeyRing.generate("kv1").with_key(sc.Key.generate("kv2"))
    root.secrets.kv.v2.create_or_update_secret("svc/keys", secret=ring.to_dict(), mount_point=mount)
    python = KVSource(mount, "svc/keys", settings(openbao))
    policy = f"ts-{mount}"
    root.sys.create_or_update_policy(policy, f'path "{mount}/data/svc/keys" {{ capabilities = ["read"] }}')
    approle = f"approle{uuid.uuid4().hex[:6]}"
    root.sys.enable_auth_method("approle", path=approle)
    root.auth.approle.create_or_update_approle(
        "svc", token_policies=[policy], token_ttl="60s", mount_point=approle
    )
    role_id = root.auth.approle.read_role_id("svc", mount_point=approle)["data"]["role_id"]
    secret_id = root.auth.approle.generate_secret_id("svc", mount_point=approle)["data"]["secret_id"]
    options = {"address": openbao.addr, "roleId": role_id, "secretId": secret_id, "approleMount": approle}
    got = ts_load({"kind": "kv", "mount": mount, "path": "svc/keys", "options": options})
    assert got == python.load().to_dict() == ring.to_dict()
    # The one-field form: {"keyring": "<JSON text>"}.
    root.secrets.kv.v2.create_or_update_secret(
        "svc/keys", secret={"keyring": ring.to_json()}, mount_point=mount
    )
    assert ts_load({"kind": "kv", "mount": mount, "path": "svc/keys", "options": options}) == ring.to_dict()
    # A wrong secret id is refused, not answered with another ring.
    spec = {
        "keyring": ring.to_dict(),
        "ops": [
            {
                "op": "vault",
                "kind": "kv",
                "mount": mount,
                "path": "svc/keys",
                "options": {**options, "secretId": "nope"},
            }
        ],
    }
    (refused,) = run_tool("interop", spec)["results"]
    assert "AppRole login" in refused["error"]
