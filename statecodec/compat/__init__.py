"""The other MCP SDKs' ``requestState`` formats: name them, read them, verify them.

For ``statecodec inspect`` and ``statecodec verify``, for fleets that mix Python and
TypeScript instances, and for migrations away from an SDK's built-in codec (accept the
old format for one TTL, mint statecodec's; see docs/compat.md). One module per format:

- :mod:`.ts_v1`: ``@modelcontextprotocol/server``'s ``createRequestStateCodec``
  (HMAC-SHA256, ``v1.<body>.<mac>``); it can also mint the SDK's tokens.
- :mod:`.mcp_py_v1`: the ``mcp`` package's ``RequestStateBoundary`` claims envelope in
  its ``AESGCMRequestStateCodec`` (AES-256-GCM, ``v1.<blob>``).
- :mod:`.ruby_v1`: the Ruby SDK's ``RequestStateSecurity`` (AES-256-GCM, ``v1.<blob>``:
  the Python SDK's shape, so :func:`detect` names both and :func:`verify_detected` lets
  the keys decide).
- :mod:`.php_v1`: the PHP SDK's ``Stateless\\RequestStateCodec`` (HMAC-SHA256,
  ``<body>.<mac>``, binds nothing).
- :mod:`.rs1`: rmcp's ``rs1.<body>.<tag>`` (HMAC-SHA256 with associated data).
- :mod:`.rs2`: rmcp's ``rs2.<kid>.<body>.<tag>`` as PROPOSED in rmcp PR #1128 (not released).

All of them raise :class:`statecodec.InvalidState` with statecodec's reasons, cap the
token size first and accept only canonical encodings. None of these formats has single
use, a key id chosen by policy, or key rotation as statecodec has them.

:func:`detect` names any token and reads what it shows without keys (``statecodec
inspect``); :func:`verify` checks one with keys by format id (``statecodec verify
--format``), never consuming it; :func:`format_for` says which id ``--format auto``
picks, :func:`mode_of` whether a format hides its payload. Nothing here imports ``mcp`` or Node.
"""

from __future__ import annotations

from ._common import DEFAULT_MAX_TOKEN_BYTES
from ._detect import FormatInfo, detect
from ._registry import (
    FORMATS,
    CompatFormat,
    Verified,
    VerifyKeys,
    VerifyOptions,
    format_for,
    mode_of,
    verify,
    verify_detected,
)

__all__ = [
    "DEFAULT_MAX_TOKEN_BYTES",
    "FORMATS",
    "CompatFormat",
    "FormatInfo",
    "Verified",
    "VerifyKeys",
    "VerifyOptions",
    "detect",
    "format_for",
    "mode_of",
    "verify",
    "verify_detected",
]
