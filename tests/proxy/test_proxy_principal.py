"""Who a proxied request is: JWTs verified against a real JWKS endpoint, hooks, gateway headers.

The JWKS document is served over loopback HTTP by the session's :class:`JWKSServer`
(an RSA key generated per session); tokens are minted with PyJWT. Every way a bearer
token can fail must raise :class:`Unauthenticated`, never yield a principal.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fixtures_proxy import CLIENT_ID, ISSUER, JWT_AUDIENCE, JWKSServer, principal

from statecodec import boundary
from statecodec.proxy import (
    BearerPrincipal,
    JWKSVerifier,
    Unauthenticated,
    bearer_token,
    header_principal,
    load_hook,
    principal_of,
)


def verifier(server: JWKSServer, **options: Any) -> JWKSVerifier:
    return JWKSVerifier(server.url, issuer=ISSUER, audience=JWT_AUDIENCE, **options)


async def resolve(server: JWKSServer, token: str, **options: Any) -> str | None:
    check = verifier(server, **options)
    try:
        return await BearerPrincipal(check)({}, {"authorization": f"Bearer {token}"})
    finally:
        await check.aclose()


async def test_a_verified_jwt_gives_client_issuer_and_subject(jwks_server: JWKSServer) -> None:
    assert await resolve(jwks_server, jwks_server.mint("alice")) == principal("alice")
    assert principal("alice") == boundary.principal_string(CLIENT_ID, ISSUER, "alice")
    # azp stands in for client_id, as OAuth access tokens from OpenID providers carry it.
    token = jwks_server.mint("carol", client_id=None, azp="web-app")
    assert await resolve(jwks_server, token) == boundary.principal_string("web-app", ISSUER, "carol")


def _hs256_with_public_key(server: JWKSServer) -> str:
    """The classic algorithm confusion: HMAC keyed with the RSA public key everyone can fetch."""
    pem = server.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "JWT", "kid": server.kid}
    claims = {"iss": ISSUER, "aud": JWT_AUDIENCE, "sub": "alice", "exp": int(time.time()) + 600}

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    signature = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


FORGERIES = {
    "other_key": lambda s: s.mint(
        "alice", key=rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ),
    "alg_none": lambda s: jwt.encode(
        {"iss": ISSUER, "aud": JWT_AUDIENCE, "sub": "alice"}, None, algorithm="none"
    ),
    "hs256_confusion": _hs256_with_public_key,
    "expired": lambda s: s.mint("alice", lifetime=-3600),
    "other_issuer": lambda s: s.mint("alice", iss="https://evil.test"),
    "other_audience": lambda s: s.mint("alice", aud="https://elsewhere.test"),
    "no_subject": lambda s: s.mint("", sub=None),
    "not_a_jwt": lambda s: "opaque-token-123",
    "truncated": lambda s: s.mint("alice").rsplit(".", 1)[0] + ".",
}


@pytest.mark.parametrize("case", sorted(FORGERIES))
async def test_unverifiable_tokens_never_give_a_principal(jwks_server: JWKSServer, case: str) -> None:
    with pytest.raises(Unauthenticated) as caught:
        await resolve(jwks_server, FORGERIES[case](jwks_server))
    assert "ey" not in str(caught.value)  # the message never carries the token


async def test_unknown_kids_refetch_the_jwks_at_most_once_per_interval(jwks_server: JWKSServer) -> None:
    check = verifier(jwks_server, min_refresh=3600)
    try:
        await check(jwks_server.mint("alice"))
        hits = jwks_server.hits
        forged = jwt.encode(
            {"iss": ISSUER, "aud": JWT_AUDIENCE, "sub": "x", "exp": int(time.time()) + 60},
            jwks_server.key,
            algorithm="RS256",
            headers={"kid": "no-such-key"},
        )
        for _ in range(5):
            with pytest.raises(Unauthenticated, match="no key"):
                await check(forged)
        assert jwks_server.hits == hits  # fetched within min_refresh already: no more requests
    finally:
        await check.aclose()


def test_verifier_configuration_is_checked(jwks_server: JWKSServer) -> None:
    with pytest.raises(ValueError, match="https"):
        JWKSVerifier("http://idp.example/jwks.json", issuer=ISSUER, audience=JWT_AUDIENCE)
    with pytest.raises(ValueError, match="asymmetric"):
        verifier(jwks_server, algorithms=["HS256"])
    with pytest.raises(ValueError, match="issuer and audience"):
        JWKSVerifier(jwks_server.url, issuer=ISSUER, audience="")


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, None), ("Bearer abc", "abc"), ("bearer  abc ", "abc")],
)
def test_bearer_token(header: str | None, expected: str | None) -> None:
    headers = {} if header is None else {"authorization": header}
    assert bearer_token(headers) == expected


@pytest.mark.parametrize("header", ["Basic YWxpY2U6cHc=", "Bearer", "Bearer a, Bearer b", "Bearer a b"])
def test_bearer_token_refuses_anything_else(header: str) -> None:
    with pytest.raises(Unauthenticated):
        bearer_token({"authorization": header})


async def test_introspection_hooks_sync_and_async() -> None:
    async def introspect(token: str) -> dict[str, Any]:
        return {"active": token == "good", "sub": "dave", "iss": ISSUER, "client_id": "cli"}

    hook = BearerPrincipal(introspect)
    dave = boundary.principal_string("cli", ISSUER, "dave")
    assert await hook({}, {"authorization": "Bearer good"}) == dave
    with pytest.raises(Unauthenticated):
        await hook({}, {"authorization": "Bearer bad"})  # active: false
    assert await hook({}, {}) is None  # no credentials: no principal, nothing to verify
    with pytest.raises(Unauthenticated):
        await BearerPrincipal(lambda token: None)({}, {"authorization": "Bearer x"})
    with pytest.raises(Unauthenticated, match="subject"):
        principal_of({"sub": 42})


def test_header_principal_refuses_repeats() -> None:
    read = header_principal("X-User")
    assert read({"headers": [(b"x-user", b"erin")]}, {}) == "erin"
    assert read({"headers": []}, {}) is None
    with pytest.raises(Unauthenticated):
        read({"headers": [(b"x-user", b"erin"), (b"X-User", b"admin")]}, {})


def test_load_hook() -> None:
    assert load_hook("os.path:join")("a", "b") == "a/b"
    with pytest.raises(ValueError, match="module:function"):
        load_hook("os.path.join")
    with pytest.raises(TypeError):
        load_hook("os:sep")
    with pytest.raises(ModuleNotFoundError):
        load_hook("no_such_module_here:fn")
