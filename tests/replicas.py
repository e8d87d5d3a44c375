"""Replicas: instances that share one key ring file and one replay store, as behind a load balancer.

Also where a test writes such a key ring file (:func:`keys_file`).

The adapter tests' clusters (tests/fixtures_mcp.py) and the proxy tests' services
(tests/fixtures_proxy.py) are both such a set: the first two are ``a`` and ``b``, and a
codec with the same keys (and no replay store) mints the tokens a test needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from statecodec import KeyRing, StateCodec

Member = TypeVar("Member")


def keys_file(directory: Path, ring: KeyRing | None = None) -> Path:
    """``directory/keys.json`` holding ``ring`` (a fresh one by default), mode 600 as servers require."""
    path = directory / "keys.json"
    path.write_text((ring or KeyRing.generate()).to_json(), encoding="utf-8")
    path.chmod(0o600)
    return path


@dataclass
class Replicas(Generic[Member]):
    mode: str
    keys_path: Path
    replay_url: str

    def members(self) -> list[Member]:
        """The instances, in the order they were named."""
        raise NotImplementedError

    @property
    def a(self) -> Member:
        return self.members()[0]

    @property
    def b(self) -> Member:
        return self.members()[1]

    def codec(self, **kwargs: Any) -> StateCodec:
        """A codec with the shared keys and no replay store: for minting test tokens."""
        ring = KeyRing.from_json(self.keys_path.read_text(encoding="utf-8"))
        return StateCodec(ring, mode=self.mode, **kwargs)
