"""One authenticated hvac client per source: login, renewal, retries, and plain-English errors.

hvac never renews tokens and raises a zoo of exceptions (some from ``requests``). This
module is the only place that knows either, so the sources read like the Vault docs and
every failure reaches the operator as one :class:`KeySourceError` saying what to fix.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import hvac
import hvac.exceptions as hx
import requests

from .. import _telemetry
from ._answers import token_lookup
from ._errors import KeySourceError, Kind
from ._settings import VaultSettings
from ._tls import TLSConfigError, certificate_problem, tls_session

logger = logging.getLogger("statecodec.kms")

T = TypeVar("T")

#: Worth retrying on an idempotent read: the server or the network may recover.
_TRANSIENT = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    hx.VaultDown,
    hx.InternalServerError,
    hx.BadGateway,
    hx.RateLimitExceeded,
)
_DENIED = (hx.Forbidden, hx.Unauthorized)

#: Login method -> the setting naming its mount, and that setting's variable (for messages).
_MOUNTS = {
    "approle": ("approle_mount", "VAULT_APPROLE_MOUNT"),
    "kubernetes": ("k8s_mount", "VAULT_K8S_MOUNT"),
    "jwt": ("jwt_mount", "VAULT_JWT_MOUNT"),
    "cert": ("cert_mount", "VAULT_CERT_MOUNT"),
}


class VaultSession:
    """Lazily connects and logs in; renews the token at 2/3 of its lease; re-logs in on 403.

    With ``settings.client`` (a caller's authenticated ``hvac.Client``) it does none of
    that: the caller owns the client's token and connection, and a 403 is final.
    """

    def __init__(self, settings: VaultSettings, source: str) -> None:
        self.settings = settings
        self.source = source
        self.logins = 0  # for tests and status pages
        self.renewals = 0
        self._client: Any = None
        self._logged_in = False
        self._renew_at: float | None = None
        self._lease = 0.0
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ calls
    def read(self, what: str, call: Callable[[Any], T], *, missing: str | None = None) -> T:
        """An idempotent call: retried with backoff on transient failures."""
        return self._call(what, call, 1 + max(0, self.settings.retries), missing)

    def write(self, what: str, call: Callable[[Any], T], *, missing: str | None = None) -> T:
        """A call that changes state: never retried, except after a 403 (the write was refused)."""
        return self._call(what, call, 1, missing)

    def _call(self, what: str, call: Callable[[Any], T], attempts: int, missing: str | None) -> T:
        relogged = False
        attempt = 0
        while True:
            try:
                with self._lock:
                    client = self._ready()
                return call(client)
            except _DENIED as exc:
                if relogged or not self.settings.relogin:
                    raise self._error(self._denied(what, exc), "denied") from None
                relogged = True  # the token may have expired or been revoked: log in again, once
                logger.info(
                    "%s: Vault answered 403 %s; logging in again",
                    self.source,
                    what,
                    extra={
                        **_telemetry.fields("vault_relogin", source=self.source, reason="denied"),
                        "auth_method": self.settings.auth_method,
                    },
                )
                with self._lock:
                    self._logged_in = False
            except _TRANSIENT as exc:
                problem = certificate_problem(exc) if isinstance(exc, requests.exceptions.SSLError) else None
                if problem is not None:  # fails the same way on every retry: the settings are wrong
                    raise self._error(self._tls_problem(problem), "config") from None
                attempt += 1
                if attempt >= attempts:
                    raise self._error(self._unreachable(exc), "unreachable") from None
                self.pause(attempt)
            except hx.InvalidPath:
                raise self._error(missing or f"not found: {what}", "missing") from None
            except hx.InvalidRequest as exc:
                # KV v2 answers 400 when a check-and-set loses: another writer came first.
                kind: Kind = "conflict" if "check-and-set" in _message(exc) else "invalid"
                raise self._error(f"Vault refused {what}: {_message(exc)}", kind) from None
            except hx.VaultError as exc:
                raise self._error(f"unexpected answer {what}: {_message(exc)}", "internal") from None
            except (KeyError, TypeError, AttributeError) as exc:
                # A 200 whose document lacks what the call reads ({} for {"auth": ...}): the
                # source answered, but not usably (exit 3), not a crash of statecodec (70).
                why = f"Vault answered {what} with a malformed document ({type(exc).__name__})"
                raise self._error(why, "invalid") from None
            except requests.exceptions.RequestException as exc:
                raise self._error(f"{what}: {type(exc).__name__}", "unreachable") from None

    def pause(self, attempt: int) -> None:
        """Sleep before retry number ``attempt`` (1, 2, ...): exponential backoff with jitter."""
        delay = self.settings.backoff * 3 ** (attempt - 1)
        time.sleep(delay * random.uniform(0.5, 1.5))  # nosec B311 - jitter, not a secret

    def close(self) -> None:
        with self._lock:
            if self._client is not None and self.settings.client is None:
                self._client.adapter.close()  # a caller's own client stays open
            self._client = None
            self._logged_in = False

    # ------------------------------------------------------------ login/renew
    def _ready(self) -> Any:
        client = self._client or self._connect()
        if not self._logged_in:
            self._login(client)
        elif self._renew_at is not None and time.monotonic() >= self._renew_at:
            self._renew(client)
        return client

    def _connect(self) -> Any:
        s = self.settings
        if s.client is not None:
            self._client = s.client
            return self._client
        if not s.addr:
            raise self._error(
                "VAULT_ADDR is not set (export VAULT_ADDR=https://vault.example:8200)", "config"
            )
        session = None  # plain HTTP (a dev server, a local agent): no TLS to configure
        if s.addr.lower().startswith("https://"):
            try:
                session = tls_session(s)
            except TLSConfigError as exc:
                raise self._error(str(exc), "config") from None
        # token="" keeps hvac from reading VAULT_TOKEN behind our back; _login sets it.
        self._client = hvac.Client(
            url=s.addr,
            token="",  # nosec B106 - empty: no token until _login
            session=session,
            timeout=s.timeout,
            namespace=s.namespace,
        )
        return self._client

    def _login(self, client: Any) -> None:
        method = self.settings.auth_method
        try:
            auth = self._authenticate(client, method)
        except (hx.InvalidRequest, hx.InvalidPath, *_DENIED) as exc:
            # Vault answers 403 to a login at a path where nothing is mounted, too.
            raise self._error(
                f"{method} login failed: {_message(exc)} ({self._login_hint(method)})", "denied"
            ) from None
        self.logins += 1
        self._logged_in = True
        self._schedule(float(auth.get("lease_duration") or 0), bool(auth.get("renewable")))

    def _authenticate(self, client: Any, method: str) -> dict[str, Any]:
        """Log in with ``method``; the token's ``auth`` block (lease, renewable)."""
        s = self.settings
        if method == "client":
            return {}  # the caller's token: never renewed here, so its lease does not matter
        if method == "token":
            client.token = s.token or _token_file()
            if not client.token:
                raise self._error(
                    "no Vault credentials: set VAULT_TOKEN, or VAULT_ROLE_ID and VAULT_SECRET_ID (AppRole), "
                    "VAULT_K8S_ROLE (Kubernetes), VAULT_JWT_ROLE (JWT/OIDC) or VAULT_CERT_ROLE "
                    "(TLS certificate)",
                    "config",
                )
            return self._lookup_self(client)
        if method == "approle":
            if not s.secret_id:
                raise self._error("VAULT_ROLE_ID is set but VAULT_SECRET_ID is not", "config")
            answer = client.auth.approle.login(s.role_id, s.secret_id, mount_point=s.approle_mount)
        elif method == "kubernetes":
            jwt = self._read_jwt(s.k8s_jwt_path, "the Kubernetes service account token")
            answer = client.auth.kubernetes.login(s.k8s_role, jwt, mount_point=s.k8s_mount)
        elif method == "jwt":
            answer = client.auth.jwt.jwt_login(s.jwt_role, self._jwt(), path=s.jwt_mount)
        else:  # cert: the client certificate is presented by the TLS handshake itself (see _tls)
            if not s.client_cert:
                raise self._error(
                    "VAULT_CERT_ROLE is set but VAULT_CLIENT_CERT is not (the certificate to log in with)",
                    "config",
                )
            answer = client.adapter.login(f"/v1/auth/{s.cert_mount}/login", json={"name": s.cert_role})
        return dict(answer["auth"])

    def _login_hint(self, method: str) -> str:
        """What to check when a login fails: where the method is mounted, and its credentials."""
        s = self.settings
        field, var = _MOUNTS[method]
        where = f"is the {method} auth method enabled at auth/{getattr(s, field)}/ ({var})"
        if method == "jwt":
            source = f"VAULT_JWT_PATH={s.jwt_path}" if s.jwt_path else "VAULT_JWT"
            return f"{where}, and is the JWT from {source} current and within role {s.jwt_role}'s bounds?"
        if method == "cert":
            issuer = f"the CA that issued VAULT_CLIENT_CERT={s.client_cert}"
            return f"{where}, and does role {s.cert_role} trust {issuer}?"
        if method == "kubernetes":
            return f"{where}, and does role {s.k8s_role} accept this service account?"
        return f"{where}, and are VAULT_ROLE_ID and VAULT_SECRET_ID current?"

    def _lookup_self(self, client: Any) -> dict[str, Any]:
        # Only to learn the lease; a token without the default policy still works unrenewed.
        try:
            answer = client.auth.token.lookup_self()
        except _DENIED:
            return {}
        try:
            return token_lookup(answer)
        except ValueError as exc:  # a malformed 200: a key-source error, not a crash (exit 3)
            raise self._error(f"Vault answered with a malformed document: {exc}", "invalid") from None

    def _renew(self, client: Any) -> None:
        try:
            auth = client.auth.token.renew_self()["auth"]
        except (hx.InvalidRequest, hx.InternalServerError, *_DENIED) as exc:
            # Past its max TTL, or revoked: a new login is the only cure.
            if not self.settings.relogin:
                logger.warning(
                    "%s: renewing VAULT_TOKEN failed (%s); it will expire",
                    self.source,
                    _message(exc),
                    extra=_telemetry.fields("vault_renew_failed", source=self.source, detail=_message(exc)),
                )
                self._renew_at = None
                return
            self._login(client)
            return
        lease = float(auth.get("lease_duration") or 0)
        self.renewals += 1
        if lease < self._lease and self.settings.relogin:
            # The lease was capped by the token's max TTL: start afresh instead of
            # renewing an ever shorter lease until it dies between two refreshes.
            self._login(client)
            return
        self._schedule(lease, bool(auth.get("renewable")))

    def _schedule(self, lease: float, renewable: bool) -> None:
        self._lease = lease
        self._renew_at = time.monotonic() + lease * 2 / 3 if renewable and lease > 0 else None

    def _jwt(self) -> str:
        s = self.settings
        if s.jwt_path:  # re-read at every login: CI systems hand out JWTs that live minutes
            return self._read_jwt(s.jwt_path, "the JWT in VAULT_JWT_PATH")
        if s.jwt:
            return s.jwt
        raise self._error("VAULT_JWT_ROLE is set but neither VAULT_JWT_PATH nor VAULT_JWT is", "config")

    def _read_jwt(self, file: str, what: str) -> str:
        path = Path(file)
        try:
            return path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise self._error(f"cannot read {what} {path}: {reason}", "config") from None

    # ----------------------------------------------------------------- errors
    def _error(self, message: str, kind: Kind) -> KeySourceError:
        return KeySourceError(message, kind=kind, source=self.source)

    def _tls_problem(self, problem: str) -> str:
        where = self.settings.where()
        if "refused our client certificate" in problem:
            return f"TLS handshake with {where} failed: {problem}; set VAULT_CLIENT_CERT and VAULT_CLIENT_KEY"
        if "mismatch" in problem.lower():
            return (
                f"TLS verification of {where} failed: {problem}; use an address the certificate names, "
                "or set VAULT_TLS_SERVER_NAME to a name it holds"
            )
        return (
            f"TLS verification of {where} failed: {problem}; set VAULT_CACERT (or VAULT_CAPATH) to the CA "
            "that signed the server's certificate"
        )

    def _unreachable(self, exc: BaseException) -> str:
        where = self.settings.where()
        if isinstance(exc, requests.exceptions.SSLError):
            return f"TLS handshake with {where} failed ({type(exc).__name__}); is VAULT_ADDR right?"
        if isinstance(exc, requests.exceptions.Timeout):
            return f"Vault at {where} did not answer within {self.settings.timeout:g}s"
        if isinstance(exc, requests.exceptions.ConnectionError):
            cause = "connection refused" if "refused" in str(exc).lower() else "connection failed"
            return f"cannot connect to Vault at {where} ({cause}); is it running, and is VAULT_ADDR right?"
        if isinstance(exc, hx.VaultDown):
            return f"Vault at {where} is sealed or in standby (503)"
        return f"Vault at {where} failed: {type(exc).__name__}: {_message(exc)}"

    @staticmethod
    def _denied(what: str, exc: BaseException) -> str:
        return (
            f"permission denied {what} ({_message(exc)}): the token's policies do not allow it, or the "
            "token expired or was revoked (the policies statecodec needs ship in statecodec/data/policies/)"
        )


def _message(exc: BaseException) -> str:
    """One line: ``1 error occurred:\\n\\t* permission denied\\n\\n`` -> the error."""
    if isinstance(exc, hx.VaultError):
        text = "; ".join(exc.errors) if exc.errors else str(exc.args[0] if exc.args else type(exc).__name__)
    else:
        text = str(exc)
    text = _ERROR_COUNT.sub("", text)
    return "; ".join(part for line in text.splitlines() if (part := line.strip().removeprefix("* ").strip()))


#: The go-multierror header Vault puts before its list of errors.
_ERROR_COUNT = re.compile(r"\b\d+ errors? occurred:")


def _token_file() -> str | None:
    try:
        return (Path.home() / ".vault-token").read_text(encoding="utf-8").strip() or None
    except OSError:
        return None
