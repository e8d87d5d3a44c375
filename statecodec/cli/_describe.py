"""Turning token facts into JSON fields and into safe, aligned lines for a terminal.

Everything a token carries was chosen by whoever made it, so before any of it reaches a
terminal, control characters are escaped: a payload holding ``ESC [ 2 J`` or a C1 CSI must
print as text, not drive the operator's terminal (terminal-escape injection).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from .._codec import DEFAULT_MAX_TOKEN_BYTES
from .._humanize import duration, iso, relative

_CONTROL_ESCAPES: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every non-printable character shown as an escape sequence."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or (keep_newlines and ch == "\n"):
            out.append(ch)
        elif ch in _CONTROL_ESCAPES:
            out.append(_CONTROL_ESCAPES[ch])
        else:
            code = ord(ch)
            out.append(
                f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
            )
    return "".join(out)


def scalar(value: Any) -> str:
    """A short value for a table cell: strings as they are (escaped), anything else as JSON."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return printable(text)


def moment(ts: float, now: float) -> dict[str, Any]:
    """A point in time for JSON: Unix seconds, ISO 8601 UTC, and relative to ``now``."""
    return {"unix": int(ts), "iso": iso(ts), "relative": relative(ts - now)}


def token_fields(token: Any, now: float, flow: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A token's key, times, id and flow for JSON, one shape for verify's and inspect's facts.

    ``token``: an :class:`~statecodec.OpenedState`, or compat's ``Verified`` or ``FormatInfo``
    (None where it does not say); ``flow``: an sc1 token's flow_id, round, flow_started_at, not_before.
    """
    issued, expires = token.issued_at, token.expires_at
    return {
        "kid": token.kid,
        "issued_at": None if issued is None else moment(issued, now),
        "expires_at": None if expires is None else moment(expires, now),
        "lifetime_seconds": None if issued is None or expires is None else int(expires - issued),
        "token_id": getattr(token, "token_id", None),
        "flow": None if flow is None else _flow(flow, now),
    }


def _flow(flow: Mapping[str, Any], now: float) -> dict[str, Any]:
    not_before = flow["not_before"]
    return {
        "flow_id": flow["flow_id"],
        "round": flow["round"],
        "started_at": moment(flow["flow_started_at"], now),
        "not_before": None if not_before is None else moment(not_before, now),
    }


def expiry_phrase(exp: float, now: float) -> str:
    return f"expires in {duration(exp - now)}" if exp > now else f"expired {duration(now - exp)} ago"


def payload_fields(payload: bytes | None) -> dict[str, Any] | None:
    """The payload as JSON when it is JSON, else text when it is UTF-8, else hex (None: none shown)."""
    if payload is None:
        return None
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return {"encoding": "hex", "bytes": len(payload), "value": payload.hex()}
    try:
        return {"encoding": "json", "bytes": len(payload), "value": json.loads(text)}
    except (ValueError, RecursionError):
        return {"encoding": "text", "bytes": len(payload), "value": text}


def payload_lines(fields: dict[str, Any]) -> list[str]:
    encoding, value = fields["encoding"], fields.get("value")
    if encoding == "json":
        return printable(json.dumps(value, indent=2, ensure_ascii=False), keep_newlines=True).splitlines()
    if encoding == "text":
        return [printable(str(value))]
    if encoding == "hex":
        return [f"(not UTF-8, hex) {value}"]
    size = fields.get("bytes")
    return [f"({encoding}, {size} bytes)" if size is not None else f"({encoding})"]


def table(rows: list[tuple[str, str | list[str]]]) -> list[str]:
    """``label  value`` rows; a multi-line value continues under the first line."""
    lines = []
    label_width = max([11, *(len(label) + 2 for label, _ in rows)])
    pad = " " * (label_width + 2)
    for label, value in rows:
        values = value if isinstance(value, list) else [value]
        first, *rest = values or [""]
        lines.append(f"  {label:<{label_width}}{first}")
        lines.extend(pad + line for line in rest)
    return lines


def token_rows(info: dict[str, Any], now: float) -> list[tuple[str, str | list[str]]]:
    """Human rows for a token description (sc1 or another SDK's format)."""
    rows: list[tuple[str, str | list[str]]] = [
        ("format", printable(info.get("format_name", "statecodec v1")))
    ]
    if info.get("candidates"):
        names = [f"{c['format_name']} ({c['format']})" for c in info["candidates"]]
        rows[0] = ("format", "one of: " + ", ".join(printable(n) for n in names))
        rows.append(("why", printable(str(info.get("ambiguity") or ""))))
    if info.get("mode"):
        rows.append(("mode", str(info["mode"]).upper()))
    if info.get("kid"):
        rows.append(("kid", printable(str(info["kid"]))))
    issued, expires = info.get("issued_at"), info.get("expires_at")
    if issued is not None:
        rows.append(("issued", f"{issued['iso']} ({issued['relative']})"))
    if expires is not None:
        rows.append(("expires", f"{expires['iso']} ({expiry_phrase(expires['unix'], now)})"))
    if info.get("lifetime_seconds") is not None:
        rows.append(("lifetime", duration(info["lifetime_seconds"])))
    if info.get("token_id"):
        rows.append(("token id", printable(str(info["token_id"]))))
    flow = info.get("flow")
    if flow is not None:
        started = flow["started_at"]
        rows.append(
            (
                "flow",
                f"{flow['flow_id']} round {flow['round']}, started {started['iso']} ({started['relative']})",
            )
        )
        if flow["not_before"] is not None:
            rows.append(
                (
                    "not before",
                    f"{flow['not_before']['iso']} ({flow['not_before']['relative']}): "
                    "the server paces this round",
                )
            )
    size = info.get("size")
    if size is not None:
        over = size["chars"] > size.get("limit", size["chars"])
        rows.append(
            (
                "size",
                f"{size['chars']} characters"
                + (f" - over the default {DEFAULT_MAX_TOKEN_BYTES} limit" if over else ""),
            )
        )
    for name, value in {**(info.get("fields") or {}), **(info.get("extra") or {})}.items():
        rows.append((printable(name.replace("_", " ")), scalar(value)))
    if info.get("payload") is not None:
        rows.append(("payload", payload_lines(info["payload"])))
    return rows
