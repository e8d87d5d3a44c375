"""One string names a key source, in code and on the command line (``--keys``)."""

from __future__ import annotations

from typing import Any

from .._extras import missing_extra
from ._errors import KeySourceError
from ._local import EnvSource, FileSource
from ._settings import VaultSettings
from ._source import KeySource

URL_FORMS = (
    "file:PATH",
    "env:NAME",
    "vault-transit:MOUNT/NAME",
    "vault-kv:MOUNT/PATH",
)


def source_from_url(
    url: str, *, vault: VaultSettings | None = None, export: str | None = None, **vault_options: Any
) -> KeySource:
    """The :class:`KeySource` that ``url`` names. Nothing is read or connected yet.

    Vault sources take their address and credentials from ``vault`` or the ``VAULT_*``
    environment (:meth:`VaultSettings.from_env`); ``vault_options`` override single
    fields (``timeout=2``, ``role_id=...``, or ``client=`` an ``hvac.Client`` your
    service has already authenticated). ``export`` picks the transit export type
    (``encryption-key`` or ``hmac-key``; by default the one the key's type has).
    """
    scheme, sep, rest = url.partition(":")
    if not sep or not rest:
        raise _bad(url, "expected SCHEME:VALUE")
    if scheme == "file":
        # file:///etc/x and file:/etc/x both mean /etc/x; file://host/... is not a thing here.
        return FileSource(rest[2:] if rest.startswith("///") else rest)
    if scheme == "env":
        return EnvSource(rest)
    if scheme in ("vault-transit", "vault-kv"):
        settings = vault or VaultSettings.from_env(**vault_options)
        if scheme == "vault-transit":
            # The key name is the last segment; a mount may be nested (team/transit).
            mount, _, name = rest.rpartition("/")
            _check_path(url, mount, name)
            try:
                from ._transit import TransitSource  # noqa: PLC0415 - hvac only when Vault is used
            except ModuleNotFoundError as exc:
                raise _without_vault(url, exc) from None
            return TransitSource(mount, name, settings, export=export)
        # A KV mount is the first segment; the document path may be nested.
        mount, _, path = rest.partition("/")
        _check_path(url, mount, path)
        try:
            from ._kv import KVSource  # noqa: PLC0415
        except ModuleNotFoundError as exc:
            raise _without_vault(url, exc) from None
        return KVSource(mount, path, settings)
    raise _bad(url, f"unknown scheme {scheme!r}")


def _check_path(url: str, mount: str, rest: str) -> None:
    if not mount or not rest or "//" in f"{mount}/{rest}" or rest.endswith("/") or mount.startswith("/"):
        raise _bad(url, "expected MOUNT/NAME, e.g. vault-transit:transit/mcp-state")


def _without_vault(url: str, exc: ModuleNotFoundError) -> Exception:
    """A configuration error naming the vault extra, or ``exc`` itself if no extra is to blame."""
    missing = missing_extra(exc, "vault", f"the key source {url!r}")
    return exc if missing is None else KeySourceError(str(missing), kind="config")


def _bad(url: str, why: str) -> KeySourceError:
    return KeySourceError(f"bad key source {url!r}: {why}; use one of {', '.join(URL_FORMS)}", kind="config")
