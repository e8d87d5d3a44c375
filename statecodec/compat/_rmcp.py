"""What rmcp's two formats share: dotted sections, the ``expiry_ms || payload`` body, its expiry rule.

``rs2`` is ``rs1`` with a key id (rmcp PR #1128); the body and the way rmcp judges its
expiry are the same in both, so they are written once here. A token's expiry comes from
whoever made it: a body too short for the field is ``malformed``, an expiry of 0 (sealed
without a TTL, which rmcp accepts for ever) is refused as ``expired``, since such a token
can be replayed without end.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Final

from .._errors import InvalidState
from .._humanize import duration
from ._common import check_token

#: The body's first field: the expiry in Unix milliseconds (i64 big-endian; 0 = never expires).
EXPIRY_LEN: Final = 8
_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")


def sections(token: str, max_token_bytes: int, layout: str) -> list[str]:
    """``token``'s dot-separated sections when it has ``layout``'s count and version, else ``malformed``.

    ``layout`` is the format as its error message shows it, e.g. ``"rs1.<body>.<tag>"``.
    """
    check_token(token, max_token_bytes)
    parts = token.split(".")
    version = layout.split(".", 1)[0]
    if len(parts) != layout.count(".") + 1 or parts[0] != version:
        raise InvalidState("malformed", f"not an rmcp {version} token (expected {layout!r})")
    return parts


def length_prefixed(data: bytes) -> bytes:
    """``u64be(len(data)) || data``: how rmcp keeps the MAC's variable-length inputs apart."""
    return _U64.pack(len(data)) + data


def check_associated_data(value: object) -> bytes:
    """The caller's associated data, which must be bytes (``b""`` for none)."""
    if not isinstance(value, bytes):
        raise TypeError("associated_data must be bytes")
    return value


def expiry_ms(body: bytes) -> int | None:
    """The expiry in Unix milliseconds, 0 for "never", ``None`` when the body is too short."""
    return _I64.unpack_from(body)[0] if len(body) >= EXPIRY_LEN else None


def split_body(body: bytes) -> tuple[int, bytes]:
    """``(expiry_ms, payload)``, or ``malformed`` for a body shorter than its expiry field."""
    expiry = expiry_ms(body)
    if expiry is None:
        raise InvalidState("malformed", f"body is {len(body)} bytes, shorter than its expiry field")
    return expiry, body[EXPIRY_LEN:]


def check_expiry(expiry: int, clock: Callable[[], float]) -> None:
    """rmcp's ``expiry != 0 and now_ms > expiry``, with expiry 0 refused too (see the module)."""
    if expiry == 0:
        raise InvalidState(
            "expired", "token never expires (sealed without a TTL): refused, it replays for ever"
        )
    now_ms = math.floor(clock() * 1000)  # called inside fail_closed: a NaN clock is an internal_error
    if now_ms > expiry:
        raise InvalidState("expired", f"expired {duration((now_ms - expiry) / 1000)} ago")
