"""Who is asking: the principal a proxied request's ``requestState`` is bound to.

A binding is only as good as the identity in it. An unverified JWT's ``sub`` is not an
identity: anyone can write ``{"sub": "alice"}`` into a token with no signature, so a
proxy that bound to it would let the thief of alice's ``requestState`` redeem it by
presenting a home-made "alice" token. The upstream rejecting that bearer later does not
help: the proxy has already consumed (burnt) the state, and an upstream without
authentication would not reject it at all. So the proxy reads a principal only in ways
the operator vouches for:

* :class:`JWKSVerifier`: the token's signature, issuer, audience and expiry checked
  against the identity provider's published keys (PyJWT), then ``(client_id or azp,
  iss, sub)`` as the SDK adapters use it;
* an introspection hook ``module:function`` the operator writes (RFC 7662 introspection,
  a session lookup...): ``fn(token) -> claims | None``, sync or async;
* :func:`header_principal`: a header set by an authenticating gateway in front of the
  proxy, which must strip any client-sent copy (the proxy cannot tell them apart).

A request without credentials has no principal (its tokens are bound to nobody, and
only another request without credentials can redeem them). A request whose credentials
do not verify raises :class:`Unauthenticated`: the middleware then neither accepts its
token nor seals a state for it, rather than binding it to nobody.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import httpx
import jwt

from .. import _telemetry, boundary
from .._errors import StateCodecError
from ..adapters.asgi import PrincipalFn, Scope

logger = logging.getLogger("statecodec.proxy")

#: Asymmetric algorithms only: a JWKS holds public keys, and an HMAC "key" taken from a
#: public document would let anyone sign.
DEFAULT_ALGORITHMS: Final = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA")
MAX_JWKS_BYTES: Final = 1024 * 1024
MAX_TOKEN_CHARS: Final = 16 * 1024

Claims: TypeAlias = Mapping[str, Any]
#: ``verify(token) -> claims | None`` (or awaitable); ``None`` or ``{"active": false}`` rejects.
TokenVerifier: TypeAlias = Callable[[str], "Claims | Awaitable[Claims | None] | None"]


class Unauthenticated(StateCodecError):  # noqa: N818 - names the outcome, like InvalidState
    """Credentials were presented but cannot be verified. The message never holds the token."""


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The bearer token of the ``Authorization`` header, ``None`` without one."""
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token or "," in token:
        # Another scheme, or two Authorization headers joined by ", ": nothing to vouch for.
        raise Unauthenticated("the Authorization header is not a single Bearer token")
    if len(token) > MAX_TOKEN_CHARS:
        raise Unauthenticated("the bearer token is too long")
    return token


def header_principal(name: str) -> PrincipalFn:
    """The principal from header ``name``, as set by a trusted gateway in front of the proxy."""
    wanted = name.strip().lower().encode("latin-1")
    if not wanted:
        raise ValueError("the principal header name is empty")

    def principal(scope: Scope, headers: Mapping[str, str]) -> str | None:
        values = [value for key, value in scope.get("headers", ()) if key.lower() == wanted]
        if len(values) > 1:
            raise Unauthenticated(f"the {name} header is repeated")
        return values[0].decode("utf-8", "strict") if values and values[0] else None

    return principal


class BearerPrincipal:
    """A :data:`~statecodec.adapters.asgi.PrincipalFn` reading the bearer token through ``verify``."""

    def __init__(self, verify: TokenVerifier) -> None:
        self.verify = verify

    def __repr__(self) -> str:
        return f"BearerPrincipal({self.verify!r})"

    async def __call__(self, scope: Scope, headers: Mapping[str, str]) -> str | None:
        token = bearer_token(headers)
        if token is None:
            return None
        claims = self.verify(token)
        if inspect.isawaitable(claims):
            claims = await claims
        if not isinstance(claims, Mapping) or claims.get("active") is False:
            raise Unauthenticated("the bearer token was rejected by the verifier")
        return principal_of(claims)


def principal_of(claims: Claims) -> str:
    """``(client_id or azp, iss, sub)`` as :func:`~statecodec.boundary.principal_string`."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise Unauthenticated("the verified token has no subject")
    client = claims.get("client_id") or claims.get("azp")
    issuer = claims.get("iss")
    return boundary.principal_string(
        client if isinstance(client, str) else None, issuer if isinstance(issuer, str) else None, subject
    )


def load_hook(spec: str) -> Callable[..., Any]:
    """The callable named ``module:attribute`` (``attribute`` may be dotted)."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"expected module:function, not {spec!r}")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec} is not callable")
    return target  # type: ignore[no-any-return]


def _allowed_url(url: httpx.URL) -> bool:
    if url.scheme == "https":
        return True
    if url.scheme != "http":
        return False
    if url.host == "localhost":
        return True
    try:
        return ipaddress.ip_address(url.host).is_loopback
    except ValueError:
        return False


class JWKSVerifier:
    """Verify JWTs against a JWKS URL (the identity provider's public keys).

    Checks signature (asymmetric algorithms only), ``exp``, ``nbf``, ``iss`` and ``aud``
    with ``leeway`` seconds of skew; requires ``exp``, ``iss`` and ``sub``. Keys are cached
    for ``cache_seconds``; an unknown ``kid`` refetches at most once per ``min_refresh``
    seconds, so forged kids cannot make the proxy hammer the identity provider. The JWKS
    URL must be https (or http on loopback).
    """

    def __init__(
        self,
        jwks_url: str,
        *,
        issuer: str,
        audience: str | Sequence[str],
        algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
        leeway: float = 60.0,
        cache_seconds: float = 300.0,
        min_refresh: float = 30.0,
        timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        url = httpx.URL(jwks_url)
        if not _allowed_url(url):
            raise ValueError(f"the JWKS URL must be https:// (or http:// on loopback), not {jwks_url!r}")
        bad = [alg for alg in algorithms if alg.upper().startswith("HS") or alg.lower() == "none"]
        if bad or not algorithms:
            raise ValueError(f"JWKS verification takes asymmetric algorithms only, not {bad or 'none'}")
        if not issuer or not audience:
            raise ValueError("JWKS verification needs the expected issuer and audience")
        self.url = url
        self.issuer = issuer
        self.audience = [audience] if isinstance(audience, str) else list(audience)
        self.algorithms = tuple(algorithms)
        self.leeway = leeway
        self.cache_seconds = cache_seconds
        self.min_refresh = min_refresh
        self._timeout = timeout
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._keys: dict[str | None, jwt.PyJWK] = {}
        self._fetched_at = float("-inf")
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"JWKSVerifier({str(self.url)!r}, issuer={self.issuer!r})"

    async def __call__(self, token: str) -> Claims:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("the bearer token is not a JWT") from None
        algorithm = header.get("alg")
        if algorithm not in self.algorithms:
            raise Unauthenticated(f"JWT algorithm {str(algorithm)[:20]!r} is not accepted")
        key = await self._key(header.get("kid"))
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key=key,
                algorithms=[algorithm],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"JWT rejected: {type(exc).__name__}: {str(exc)[:100]}") from None
        return claims

    async def _key(self, kid: Any) -> jwt.PyJWK:
        if not isinstance(kid, str | None):
            raise Unauthenticated("the JWT kid is not a string")
        now = time.monotonic()
        if kid not in self._keys or now - self._fetched_at > self.cache_seconds:
            async with self._lock:
                if now - self._fetched_at > self.min_refresh:
                    await self._refresh()
        key = self._keys.get(kid)
        if key is None and kid is None and len(self._keys) == 1:
            key = next(iter(self._keys.values()))  # a JWKS of one key may omit kids
        if key is None:
            raise Unauthenticated(f"no key {str(kid)[:40]!r} in the JWKS")
        return key

    async def _refresh(self) -> None:
        self._fetched_at = time.monotonic()
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self._timeout, follow_redirects=False, trust_env=False, transport=self._transport
            )
        try:
            response = await self._client.get(self.url, headers={"accept": "application/json"})
            response.raise_for_status()
            if len(response.content) > MAX_JWKS_BYTES:
                raise ValueError("the JWKS document is over 1 MiB")
            keyset = jwt.PyJWKSet.from_dict(response.json())
        except Exception as exc:  # keep the previous keys; verification of new kids fails closed
            logger.warning(
                "cannot load the JWKS: %s: %s",
                type(exc).__name__,
                str(exc)[:200],
                extra=_telemetry.fields("jwks_failed", reason=type(exc).__name__, detail=str(exc)[:200]),
            )
            return
        self._keys = {key.key_id: key for key in keyset.keys}

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
