"""Where Vault/OpenBao is and how to log in: from the standard environment or arguments.

Kept apart from :mod:`._vault` so describing a source never imports hvac.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

AuthMethod = Literal["client", "approle", "kubernetes", "jwt", "cert", "token"]

DEFAULT_K8S_JWT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"

# field name -> environment variable (OpenBao's BAO_* spelling is accepted as well).
# Variable names, not values: nothing secret is written here.
_ENV = {  # nosec B105
    "addr": "VAULT_ADDR",
    "token": "VAULT_TOKEN",
    "cacert": "VAULT_CACERT",
    "capath": "VAULT_CAPATH",
    "client_cert": "VAULT_CLIENT_CERT",
    "client_key": "VAULT_CLIENT_KEY",
    "tls_server_name": "VAULT_TLS_SERVER_NAME",
    "namespace": "VAULT_NAMESPACE",
    "role_id": "VAULT_ROLE_ID",
    "secret_id": "VAULT_SECRET_ID",
    "approle_mount": "VAULT_APPROLE_MOUNT",
    "k8s_role": "VAULT_K8S_ROLE",
    "k8s_jwt_path": "VAULT_K8S_JWT_PATH",
    "k8s_mount": "VAULT_K8S_MOUNT",
    "jwt_role": "VAULT_JWT_ROLE",
    "jwt_path": "VAULT_JWT_PATH",
    "jwt": "VAULT_JWT",
    "jwt_mount": "VAULT_JWT_MOUNT",
    "cert_role": "VAULT_CERT_ROLE",
    "cert_mount": "VAULT_CERT_MOUNT",
}

#: Every environment variable :meth:`VaultSettings.from_env` reads, ``VAULT_`` spelling.
ENV_VARS = tuple(_ENV.values())


@dataclass(frozen=True, slots=True)
class VaultSettings:
    """Connection and login settings. Unset fields come from the environment.

    Login method, first match wins: your own authenticated ``client`` (an
    ``hvac.Client``: statecodec neither logs it in, renews it nor closes it), AppRole
    (``role_id`` + ``secret_id``), Kubernetes (``k8s_role``; the service account JWT is
    re-read at each login because kubelet rotates it), JWT/OIDC (``jwt_role``; the JWT is
    re-read from ``jwt_path`` at each login because CI tokens live minutes, else taken
    from ``jwt``), TLS certificate (``cert_role``, with ``client_cert``/``client_key``),
    then a token (``VAULT_TOKEN``, else ``~/.vault-token``). Every login method is
    repeated whenever Vault answers 403, so a revoked or expired token heals itself; a
    plain token or your own client cannot.

    TLS: ``cacert`` (a PEM bundle) or ``capath`` (a directory of PEM files; both may be
    given) replace the default CA bundle; ``client_cert``/``client_key`` present a client
    certificate (also for other login methods, when Vault's listener requires one);
    ``tls_server_name`` is the name the server certificate must carry when ``addr`` holds
    another (an IP address, a tunnel). Verification is never turned off.

    ``timeout`` bounds every HTTP call (hvac's default of 30 s would stall a refresh);
    idempotent reads are retried ``retries`` times with exponential backoff from
    ``backoff`` seconds. Writes are never retried blindly: a rotation that timed out may
    have happened. Transit writes re-read the key after a failure and are tried again
    only when it shows they did not happen (OpenBao fails one of two racing writes).
    """

    addr: str | None = None
    token: str | None = field(default=None, repr=False)
    cacert: str | None = None
    capath: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    tls_server_name: str | None = None
    namespace: str | None = None
    role_id: str | None = None
    secret_id: str | None = field(default=None, repr=False)
    approle_mount: str = "approle"
    k8s_role: str | None = None
    k8s_jwt_path: str = DEFAULT_K8S_JWT_PATH
    k8s_mount: str = "kubernetes"
    jwt_role: str | None = None
    jwt_path: str | None = None
    jwt: str | None = field(default=None, repr=False)
    jwt_mount: str = "jwt"
    cert_role: str | None = None
    cert_mount: str = "cert"
    client: Any = field(default=None, repr=False, compare=False)
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
        if self.client is not None:
            return "client"
        if self.role_id:
            return "approle"
        if self.k8s_role:
            return "kubernetes"
        if self.jwt_role:
            return "jwt"
        if self.cert_role:
            return "cert"
        return "token"

    @property
    def relogin(self) -> bool:
        """Whether a 403 can be cured by logging in again (not with a fixed token or client)."""
        return self.auth_method not in ("token", "client")

    def where(self) -> str:
        """``http://127.0.0.1:8200`` plus the namespace, for messages."""
        addr = self.addr or getattr(self.client, "url", None) or "(VAULT_ADDR not set)"
        return f"{addr} namespace {self.namespace}" if self.namespace else addr
