"""Keys from files, the environment, or Vault/OpenBao, rotated without downtime.

One string names where keys live (``file:PATH``, ``env:NAME``,
``vault-transit:MOUNT/NAME``, ``vault-kv:MOUNT/PATH``); :class:`KeyManager` keeps the
current ring for codecs and refreshes it in the background; :func:`rotate` is the
scheduled job that adds and retires keys, :func:`retire` the emergency cut after a leak.
docs/keys.md has the timeline and runbook.

hvac is imported only when a Vault source is used, so this package stays light.
"""

from .._errors import KeyUnavailable
from ._errors import KINDS, KeySourceError
from ._local import EnvSource, FileSource
from ._manager import KeyManager
from ._policy import RotationRequest
from ._retire import RetirementReport, retire
from ._rotate import DEFAULT_KEY_TYPE, init_keys, rotate
from ._settings import VaultSettings
from ._source import TRANSIT_KEY_TYPES, KeySource, RotationReport
from ._timeline import KeyState, Plan, Timeline, key_states
from ._urls import URL_FORMS, source_from_url

__all__ = [
    "DEFAULT_KEY_TYPE",
    "KINDS",
    "TRANSIT_KEY_TYPES",
    "URL_FORMS",
    "EnvSource",
    "FileSource",
    "KeyManager",
    "KeySource",
    "KeySourceError",
    "KeyState",
    "KeyUnavailable",
    "Plan",
    "RetirementReport",
    "RotationReport",
    "RotationRequest",
    "Timeline",
    "VaultSettings",
    "init_keys",
    "key_states",
    "retire",
    "rotate",
    "source_from_url",
]
