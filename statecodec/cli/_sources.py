"""Where the CLI gets keys and replay stores, and how their failures map to exit codes.

The CLI owns none of these: key specs are resolved by :mod:`statecodec.kms`, store URLs by
:mod:`statecodec.replay`. This module only opens them for one command and adapts their
errors to the CLI's failure classes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .._extras import missing_extra
from ..replay.base import ReplayStore
from ._exit import CliError, ExitCode

if TYPE_CHECKING:
    from ..kms import KeyManager


@contextlib.contextmanager
def key_manager(spec: str, *, clock: Callable[[], float], **timeline: Any) -> Iterator[KeyManager]:
    """Keys from ``spec`` loaded once, as the services see them at ``clock()``.

    A :class:`~statecodec.kms.KeyManager` rather than the raw ring: it chooses the primary
    by the rotation timeline and gives replaced keys their retirement time, so ``mint``
    uses the key a server would use and ``verify`` rejects what a server would reject.
    """
    from ..kms import KeyManager  # noqa: PLC0415 - hvac and friends load only when needed

    manager = KeyManager(spec, clock=clock, **timeline)
    try:
        manager.start(background=False)
        yield manager
    finally:
        manager.stop()


def open_store(url: str, *, check: bool = False) -> ReplayStore:
    """The replay store at ``url``; a bad URL or an unopenable store is a store failure (exit 4).

    A store whose extra is not installed is a configuration error (exit 3) naming the extra.

    With ``check``, the store must also answer now (:meth:`ReplayStore.check`: for Redis a
    PING, a cluster's slot map, the replicas ``wait=N`` needs), before the command goes on.
    """
    from ..replay._url import OPEN_ERRORS, checked, redact, store_from_url  # noqa: PLC0415 - only when used

    try:
        store = store_from_url(url)
    except ModuleNotFoundError as exc:  # an extra to install, not a store to retry later
        missing = missing_extra(exc, None, f"the replay store {redact(url)!r}")
        if missing is None:
            raise
        raise CliError(ExitCode.KEYS, str(missing)) from None
    except OPEN_ERRORS as exc:
        raise CliError(ExitCode.STORE, f"cannot open the replay store: {exc}") from None
    try:
        return checked(store) if check else store
    except Exception as exc:  # whatever a custom store raises: it cannot serve
        raise CliError(
            ExitCode.STORE,
            f"the replay store does not answer: {exc}; is it running, and is the --replay URL right?",
            reason="store_unavailable",
        ) from None


def classify_kms_error(exc: Exception) -> CliError | None:
    """The exit code of a key-source failure: retry later (7), fix something (3), or a bug (70)."""
    from ..kms import KeySourceError  # noqa: PLC0415

    if not isinstance(exc, KeySourceError):
        return None
    if exc.transient:
        return CliError(ExitCode.KEY_SOURCE_DOWN, str(exc))
    if exc.kind == "internal":
        return CliError(ExitCode.INTERNAL, f"{exc} (this is a bug in statecodec, please report it)")
    return CliError(ExitCode.KEYS, str(exc))
