"""Naming a token's format and reading what it shows without keys (``statecodec inspect``).

Nothing here is verified: every field comes from whoever made the token. The shapes are
told apart by prefix and section count alone, and where they cannot be, detection says
so instead of guessing:

- ``sc1s.``/``sc1e.``: statecodec; ``rs1.``/``rs2.``: rmcp (three and four sections);
- ``v1.<body>.<mac>``: the TypeScript SDK;
- ``v1.<blob>``: the Python SDK **or** the Ruby SDK. Both are ``"v1."`` and one base64url
  section of AES-256-GCM output; the Python SDK's first 4 bytes are a fingerprint of its
  HKDF-derived key, the Ruby SDK's are the start of a random IV, and nothing without the
  key tells the two apart. :func:`detect` then names both (:attr:`FormatInfo.candidates`)
  and says why; ``verify`` with the keys decides (:func:`~statecodec.compat.verify_detected`);
- ``<body>.<mac>`` without a prefix: the PHP SDK (the only format of that shape).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .. import _format
from .._errors import InvalidState, Reason
from . import _rmcp, mcp_py_v1, php_v1, rs1, rs2, ruby_v1, ts_v1
from ._common import DEFAULT_MAX_TOKEN_BYTES, GCM_TAG_LEN, displayable_time, logger

SC1: Final = "statecodec sc1"
TS_V1: Final = ts_v1.NAME
MCP_PY_V1: Final = mcp_py_v1.NAME
RUBY_V1: Final = ruby_v1.NAME
PHP_V1: Final = "PHP SDK v1"
RS1: Final = "rmcp rs1"
RS2: Final = "rmcp rs2 (proposed, rmcp PR #1128)"
UNKNOWN: Final = "unknown"
#: base64url of ``{"exp":``: the PHP SDK's json_encode always writes ``exp`` first.
PHP_BODY_START: Final = "eyJleHAiOj"
AMBIGUOUS_V1: Final = f"{MCP_PY_V1} or {RUBY_V1}"
#: Why a ``v1.<blob>`` token has two candidates: said by inspect, word for word.
WHY_AMBIGUOUS_V1: Final = (
    "the Python SDK and the Ruby SDK both write 'v1.' + one base64url section of AES-256-GCM "
    "output; only the key tells them apart (verify with --keys: the format whose key opens it wins)"
)


@dataclass(frozen=True, slots=True)
class FormatInfo:
    """What a token's format is and what it shows without keys. UNVERIFIED.

    ``format`` is the registry id (``"sc1"``, ``"ts-v1"``, ``"mcp-py-v1"``, ``"ruby-v1"``,
    ``"php-v1"``, ``"rs1"``, ``"rs2"``) or ``None``: unknown, or one of several
    ``candidates`` (registry ids) that the bytes alone cannot tell apart, ``ambiguity``
    saying why. ``problem`` says why the fields could not be read when the format was
    recognised but the token is malformed (or why it is unknown); ``reason`` is then the
    stable reason of :data:`statecodec.REASONS` for it (``None`` for an unknown format).
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
    candidates: tuple[str, ...] = ()
    ambiguity: str | None = None
    reason: Reason | None = None

    @property
    def recognised(self) -> bool:
        return self.format is not None or bool(self.candidates)

    def refusal(self) -> InvalidState | None:
        """Why the token cannot be read, as the error to raise; ``None`` when it was read."""
        if not self.recognised:
            return InvalidState("malformed", f"not a recognised requestState token: {self.problem}")
        if self.problem is not None:
            return InvalidState(self.reason or "malformed", f"unreadable {self.name} token: {self.problem}")
        return None


def detect(token: object, *, max_token_bytes: int = DEFAULT_MAX_TOKEN_BYTES) -> FormatInfo:
    """Name ``token``'s format and read its clear fields. Never raises on any input."""
    if not isinstance(token, str):
        return FormatInfo(UNKNOWN, None, 0, problem=f"a token is text, not {type(token).__name__}")
    name, fmt, reader = _classify(token)
    if reader is None:
        return FormatInfo(name, fmt, len(token), problem=_unknown_hint(token))
    candidates = ("mcp-py-v1", "ruby-v1") if name == AMBIGUOUS_V1 else ()
    why = WHY_AMBIGUOUS_V1 if candidates else None
    try:
        return reader(token, max(max_token_bytes, 1))
    except InvalidState as exc:
        problem = f"{exc.reason}: {exc.detail}"
        return FormatInfo(
            name, fmt, len(token), problem=problem, candidates=candidates, ambiguity=why, reason=exc.reason
        )
    except Exception as exc:  # inspect must describe anything, never crash on it
        logger.exception(
            "unexpected error while reading a %s token",
            name,
            extra={"event": "compat_crashed", "format": name},
        )
        problem = f"internal_error: unexpected {type(exc).__name__}"
        return FormatInfo(
            name,
            fmt,
            len(token),
            problem=problem,
            candidates=candidates,
            ambiguity=why,
            reason="internal_error",
        )


_Reader = Callable[[str, int], FormatInfo]


def _classify(token: str) -> tuple[str, str | None, _Reader | None]:
    if token.startswith((_format.PREFIX_SIGN, _format.PREFIX_ENCRYPT)):
        return SC1, "sc1", _read_sc1
    if token.startswith(rs1.PREFIX):
        return RS1, "rs1", _read_rs1
    if token.startswith(rs2.PREFIX):
        return RS2, "rs2", _read_rs2
    if token.startswith(ts_v1.PREFIX):
        dots = token.count(".", len(ts_v1.PREFIX), len(ts_v1.PREFIX) + DEFAULT_MAX_TOKEN_BYTES)
        if dots == 1:
            return TS_V1, "ts-v1", _read_ts_v1
        if dots == 0:
            return AMBIGUOUS_V1, None, _read_v1_blob
        return UNKNOWN, None, None
    if token.startswith(PHP_BODY_START) and token.count(".", 0, DEFAULT_MAX_TOKEN_BYTES) == 1:
        return PHP_V1, "php-v1", _read_php_v1
    return UNKNOWN, None, None


def _unknown_hint(token: str) -> str:
    if token.startswith("v1."):
        return (
            "starts with 'v1.' but has neither the TypeScript (2 sections) nor the Python/Ruby "
            "(1 section) shape"
        )
    if token.count(".", 0, DEFAULT_MAX_TOKEN_BYTES) == 1 and not token.startswith("sc"):
        return "two sections without a prefix, but not a PHP SDK body (it starts with '{\"exp\":')"
    if token.startswith("sc"):
        try:
            _format.parse(token, DEFAULT_MAX_TOKEN_BYTES)
        except InvalidState as exc:
            return f"{exc.reason}: {exc.detail}"
    return "not a statecodec, TypeScript SDK, Python SDK, Ruby SDK, PHP SDK or rmcp token"


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


def _read_v1_blob(token: str, cap: int) -> FormatInfo:
    """``v1.<blob>``: both candidates when the blob fits both, else the one it fits."""
    ruby = ruby_v1.parse(token, cap)  # the shorter minimum: fails only if it fits neither
    ruby_fields = {"ruby-v1 ciphertext_bytes": len(ruby.sealed) - GCM_TAG_LEN}
    try:
        py = mcp_py_v1.parse(token, cap)
    except InvalidState as exc:  # 28 to 31 bytes: room for an IV and a tag, not for a kid too
        fields = {"ciphertext_bytes": len(ruby.sealed) - GCM_TAG_LEN, "not mcp-py-v1": exc.detail}
        return FormatInfo(RUBY_V1, "ruby-v1", len(token), mode="encrypt", fields=fields)
    fields = {
        "candidates": "mcp-py-v1, ruby-v1",
        "mcp-py-v1 kid": py.kid.hex(),
        "mcp-py-v1 ciphertext_bytes": len(py.sealed) - GCM_TAG_LEN,
        **ruby_fields,
    }
    return FormatInfo(
        AMBIGUOUS_V1,
        None,
        len(token),
        mode="encrypt",
        fields=fields,
        candidates=("mcp-py-v1", "ruby-v1"),
        ambiguity=WHY_AMBIGUOUS_V1,
    )


def _read_php_v1(token: str, cap: int) -> FormatInfo:
    exp, data = php_v1.read_body(php_v1.parse(token, cap).body)
    shown = displayable_time(exp)
    fields: dict[str, Any] = {"binds": "nothing (no method, target, arguments, audience or principal)"}
    if shown is None:
        fields["exp_out_of_range"] = str(exp)
    payload = json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return FormatInfo(
        PHP_V1, "php-v1", len(token), mode="sign", expires_at=shown, payload=payload, fields=fields
    )


def _read_rs2(token: str, cap: int) -> FormatInfo:
    p = rs2.parse(token, cap)
    body = p.body()
    p.tag()  # both sections must decode, as rmcp requires
    status = {"status": "proposed (rmcp PR #1128), not released"}
    return _rmcp_info(RS2, "rs2", len(token), body, p.kid, status)


def _read_rs1(token: str, cap: int) -> FormatInfo:
    return _rmcp_info(RS1, "rs1", len(token), rs1.parse(token, cap).body, None, {})


def _rmcp_info(  # noqa: PLR0917 - private, one caller per rmcp format
    name: str, fmt: str, size: int, body: bytes, kid: str | None, extra: Mapping[str, str]
) -> FormatInfo:
    """An rmcp token's clear facts: both formats carry the body ``expiry_ms || payload``."""
    expiry, payload = _rmcp.split_body(body)
    return FormatInfo(
        name,
        fmt,
        size,
        mode="sign",
        kid=kid,
        expires_at=displayable_time(expiry / 1000) if expiry else None,
        payload=payload,
        fields={"expiry_ms": expiry, "never_expires": expiry == 0, **extra},
    )
