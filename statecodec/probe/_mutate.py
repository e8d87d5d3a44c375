"""Reading a server's requestState from the outside, and the bad states the probe sends.

Pure functions on strings, no MCP. The state comes from the server under test, so every
function here takes any input (huge, non-ASCII, not base64, deeply nested JSON) and
either returns a result or ``None``; none raises on what a server may send.

What a client can read is found in three places, most specific first: a format
:func:`statecodec.compat.detect` knows (statecodec sc1, TypeScript SDK v1, Python SDK v1,
rmcp rs1); JSON in the clear, or base64 of JSON; one dot-separated part of an unknown
format holding base64 of JSON (a JWT, a home-made ``body.mac``). The same place is where
a forged edit is made, so an edit is re-encoded exactly as the server encoded it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from .. import _format
from ..compat import FormatInfo, detect
from ._model import clip

ONE_MIB: Final = 1024 * 1024
_B64_STD: Final = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_B64_URL: Final = re.compile(r"[A-Za-z0-9_-]+={0,2}")
_URL_ALPHABET: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_MAX_FIELDS: Final = 24
_MAX_DEPTH: Final = 3
#: A format's own name for its prefix part (``v1``, ``rs1``), kept when inventing a state.
_PREFIX_PART: Final = re.compile(r"[a-z][a-z0-9]{0,5}")


# ------------------------------------------------------------------ base64
@dataclass(frozen=True)
class _Coding:
    """How a part was encoded, so an edit can be encoded the same way."""

    kind: str  # "raw" (the text itself), "base64" or "base64url"
    padded: bool = False

    def decode(self, text: str) -> bytes | None:
        if self.kind == "raw":
            return text.encode("utf-8", "surrogatepass")
        try:
            data = text.rstrip("=").encode("ascii")
            data += b"=" * (-len(data) % 4)
            decoded = (
                base64.urlsafe_b64decode(data)
                if self.kind == "base64url"
                else base64.b64decode(data, validate=True)
            )
        except (binascii.Error, ValueError):
            return None
        return decoded if self.encode(decoded) == text else None  # canonical only

    def encode(self, data: bytes) -> str:
        if self.kind == "raw":
            return data.decode("utf-8", "surrogatepass")
        text = (
            base64.urlsafe_b64encode(data) if self.kind == "base64url" else base64.b64encode(data)
        ).decode()
        return text if self.padded else text.rstrip("=")


def _coding_of(text: str) -> _Coding | None:
    """The base64 flavour ``text`` is written in, if it decodes canonically in one.

    Text using neither ``-_`` nor ``+/`` fits both: padding suggests the standard alphabet
    (base64url is usually unpadded), so an edit is re-encoded the way the server likely would.
    """
    if len(text) < 4:
        return None
    padded = text.endswith("=")
    url = any(c in text for c in "-_") or (not padded and not any(c in text for c in "+/"))
    kind, pattern = ("base64url", _B64_URL) if url else ("base64", _B64_STD)
    coding = _Coding(kind, padded)
    return coding if pattern.fullmatch(text) and coding.decode(text) is not None else None


def _json_container(data: bytes) -> Any:
    """The JSON object or array ``data`` holds, else None (scalars are not a readable structure)."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict | list) and value else None


# ------------------------------------------------------------------ where JSON is readable
@dataclass(frozen=True)
class Place:
    """JSON a client can read: which part of the state, how it is encoded, where inside."""

    part: int | None  # index in state.split("."), or None for the whole state
    coding: _Coding
    decoded: bytes
    start: int
    end: int
    value: Any

    @property
    def compact(self) -> bool:
        text = self.decoded[self.start : self.end]
        return b", " not in text and b": " not in text

    def rebuild(self, state: str, value: Any) -> str:
        """``state`` with this JSON replaced by ``value``, encoded as the server encoded it."""
        separators = (",", ":") if self.compact else (", ", ": ")
        new = json.dumps(value, ensure_ascii=False, separators=separators).encode("utf-8", "surrogatepass")
        encoded = self.coding.encode(self.decoded[: self.start] + new + self.decoded[self.end :])
        if self.part is None:
            return encoded
        parts = state.split(".")
        parts[self.part] = encoded
        return ".".join(parts)


def _find_json(state: str, payload: bytes | None) -> Place | None:
    candidates: list[tuple[int | None, str]] = [(None, state)]
    parts = state.split(".")
    if len(parts) > 1:
        candidates += list(enumerate(parts))
    for part, text in candidates:
        for coding in (_Coding("raw"), _coding_of(text)):
            if coding is None:
                continue
            decoded = coding.decode(text)
            if decoded is None:
                continue
            value = _json_container(decoded)
            if value is not None:
                return Place(part, coding, decoded, 0, len(decoded), value)
            if payload and coding.kind != "raw" and (start := decoded.find(payload)) >= 0:
                value = _json_container(payload)
                if value is not None:  # JSON inside a binary envelope (sc1 SIGN, rs1)
                    return Place(part, coding, decoded, start, start + len(payload), value)
    return None


@dataclass(frozen=True)
class Readability:
    """What a client learns from a state without any key. Nothing here is verified."""

    name: str  # e.g. "TypeScript SDK v1 (SIGN)", "plaintext JSON", "opaque"
    format: str | None  # statecodec.compat's format id, when it recognised one
    mode: str | None  # "sign" or "encrypt" for a known format
    readable: bool
    fields: tuple[str, ...]  # field paths and types, never values
    expires_at: float | None
    place: Place | None  # where readable JSON sits (for the forge check)
    info: FormatInfo | None

    def facts(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "format_name": self.name,
            "mode": self.mode,
            "readable": self.readable,
            "fields": list(self.fields),
            "expires_at": None if self.expires_at is None else int(self.expires_at),
        }


def analyse(state: str) -> Readability:
    """Name ``state``'s format and list what it shows in the clear (field names, not values)."""
    info = detect(state, max_token_bytes=max(len(state), 1))
    known = info.recognised and info.problem is None
    place = _find_json(state, info.payload if known else None)
    if known:
        sign = info.mode != "encrypt"
        fields = _payload_fields(info.payload) if sign else ()
        return Readability(
            f"{info.name} ({'SIGN: signed, readable' if sign else 'encrypted'})",
            info.format,
            info.mode,
            bool(fields),
            fields,
            info.expires_at,
            place if sign else None,
            info,
        )
    if place is None:
        return Readability(
            "opaque: no known format, no JSON in the clear", None, None, False, (), None, None, None
        )
    if place.part is None:
        name = "plaintext JSON" if place.coding.kind == "raw" else f"{place.coding.kind} of JSON"
    else:
        name = (
            f"unknown format, part {place.part + 1} of {state.count('.') + 1} is {place.coding.kind} of JSON"
        )
    return Readability(name, None, None, True, field_paths(place.value), None, place, None)


def _payload_fields(payload: bytes | None) -> tuple[str, ...]:
    if not payload:
        return ()
    value = _json_container(payload)
    if value is not None:
        return field_paths(value)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return (f"({len(payload)} bytes, not text)",)
    return (f"(text, {len(text)} characters)",)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, list):
        return f"array of {len(value)}"
    return "object"


def field_paths(value: Any) -> tuple[str, ...]:
    """``("plan.version: string", "steps: array of 3")``: names and types, values redacted."""
    paths: list[str] = []

    def walk(node: Any, prefix: str, depth: int) -> None:
        items: Iterator[tuple[str, Any]] = (
            ((clip(str(k), 60), v) for k, v in node.items())
            if isinstance(node, dict)
            else ((f"[{i}]", v) for i, v in enumerate(node[:3]))
        )
        for key, child in items:
            path = f"{prefix}.{key}" if prefix and not key.startswith("[") else f"{prefix}{key}"
            if isinstance(child, dict) and child and depth < _MAX_DEPTH:
                walk(child, path, depth + 1)
            else:
                paths.append(f"{path}: {_kind(child)}")
            if len(paths) > _MAX_FIELDS:
                return

    walk(value, "", 1)
    if len(paths) > _MAX_FIELDS:
        paths[_MAX_FIELDS:] = ["..."]
    return tuple(paths)


# ------------------------------------------------------------------ forged states
def _leaves(node: Any, path: tuple[Any, ...] = (), depth: int = 0) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if depth > 32:
        return
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
    if children is None:
        yield path, node
        return
    for key, child in children:
        yield from _leaves(child, (*path, key), depth + 1)


def _replaced(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {**node, head: _replaced(node[head], rest, value)}
    copy = list(node)
    copy[head] = _replaced(node[head], rest, value)
    return copy


def _changed(leaf: Any) -> Any:
    if isinstance(leaf, bool):
        return not leaf
    if isinstance(leaf, int | float):
        return leaf + 1
    return f"{leaf}-forged"


def _path_text(path: tuple[Any, ...]) -> str:
    return clip(".".join(str(p) for p in path), 80) or "(the value)"


def forge_edited(state: str, readability: Readability) -> tuple[str, str] | None:
    """The state with one readable field changed and re-encoded; None if nothing is readable."""
    place = readability.place
    edit = None if place is None else _edit_one(place.value)
    if place is None or edit is None:
        return None
    value, path = edit
    return place.rebuild(
        state, value
    ), f"field {_path_text(path)} changed, re-encoded, the rest kept as issued"


def _edit_one(value: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """``value`` with one leaf changed, text first (it is what plans and ids are made of)."""
    leaves = list(_leaves(value))
    for wanted in (str, int | float, bool):
        for path, leaf in leaves:
            if path and isinstance(leaf, wanted) and (wanted is bool or not isinstance(leaf, bool)):
                return _replaced(value, path, _changed(leaf)), path
    return None


def forge_invented(state: str, readability: Readability) -> tuple[str, str]:
    """A state made up by the client, in the shape of the real one (no key could have made it)."""
    info = readability.info
    if info is not None and info.format == "sc1" and info.kid:
        minted = _sc1_under_made_up_key(info)
        if minted is not None:
            return (
                minted,
                f"a well-formed statecodec token for key id {clip(info.kid, 40)}, sealed with a made-up key",
            )
    place = readability.place
    if place is not None:
        parts = place.rebuild(state, _invented(place.value)).split(".")
        what = "the same fields with made-up text values"
        if place.part is not None and place.part < len(parts) - 1:  # a signature follows: make one up
            parts[-1] = _random_like(parts[-1], _coding_of(parts[-1]))
            what += ", and a made-up signature"
        return ".".join(parts), what
    parts = state.split(".")
    for i, part in enumerate(parts):
        if not (i == 0 and len(parts) > 1 and _PREFIX_PART.fullmatch(part)):  # keep "v1", "rs1"...
            parts[i] = _random_like(part, _coding_of(part))
    return ".".join(parts), "random bytes in the shape of the real state (same parts, same lengths)"


def _invented(node: Any, depth: int = 0) -> Any:
    if depth > 32:
        return node
    if isinstance(node, dict):
        return {k: _invented(v, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_invented(v, depth + 1) for v in node]
    return "statecodec-probe" if isinstance(node, str) else node


def _random_like(text: str, coding: _Coding | None) -> str:
    if coding is not None:
        decoded = coding.decode(text)
        if decoded is not None:
            return coding.encode(secrets.token_bytes(len(decoded)))
    return "".join(secrets.choice(_URL_ALPHABET) for _ in range(max(len(text), 16)))


def _sc1_under_made_up_key(info: FormatInfo) -> str | None:
    from .._codec import StateCodec  # noqa: PLC0415 - only for sc1 states
    from .._keys import KeyRing  # noqa: PLC0415

    try:
        ring = KeyRing.generate(info.kid)
        return StateCodec(ring, mode=info.mode or "sign").seal(info.payload or b"{}")
    except (ValueError, TypeError):
        return None


# ------------------------------------------------------------------ tampered states
def _longest_part(state: str) -> tuple[int, int]:
    """Start and end of the longest dot-separated part (where a changed character lands)."""
    start, best = 0, (0, len(state))
    for part in state.split("."):
        if len(part) > best[1] - best[0]:
            best = (start, start + len(part))
        start += len(part) + 1
    return best


def one_char_changed(state: str) -> tuple[str, str]:
    start, end = _longest_part(state)
    i = (start + end) // 2 if end > start else len(state) // 2
    if not state:
        return "A", "the empty state replaced by one character"
    old = state[i]
    new = "B" if old == "A" else "A" if old.isalnum() or old in "-_+/" else "x" if old != "x" else "y"
    return state[:i] + new + state[i + 1 :], f"character {i + 1} of {len(state)} changed"


def truncated(state: str) -> tuple[str, str]:
    cut = min(8, max(1, len(state) // 2))
    return state[:-cut], f"the last {cut} characters cut off ({len(state) - cut} of {len(state)} left)"


def payload_swapped(first: str, second: str, readability: Readability) -> tuple[str, str] | None:
    """``second``'s payload under ``first``'s signature, for a signed format; None otherwise."""
    if readability.mode != "sign":
        return None
    a, b = first.split("."), second.split(".")
    if len(a) >= 3 and len(a) == len(b):  # prefix . body . signature (TypeScript v1, rs1)
        if a[:-1] == b[:-1]:
            return None
        return ".".join([*b[:-1], a[-1]]), "the body of a second state under the signature of the first"
    if readability.format == "sc1" and len(a) == len(b) == 2:  # prefix . blob(header, payload, mac)
        coding = _Coding("base64url")
        da, db = coding.decode(a[1]), coding.decode(b[1])
        if da is None or db is None or len(da) <= _format.MAC_LEN or len(db) <= _format.MAC_LEN:
            return None
        spliced = db[: -_format.MAC_LEN] + da[-_format.MAC_LEN :]
        return (
            f"{a[0]}.{coding.encode(spliced)}",
            "the header and payload of a second state under the MAC of the first",
        )
    return None


# ------------------------------------------------------------------ garbage
def oversize(state: str) -> tuple[str, str]:
    filler = "A" * max(0, ONE_MIB - len(state))
    return state + filler, f"the state padded with 'A' to {ONE_MIB:,} characters (1 MiB)"


def non_ascii(state: str) -> tuple[str, str]:
    i = len(state) // 2
    return state[:i] + "\u00e9" + state[
        i + 1 :
    ], f"character {i + 1} replaced by U+00E9 (e with acute accent)"


def json_object(state: str) -> tuple[dict[str, str], str]:
    return {"requestState": state}, 'a JSON object {"requestState": <the state>} instead of a string'


# ------------------------------------------------------------------ answering input requests
def default_response(request: Any) -> dict[str, Any]:
    """What a consenting user would answer to one input request, from its schema alone."""
    method = request.get("method") if isinstance(request, Mapping) else None
    params = request.get("params") if isinstance(request, Mapping) else None
    params = params if isinstance(params, Mapping) else {}
    if method == "sampling/createMessage":
        return {
            "role": "assistant",
            "content": {"type": "text", "text": "statecodec probe"},
            "model": "statecodec-probe",
            "stopReason": "endTurn",
        }
    if method == "roots/list":
        return {"roots": []}
    if params.get("mode") == "url":
        return {"action": "accept"}
    schema = params.get("requestedSchema")
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    content = {
        str(name): _default_value(prop)
        for name, prop in (properties.items() if isinstance(properties, Mapping) else ())
    }
    return {"action": "accept", "content": content}


_FORMATS: Final = {
    "email": "probe@example.com",
    "uri": "https://example.com/",
    "date": "2026-07-28",
    "date-time": "2026-07-28T12:00:00Z",
}


def _default_value(prop: Any) -> Any:
    if not isinstance(prop, Mapping):
        return "statecodec-probe"
    if "default" in prop:
        return prop["default"]
    if "const" in prop:
        return prop["const"]
    for key in ("enum", "oneOf", "anyOf"):
        options = prop.get(key)
        if isinstance(options, list) and options:
            first = options[0]
            return first.get("const", "statecodec-probe") if isinstance(first, Mapping) else first
    kind = prop.get("type")
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        low = prop.get("minimum")
        return low if isinstance(low, int | float) and not isinstance(low, bool) else 1
    if kind == "array":
        items = prop.get("items")
        return [_default_value(items)] if isinstance(items, Mapping) else []
    text = _FORMATS.get(str(prop.get("format")), "statecodec-probe")
    low, high = prop.get("minLength"), prop.get("maxLength")
    if isinstance(low, int) and 0 < low <= 4096 and len(text) < low:
        text = text.ljust(low, "x")
    if isinstance(high, int) and 0 <= high < len(text):
        text = text[:high]
    return text


def changed_arguments(arguments: Mapping[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The arguments with one value changed (a text first), or None when there is none to change."""
    edit = _edit_one(dict(arguments))
    return None if edit is None else (edit[0], _path_text(edit[1]))
