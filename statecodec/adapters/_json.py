"""JSON for a byte-level intermediary: strict for requests, as any client reads it for answers.

The two directions ask opposite questions.

A **request** comes from the attacker, and the application behind the middleware must
read exactly the document the middleware judged. :func:`loads_strict` therefore refuses
whatever two parsers could read differently: a BOM, invalid UTF-8, duplicate keys,
``NaN``/``Infinity``, and numbers beyond the float range such as ``1e400`` (Python reads
them as infinity, which no JSON can carry on to the application).

An **answer** comes from the protected server, and the question is whether *any* client
could find a state in it (:func:`may_hold_state` rules most answers out without parsing
them). :func:`decode_answer` and :func:`read_answer` read it as the most lenient client does:
UTF-16 and UTF-32 as ``httpx`` detects them, any number of leading byte-order marks,
invalid UTF-8 replaced as ``fetch()`` does, ``NaN`` as Python's ``json`` reads it,
duplicate keys with the last one winning (JavaScript's rule), and **no nesting limit**:
Python's C parser stops near 1,000 levels, ``JSON.parse`` does not, so a deeper answer
goes through an iterative parser here rather than being taken for "not JSON" and relayed.
:func:`dumps` writes any decoded document back, at any depth.

:func:`classify` tells, from the first bytes of an answer, whether a client could read it
as JSON, as a stream of server-sent events, or not at all.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Callable
from typing import Any, Final, Literal

import orjson

from ..boundary import FOLDED_REQUEST_STATE, fold_key

Kind = Literal["json", "sse", "other"]

_STRICT_NUMBERS: Final = "NaN, Infinity and numbers beyond the float range are not JSON"
_WS: Final = re.compile(r"[ \t\n\r]*")
# Reads one scalar (string, number, literal) at a position: never nested, so never deep.
_SCALAR: Final = json.JSONDecoder()
_LEADING: Final = " \t\r\n\ufeff"  # whitespace and byte-order marks before a document
# The first line of an event stream: a field (data, event, id, retry) or a comment.
_SSE_START: Final = re.compile(r"(?:data|event|id|retry)(?::|\r|\n|$)|:")
_SNIFF_BYTES: Final = 64
# Where orjson's bytes may differ from json.dumps': a float (orjson writes every one with a '.'
# or an exponent after its digits: 1e-05 as 0.00001) or a null (NaN and Infinity come out as
# null). In compact JSON such a token opens the document or follows ':', ',' or '['. With the
# digits and '-' deleted, ',' and '[' read as ':' and the exponent as '.', every float token
# reads ":." (or opens the document with "."), every null ":null" (or opens it). A string may
# read the same (a false alarm only costs the slow path); a version "1.2.3" or the word
# "nullable" does not. bytes.translate and find run at C speed, where a regular expression
# over the whole document would cost about as much as json.dumps itself.
_TOKENS: Final = bytes.maketrans(b",[eE", b"::..")
_DELETED: Final = b"0123456789-"


def _may_differ(fast: bytes) -> bool:
    """Whether orjson's ``fast`` bytes may hold a float or a null: then json writes the value.

    A large document is looked at a piece at a time (pieces overlapping by a token's
    length), so the check never holds a second copy of it.
    """
    if len(fast) > _DECODE_PIECE:
        return _pieces_may_differ(fast)
    shape = fast.translate(_TOKENS, _DELETED)
    # find, not `in`: bytes.__contains__ raises and clears a TypeError before it searches.
    return shape.find(b":.") != -1 or shape.find(b":null") != -1 or shape.startswith((b".", b"null"))


def _pieces_may_differ(fast: bytes) -> bool:
    """:func:`_may_differ` of a large document, a piece at a time (each within one piece)."""
    # A piece that starts inside a number or a string may raise a false alarm (a leading
    # "." or "null"), never miss a float: a false alarm costs the slow path.
    view = memoryview(fast)
    step = _DECODE_PIECE - _PIECE_OVERLAP
    return any(_may_differ(bytes(view[at : at + _DECODE_PIECE])) for at in range(0, len(fast), step))


# What json.dumps cannot write, orjson must not write either: those go the slow way and fail.
_PLAIN_JSON_ONLY: Final = (
    orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
)


# ---------------------------------------------------------------- requests
def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(_STRICT_NUMBERS)
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(_STRICT_NUMBERS)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key[:40]!r}")
            seen.add(key)
    return obj


_STRICT: Final = json.JSONDecoder(object_pairs_hook=_unique, parse_constant=_no_constant, parse_float=_finite)


_MISS: Final = object()
_DECODE_PIECE: Final = 1024 * 1024
# Pieces looked at separately overlap by more than a token's length (":null", ":."), so
# no token is split between two of them.
_PIECE_OVERLAP: Final = 16
# orjson's parser reserves many times its input while it reads (over 12 times for a 15 MiB
# answer of non-ASCII text), and json's a little over one: beyond this size an answer is
# read by json, so the memory an answer takes stays a few times its size.
_ORJSON_MAX_CHARS: Final = 256 * 1024


def _exact(data: bytes) -> Any:
    """orjson's reading of ``data`` when orjson writes ``data`` back byte for byte, else ``_MISS``.

    Those bytes are then the serialisation of one tree of plain values, in which no object
    can hold a key twice (a dropped duplicate would be missing from what is written back)
    and which json reads as the same values (a float written back identically is the same
    double; NaN, Infinity, 1e400, integers orjson reads as floats, lone surrogates, a BOM,
    whitespace, other escapes, control characters and depths beyond orjson's 254 levels of
    writing all fail the comparison or orjson itself). ``_MISS``: json must decide.
    """
    try:
        value = orjson.loads(data)
        if orjson.dumps(value) == data:
            return value
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        pass  # json's path decides, with its own message
    return _MISS


def loads_strict(data: bytes) -> Any:
    """JSON that every conforming parser reads the same way, or ``ValueError``.

    UTF-8 only (no BOM, no repaired bytes), no duplicate keys, no NaN or Infinity, no
    number that overflows a float. Input nested too deeply for the C parser raises
    ``ValueError`` too (a request has no business being that deep), never ``RecursionError``.

    The usual request (compact JSON as the SDKs' clients, httpx and ``JSON.stringify``
    write it) is read by orjson and kept only when orjson writes the very same bytes back
    (:func:`_exact`: then no key is repeated and json would read the same values).
    Anything else, and every refusal, takes json's path with its duplicate-key hook, which
    decides alone (the hook's Python call per object is much of that path's cost).
    """
    value = _exact(data)
    if value is not _MISS:
        return value
    try:
        return _STRICT.decode(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


# ---------------------------------------------------------------- answers
def _encoding(data: bytes) -> str:
    """:func:`json.detect_encoding`, answering the usual UTF-8 document without its checks."""
    if data[:1] in (b"{", b"[") and data[1:2] != b"\x00":
        return "utf-8"  # what detect_encoding says for any ASCII first byte and non-null second
    return json.detect_encoding(data)


def decode_answer(data: bytes) -> str:
    """``data`` as text the way the most lenient client reads it, byte-order marks removed.

    A large answer is decoded a piece at a time: decoded at once, text beyond Latin-1 goes
    through a buffer of several times its size first.
    """
    encoding = _encoding(data)
    if len(data) <= _DECODE_PIECE:
        return data.decode(encoding, "replace").lstrip(_LEADING)
    decoder = codecs.getincrementaldecoder(encoding)("replace")
    view = memoryview(data)
    pieces = [decoder.decode(view[at : at + _DECODE_PIECE]) for at in range(0, len(data), _DECODE_PIECE)]
    pieces.append(decoder.decode(b"", final=True))
    return "".join(pieces).lstrip(_LEADING)


def may_hold_state(text: str) -> bool:
    """False only when no key of ``text`` can spell ``requestState``: then nothing needs reading.

    A key is a state when it is ``requestState`` or normalises to it as
    :func:`statecodec.boundary.fold_key` normalises (case-folded, ``_`` and
    ``-`` removed). In ASCII text without ``\\u`` escapes such a key is written with
    exactly those letters, in some case, with ``_`` and ``-`` between them, so the text
    normalised the same way contains ``requeststate`` (a false alarm only costs a parse).
    Any other text, where case folding or an escape could spell it otherwise (U+017F,
    the long s, folds to ``s``), may hold one.
    """
    if not text.isascii() or has_unicode_escape(text):
        return True
    return FOLDED_REQUEST_STATE in fold_key(text)


def has_unicode_escape(text: str) -> bool:
    """Whether ``text`` holds a ``\\u`` escape, by which a JSON string may spell any character."""
    # A backslash is looked for first: a one-character search runs at memchr's speed, and
    # most answers hold none, where a two-character search costs a pass of its own. `in`,
    # not find: on str it goes straight to the search (bytes' `in` tries an int first), and
    # find parses its arguments, dearer in callgrind.
    return "\\" in text and "\\u" in text


def may_need_sealing(text: str) -> bool:
    """False only when the answer ``text`` needs nothing from the boundary's sealing path.

    It must be read when it may hold a state (:func:`may_hold_state`) and when it may be
    an ``input_required`` result, which must carry ``inputRequests`` or a state
    (:func:`statecodec.boundary.check_asks_something`). That value is a JSON
    string, so written without escapes it appears in quotes exactly; with escapes,
    :func:`may_hold_state` already says yes.
    """
    return '"input_required"' in text or may_hold_state(text)


def read_answer(text: str) -> Any:
    """The JSON document of an answer's text, at any depth, or ``ValueError``.

    Duplicate keys keep the last value, as in JavaScript; the shadowed ones are still in
    the bytes, so a caller about to relay the bytes must ask :func:`has_duplicate_keys`.
    An answer as ``JSON.stringify`` or orjson writes it is read by orjson when orjson
    writes its very bytes back (:func:`_exact`: json would read the same values), which
    is cheaper than json's read (docs/performance.md); anything else (NaN, whitespace,
    escapes, big integers) is json's to read.
    """
    value = _MISS
    if len(text) <= _ORJSON_MAX_CHARS:
        try:  # not contextlib.suppress: its three Python calls would come with every answer read
            value = _exact(text.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate: json reads it
            value = _MISS
    if value is not _MISS:
        return value
    try:
        return json.loads(text)
    except RecursionError:
        return loads_deep(text)


def has_duplicate_keys(text: str) -> bool:
    """Whether an object of the JSON ``text`` (which must parse) repeats a key."""
    found = False

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        obj = dict(pairs)
        found = found or len(obj) != len(pairs)
        return obj

    try:
        json.loads(text, object_pairs_hook=pairs_hook)
    except RecursionError:
        loads_deep(text, pairs_hook)
    return found


def loads_deep(text: str, pairs_hook: Callable[[list[tuple[str, Any]]], Any] = dict) -> Any:
    """``json.loads(text, object_pairs_hook=pairs_hook)`` without recursion, at any depth.

    The same grammar as Python's ``json`` (NaN and Infinity included) and the same
    values; slower, so it is only the fallback for what the C parser cannot nest.
    """
    frames: list[list[Any]] = []  # open containers: [items, is_object, pending key]
    pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
    while True:
        char = text[pos : pos + 1]
        value: Any
        if char in ("{", "["):
            pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
            closer = "}" if char == "{" else "]"
            if text.startswith(closer, pos):
                value, pos = (pairs_hook([]) if char == "{" else []), pos + 1
            else:
                key = None
                if char == "{":
                    key, pos = _key(text, pos)
                frames.append([[], char == "{", key])
                continue
        else:
            value, pos = _scalar(text, pos)
        # A value is complete: hand it to its container, closing every one that ends here.
        while True:
            pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
            if not frames:
                if pos != len(text):
                    raise ValueError(f"Extra data at character {pos}")
                return value
            frame = frames[-1]
            items, is_object = frame[0], frame[1]
            items.append((frame[2], value) if is_object else value)
            separator = text[pos : pos + 1]
            if separator == ",":
                pos = _WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                if is_object:
                    frame[2], pos = _key(text, pos)
                break
            if separator != ("}" if is_object else "]"):
                raise ValueError(f"Expecting ',' or a closing bracket at character {pos}")
            pos += 1
            frames.pop()
            value = pairs_hook(items) if is_object else items


def _key(text: str, pos: int) -> tuple[str, int]:
    if not text.startswith('"', pos):
        raise ValueError(f"Expecting a property name at character {pos}")
    key, pos = _scalar(text, pos)
    pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
    if not text.startswith(":", pos):
        raise ValueError(f"Expecting ':' at character {pos}")
    return key, _WS.match(text, pos + 1).end()  # type: ignore[union-attr]


def _scalar(text: str, pos: int) -> tuple[Any, int]:
    # raw_decode is json.loads at a position, without skipping whitespace: the same
    # strings, numbers, NaN and Infinity as the C parser reads.
    value, end = _SCALAR.raw_decode(text, pos)
    return value, end


def classify(data: bytes, *, final: bool) -> Kind | None:
    """What a client could read in an answer starting with ``data``; ``None``: need more bytes.

    ``"json"`` when the first character after whitespace and byte-order marks opens an
    object or an array (in UTF-8, UTF-16 or UTF-32), ``"sse"`` when the first line is an
    event-stream field or comment, ``"other"`` for anything else (HTML, text, binary).
    """
    if len(data) < 4 and not final:
        return None  # the encoding is not known yet
    encoding = _encoding(data)
    head = data[:_SNIFF_BYTES].decode(encoding, "replace")
    start = head.lstrip(_LEADING)
    if not start and len(data) > _SNIFF_BYTES:  # a long run of whitespace: look at all of it
        head = data.decode(encoding, "replace")
        start = head.lstrip(_LEADING)
    if not start:
        return "other" if final else None
    if start[0] in ("{", "["):
        return "json"
    line = head.lstrip("\ufeff\r\n")  # blank lines may open an event stream
    if _SSE_START.match(line):
        return "sse"
    if not final and len(line) < len("retry:") and "\n" not in line and "\r" not in line:
        return None
    return "other"


# ---------------------------------------------------------------- writing
def dumps(value: Any, *, allow_nan: bool = False) -> bytes:
    """Compact UTF-8 JSON, never containing a raw line break (safe as one SSE data line).

    Strings holding a lone surrogate (legal in JSON as an escape, not encodable as UTF-8)
    are written escaped, so any decoded document can be written back, however deep.
    ``allow_nan`` writes NaN and Infinity back as Python's ``json`` read them (answers).
    """
    try:
        # orjson writes the same compact JSON as json.dumps(ensure_ascii=False) several
        # times faster, except NaN and Infinity (as null) and floats (1e-05 as 0.00001,
        # 1e+16 as 1e16): a null or anything that may be a float sends the value the slow way.
        fast = orjson.dumps(value, option=_PLAIN_JSON_ONLY)
        if not _may_differ(fast):
            return fast
    except (TypeError, orjson.JSONEncodeError):  # integers beyond 64 bits, lone surrogates, depth
        pass
    try:
        return _dump(value, ensure_ascii=False, allow_nan=allow_nan).encode("utf-8")
    except UnicodeEncodeError:
        return _dump(value, ensure_ascii=True, allow_nan=allow_nan).encode("ascii")


def _dump(value: Any, *, ensure_ascii: bool, allow_nan: bool) -> str:
    try:
        return json.dumps(value, ensure_ascii=ensure_ascii, separators=(",", ":"), allow_nan=allow_nan)
    except RecursionError:
        return _dump_deep(value, ensure_ascii=ensure_ascii, allow_nan=allow_nan)


def _dump_deep(value: Any, *, ensure_ascii: bool, allow_nan: bool) -> str:
    """:func:`json.dumps` without recursion, for what :func:`loads_deep` can read."""

    def scalar(item: Any) -> str:
        return json.dumps(item, ensure_ascii=ensure_ascii, allow_nan=allow_nan)

    parts: list[str] = []
    frames: list[list[Any]] = []  # [iterator, closer, first]

    def open_value(item: Any) -> None:
        if isinstance(item, dict):
            parts.append("{")
            frames.append([iter(item.items()), "}", True])
        elif isinstance(item, list | tuple):
            parts.append("[")
            frames.append([iter(item), "]", True])
        else:
            parts.append(scalar(item))

    end: Any = object()
    open_value(value)
    while frames:
        frame = frames[-1]
        item: Any = next(frame[0], end)
        if item is end:
            parts.append(frame[1])
            frames.pop()
            continue
        if not frame[2]:
            parts.append(",")
        frame[2] = False
        if frame[1] == "}":
            key, item = item
            if not isinstance(key, str):
                raise TypeError(f"keys must be str, not {type(key).__name__}")
            parts.append(scalar(key) + ":")
        open_value(item)
    return "".join(parts)


# ---------------------------------------------------------------- streams of messages
# What may open, close or quote a JSON value: found with a compiled search (C), so text
# between them (most of a document) is never looked at byte by byte here.
_STRUCTURE: Final = re.compile(rb'["{}\[\]]')
_SPACE: Final = frozenset(b" \t\r\n")


def is_utf8(data: bytes) -> bool:
    """Whether an answer starting with ``data`` reads as UTF-8 (with or without a BOM)."""
    return _encoding(data) in ("utf-8", "utf-8-sig")


class MessageEnds:
    """Where each top-level JSON value of a UTF-8 stream ends (with the whitespace after it,
    as far as it has arrived), found as the bytes arrive.

    :meth:`scan` looks only at what was added since the last scan; :meth:`consumed` says
    that the caller removed that many bytes from the front of its buffer. Only brackets and
    quotes are followed (a string's escapes included), not the grammar: bytes that are not
    JSON end up inside a value that fails to parse where it is judged, never unjudged.
    """

    __slots__ = ("_depth", "_in_string", "_pos")

    def __init__(self) -> None:
        self._pos = 0
        self._depth = 0
        self._in_string = False

    def scan(self, buffer: bytes | bytearray) -> list[int]:
        """The offsets in ``buffer`` just past each top-level value completed since the last scan."""
        ends: list[int] = []
        pos, depth, in_string, size = self._pos, self._depth, self._in_string, len(buffer)
        while pos < size:
            if in_string:
                quote = buffer.find(b'"', pos)
                if quote == -1:
                    pos = size
                    break
                slashes = quote - 1
                while buffer[slashes] == 0x5C:  # an odd run of backslashes escapes the quote
                    slashes -= 1
                in_string = (quote - 1 - slashes) % 2 == 1
                pos = quote + 1
                continue
            found = _STRUCTURE.search(buffer, pos)
            if found is None:
                pos = size
                break
            pos = found.end()
            char = buffer[pos - 1]
            if char == 0x22:
                in_string = True
            elif char in (0x7B, 0x5B):
                depth += 1
            elif depth:
                depth -= 1
                if not depth:  # the whitespace after a value goes with it: a line ends with its LF
                    while pos < size and buffer[pos] in _SPACE:
                        pos += 1
                    ends.append(pos)
        self._pos, self._depth, self._in_string = pos, depth, in_string
        return ends

    def consumed(self, count: int) -> None:
        """The caller dropped the first ``count`` bytes (never inside an unfinished value)."""
        self._pos -= count
