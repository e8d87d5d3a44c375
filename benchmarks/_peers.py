"""What a server author would otherwise use for requestState, set up for a fair race.

Each peer is used the way its documentation shows, with the strongest protection it
offers that matches statecodec's (integrity, expiry, a binding to the request where the
peer has one). Nothing here is for production use: it exists so ``bench_codec.py`` can
time and size the alternatives in the same process as statecodec. (The TypeScript SDK's
format is ``statecodec.compat.ts_v1``, which mints its tokens byte for byte.)

- :class:`McpSdkBoundary`: the installed ``mcp`` package's ``AESGCMRequestStateCodec``
  driven through the real ``RequestStateBoundary._unseal`` / ``_seal`` (the claims
  envelope, request identity digest and salted principal claim, exactly as the
  middleware builds them), minus the request plumbing around them.
- :func:`pyseto_v4_local`, :func:`fernet`, :func:`itsdangerous_timed`: the libraries'
  public APIs.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pyseto
from cryptography.fernet import Fernet
from itsdangerous import URLSafeTimedSerializer
from mcp.server.context import ServerRequestContext
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity


# ----------------------------------------------------------------------- MCP Python SDK
class McpSdkBoundary:
    """The ``mcp`` SDK's requestState protection for one ``tools/call`` request shape.

    ``seal`` and ``unseal`` call ``RequestStateBoundary._seal`` / ``_unseal``, the two
    halves of what the middleware does per round: the AES-256-GCM codec plus the JSON
    claims envelope (``v, iat, exp, m, t, a, s, aud, p``), the request-identity digest
    and the salted principal claim. The round binding that ``_unseal`` returns is handed
    to the next ``_seal``, as the middleware does within one request.
    """

    def __init__(
        self,
        secret: bytes,
        *,
        principal: str,
        audience: str,
        method: str,
        name: str,
        arguments: dict[str, Any],
    ) -> None:
        security = RequestStateSecurity(keys=[secret], ttl=600.0, bind_principal=lambda _ctx: principal)
        self._boundary = RequestStateBoundary(security, default_audience=audience)
        # The request as the framework hands it to the middleware; only requestState
        # changes between rounds, so the context is built once (no plumbing is timed).
        self._params: dict[str, Any] = {"name": name, "arguments": arguments, "requestState": None}
        self._ctx: Any = ServerRequestContext(
            session=None,  # type: ignore[arg-type]  # the envelope code never touches it
            lifespan_context=None,
            protocol_version="2026-07-28",
            method=method,
            params=self._params,
        )
        self._round: Any = None

    def seal(self, state: str) -> str:
        token: str = self._boundary._seal(self._ctx, state, self._round)
        return token

    def unseal(self, token: str) -> str:
        self._params["requestState"] = token
        inner, self._round = self._boundary._unseal(self._ctx)
        return inner

    def codec_only(self) -> Any:
        """The bare ``AESGCMRequestStateCodec`` (no envelope), for reference."""
        return self._boundary._security.codec


# ------------------------------------------------------------------------ libraries
def pyseto_v4_local(secret: bytes, ttl: int = 600) -> tuple[Callable[..., bytes], Callable[..., Any]]:
    """PASETO v4.local (XChaCha20 + BLAKE2b-MAC) with an ``exp`` claim and an implicit assertion.

    Returns ``(seal(claims, assertion) -> token, unseal(token, assertion) -> claims)``;
    pyseto checks ``exp`` on decode when a JSON deserializer is given.
    """
    key = pyseto.Key.new(version=4, purpose="local", key=secret)

    def seal(claims: dict[str, Any], assertion: bytes) -> bytes:
        return pyseto.encode(key, claims, serializer=json, exp=ttl, implicit_assertion=assertion)

    def unseal(token: bytes, assertion: bytes) -> Any:
        return pyseto.decode(key, token, implicit_assertion=assertion, deserializer=json).payload

    return seal, unseal


def fernet(secret: bytes, ttl: int = 600) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    """``cryptography.fernet``: AES-128-CBC + HMAC-SHA256, ``ttl`` checked on decrypt; no binding."""
    f = Fernet(base64.urlsafe_b64encode(secret[:32]))

    def unseal(token: bytes) -> bytes:
        return f.decrypt(token, ttl=ttl)

    return f.encrypt, unseal


def itsdangerous_timed(secret: bytes, ttl: int = 600) -> tuple[Callable[[Any], str], Callable[[str], Any]]:
    """``itsdangerous.URLSafeTimedSerializer``: HMAC-SHA1 by default, JSON, zlib when it helps;
    ``max_age`` checked; no binding."""
    s = URLSafeTimedSerializer(secret, salt="requestState")

    def seal(obj: Any) -> str:
        token: str = s.dumps(obj)
        return token

    def unseal(token: str) -> Any:
        return s.loads(token, max_age=ttl)

    return seal, unseal
