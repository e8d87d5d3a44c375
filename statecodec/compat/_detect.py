"""Naming a token's format and reading what it shows without keys (``statecodec inspect``).

Nothing here is verified: every field comes from whoever made the token. The shapes are
told apart by prefix and section count alone; ``v1.`` is shared by the TypeScript SDK
(``v1.<body>.<mac>``, two sections) and the Python SDK (``v1.<blob>``, one section).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .. import _format
from .._errors import InvalidState
from . import mcp_py_v1, rs1, ts_v1
from ._common import DEFAULT_MAX_TOKEN_BYTES, displayable_time, logger

SC1: Final = "statecodec sc1"
TS_V1: Final = "TypeScript SDK v1"
MCP_PY_V1: Final = "Python SDK v1"
RS1: Final = "rmcp rs1"
UNKNOWN: Final = "unknown"


@dataclass(frozen=True, slots=True)
class FormatInfo:
    """What a token's format is and what it shows without keys. UNVERIFIED.

    ``format`` is the registry id (``"sc1"``, ``"ts-v1"``, ``"mcp-py-v1"``, ``"rs1"``) or
    ``None``. ``problem`` says why the fields could not be read when the format was
    recognised but the token is malformed (or why it is unknown).
    """

    name: str
    format: str | None
    size: int
    mode: str | None = None  # "sign" (payload readable) or "encrypt"
    kid: str | None = None
    issued_at: float | None = None
    expires_at: float | None = None  # None: not readable, or the token never expires
    token_id: str | None = None
    payload: bytes | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)  # format-specific, JSON-serialisable
    problem: str | None = None
    # sc1 only: the flow the token belongs to: flow_id (hex), round, flow_started_at, not_before
    flow: Mapping[str, Any] | None = None

    @property
    def recognised(self) -> bool:
        return self.format is not None


def detect(token: object, *, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> FormatInfo:
    """Name ``token``'s format and read its clear fields. Never raises on any input."""
    if not isinstance(token, str):
        return FormatInfo(UNKNOWN, None, 0, problem=f"a token is text, not {type(token).__name__}")
    name, fmt, reader = _classify(token)
    if reader is None:
        return FormatInfo(name, fmt, len(token), problem=_unknown_hint(token))
    try:
        return reader(token, max(max_token_bytes, 1))
    except InvalidState as exc:
        return FormatInfo(name, fmt, len(token), problem=f"{exc.reason}: {exc.detail}")
    except Exception as exc:  # inspect must describe anything, never crash on it
        logger.exception(
            "unexpected error while reading a %s token",
            name,
            extra={"event": "compat_crashed", "format": name},
        )
        return FormatInfo(name, fmt, len(token), problem=f"internal_error: unexpected {type(exc).__name__}")


_Reader = Callable[[str, int], FormatInfo]


def _classify(token: str) -> tuple[str, str | None, _Reader | None]:
    if token.startswith((_format.PREFIX_SIGN, _format.PREFIX_ENCRYPT)):
        return SC1, "sc1", _read_sc1
    if token.startswith(rs1.PREFIX):
        return RS1, "rs1", _read_rs1
    if token.startswith(ts_v1.PREFIX):
        dots = token.count(".", len(ts_v1.PREFIX), len(ts_v1.PREFIX) + DEFAULT_MAX_TOKEN_BYTES)
        if dots == 1:
            return TS_V1, "ts-v1", _read_ts_v1
        if dots == 0:
            return MCP_PY_V1, "mcp-py-v1", _read_mcp_py_v1
    return UNKNOWN, None, None


def _unknown_hint(token: str) -> str:
    if token.startswith("rs2."):
        return "an rmcp rs2 token (with a key id): not supported by statecodec.compat"
    if token.startswith("v1."):
        return (
            "starts with 'v1.' but has neither the TypeScript (2 sections) nor the Python (1 section) shape"
        )
    if token.startswith("sc"):
        try:
            _format.parse(token, DEFAULT_MAX_TOKEN_BYTES)
        except InvalidState as exc:
            return f"{exc.reason}: {exc.detail}"
    return "not a statecodec, TypeScript SDK, Python SDK or rmcp token"


def _read_sc1(token: str, cap: int) -> FormatInfo:
    p = _format.parse(token, cap)
    sign = p.mode == "s"
    return FormatInfo(
        SC1,
        "sc1",
        len(token),
        mode="sign" if sign else "encrypt",
        kid=p.kid,
        issued_at=p.issued_at,
        expires_at=p.expires_at,
        token_id=p.token_id.hex(),
        payload=p.body if sign else None,
        fields={"version": _format.VERSION},
        flow={
            "flow_id": p.flow_id.hex(),
            "round": p.round,
            "flow_started_at": p.flow_started_at,
            "not_before": p.issued_at + p.not_before_ms / 1000 if p.not_before_ms else None,
        },
    )


def _read_ts_v1(token: str, cap: int) -> FormatInfo:
    envelope = ts_v1.read_envelope(ts_v1.parse(token, cap).body)
    payload, exp, fields = ts_v1_facts(envelope.get("p"), envelope["exp"], "b" in envelope)
    return FormatInfo(TS_V1, "ts-v1", len(token), mode="sign", expires_at=exp, payload=payload, fields=fields)


def ts_v1_facts(payload: Any, exp: float, bound: bool) -> tuple[bytes, float | None, dict[str, Any]]:
    """A ts-v1 envelope as inspect and verify show it: ``p`` as JSON, a displayable ``exp``."""
    fields: dict[str, Any] = {"bound": bound}
    shown = displayable_time(exp)
    if shown is None:
        fields["exp_out_of_range"] = str(exp)
    return json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass"), shown, fields


def _read_mcp_py_v1(token: str, cap: int) -> FormatInfo:
    p = mcp_py_v1.parse(token, cap)
    return FormatInfo(
        MCP_PY_V1,
        "mcp-py-v1",
        len(token),
        mode="encrypt",
        kid=p.kid.hex(),
        fields={"ciphertext_bytes": len(p.sealed) - mcp_py_v1.TAG_LEN},
    )


def _read_rs1(token: str, cap: int) -> FormatInfo:
    p = rs1.parse(token, cap)
    expiry = p.expiry_ms
    if expiry is None:
        raise InvalidState("malformed", f"body is {len(p.body)} bytes, shorter than its expiry field")
    return FormatInfo(
        RS1,
        "rs1",
        len(token),
        mode="sign",
        expires_at=displayable_time(expiry / 1000) if expiry else None,
        payload=p.body[rs1.EXPIRY_LEN :],
        fields={"expiry_ms": expiry, "never_expires": expiry == 0},
    )
