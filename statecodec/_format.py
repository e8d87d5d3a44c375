"""The statecodec v1 token format: bytes <-> text, nothing else.

This module knows the layout of a token and how to read it strictly. It never sees a
clock, a key or a policy; :mod:`statecodec._codec` does the cryptography and the checks.
docs/format.md is the normative description; keep the two in step.

Text form::

    "sc1s." base64url(header || payload || mac)                     SIGN    (HMAC-SHA256)
    "sc1e." base64url(header || nonce_suffix || ciphertext || tag)  ENCRYPT (XChaCha20-Poly1305)

Header (fixed order, fixed widths except the kid, which is length-prefixed)::

    flags|kid_len  u8  bits 0-5: kid_len 1..32; bit 7: CHAINED; bit 6: PACED
    kid      kid_len   ASCII [A-Za-z0-9._:-]
    iat      u32 BE    issued-at, Unix seconds
    exp      u32 BE    expires-at, Unix seconds
    tid      16 bytes  random token id (the replay store's key)
    btag     16 bytes  keyed binding tag
    -- only if CHAINED (a later round of a multi-round flow):
    flow     16 bytes  the flow id: the tid of the flow's first token
    round    u8        2..255, this token's round in the flow
    start    u32 BE    the flow's start: the iat of its first token
    -- only if PACED (the server asks the client to wait before retrying):
    nbf_ms   u32 BE    1..: milliseconds after iat before which the token is too early

A token without the flags is byte for byte a token of before the flags: a first round
is a flow of one (flow = tid, round 1, start = iat), never spelled CHAINED.

The prefix selects the version and the mode; a codec accepts only its own. The MAC input
and the AEAD associated data both start with the ASCII prefix, so a token cannot be
moved from one mode or version to another.

The 24-byte XChaCha20 nonce is ``tid || nonce_suffix``: the token id, already random and
authenticated as part of the header, doubles as the first 16 nonce bytes, so only the
last 8 travel after the header (see :func:`aead_nonce` and docs/format.md).
"""

from __future__ import annotations

import re
import struct
import time
from typing import Final, NamedTuple

from pybase64 import b64decode as _b64decode
from pybase64 import b64encode_as_string

from ._errors import InvalidState

VERSION: Final = 1
PREFIX_SIGN: Final = "sc1s."
PREFIX_ENCRYPT: Final = "sc1e."
PREFIXES: Final = {"s": PREFIX_SIGN, "e": PREFIX_ENCRYPT}

KID_MAX: Final = 32
TOKEN_ID_LEN: Final = 16
BIND_TAG_LEN: Final = 16
MAC_LEN: Final = 32
NONCE_LEN: Final = 24  # XChaCha20's nonce: tid || nonce_suffix
NONCE_SUFFIX_LEN: Final = NONCE_LEN - TOKEN_ID_LEN  # the 8 nonce bytes the header does not carry
AEAD_TAG_LEN: Final = 16
MAX_TIME: Final = 2**32 - 1
#: :data:`MAX_TIME` for people: the last instant a token can carry.
LAST_TIME: Final = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(MAX_TIME))

FLAG_CHAINED: Final = 0x80
FLAG_PACED: Final = 0x40
_KID_LEN_MASK: Final = 0x3F
MAX_ROUND: Final = 255

_TIMES = struct.Struct(">II")
_CHAIN = struct.Struct(f">{TOKEN_ID_LEN}sBI")  # flow id, round, flow start
_PACE = struct.Struct(">I")  # nbf_ms
_HEADER_FIXED: Final = 1 + 8 + TOKEN_ID_LEN + BIND_TAG_LEN  # the header without the kid: 41 bytes
_AEAD_TRAILER: Final = NONCE_SUFFIX_LEN + AEAD_TAG_LEN
# kid, iat, exp, tid and btag in one C call: one layout per kid length.
_HEADER_FIELDS: Final = {
    n: struct.Struct(f">{n}sII{TOKEN_ID_LEN}s{BIND_TAG_LEN}s") for n in range(1, KID_MAX + 1)
}
_KID_RE: Final = re.compile(r"[A-Za-z0-9._:-]{1,32}")
_B64_RE: Final = re.compile(r"[A-Za-z0-9_-]*")
# ASCII digits only: a Unicode digit is not a version number, just a malformed token.
_PREFIX_RE: Final = re.compile(r"sc([0-9]{1,3})([a-z])\.")
_PADDING: Final = ("", "", "==", "=")  # by len % 4 (1 is impossible)
# For canonical base64url: the value of each alphabet character, to test the unused low
# bits of the last character (non-zero bits would give two spellings of one token).
_B64_VALUE: Final = {
    c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
}


class TimeRangeError(ValueError):
    """Times a header cannot carry: before 1970, after :data:`LAST_TIME`, or ending before they start.

    A ``ValueError`` as any other refusal of a value to seal; a class of its own so that
    ``statecodec mint`` tells a ``--ttl`` too long for ``--at`` (a usage error) from a
    payload too large for a token.
    """


class ParsedToken(NamedTuple):
    """A token split into its fields. Nothing here has been verified."""

    prefix: str
    mode: str  # "s" or "e"
    kid: str
    issued_at: int
    expires_at: int
    token_id: bytes
    bind_tag: bytes
    header: bytes  # everything from kid_len to bind_tag
    body: bytes  # SIGN: payload; ENCRYPT: nonce_suffix || ciphertext || tag
    mac: bytes  # SIGN: the 32-byte MAC; ENCRYPT: empty
    flow_id: bytes  # the tid of the flow's first token (this token's own tid in a first round)
    round: int  # 1 for a first round
    flow_started_at: int  # the iat of the flow's first token
    not_before_ms: int  # 0, or milliseconds after issued_at before which the token is too early


def valid_kid(kid: str) -> bool:
    return _KID_RE.fullmatch(kid) is not None


def b64encode(raw: bytes) -> str:
    # pybase64 (SIMD base64 in C) writes the URL-safe alphabet itself; only "=" goes.
    return b64encode_as_string(raw, altchars=b"-_").rstrip("=")


#: Why 4n+1 characters of base64url are refused: no encoding has that length.
CUT_SHORT: Final = "looks cut short (no base64url text is 4n+1 characters long: was it truncated?)"


def b64decode(text: str) -> bytes:
    """Decode canonical unpadded base64url or raise ``ValueError``.

    Rejects padding, whitespace, characters outside the URL-safe alphabet, impossible
    lengths and non-zero trailing bits, so every byte string has exactly one spelling.
    """
    if not isinstance(text, str):
        raise TypeError(f"base64url text must be str, not {type(text).__name__}")
    rem = len(text) % 4
    # pybase64 with altchars "-_" and validate=True refuses every character outside
    # the alphabet, but also takes "+" and "/" (as 62 and 63) and "=" in padding
    # positions: those three are refused first, so only the URL-safe spelling decodes.
    if rem != 1 and "=" not in text and "+" not in text and "/" not in text:
        try:
            raw = _b64decode(text + _PADDING[rem], altchars=b"-_", validate=True)
        except ValueError:  # binascii.Error, also for non-ASCII text
            pass
        else:
            if rem and _B64_VALUE[text[-1]] & (0x0F if rem == 2 else 0x03):
                raise ValueError("non-canonical base64url (trailing bits set)")
            return raw
    # Not canonical base64url: find out why, for a precise message.
    if _B64_RE.fullmatch(text) is None:
        raise ValueError("characters outside the unpadded base64url alphabet")
    if rem == 1:
        # No encoding is 4n+1 characters long: such text lost characters, almost always
        # at its end (a copy, a terminal, a log line cut it).
        raise ValueError(CUT_SHORT)
    raise ValueError("not canonical base64url")  # unreachable; fail closed anyway


def kid_field(kid: str) -> bytes:
    """The kid as the header carries it: ``kid_len || kid``, or ``ValueError``."""
    if not valid_kid(kid):
        raise ValueError(f"invalid kid {kid!r}: 1-32 characters of [A-Za-z0-9._:-]")
    kid_b = kid.encode("ascii")
    return bytes((len(kid_b),)) + kid_b


def pack_header(
    kid_field: bytes,
    issued_at: int,
    expires_at: int,
    token_id: bytes,
    bind_tag: bytes,
    *,
    flow: tuple[bytes, int, int] | None = None,
    not_before_ms: int = 0,
) -> bytes:
    """The header, with the kid already encoded by :func:`kid_field`, or ``ValueError``.

    ``flow`` is ``(flow_id, round, flow_started_at)`` of a later round (CHAINED), ``None``
    for a first round; ``not_before_ms`` > 0 makes the token PACED. A :class:`~statecodec.Key`
    encodes its kid once, so minting skips the kid regex.
    """
    if not 0 <= issued_at <= expires_at <= MAX_TIME:
        raise TimeRangeError(_times_problem(issued_at, expires_at))
    if len(token_id) != TOKEN_ID_LEN or len(bind_tag) != BIND_TAG_LEN:
        raise ValueError("token id and binding tag must be 16 bytes each")
    header = kid_field + _TIMES.pack(issued_at, expires_at) + token_id + bind_tag
    if flow is None and not not_before_ms:
        return header
    flags = 0
    if flow is not None:
        flow_id, round_, started = flow
        if len(flow_id) != TOKEN_ID_LEN or not 2 <= round_ <= MAX_ROUND or not 0 <= started <= issued_at:
            raise ValueError("a chained header needs a 16-byte flow id, round 2..255, 0 <= start <= iat")
        flags |= FLAG_CHAINED
        header += _CHAIN.pack(flow_id, round_, started)
    if not_before_ms:
        if not 0 < not_before_ms <= (expires_at - issued_at) * 1000:
            raise ValueError("not_before_ms must be positive and no later than the expiry")
        flags |= FLAG_PACED
        header += _PACE.pack(not_before_ms)
    return bytes((header[0] | flags,)) + header[1:]


def _times_problem(issued_at: int, expires_at: int) -> str:
    rule = "times must satisfy 0 <= issued_at <= expires_at < 2**32"
    if 0 <= issued_at <= MAX_TIME < expires_at:
        return f"the token would expire after {LAST_TIME}, the last time a token can carry ({rule})"
    return rule


def aead_nonce(token_id: bytes, nonce_suffix: bytes) -> bytes:
    """The XChaCha20 nonce of an ENCRYPT token: ``tid || nonce_suffix``, 24 bytes.

    Both parts are random bytes the library draws for every token, so the nonce is a
    fresh 192-bit random value as before; sharing its first 16 bytes with the token id
    saves 16 bytes per token. The token id also sits in the associated data, so changing
    it changes both the nonce and the associated data, and the tag fails either way.
    """
    if len(token_id) != TOKEN_ID_LEN or len(nonce_suffix) != NONCE_SUFFIX_LEN:
        raise ValueError(f"the nonce is a {TOKEN_ID_LEN}-byte token id and a {NONCE_SUFFIX_LEN}-byte suffix")
    return token_id + nonce_suffix


def encode(prefix: str, raw: bytes) -> str:
    return prefix + b64encode(raw)


def _prefix_error(token: str) -> InvalidState:
    """Why ``token`` has neither ``sc1s.`` nor ``sc1e.``: another version, mode or nothing."""
    m = _PREFIX_RE.match(token)
    if m is None:
        return InvalidState("malformed", "not a statecodec token (no 'sc1s.' or 'sc1e.' prefix)")
    version, mode = m.groups()
    if version != str(VERSION):
        return InvalidState("unsupported_version", f"token format version {version} is not supported")
    return InvalidState("unsupported_version", f"unknown mode {mode!r} in format version {VERSION}")


def check_size(token: str, max_token_bytes: int) -> None:
    """The size cap of an inbound token (``too_large``): the one place it is written.

    Every reader runs it first, before any decoding (and the boundary before the argument
    digest), so a huge input costs nothing: the sc1 parser here, the SDK window, the
    readers of the other SDKs' formats.
    """
    if len(token) > max_token_bytes:
        raise InvalidState("too_large", f"token is {len(token)} characters, the limit is {max_token_bytes}")


def parse(token: str, max_token_bytes: int) -> ParsedToken:
    """Split ``token`` into fields, strictly, or raise :class:`InvalidState`.

    The size cap comes first, before any decoding, so a huge input costs nothing.
    """
    if not isinstance(token, str):
        raise InvalidState("malformed", f"token must be str, not {type(token).__name__}")
    check_size(token, max_token_bytes)
    if token.startswith(PREFIX_SIGN):
        prefix, mode, trailer = PREFIX_SIGN, "s", MAC_LEN
    elif token.startswith(PREFIX_ENCRYPT):
        prefix, mode, trailer = PREFIX_ENCRYPT, "e", _AEAD_TRAILER
    else:
        raise _prefix_error(token)
    try:
        raw = b64decode(token[len(prefix) :])
    except ValueError as exc:
        detail = str(exc)
        raise InvalidState("malformed", f"the token {detail}" if detail == CUT_SHORT else detail) from None
    if not raw:
        raise InvalidState("malformed", "empty token body")
    kid_len = raw[0]
    flags = 0
    if kid_len > _KID_LEN_MASK:  # a flag is set (a first round never has one: the fast path)
        flags, kid_len = kid_len & ~_KID_LEN_MASK, kid_len & _KID_LEN_MASK
    if not 1 <= kid_len <= KID_MAX:
        raise InvalidState("malformed", f"kid length {kid_len} is out of range")
    header_len = kid_len + _HEADER_FIXED
    if flags:
        header_len += (_CHAIN.size if flags & FLAG_CHAINED else 0) + (_PACE.size if flags & FLAG_PACED else 0)
    if len(raw) < header_len + trailer:
        raise InvalidState("malformed", "the token looks cut short (truncated before its tag)")
    kid_b, issued_at, expires_at, token_id, bind_tag = _HEADER_FIELDS[kid_len].unpack_from(raw, 1)
    if kid_b.isalnum():  # ASCII letters and digits only (bytes.isalnum is ASCII-only): valid
        kid = kid_b.decode("ascii")
    else:
        kid = kid_b.decode("ascii", "replace")
        if not valid_kid(kid):
            raise InvalidState("malformed", "kid has characters outside [A-Za-z0-9._:-]")
    if trailer == MAC_LEN:
        body, mac = raw[header_len:-MAC_LEN], raw[-MAC_LEN:]
    else:
        body, mac = raw[header_len:], b""
    header = raw[:header_len]
    if not flags:  # a flow of one: its own id, round 1, started at iat; not paced
        return ParsedToken(
            prefix, mode, kid, issued_at, expires_at, token_id, bind_tag, header, body, mac,
            token_id, 1, issued_at, 0,
        )  # fmt: skip
    flow_id, round_, started, not_before_ms = token_id, 1, issued_at, 0
    at = kid_len + _HEADER_FIXED
    if flags & FLAG_CHAINED:
        flow_id, round_, started = _CHAIN.unpack_from(raw, at)
        if round_ < 2:  # round 1 is spelled without the flag: one spelling per token
            raise InvalidState("malformed", f"a chained token of round {round_}")
        at += _CHAIN.size
    if flags & FLAG_PACED:
        (not_before_ms,) = _PACE.unpack_from(raw, at)
        if not not_before_ms:
            raise InvalidState("malformed", "a paced token without a wait")
    return ParsedToken(
        prefix, mode, kid, issued_at, expires_at, token_id, bind_tag, header, body, mac,
        flow_id, round_, started, not_before_ms,
    )  # fmt: skip
