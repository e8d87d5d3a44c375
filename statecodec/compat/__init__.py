"""The other MCP SDKs' ``requestState`` formats: read them, write them, name them.

For fleets that mix Python and TypeScript instances, and for migrations away from an
SDK's built-in codec (accept the old format for one TTL, mint statecodec's; see
docs/compat.md):

- :class:`TsV1Codec`: ``@modelcontextprotocol/server``'s ``createRequestStateCodec``
  (HMAC-SHA256, ``v1.<body>.<mac>``).
- :class:`McpPyV1Codec`: the ``mcp`` package's ``RequestStateBoundary`` claims envelope in
  its ``AESGCMRequestStateCodec`` (AES-256-GCM, ``v1.<blob>``); :class:`McpPyV1Cipher`
  is the bare cipher.
- :class:`Rs1Codec`: rmcp's ``rs1.<body>.<tag>`` (HMAC-SHA256 with associated data).

All of them raise :class:`statecodec.InvalidState` with statecodec's reasons, cap the
token size first and accept only canonical encodings. None of these formats has single
use, a key id chosen by policy, or key rotation as statecodec has them.

:func:`detect` names any token and reads what it shows without keys (``statecodec
inspect``); :func:`verify` checks one with keys by format id (``statecodec verify
--format``), never consuming it. Nothing here imports ``mcp`` or Node.
"""

from __future__ import annotations

from ._common import DEFAULT_MAX_TOKEN_BYTES
from ._detect import FormatInfo, detect
from ._registry import FORMATS, CompatFormat, KeySource, Verified, VerifyOptions, verify
from .mcp_py_v1 import McpPyV1Cipher, McpPyV1Codec, OpenedMcpPyV1, request_identity, sdk_principal
from .rs1 import OpenedRs1, Rs1Codec
from .ts_v1 import OpenedTsV1, TsV1Codec

__all__ = [
    "DEFAULT_MAX_TOKEN_BYTES",
    "FORMATS",
    "CompatFormat",
    "FormatInfo",
    "KeySource",
    "McpPyV1Cipher",
    "McpPyV1Codec",
    "OpenedMcpPyV1",
    "OpenedRs1",
    "OpenedTsV1",
    "Rs1Codec",
    "TsV1Codec",
    "Verified",
    "VerifyOptions",
    "detect",
    "request_identity",
    "sdk_principal",
    "verify",
]
