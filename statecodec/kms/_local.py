"""Key sources on this machine: a keyring JSON file, an environment variable."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from .. import _format, _telemetry
from .._keys import MIN_SECRET_BYTES, KeyRing
from ._document import Change, DocumentSource
from ._errors import KeySourceError, Kind
from ._source import KeySource, require_keys

logger = logging.getLogger("statecodec.kms")

#: The kid of a ring made from one bare secret. Fixed, so every instance agrees on it.
ENV_SECRET_KID = "k0"  # noqa: S105  # nosec B105 - a key id, not a secret


class FileSource(DocumentSource):
    """``file:PATH``: a keyring JSON file (:meth:`KeyRing.to_json`), rewritten atomically on rotation."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self.url = f"file:{path}"
        self._warned_mode = False

    def describe(self) -> str:
        return f"file:{self.path}"

    def load(self) -> KeyRing:
        try:
            text = self.path.read_bytes()
            mode = self.path.stat().st_mode
        except FileNotFoundError:
            raise self._error(
                f"no such file (create it with `statecodec keys init --keys {self.url}`)", "missing"
            ) from None
        except PermissionError:
            raise self._error("permission denied reading the key file", "denied") from None
        except IsADirectoryError:
            raise self._error("is a directory; give the path of the key file in it", "config") from None
        except OSError as exc:
            raise self._error(f"cannot read the key file: {exc.strerror}", _read_failure(exc)) from None
        if mode & 0o077 and not self._warned_mode:
            self._warned_mode = True
            logger.warning(
                "%s is readable by group or others (mode %o); it holds secrets: chmod 600",
                self.describe(),
                stat.S_IMODE(mode),
                extra=_telemetry.fields("key_file_exposed", source=self.describe()),
            )
        try:
            return require_keys(KeyRing.from_json(text), self.describe())
        except ValueError as exc:
            raise self._error(str(exc), "invalid") from None

    def _update(self, change: Change) -> None:
        # The lock makes two concurrent writers take turns: the second reads the first's
        # result (a rotation then finds a fresh newest key and does nothing).
        with self._locked():
            new = change(self.load())
            if new is None:
                return
            try:
                mode = stat.S_IMODE(self.path.stat().st_mode)  # kept: the operator chose it
                write_key_file(self.path, new.to_json(), replace=True, mode=mode)
            except PermissionError:
                raise self._error("permission denied writing the key file's directory", "denied") from None

    def init(self, *, key_type: str, now: float) -> str:
        ring = KeyRing.generate(created_at=int(now))
        try:
            write_key_file(self.path, ring.to_json(), replace=False)
        except FileExistsError:
            self.load()  # an existing file must at least be a valid ring
            return f"{self.describe()} already exists; left unchanged"
        except PermissionError:
            raise self._error("permission denied creating the key file", "denied") from None
        except OSError as exc:
            raise self._error(f"cannot create the key file: {exc.strerror}", "config") from None
        return f"{self.describe()}: created a key ring with key {ring.primary_kid} (mode 600)"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl  # noqa: PLC0415 - POSIX only, and only the rotation job needs it

        lock_path = self.path.with_name(f".{self.path.name}.lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            kind: Kind = "denied" if isinstance(exc, PermissionError) else "unreachable"
            raise self._error(f"cannot create the lock file {lock_path}: {exc.strerror}", kind) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _error(self, message: str, kind: Kind) -> KeySourceError:
        return KeySourceError(message, kind=kind, source=self.describe())


#: errno values of a read that may succeed if retried as it is (a network file system
#: timing out or losing its server, a device error): the source is down, not misconfigured.
_TRANSIENT_ERRNOS: Final = frozenset(
    {errno.EIO, errno.ETIMEDOUT, errno.ESTALE, errno.ENOTCONN, errno.EAGAIN, errno.EBUSY, errno.EINTR}
)


def _read_failure(exc: OSError) -> Kind:
    """``unreachable`` (retry later, exit 7) only for a failure retrying can cure; else ``config``.

    A path that is a directory, goes through a file, loops or is too long is the
    deployment's mistake: a scheduler that retried it on exit 7 would retry forever.
    """
    return "unreachable" if exc.errno in _TRANSIENT_ERRNOS else "config"


def write_key_file(path: Path, text: str, *, replace: bool, mode: int = 0o600) -> None:
    """Write a secret file durably, so that readers see the old content or the new, never half.

    ``replace=False`` creates the file (``FileExistsError`` if it exists) with ``mode``
    from the first byte: no window in which another user could open it. ``replace=True``
    writes a temporary file in the same directory (``mkstemp``: private and unique),
    sets ``mode`` and renames it over ``path``. Either way the data is fsynced, then the
    directory, so the new name survives a crash too.
    """
    if not replace:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    else:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class EnvSource(KeySource):
    """``env:NAME``: a keyring JSON, or one base64url secret of 32+ bytes, in a variable.

    A bare secret becomes a ring of one key with kid ``k0``, created at 0 (so it mints at
    once). It cannot rotate without downtime; use a keyring JSON for that.
    """

    def __init__(self, name: str) -> None:
        if not name or "=" in name or "\0" in name:
            raise KeySourceError(f"invalid environment variable name {name!r}", kind="config")
        self.name = name
        self.url = f"env:{name}"

    def describe(self) -> str:
        return self.url

    def load(self) -> KeyRing:
        value = os.environ.get(self.name)
        if value is None or not value.strip():
            raise KeySourceError(
                f"environment variable {self.name} is not set", kind="config", source=self.url
            )
        value = value.strip()
        if value.startswith("{"):
            try:
                return require_keys(KeyRing.from_json(value), self.url)
            except ValueError as exc:
                raise KeySourceError(str(exc), kind="invalid", source=self.url) from None
        try:
            secret = _format.b64decode(value)
        except ValueError:
            secret = b""
        # Never echo the value: it is (meant to be) a secret.
        if len(secret) < MIN_SECRET_BYTES:
            raise KeySourceError(
                f"{self.name} is neither a keyring JSON nor an unpadded base64url secret of at least "
                f"{MIN_SECRET_BYTES} bytes "
                "(make one: python -c 'import secrets; print(secrets.token_urlsafe(32))')",
                kind="invalid",
                source=self.url,
            )
        return KeyRing.from_secret(secret, ENV_SECRET_KID, created_at=0)
