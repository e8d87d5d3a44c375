"""The shape of Vault/OpenBao transit answers, checked before anything is computed from them.

A 200 answer is not a good answer: a proxy in front of Vault, a plugin or a bug can send
``{}``, a version that is a string, a key that is a number. Reading such a document with
``int()`` and ``[...]`` fails with a ``KeyError`` or ``TypeError`` that reaches the
operator as "a bug in statecodec" (exit 70), and a ``latest_version`` of 10**12 makes
``range(1, latest + 1)`` exhaust memory. So each answer is checked here, once, and a
bad one is a :class:`ValueError` the source turns into a key-source error
(``invalid``: exit 3) naming what was wrong. The bounds: a version is a positive 32-bit
integer (transit's own type), and at most :data:`MAX_LIVE_VERSIONS` versions are live at
once (retired ones are cut with ``min_decryption_version``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

#: The largest version number accepted (transit versions are 32-bit signed integers).
MAX_VERSION: Final = 2**31 - 1
#: The most live versions (latest_version - min_decryption_version + 1) one key may have:
#: hourly rotation for more than a year with nothing retired. More is refused, not loaded.
MAX_LIVE_VERSIONS: Final = 10_000


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _version(value: object, what: str) -> int:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        value = int(value)
    if not _whole(value) or not 1 <= value <= MAX_VERSION:  # type: ignore[operator]
        raise ValueError(f"{what} {_shown(value)} is not a version number (1 to {MAX_VERSION})")
    return value  # type: ignore[return-value]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def transit_metadata(meta: object) -> dict[str, Any]:
    """``transit/keys/NAME``'s ``data``, checked: versions whole and bounded, times whole.

    The copy returned has ``latest_version`` and ``min_decryption_version`` as ints and
    ``keys`` as ``{version: creation time}`` (times that are not whole seconds are left
    out, as hmac keys' are: their versions are then dated as first seen).
    """
    if not isinstance(meta, Mapping):
        raise ValueError(f"the key's metadata is {type(meta).__name__}, not an object")
    if "latest_version" not in meta:
        raise ValueError("the key's metadata has no latest_version")
    latest = _version(meta["latest_version"], "latest_version")
    raw_min = meta.get("min_decryption_version") or 1
    first = _version(raw_min, "min_decryption_version")
    if first > latest:
        raise ValueError(f"min_decryption_version {first} is above latest_version {latest}")
    if latest - first + 1 > MAX_LIVE_VERSIONS:
        raise ValueError(
            f"{latest - first + 1} live versions (min_decryption_version {first} to {latest}); statecodec "
            f"loads at most {MAX_LIVE_VERSIONS}: retire old ones (raise min_decryption_version)"
        )
    raw_keys = meta.get("keys") or {}
    if not isinstance(raw_keys, Mapping):
        raise ValueError(f"the key's metadata lists its versions as {type(raw_keys).__name__}, not an object")
    if len(raw_keys) > MAX_LIVE_VERSIONS:
        raise ValueError(f"the key's metadata lists {len(raw_keys)} versions, more than {MAX_LIVE_VERSIONS}")
    times = {_version(v, "a version"): t for v, t in raw_keys.items() if _whole(t) and t >= 0}
    return {**meta, "latest_version": latest, "min_decryption_version": first, "keys": times}


def transit_export(exported: object) -> dict[int, str]:
    """``transit/export/TYPE/NAME``'s ``data.keys``, checked: ``{version: base64 text}``."""
    if not isinstance(exported, Mapping):
        raise ValueError(f"the export's keys are {type(exported).__name__}, not an object")
    if len(exported) > MAX_LIVE_VERSIONS:
        raise ValueError(f"the export holds {len(exported)} versions, more than {MAX_LIVE_VERSIONS}")
    keys: dict[int, str] = {}
    for v, text in exported.items():
        version = _version(v, "an exported version")
        if not isinstance(text, str):
            raise ValueError(f"version {version} was exported as {_shown(text)}, not base64 text")
        keys[version] = text
    return keys


def token_lookup(answer: object) -> dict[str, Any]:
    """``auth/token/lookup-self``'s lease facts: ``lease_duration`` (seconds) and ``renewable``."""
    data = answer.get("data") if isinstance(answer, Mapping) else None
    if not isinstance(data, Mapping):
        raise ValueError("auth/token/lookup-self answered without a data object")
    ttl = data.get("ttl")
    if ttl is not None and not (_whole(ttl) and 0 <= ttl <= MAX_VERSION):
        raise ValueError(f"auth/token/lookup-self gave the token's ttl as {_shown(ttl)}, not seconds")
    return {"lease_duration": ttl, "renewable": data.get("renewable") is True}
