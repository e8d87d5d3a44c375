"""``vault-kv:MOUNT/PATH``: a keyring document in KV v2, rotated with check-and-set.

The secret's data is the keyring JSON object itself (``{"statecodec_keyring": 1, ...}``),
or, for operators who prefer one opaque field, ``{"keyring": "<keyring JSON text>"}``.
"""

from __future__ import annotations

from typing import Any

from .._keys import KeyRing
from ._document import Change, DocumentSource
from ._errors import KeySourceError
from ._settings import VaultSettings
from ._source import require_keys
from ._vault import VaultSession

#: A change that loses the check-and-set race re-reads and decides again; a writer
#: that keeps winning this often means something is wrong, not busy.
MAX_CAS_ATTEMPTS = 4


class KVSource(DocumentSource):
    def __init__(self, mount: str, path: str, settings: VaultSettings) -> None:
        self.mount = mount
        self.path = path
        self.url = f"vault-kv:{mount}/{path}"
        self.settings = settings
        self.session = VaultSession(settings, self.describe())

    def describe(self) -> str:
        return f"{self.url} at {self.settings.where()}"

    def load(self) -> KeyRing:
        return self._read()[0]

    def _read(self) -> tuple[KeyRing, int]:
        answer: dict[str, Any] = self.session.read(
            f"reading {self.mount}/data/{self.path}",
            lambda c: c.secrets.kv.v2.read_secret_version(
                self.path, mount_point=self.mount, raise_on_deleted_version=True
            )["data"],
            missing=(
                f"no keyring document at {self.mount}/data/{self.path} "
                f"(create it with `statecodec keys init --keys {self.url}`)"
            ),
        )
        data, version = answer.get("data") or {}, int(answer["metadata"]["version"])
        try:
            if isinstance(data.get("keyring"), str):
                ring = KeyRing.from_json(data["keyring"])
            else:
                ring = KeyRing.from_dict(data)
        except (ValueError, TypeError) as exc:
            raise KeySourceError(
                f"version {version}: {exc}", kind="invalid", source=self.describe()
            ) from None
        return require_keys(ring, self.describe()), version

    def _write(self, ring: KeyRing, cas: int) -> None:
        # cas=N: written only if the document is still at version N (cas=0: only if absent).
        self.session.write(
            f"writing {self.mount}/data/{self.path}",
            lambda c: c.secrets.kv.v2.create_or_update_secret(
                self.path, secret=ring.to_dict(), cas=cas, mount_point=self.mount
            ),
        )

    def _update(self, change: Change) -> None:
        for _ in range(MAX_CAS_ATTEMPTS):
            ring, version = self._read()
            new = change(ring)
            if new is None:
                return
            try:
                self._write(new, version)
            except KeySourceError as exc:
                if exc.kind != "conflict":
                    raise
                continue  # another writer came first: decide again from what it wrote
            return
        raise KeySourceError(
            f"lost the check-and-set race {MAX_CAS_ATTEMPTS} times in a row; is another writer looping?",
            kind="conflict",
            source=self.describe(),
        )

    def init(self, *, key_type: str, now: float) -> str:
        try:
            ring = self.load()
        except KeySourceError as exc:
            if exc.kind != "missing":
                raise
        else:
            return f"{self.describe()} already holds a key ring ({', '.join(ring.kids)}); left unchanged"
        ring = KeyRing.generate(created_at=int(now))
        try:
            self._write(ring, 0)
        except KeySourceError as err:
            if err.kind != "conflict":
                raise
            # Written concurrently, or a deleted version is in the way: never overwrite.
            return f"{self.describe()} exists already (created concurrently, or deleted); left unchanged"
        return f"{self.describe()}: created a key ring with key {ring.primary_kid}"

    def close(self) -> None:
        self.session.close()
