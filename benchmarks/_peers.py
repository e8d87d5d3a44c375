"""What a server author would otherwise use for requestState, set up for a fair race.

Each peer is used the way its documentation shows, with the strongest protection it
offers that matches statecodec's (integrity, expiry, a binding to the request where the
peer has one). Nothing here is for production use: it exists so ``bench_codec.py`` can
time and size the alternatives in the same process as statecodec.

- :class:`TsV1Codec`: a line-by-line Python port of ``createRequestStateCodec`` from
  ``@modelcontextprotocol/server`` 2.4.0 (dist/index.mjs, region
  ``src/server/requestStateCodec.ts``), including its ``bind`` tag.
- :class:`McpSdkBoundary`: the installed ``mcp`` package's ``AESGCMRequestStateCodec``
  driven through the real ``RequestStateBoundary._unseal`` / ``_seal`` (the claims
  envelope, request identity digest and salted principal claim, exactly as the
  middleware builds them), minus the request plumbing around them.
- :func:`pyseto_v4_local`, :func:`fernet`, :func:`itsdangerous_timed`: the libraries'
  public APIs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import time
from collections.abc import Callable
from typing import Any

import pyseto
from cryptography.fernet import Fernet
from itsdangerous import URLSafeTimedSerializer
from mcp.server.context import ServerRequestContext
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity

# --------------------------------------------------------------------------- TS SDK v1
_TS_PREFIX = "v1."
_TS_BIND_LABEL = "mcp.requestState.bind:"


def _ts_b64url(data: bytes) -> str:
    # bytesToBase64Url: btoa, then +/ -> -_ and strip the padding.
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _ts_b64url_to_bytes(text: str) -> bytes:
    # base64UrlToBytes: -_ -> +/, then atob, which is "forgiving": padding optional,
    # any character outside the alphabet throws (validate=True), trailing bits ignored.
    b64 = text.replace("-", "+").replace("_", "/")
    return base64.b64decode(b64 + "=" * (-len(b64) % 4), validate=True)


class TsV1Codec:
    """``createRequestStateCodec({key, ttlSeconds, bind})`` of the TypeScript SDK, in Python.

    ``mint(payload, ctx)`` / ``verify(state, ctx)`` follow the TS source statement by
    statement. The payload is any JSON value (TS ``JSON.stringify``); the imported
    WebCrypto HMAC key is modelled by a keyed ``hmac`` object made once and copied per
    use, the fastest stdlib HMAC, so the port is never slower than it has to be.
    """

    def __init__(
        self, key: bytes, *, ttl_seconds: int = 600, bind: Callable[[Any], str] | None = None
    ) -> None:
        if len(key) < 32:
            raise ValueError(f"createRequestStateCodec: key must be at least 32 bytes (got {len(key)})")
        if not math.isfinite(ttl_seconds):
            raise ValueError("createRequestStateCodec: ttlSeconds must be a finite number")
        self._ttl = ttl_seconds
        self._bind = bind
        self._hmac = hmac.new(key, digestmod=hashlib.sha256)

    def _sign(self, data: bytes) -> bytes:
        h = self._hmac.copy()
        h.update(data)
        return h.digest()

    def _bind_tag(self, value: str) -> str:
        return _ts_b64url(self._sign((_TS_BIND_LABEL + value).encode("utf-8"))[:16])

    def mint(self, payload: Any, ctx: Any = None) -> str:
        envelope: dict[str, Any] = {"p": payload, "exp": math.floor(time.time()) + self._ttl}
        if self._bind is not None:
            if ctx is None:
                raise TypeError(
                    "createRequestStateCodec: mint() requires ctx when a bind callback is configured"
                )
            envelope["b"] = self._bind_tag(self._bind(ctx))
        # JSON.stringify: compact separators, non-ASCII left as is.
        body = _ts_b64url(json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
        return f"{_TS_PREFIX}{body}.{_ts_b64url(self._sign((_TS_PREFIX + body).encode('utf-8')))}"

    def verify(self, state: str, ctx: Any = None) -> Any:
        dot = state.rfind(".")
        if not state.startswith(_TS_PREFIX) or dot <= 3:
            raise ValueError("malformed")
        body = state[3:dot]
        try:
            mac = _ts_b64url_to_bytes(state[dot + 1 :])
        except (binascii.Error, ValueError):
            raise ValueError("malformed") from None
        # subtle.verify: constant-time comparison of the full tag.
        if not hmac.compare_digest(mac, self._sign((_TS_PREFIX + body).encode("utf-8"))):
            raise ValueError("mac")
        try:
            envelope = json.loads(_ts_b64url_to_bytes(body).decode("utf-8", "strict"))
        except (binascii.Error, ValueError):
            raise ValueError("malformed") from None
        exp = envelope.get("exp") if isinstance(envelope, dict) else None
        if type(exp) not in (int, float) or exp < math.floor(time.time()):
            raise ValueError("expired")
        if self._bind is not None:
            expected = self._bind_tag(self._bind(ctx))
            tag = envelope.get("b")
            if not isinstance(tag, str) or not hmac.compare_digest(tag.encode(), expected.encode()):
                raise ValueError("bind")
        elif "b" in envelope:
            raise ValueError("bind")
        return envelope.get("p")


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
