"""Binding a token to who asked, where, and for what.

The MCP spec asks servers to bind requestState to the authenticated principal and to the
originating request (method and a digest of its salient parameters). A :class:`Binding`
names those facts; the codec stores only a 16-byte *keyed* tag over them. Never the raw
values, and never an unkeyed hash: an unkeyed hash of a user id in a readable token lets
anyone holding the token guess the user offline.

The argument digest is SHA-256 over RFC 8785 (JCS) canonical JSON, so two instances, two
Python versions or an independent implementation always agree on it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from operator import attrgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, NoReturn

import orjson
import rfc8785

if TYPE_CHECKING:
    from ._keys import Key

MAX_ARGUMENT_DEPTH: Final = 64
MAX_ARGUMENT_NODES: Final = 100_000
# The pure-Python RFC 8785 encoder costs about 7 us per value (floats, astral-plane
# text), against well under 1 us for the C json path: a smaller budget keeps one hostile
# request from holding the event loop for long (~70 ms at this bound).
MAX_JCS_NODES: Final = 10_000
_SAFE_INT: Final = 2**53 - 1
_DOMAIN: Final = b"statecodec/v1/binding\x00"
_U32 = struct.Struct(">I")
_PRESENT = struct.Struct(">BI")  # 0x01 and the u32 length of a present field
_TEXT_FIELDS: Final = ("principal", "audience", "method", "target")
# Copied per digest: hashlib.sha256(data) looks the algorithm up in OpenSSL on every call.
_SHA256: Final = hashlib.sha256()
_NO_EXTRA: Final[Mapping[str, str]] = MappingProxyType({})


class _Walk:
    """One pass over JSON-like arguments: validate types, bound size, pick the encoder."""

    __slots__ = ("needs_jcs", "nodes")

    def __init__(self) -> None:
        self.nodes = 0
        self.needs_jcs = False

    def visit(self, value: Any, depth: int) -> None:
        self.nodes += 1
        if self.nodes > MAX_ARGUMENT_NODES:
            raise ValueError(f"arguments have more than {MAX_ARGUMENT_NODES} JSON values")
        if depth > MAX_ARGUMENT_DEPTH:
            raise ValueError(f"arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels")
        kind = type(value)
        if value is None or kind is bool:
            return
        if kind is str:
            if not value.isascii():  # ASCII (the common case) needs no further look
                self._text(value)
        elif kind is int:
            if not -_SAFE_INT <= value <= _SAFE_INT:
                raise TypeError(f"integer {value} is outside the interoperable range +-(2**53-1)")
        elif kind is float:
            self.needs_jcs = True  # ECMAScript number formatting differs from repr()
        elif kind is dict:
            for key, item in value.items():
                if type(key) is not str:
                    raise TypeError(f"argument keys must be str, not {type(key).__name__}")
                if not key.isascii():
                    self._text(key)
                self.visit(item, depth + 1)
        elif kind is list or kind is tuple:
            for item in value:
                self.visit(item, depth + 1)
        else:
            raise TypeError(f"argument value of type {kind.__name__} cannot be canonical JSON")

    def _text(self, text: str) -> None:
        # JCS sorts keys by UTF-16 code units, Python by code points: they differ only
        # when a key holds characters at or above U+D800. Such text takes the JCS path,
        # which also rejects lone surrogates.
        if max(text) >= "\ud800":
            self.needs_jcs = True


def _plain_flat(arguments: dict[Any, Any]) -> bool:
    """True for a flat object of plain scalars, which needs neither the walk nor JCS.

    The usual ``tools/call`` arguments (``{"city": "Lisbon", "days": 3}``), checked in one
    loop instead of the recursive walk. It accepts only what the walk accepts without
    needing JCS (str keys and text below U+D800, integers within +-(2**53-1), bools, None;
    fewer than MAX_ARGUMENT_NODES members). Anything else, including every value the walk
    refuses, returns False so the walk decides, with its precise error.
    """
    if len(arguments) >= MAX_ARGUMENT_NODES:  # the object itself is one more node
        return False
    for name, value in arguments.items():
        # Below U+D800, code-point order is UTF-16 order and no lone surrogate can hide,
        # so orjson's sorted keys and JCS agree (see _Walk._text).
        if type(name) is not str or not (name.isascii() or max(name) < "\ud800"):
            return False
        kind = type(value)  # exact types: subclasses (IntEnum, str subclasses) take the walk
        if kind is str:
            if not (value.isascii() or max(value) < "\ud800"):
                return False
        elif kind is int:
            if not -_SAFE_INT <= value <= _SAFE_INT:
                return False
        elif kind is not bool and value is not None:
            return False
    return True


def canonical_json(arguments: Any) -> bytes:
    """RFC 8785 canonical JSON of ``arguments``, or ``TypeError``/``ValueError``.

    Plain data (str keys, strings below U+D800, safe integers, bools, None) is encoded by
    orjson with sorted keys, which yields the same bytes as JCS for that subset: UTF-8
    output, the same escapes, keys in code-point order (tests hold it to ``rfc8785``).
    Anything else (floats, astral-plane text) goes through ``rfc8785``.
    """
    if type(arguments) is not dict or not _plain_flat(arguments):
        walk = _Walk()
        walk.visit(arguments, 0)
        if walk.needs_jcs:
            if walk.nodes > MAX_JCS_NODES:
                raise ValueError(
                    f"arguments with floats or astral-plane text are limited to {MAX_JCS_NODES} JSON values"
                )
            try:
                return rfc8785.dumps(arguments)
            except rfc8785.CanonicalizationError as exc:
                raise TypeError(f"arguments cannot be canonical JSON: {exc}") from None
            except UnicodeEncodeError:  # rfc8785 sorts keys as UTF-16 before it checks them
                raise TypeError("arguments cannot be canonical JSON: a key holds a lone surrogate") from None
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)


def argument_digest(arguments: Any) -> bytes:
    """SHA-256 of the canonical JSON of ``arguments`` (32 bytes)."""
    h = _SHA256.copy()
    h.update(canonical_json(arguments))
    return h.digest()


def _field(value: bytes) -> bytes:
    return _PRESENT.pack(1, len(value)) + value


# The encoded text fields of recent bindings. Audience, method and target repeat on nearly
# every request, and a principal across the rounds of its requests, so a hit replaces an
# encode, a pack and a concatenation by one dict lookup (this runs once per request; the
# A/B measurement in docs/performance.md kept it). Only exact ``str`` keys: a subclass
# could override ``__eq__``/``__hash__`` and alias the entry of other text. Only short
# text, and emptied when full, so hostile requests can neither grow it past about 2 MiB
# nor do more than turn hits into misses. It holds no secret: a hit or miss reveals at
# most that some request recently carried that text.
_FIELD_CACHE: Final[dict[str, bytes]] = {}
_FIELD_CACHE_MAX: Final = 1024
_FIELD_CACHE_TEXT_MAX: Final = 256
_ABSENT: Final = b"\x00"
_DIGEST_PRESENT: Final = _PRESENT.pack(1, 32)
_NO_EXTRA_COUNT: Final = _U32.pack(0)


def _text_field(text: Any) -> bytes:
    """One text field of the encoding; raises ``TypeError`` (for :func:`_encode`) if not text."""
    if type(text) is str:
        field = _FIELD_CACHE.get(text)
        if field is None:
            field = _field(text.encode("utf-8", "surrogatepass"))
            if len(text) <= _FIELD_CACHE_TEXT_MAX:
                if len(_FIELD_CACHE) >= _FIELD_CACHE_MAX:
                    _FIELD_CACHE.clear()
                _FIELD_CACHE[text] = field
        return field
    if text is None:
        return _ABSENT
    if isinstance(text, str):  # a str subclass: correct, just never cached
        return _field(text.encode("utf-8", "surrogatepass"))
    raise TypeError


def _encode(
    texts: tuple[Any, Any, Any, Any], argument_digest: bytes | None, extra: Mapping[str, str]
) -> bytes:
    """The binding encoding of docs/format.md: every field 0x00 (absent) or 0x01 || u32 || bytes."""
    principal, audience, method, target = texts
    try:
        parts = [
            _DOMAIN,
            _text_field(principal),
            _text_field(audience),
            _text_field(method),
            _text_field(target),
        ]
    except TypeError:
        raise _type_error(texts) from None
    parts.append(_ABSENT if argument_digest is None else _DIGEST_PRESENT + argument_digest)
    parts.append(_encode_extra(extra) if extra else _NO_EXTRA_COUNT)
    return b"".join(parts)


def _encode_extra(extra: Mapping[str, str]) -> bytes:
    parts = [_U32.pack(len(extra))]
    for key in sorted(extra):
        value = extra[key]
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError("binding extra must map str to str")
        parts.append(_field(key.encode("utf-8", "surrogatepass")))
        parts.append(_field(value.encode("utf-8", "surrogatepass")))
    return b"".join(parts)


def _type_error(texts: tuple[Any, ...]) -> TypeError:
    for name, value in zip(_TEXT_FIELDS, texts, strict=True):
        if value is not None and not isinstance(value, str):
            return TypeError(f"binding {name} must be str or None, not {type(value).__name__}")
    # Reached only if a str subclass raises TypeError while encoding itself.
    return TypeError("binding fields must be str or None")


def _read_only(name: str) -> Any:
    """A public, read-only field of :class:`Binding`, stored in the private slot ``_<name>``.

    A property rather than a ``__setattr__`` override: ``__init__`` then fills the slots
    with plain assignments (an override would turn each into a Python call), and only
    the public name refuses assignment.
    """
    slot = "_" + name

    def refuse(self: Binding, value: object = None) -> NoReturn:
        # The tag covers the fields as they were at construction, so a field changed
        # afterwards would silently bind to something other than what it says.
        raise AttributeError(f"Binding is immutable; use binding.replace({name}=...)")

    return property(attrgetter(slot), refuse, refuse)


def _restore(
    texts: tuple[str | None, str | None, str | None, str | None],
    argument_digest: bytes | None,
    extra: dict[str, str],
) -> Binding:
    return Binding(*texts, argument_digest=argument_digest, extra=extra)


class Binding:
    """What a token is bound to. Every field is optional; absent and empty differ.

    ``arguments`` is digested at construction, so a non-JSON value fails right here with a
    ``TypeError`` naming the culprit, and the raw arguments are not kept. Pass
    ``argument_digest`` instead when the digest was computed elsewhere.

    A Binding is immutable and caches its keyed tag per key: build one per request and
    use it for both the inbound unseal and the outbound seal.
    """

    __slots__ = (
        "_argument_digest",
        "_audience",
        "_encoded",
        "_extra",
        "_method",
        "_principal",
        "_tags",
        "_target",
    )
    principal: str | None = _read_only("principal")
    audience: str | None = _read_only("audience")
    method: str | None = _read_only("method")
    target: str | None = _read_only("target")
    argument_digest: bytes | None = _read_only("argument_digest")
    extra: Mapping[str, str] = _read_only("extra")
    _encoded: bytes
    _tags: dict[bytes, bytes]

    def __init__(
        self,
        principal: str | None = None,
        audience: str | None = None,
        method: str | None = None,
        target: str | None = None,
        arguments: Any = None,
        *,
        argument_digest: bytes | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        if arguments is not None:
            if argument_digest is not None:
                raise ValueError("pass arguments or argument_digest, not both")
            h = _SHA256.copy()  # argument_digest(), inline: this runs once per request
            h.update(canonical_json(arguments))
            argument_digest = h.digest()
        elif argument_digest is not None and len(argument_digest) != 32:
            raise ValueError("argument_digest must be 32 bytes (SHA-256)")
        frozen_extra = MappingProxyType(dict(extra)) if extra else _NO_EXTRA
        # The encoding first: it type-checks every field, so a Binding is complete or absent.
        self._encoded = _encode((principal, audience, method, target), argument_digest, frozen_extra)
        self._principal = principal
        self._audience = audience
        self._method = method
        self._target = target
        self._argument_digest = argument_digest
        self._extra = frozen_extra
        self._tags = {}

    def __copy__(self) -> Binding:
        return self  # immutable: a copy is the same value

    def __deepcopy__(self, memo: dict[int, Any]) -> Binding:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its fields, so the tag cache never travels: it is keyed by secret
        # binding subkeys.
        texts = (self.principal, self.audience, self.method, self.target)
        return (_restore, (texts, self.argument_digest, dict(self.extra)))

    @property
    def encoded(self) -> bytes:
        """The unambiguous, length-prefixed byte string the tag is computed over."""
        return self._encoded

    def tag(self, key: Key) -> bytes:
        """HMAC-SHA256(key.bind_key, encoded)[:16], cached per key (a handful at most)."""
        tags = self._tags
        tag = tags.get(key.bind_key)
        if tag is None:
            tag = key.binding_tag(self._encoded)
            if len(tags) < 8:  # never grow without bound
                tags[key.bind_key] = tag
        return tag

    def replace(self, **changes: Any) -> Binding:
        fields: dict[str, Any] = {
            "principal": self.principal,
            "audience": self.audience,
            "method": self.method,
            "target": self.target,
            "argument_digest": self.argument_digest,
            "extra": self.extra,
        }
        if "arguments" in changes:
            fields.pop("argument_digest")
        fields.update(changes)
        return Binding(**fields)

    def describe(self) -> dict[str, Any]:
        """The binding's fields, with the digest in hex (for logs and the CLI)."""
        return {
            "principal": self.principal,
            "audience": self.audience,
            "method": self.method,
            "target": self.target,
            "argument_digest": None if self.argument_digest is None else self.argument_digest.hex(),
            "extra": dict(self.extra),
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Binding):
            return NotImplemented
        return self._encoded == other._encoded

    def __hash__(self) -> int:
        return hash(self._encoded)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.describe().items() if v not in (None, {}))
        return f"Binding({fields})"


#: The binding of a token sealed without one. Unsealing with any other binding fails.
UNBOUND: Final = Binding()
