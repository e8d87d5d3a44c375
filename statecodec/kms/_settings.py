"""Where Vault/OpenBao is and how to log in: from the standard environment or arguments.

Kept apart from :mod:`._vault` so describing a source never imports hvac.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

AuthMethod = Literal["approle", "kubernetes", "token"]

DEFAULT_K8S_JWT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"

# field name -> environment variable (OpenBao's BAO_* spelling is accepted as well).
# Variable names, not values: nothing secret is written here.
_ENV = {  # nosec B105
    "addr": "VAULT_ADDR",
    "token": "VAULT_TOKEN",
    "cacert": "VAULT_CACERT",
    "namespace": "VAULT_NAMESPACE",
    "role_id": "VAULT_ROLE_ID",
    "secret_id": "VAULT_SECRET_ID",
    "approle_mount": "VAULT_APPROLE_MOUNT",
    "k8s_role": "VAULT_K8S_ROLE",
    "k8s_jwt_path": "VAULT_K8S_JWT_PATH",
    "k8s_mount": "VAULT_K8S_MOUNT",
}


@dataclass(frozen=True, slots=True)
class VaultSettings:
    """Connection and login settings. Unset fields come from the environment.

    Login method, first match wins: AppRole (``role_id`` + ``secret_id``), Kubernetes
    (``k8s_role``; the service account JWT is re-read at each login because kubelet
    rotates it), then a token (``VAULT_TOKEN``, else ``~/.vault-token``). AppRole and
    Kubernetes logins are repeated whenever Vault answers 403, so a revoked or expired
    token heals itself; a plain token cannot.

    ``timeout`` bounds every HTTP call (hvac's default of 30 s would stall a refresh);
    idempotent reads are retried ``retries`` times with exponential backoff from
    ``backoff`` seconds. Writes are never retried blindly: a rotation that timed out may
    have happened. Transit writes re-read the key after a failure and are tried again
    only when it shows they did not happen (OpenBao fails one of two racing writes).
    """

    addr: str | None = None
    token: str | None = field(default=None, repr=False)
    cacert: str | None = None
    namespace: str | None = None
    role_id: str | None = None
    secret_id: str | None = field(default=None, repr=False)
    approle_mount: str = "approle"
    k8s_role: str | None = None
    k8s_jwt_path: str = DEFAULT_K8S_JWT_PATH
    k8s_mount: str = "kubernetes"
    timeout: float = 3.0
    retries: int = 2
    backoff: float = 0.2

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> VaultSettings:
        """Settings from ``VAULT_*`` (or ``BAO_*``) variables; keyword arguments win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, var in _ENV.items():
            value = env.get(var) or env.get("BAO_" + var.removeprefix("VAULT_"))
            if value:
                values[name] = value
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown Vault setting(s): {', '.join(sorted(unknown))}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def auth_method(self) -> AuthMethod:
        if self.role_id:
            return "approle"
        if self.k8s_role:
            return "kubernetes"
        return "token"

    def where(self) -> str:
        """``http://127.0.0.1:8200`` plus the namespace, for messages."""
        addr = self.addr or "(VAULT_ADDR not set)"
        return f"{addr} namespace {self.namespace}" if self.namespace else addr
