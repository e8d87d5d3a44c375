"""What the end-to-end tests hold a token and a refusal to, as a client sees them on the wire.

A token is ``PREFIX[mode]`` then base64url; :func:`tamper` flips one character in its
middle (still canonical base64url, no longer authentic); a refused state is answered
with the one uniform JSON-RPC error, whatever the reason (:func:`assert_wire_error`).
"""

from __future__ import annotations

import base64
from typing import Any

from mcp.shared.exceptions import MCPError

from statecodec.boundary import WIRE_ERROR_CODE, WIRE_ERROR_DATA, WIRE_ERROR_MESSAGE

PREFIX = {"sign": "sc1s.", "encrypt": "sc1e."}


def payload_of(token: str) -> bytes:
    """The token's bytes after its prefix (readable plaintext in SIGN mode, ciphertext in ENCRYPT)."""
    body = token.split(".", 1)[1]
    return base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))


def tamper(token: str) -> str:
    """Flip one base64url character in the middle: still canonical, no longer authentic."""
    prefix, body = token.split(".", 1)
    middle = len(body) // 2
    return f"{prefix}.{body[:middle]}{'B' if body[middle] == 'A' else 'A'}{body[middle + 1 :]}"


def assert_wire_error(error: MCPError | dict[str, Any]) -> None:
    """The uniform refusal: -32602, its one message and its one ``data``, as the library names them."""
    if isinstance(error, MCPError):
        error = {"code": error.code, "message": error.message, "data": error.data}
    assert error == {"code": WIRE_ERROR_CODE, "message": WIRE_ERROR_MESSAGE, "data": WIRE_ERROR_DATA}
    assert error == {
        "code": -32602,
        "message": "Invalid or expired requestState",
        "data": {"reason": "invalid_request_state"},
    }
