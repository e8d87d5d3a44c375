"""``vault-transit:MOUNT/NAME``: every version of an exportable transit key is one kid.

Keys are exported and cached, and all cryptography happens locally: a transit call
costs about a millisecond against microseconds for a local HMAC, and minting must not
stop when Vault blinks. Vault keeps what it is good at: generating, versioning and
access-controlling the secrets, and retiring old versions (``min_decryption_version``).
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .. import _format, _telemetry
from .._keys import MIN_SECRET_BYTES, Key, KeyRing
from ._answers import transit_export, transit_metadata
from ._errors import KeySourceError
from ._policy import Decision, RotationRequest
from ._settings import VaultSettings
from ._source import TRANSIT_KEY_TYPES, KeySource, RotationReport, metadata_ring
from ._timeline import Timeline
from ._vault import VaultSession

logger = logging.getLogger("statecodec.kms")
T = TypeVar("T")

EXPORT_TYPES = ("encryption-key", "hmac-key")


class TransitSource(KeySource):
    """Keys exported from one transit key; kid ``<name>-v<N>`` (or ``v<N>`` for long names).

    Creation times come from the key's metadata. Keys of type ``hmac`` carry none, so
    their versions are dated by when this process first saw them, and at the first load
    the newest of several versions counts as just published: it verifies at once but
    mints only after the promotion delay, which errs on the safe side (an older version
    mints meanwhile). ``rotate()`` refuses hmac keys, since it could not tell ages.
    """

    def __init__(
        self,
        mount: str,
        name: str,
        settings: VaultSettings,
        *,
        export: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if export is not None and export not in EXPORT_TYPES:
            raise KeySourceError(f"export must be one of {', '.join(EXPORT_TYPES)}", kind="config")
        self.mount = mount
        self.name = name
        self.url = f"vault-transit:{mount}/{name}"
        self.settings = settings
        self.export = export
        self.session = VaultSession(settings, self.describe())
        self._first_seen: dict[int, int] = {}
        self._loaded = False
        self._clock = clock

    def describe(self) -> str:
        return f"{self.url} at {self.settings.where()}"

    def kid(self, version: int) -> str:
        kid = f"{self.name}-v{version}"
        return kid if _format.valid_kid(kid) else f"v{version}"

    # ------------------------------------------------------------------ load
    def load(self) -> KeyRing:
        # Metadata first: a version rotated in between is then exported without a
        # timestamp and dated "now", which only delays its promotion.
        meta = self._metadata()
        export = self._export_type(meta)
        answer = self.session.read(
            f"reading {self.mount}/export/{export}/{self.name}",
            lambda c: c.secrets.transit.export_key(self.name, key_type=export, mount_point=self.mount),
            missing=self._missing(),
        )
        exported = self._checked(transit_export, _data(answer).get("keys"))
        versions = sorted(exported)
        if not versions:
            raise KeySourceError(
                "the transit key exported no versions", kind="invalid", source=self.describe()
            )
        created = self._creation_times(meta, versions)
        keys = [Key(self.kid(v), self._secret(v, exported[v]), created[v]) for v in versions]
        # No primary: Vault has no notion of promotion; the KeyManager's timeline decides.
        return KeyRing(keys)

    def metadata(self) -> KeyRing:
        # transit/keys/NAME only: what the rotation policy may read (it never exports).
        meta = self._metadata()
        versions = self._live_versions(meta)
        created = self._creation_times(meta, versions)
        return metadata_ring((self.kid(v), created[v]) for v in versions)

    @staticmethod
    def _live_versions(meta: dict[str, Any]) -> list[int]:
        """The versions export would return: from min_decryption_version to the latest.

        Counted, not read from ``keys``, which hmac-type keys leave out.
        """
        first = max(1, int(meta.get("min_decryption_version") or 1))
        return list(range(first, int(meta["latest_version"]) + 1))

    def _metadata(self) -> dict[str, Any]:
        answer = self.session.read(
            f"reading {self.mount}/keys/{self.name}",
            lambda c: c.secrets.transit.read_key(self.name, mount_point=self.mount),
            missing=self._missing(),
        )
        meta = self._checked(transit_metadata, _data(answer))
        if not meta.get("exportable"):
            raise KeySourceError(
                f"transit key {self.name} is not exportable; statecodec caches exported keys and does the "
                f"crypto locally. Make it exportable (irreversible): "
                f"bao write {self.mount}/keys/{self.name}/config exportable=true",
                kind="invalid",
                source=self.describe(),
            )
        return meta

    def _checked(self, check: Callable[[object], T], document: object) -> T:
        """``check(document)``, a malformed 200 answer becoming a key-source error (exit 3)."""
        try:
            return check(document)
        except ValueError as exc:
            raise KeySourceError(
                f"Vault answered with a malformed document: {exc}", kind="invalid", source=self.describe()
            ) from None

    def _export_type(self, meta: dict[str, Any]) -> str:
        if self.export:
            return self.export
        return "hmac-key" if meta.get("type") == "hmac" else "encryption-key"

    def _creation_times(self, meta: dict[str, Any], versions: list[int]) -> dict[int, int]:
        times = {int(v): int(t) for v, t in (meta.get("keys") or {}).items() if isinstance(t, int)}
        now = int(self._clock())
        first_load, self._loaded = not self._loaded, True
        for v in versions:
            if v in times:
                continue
            if v not in self._first_seen:
                # Unknown age. "Long ago" is safe only for what every instance must
                # already have: older versions, or the only one, at this process's start.
                old = first_load and (v != versions[-1] or len(versions) == 1)
                self._first_seen[v] = 0 if old else now
            times[v] = self._first_seen[v]
        return times

    def _secret(self, version: int, text: str) -> bytes:
        try:
            secret = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise KeySourceError(
                f"version {version} was not exported as base64", kind="invalid", source=self.describe()
            ) from None
        if len(secret) < MIN_SECRET_BYTES:
            raise KeySourceError(
                f"version {version} is a {len(secret)}-byte key; statecodec needs {MIN_SECRET_BYTES} "
                "(use chacha20-poly1305, aes256-gcm96, or hmac with key_size 32)",
                kind="invalid",
                source=self.describe(),
            )
        return secret

    def _missing(self) -> str:
        return (
            f"no transit key {self.name} on mount {self.mount}/ "
            f"(create it with `statecodec keys init --keys {self.url}`)"
        )

    # ---------------------------------------------------------------- rotate
    def rotate(self, request: RotationRequest) -> RotationReport:
        policy, now, dry_run = request.policy, request.now, request.dry_run
        meta = self._metadata()
        latest = int(meta["latest_version"])
        decision = retiring = policy.decide(self._dated_ring(meta), now)
        new_kid: str | None = None
        held_back = policy.held_back(decision, now)
        notes: list[str] = [held_back] if held_back else []
        if decision.rotate:
            if dry_run:
                new_kid = self.kid(latest + 1)
            else:
                meta, new_kid = self._rotate_once(latest, notes)
                # Vault dates the new version by its own clock, which may be behind ``now``
                # (a job judging ages at another instant): decide again on what is there now.
                retiring = policy.decide(self._dated_ring(meta), now)
        retired = self._retire(meta, retiring, dry_run=dry_run, notes=notes)
        newest = int(meta["latest_version"]) if new_kid is None or not dry_run else latest + 1
        return RotationReport(
            source=self.describe(),
            rotated=new_kid is not None,
            newest_kid=self.kid(newest),
            newest_age=decision.newest_age,
            new_kid=new_kid,
            retired=tuple(retired),
            dry_run=dry_run,
            notes=tuple(notes),
            held_back=held_back is not None,
        )

    def _dated_ring(self, meta: dict[str, Any]) -> KeyRing:
        """The live versions with their recorded creation times, in version order."""
        times = self._dated(meta)
        return metadata_ring((self.kid(v), times[v]) for v in self._live_versions(meta) if v in times)

    def _rotate_once(self, seen_latest: int, notes: list[str]) -> tuple[dict[str, Any], str]:
        self._write_until(
            f"rotating {self.mount}/keys/{self.name}",
            lambda c: c.secrets.transit.rotate_key(self.name, mount_point=self.mount),
            done=lambda meta: int(meta["latest_version"]) > seen_latest,
            notes=notes,
        )
        # Transit has no check-and-set: two jobs that both read the old latest version
        # both rotate. Re-reading shows it; the extra version is harmless (it verifies
        # at once, the newest promotes, and it retires like any other).
        meta = self._metadata()
        latest = int(meta["latest_version"])
        if latest > seen_latest + 1:
            notes.append(
                f"{latest - seen_latest - 1} more version(s) appeared at the same time (a concurrent "
                "rotation); harmless: the newest mints, the others verify until retired"
            )
        return meta, self.kid(latest)

    def _retire(
        self, meta: dict[str, Any], decision: Decision, *, dry_run: bool, notes: list[str]
    ) -> list[str]:
        # Transit retires by raising min_decryption_version, which cuts every version below
        # it: cut below the newest version the decision retires, and only ever upwards (a
        # concurrent job may have cut further meanwhile).
        version = {self.kid(v): v for v in self._live_versions(meta)}
        retired = [version[kid] for kid, _ in decision.retire if kid in version]
        if not retired:
            return []
        current = int(meta["min_decryption_version"])
        target = max(retired) + 1
        if not dry_run:
            self._cut_below(target, notes)
        return [self.kid(v) for v in range(current, target) if self.kid(v) in version]

    # ---------------------------------------------------------------- retire
    def retire_scope(self, ring: KeyRing, kid: str) -> tuple[tuple[str, ...], str | None]:
        meta = self._metadata()
        self._dated(meta)  # hmac keys: no creation times, so no safe plan either
        version = {self.kid(v): v for v in self._live_versions(meta)}.get(kid)
        if version is None:
            return (), None  # not a live version: the caller reports it missing
        older = tuple(self.kid(v) for v in self._live_versions(meta) if v < version)
        versions = f"version {older[0]} is" if len(older) == 1 else f"versions {', '.join(older)} are"
        why = (
            f"transit retires {kid} by raising min_decryption_version, which cuts every older version: "
            f"the older {versions} retired with it"
            if older
            else None
        )
        return (*older, kid), why

    def add_key(self, *, now: float, timeline: Timeline, notes: list[str]) -> str:
        meta = self._metadata()
        return self._rotate_once(int(meta["latest_version"]), notes)[1]

    def remove_keys(self, kids: tuple[str, ...], *, now: float, timeline: Timeline, notes: list[str]) -> None:
        meta = self._metadata()
        live = self._live_versions(meta)
        cut = [v for v in live if self.kid(v) in kids]
        if not cut:
            notes.append(f"{', '.join(kids)} no longer verified (a concurrent retire?)")
            return
        target = max(cut) + 1
        if [v for v in live if v < target] != cut:  # never cut more than was asked
            raise KeySourceError(
                f"retiring {', '.join(kids)} would also retire other versions; run the retire again",
                kind="conflict",
                source=self.describe(),
            )
        self._cut_below(target, notes)

    def _cut_below(self, version: int, notes: list[str]) -> None:
        """Raise min_decryption_version: versions below ``version`` leave every export."""
        self._write_until(
            f"updating {self.mount}/keys/{self.name}/config",
            lambda c: c.secrets.transit.update_key_configuration(
                self.name, min_decryption_version=version, mount_point=self.mount
            ),
            done=lambda meta: int(meta["min_decryption_version"]) >= version,
            notes=notes,
        )

    def _write_until(
        self,
        what: str,
        call: Callable[[Any], object],
        *,
        done: Callable[[dict[str, Any]], bool],
        notes: list[str],
    ) -> None:
        """Write; when Vault fails the write, re-read and try again only if it did not happen.

        A write is never blindly retried (it might have happened and its reply been lost).
        But OpenBao answers 500 ("transaction commit failed", "archive version not
        up-to-date") to a transit write that races another one on the same key, as two
        scheduled rotation jobs do. Re-reading the key tells whether the goal was met
        (by this write or the concurrent one); if not, nothing changed and trying again is safe.
        """
        attempts = 1 + max(0, self.session.settings.retries)
        for attempt in range(1, attempts + 1):
            try:
                self.session.write(what, call, missing=self._missing())
                return
            except KeySourceError as exc:
                if exc.kind != "unreachable":
                    raise
                if done(self._metadata()):
                    notes.append(
                        f"Vault failed {what} ({exc.message.splitlines()[0]}), but the key shows it done, "
                        "by this job or a concurrent one"
                    )
                    return
                if attempt == attempts:
                    raise
                logger.info(
                    "%s: %s failed and did not happen; trying again",
                    self.url,
                    what,
                    extra=_telemetry.fields("vault_retry", source=self.url, detail=what),
                )
                self.session.pause(attempt)

    def _dated(self, meta: dict[str, Any]) -> dict[int, int]:
        times = {int(v): int(t) for v, t in (meta.get("keys") or {}).items() if isinstance(t, int)}
        if meta.get("type") == "hmac" or int(meta["latest_version"]) not in times:
            raise KeySourceError(
                f"transit keys of type {meta.get('type')} record no creation times, so rotate() cannot tell "
                "the newest version's age or when an old one may retire; use a chacha20-poly1305 key "
                "(the default of `statecodec keys init`) or rotate by hand (docs/keys.md)",
                kind="unsupported",
                source=self.describe(),
            )
        return times

    # ------------------------------------------------------------------ init
    def init(self, *, key_type: str, now: float) -> str:
        if key_type not in TRANSIT_KEY_TYPES:
            raise KeySourceError(
                f"unsupported key type {key_type!r}; use one of {', '.join(TRANSIT_KEY_TYPES)}", kind="config"
            )
        try:
            meta = self._metadata()
        except KeySourceError as exc:
            if exc.kind != "missing":
                raise
        else:
            return (
                f"{self.describe()} already exists (type {meta.get('type')}, "
                f"version {meta.get('latest_version')}); left unchanged"
            )
        body: dict[str, Any] = {"type": key_type, "exportable": True}
        if key_type == "hmac":
            body["key_size"] = 32
        # hvac's create_key refuses some types its allow-list does not know; the API does not.
        self.session.write(
            f"creating {self.mount}/keys/{self.name}",
            lambda c: c.adapter.post(f"/v1/{self.mount}/keys/{self.name}", json=body),
            missing=(
                f"no transit engine is mounted at {self.mount}/ "
                f"(enable it: bao secrets enable -path={self.mount} transit)"
            ),
        )
        return f"{self.describe()}: created an exportable {key_type} key, version 1 (kid {self.kid(1)})"

    def close(self) -> None:
        self.session.close()


def _data(answer: object) -> Any:
    """An answer's ``data`` member, or ``None`` for an answer that has none (then refused)."""
    return answer.get("data") if isinstance(answer, dict) else None
