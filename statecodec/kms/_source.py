"""What every key source offers, and what a rotation run reports."""

from __future__ import annotations

import abc
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Self

from .._humanize import duration
from .._keys import Key, KeyRing
from ._errors import KeySourceError
from ._policy import RotationRequest
from ._timeline import Timeline

#: Key types ``init_keys`` can create in transit. All export 32 random bytes per version,
#: from which statecodec derives its own subkeys, so the choice does not change tokens.
TRANSIT_KEY_TYPES = ("chacha20-poly1305", "xchacha20-poly1305", "aes256-gcm96", "hmac")


@dataclass(frozen=True, slots=True)
class RotationReport:
    """What one ``rotate()`` run found and did (or, with ``dry_run``, would do)."""

    source: str
    rotated: bool
    newest_kid: str | None  # the newest key after the run
    newest_age: float | None  # the newest key's age before the run, seconds
    new_kid: str | None = None
    retired: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    dry_run: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    held_back: bool = False  # due, but the key of an earlier rotation is still pending (a note says so)

    @property
    def changed(self) -> bool:
        return self.rotated or bool(self.retired or self.removed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "rotated": self.rotated,
            "new_kid": self.new_kid,
            "newest_kid": self.newest_kid,
            "newest_age": self.newest_age,
            "retired": list(self.retired),
            "removed": list(self.removed),
            "dry_run": self.dry_run,
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        would = "would " if self.dry_run else ""
        age = "no keys" if self.newest_age is None else f"newest key was {duration(self.newest_age)} old"
        lines = [f"{self.source}: {age}"]
        if self.rotated:
            lines.append(
                f"  {would}create {self.new_kid or 'a new key'} (verifies at once, mints after promotion)"
            )
        else:
            lines.append(
                "  no new key (see the note)"
                if self.held_back
                else "  no rotation needed (the newest key is younger than min-age)"
            )
        if self.retired:
            lines.append(f"  {would}retire {', '.join(self.retired)}")
        if self.removed:
            lines.append(f"  {would}remove {', '.join(self.removed)} (retired long ago)")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


class KeySource(abc.ABC):
    """Somewhere keys live. ``load()`` is called at start and on every refresh.

    Sources never cache: the :class:`~statecodec.kms.KeyManager` keeps the last good
    ring and decides what to do when a load fails.
    """

    url: str

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the keys come from, for logs and errors. Never contains a secret."""

    @abc.abstractmethod
    def load(self) -> KeyRing:
        """Every key with its times, or :class:`KeySourceError`."""

    def rotate(self, request: RotationRequest) -> RotationReport:
        """Apply ``request.policy``'s decision at ``request.now``: add a key if the newest is
        older than ``min_age`` (and, unless ``force``, promoted); retire keys past their window."""
        raise KeySourceError(
            "statecodec cannot rotate keys it does not store; rotate them where they are defined "
            "(for a keyring JSON: add a key, later retire the old one, see docs/keys.md)",
            kind="unsupported",
            source=self.describe(),
        )

    def init(self, *, key_type: str, now: float) -> str:
        """Create the key (ring) when absent; say what was done. Never overwrites."""
        raise KeySourceError(
            "statecodec cannot create keys here; store a keyring JSON "
            "(statecodec.KeyRing.generate().to_json()) or a base64url 32-byte secret "
            "(python -c 'import secrets; print(secrets.token_urlsafe(32))') yourself",
            kind="unsupported",
            source=self.describe(),
        )

    def metadata(self) -> KeyRing:
        """Every key's id and times; the secrets may be stand-ins (:func:`metadata_ring`).

        What ``keys list`` and ``retire()`` read. A source whose secrets are guarded apart
        from their metadata (transit) reads only the metadata, so the rotation job's
        policy, which never sees key material, suffices.
        """
        return self.load()

    # Emergency retirement (see ._retire): which keys go, and the two writes it needs.
    def retire_scope(self, ring: KeyRing, kid: str) -> tuple[tuple[str, ...], str | None]:
        """The kids that stop verifying when ``kid`` is retired, ``kid`` included, and why if more."""
        raise self._cannot_retire()

    def add_key(self, *, now: float, timeline: Timeline, notes: list[str]) -> str:
        """Create a new key (it verifies at its next refresh, mints once promoted); its kid."""
        raise self._cannot_retire()

    def remove_keys(self, kids: tuple[str, ...], *, now: float, timeline: Timeline, notes: list[str]) -> None:
        """Make exactly ``kids`` (a :meth:`retire_scope`) stop verifying at the next refresh."""
        raise self._cannot_retire()

    def _cannot_retire(self) -> KeySourceError:
        return KeySourceError(
            "statecodec cannot retire keys it does not store; remove the key from the keyring JSON where "
            "it is defined (when it is the primary, add a new key first and wait for it to be promoted; "
            "see docs/keys.md)",
            kind="unsupported",
            source=self.describe(),
        )

    def close(self) -> None:  # noqa: B027 - most sources hold nothing to release
        """Release connections. The source stays usable; it reconnects on demand."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        # A source opened for one job (``keys list``, an emergency retirement) holds a Vault
        # session until closed; leaving the block closes it, however the job ended.
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


def require_keys(ring: KeyRing, source: str) -> KeyRing:
    if not len(ring):
        raise KeySourceError("the key ring is empty", kind="invalid", source=source)
    return ring


def metadata_ring(keys: Iterable[tuple[str, int]]) -> KeyRing:
    """Key ids and creation times as a ring, for :class:`Timeline` decisions and listings.

    The secrets are random stand-ins, drawn here and never stored or shown: such a ring
    says which keys exist and when, and verifies nothing anyone ever sealed.
    """
    return KeyRing(Key(kid, secrets.token_bytes(32), created_at) for kid, created_at in keys)
