"""TLS to Vault/OpenBao as its own CLI does it: VAULT_CACERT, VAULT_CAPATH, client certificates, server name.

requests verifies against one CA bundle file or an OpenSSL *hashed* directory, and has no
notion of a server name other than the URL's host. Vault's CLI reads every PEM file in
``VAULT_CAPATH`` and can check the certificate against ``VAULT_TLS_SERVER_NAME``. So the
session gets one :class:`ssl.SSLContext` built here from the settings, and an adapter
that hands it (and the server name) to urllib3 and keeps requests from adding its own
CA bundle or certificate files. Building the context reads every file at once, so a
missing or broken CA or certificate file is a configuration error before any request.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import requests
import requests.adapters
import requests.utils

from ._settings import VaultSettings


class TLSConfigError(ValueError):
    """A CA, certificate or key file named in the settings cannot be used."""


def tls_session(settings: VaultSettings) -> requests.Session:
    """A requests session whose HTTPS connections use exactly the settings' TLS configuration."""
    session = requests.Session()
    session.mount("https://", _VaultTLSAdapter(tls_context(settings), settings.tls_server_name))
    return session


def tls_context(s: VaultSettings) -> ssl.SSLContext:
    """Verifying context: the configured CAs (else requests' default bundle) and the client certificate."""
    if not (s.cacert or s.capath):
        context = ssl.create_default_context(cafile=requests.utils.DEFAULT_CA_BUNDLE_PATH)
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifying, hostname-checking, no CA yet
    if s.cacert:
        _load_ca(context, Path(s.cacert), "VAULT_CACERT")
    if s.capath:
        directory = Path(s.capath)
        if not directory.is_dir():
            raise TLSConfigError(f"VAULT_CAPATH={s.capath} is not a readable directory")
        files = sorted(p for p in directory.iterdir() if p.is_file())
        if not files:
            raise TLSConfigError(f"VAULT_CAPATH={s.capath} holds no CA certificate files")
        for path in files:
            _load_ca(context, path, "a file in VAULT_CAPATH")
    if s.client_cert:
        try:
            context.load_cert_chain(s.client_cert, s.client_key)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(
                f"cannot use the client certificate VAULT_CLIENT_CERT={s.client_cert}"
                f"{f' with VAULT_CLIENT_KEY={s.client_key}' if s.client_key else ''}: {_reason(exc)}"
            ) from None
    elif s.client_key:
        raise TLSConfigError("VAULT_CLIENT_KEY is set but VAULT_CLIENT_CERT is not")
    return context


def _load_ca(context: ssl.SSLContext, path: Path, what: str) -> None:
    try:
        context.load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        name = f"VAULT_CACERT={path}" if what == "VAULT_CACERT" else f"{path} ({what})"
        raise TLSConfigError(f"{name} is not a readable PEM CA bundle: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


def certificate_problem(exc: BaseException) -> str | None:
    """What is wrong when a TLS failure is a configuration problem, or None when it may pass.

    A certificate that does not verify, or a server that refuses ours, will fail again on
    every retry; a handshake cut short by a restarting server will not.
    """
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError):
            return e.verify_message or "certificate verify failed"
        if isinstance(e, ssl.SSLError) and any(word in (e.reason or "") for word in _REFUSED):
            return f"the server refused our client certificate ({_reason(e)})"
        linked = (*e.args, getattr(e, "reason", None), e.__cause__, e.__context__)
        todo += [x for x in linked if isinstance(x, BaseException)]
    return None


#: Alert reasons OpenSSL reports when the server rejects (or wanted) our client certificate.
_REFUSED = ("CERTIFICATE", "UNKNOWN_CA")


class _VaultTLSAdapter(requests.adapters.HTTPAdapter):
    """Every HTTPS pool, direct or through a proxy, uses our context and server name."""

    def __init__(self, context: ssl.SSLContext, server_name: str | None) -> None:
        self._tls: dict[str, Any] = {"ssl_context": context}
        if server_name:
            # SNI and the name the certificate must match (the context checks hostnames).
            self._tls["server_hostname"] = server_name
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **{**kwargs, **self._tls})

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        return super().proxy_manager_for(proxy, **{**kwargs, **self._tls})

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        # requests would add its CA bundle (or REQUESTS_CA_BUNDLE) and hvac's
        # VAULT_CLIENT_CERT to the pool; the context already holds exactly what is wanted.
        conn.cert_reqs = "CERT_REQUIRED"
        conn.ca_certs = conn.ca_cert_dir = None
        conn.cert_file = conn.key_file = None
