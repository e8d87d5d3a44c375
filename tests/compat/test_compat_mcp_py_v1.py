"""statecodec.compat.mcp_py_v1 against the real ``mcp`` package (2.3).

Two layers are held against the SDK: the bare cipher against
``mcp.server.request_state.AESGCMRequestStateCodec``, and the claims envelope against a real
low-level ``mcp`` Server with the real ``RequestStateBoundary`` middleware, driven in-process
by the real ``mcp.Client`` (no sockets needed; nothing is mocked). The boundary has no clock
option, so times are moved on our side only: tokens we mint in the past or the future, and
SDK tokens we open at chosen instants.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import pytest
from compat_writers import compact_json, mcp_py_v1_cipher_seal, mcp_py_v1_seal, principal_claim

from statecodec import InvalidState
from statecodec.compat.mcp_py_v1 import (
    Expected,
    OpenedMcpPyV1,
    arguments_digest,
    decrypt,
    derive_key,
    key_id,
    parse,
    principal_matches,
    unseal,
)

request_state = pytest.importorskip("mcp.server.request_state")
from mcp import Client, types  # noqa: E402
from mcp.server.auth.provider import AccessToken, principal_components  # noqa: E402
from mcp.server.lowlevel import Server  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

SECRET = b"python-sdk-secret-0123456789abcdef!"
OTHER = b"another-python-sdk-secret-0123456789"
AUDIENCE = "weather"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


# ----------------------------------------------------------------------------- the cipher
def test_sdk_sealed_bytes_open_with_ours() -> None:
    sdk = request_state.AESGCMRequestStateCodec([SECRET])
    token = sdk.seal(b"\x00payload\xff")
    kid, plaintext = decrypt(token, [SECRET])
    assert plaintext == b"\x00payload\xff"
    assert kid == unb64(token[3:])[:4].hex() == key_id(derive_key(SECRET)).hex()


def test_our_sealed_bytes_open_with_the_sdk() -> None:
    token = mcp_py_v1_cipher_seal([SECRET], b"hello")
    assert request_state.AESGCMRequestStateCodec([SECRET]).unseal(token) == b"hello"


def test_str_secrets_are_utf8_like_the_sdk() -> None:
    text = "ünïcode-secret-0123456789abcdefghij"
    token = request_state.AESGCMRequestStateCodec([text]).seal(b"x")
    assert decrypt(token, [text])[1] == b"x"


def test_rotation_ring_both_ways() -> None:
    # Phase 2 of the SDK's rotation: keys=[new, old]. Tokens of either key open on either side.
    sdk = request_state.AESGCMRequestStateCodec([OTHER, SECRET])
    assert decrypt(request_state.AESGCMRequestStateCodec([SECRET]).seal(b"old"), [OTHER, SECRET])[1] == b"old"
    assert sdk.unseal(mcp_py_v1_cipher_seal([SECRET], b"old")) == b"old"
    ours = mcp_py_v1_cipher_seal([OTHER, SECRET], b"n")
    assert unb64(ours[3:])[:4] == key_id(derive_key(OTHER))  # keys[0] seals
    assert unb64(ours[3:])[:4] == unb64(sdk.seal(b"n")[3:])[:4]


def test_every_single_byte_change_is_rejected_by_both() -> None:
    token = request_state.AESGCMRequestStateCodec([SECRET]).seal(b"amount=100")
    raw = unb64(token[3:])
    sdk = request_state.AESGCMRequestStateCodec([SECRET])
    for i in range(len(raw)):
        forged = "v1." + b64(raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1 :])
        with pytest.raises(request_state.InvalidRequestState) as sdk_err:
            sdk.unseal(forged)
        with pytest.raises(InvalidState) as ours_err:
            decrypt(forged, [SECRET])
        expected = {"unknown key": "unknown_key", "seal": "tampered"}[str(sdk_err.value)]
        assert ours_err.value.reason == expected, i
        assert ours_err.value.reason == ("unknown_key" if i < 4 else "tampered")


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda t: t + "=", id="padding"),
        pytest.param(lambda t: t[:-1] + chr(ord(t[-1]) + 1), id="trailing-bits-or-char"),
        pytest.param(lambda t: t.replace("v1.", "v2.", 1), id="wrong-prefix"),
        pytest.param(lambda t: t[:30], id="truncated"),
        pytest.param(lambda t: "v1." + t[3:].replace("-", "+").replace("_", "/"), id="std-alphabet"),
    ],
)
def test_malformed_tokens_are_rejected_by_both(mutate: Any) -> None:
    # Tokens are random: draw until the mutation changes one (std-alphabet needs a - or _).
    for _ in range(64):
        token = mcp_py_v1_cipher_seal([SECRET], b"state-with-some-length-to-have-dashes" * 3)
        forged = mutate(token)
        if forged != token:
            break
    assert forged != token
    with pytest.raises(request_state.InvalidRequestState):
        request_state.AESGCMRequestStateCodec([SECRET]).unseal(forged)
    with pytest.raises(InvalidState) as err:
        decrypt(forged, [SECRET])
    assert err.value.reason in {"malformed", "tampered", "unknown_key"}


def test_cipher_refuses_short_and_duplicate_keys_like_the_sdk() -> None:
    token = mcp_py_v1_cipher_seal([SECRET], b"x")
    with pytest.raises(ValueError):
        decrypt(token, [b"short"])
    with pytest.raises(ValueError):
        decrypt(token, [SECRET, SECRET])
    with pytest.raises(TypeError):
        decrypt(token, SECRET)  # a bare secret, not a ring


# ------------------------------------------------------------------ the claims envelope
def test_arguments_digest_matches_the_sdk_request_identity() -> None:
    cases: list[tuple[str, dict[str, Any] | None]] = [
        ("tools/call", {"name": "t", "arguments": {"b": [1, 2, {"z": None}], "a": "é\u2028"}}),
        ("tools/call", {"name": "t"}),
        ("tools/call", {"name": "t", "arguments": {}}),
        ("prompts/get", {"name": "p", "arguments": {"x": "1"}}),
        ("resources/read", {"uri": "file:///tmp/a.txt", "arguments": {"ignored": True}}),
        ("tools/call", None),
    ]
    for method, params in cases:
        p = params or {}
        ours = (
            (p.get("uri", ""), arguments_digest(None))
            if method == "resources/read"
            else (p.get("name", ""), arguments_digest(p.get("arguments")))
        )
        assert ours == request_state._request_identity(method, params)


def test_principal_claim_matches_the_sdk_both_ways() -> None:
    ours = principal_claim("alice")
    assert request_state._principal_matches(ours, "alice")
    assert not request_state._principal_matches(ours, "bob")
    sdk = request_state._principal_claim("alice")
    assert principal_matches(sdk, "alice") and not principal_matches(sdk, "bob")


def test_the_sdk_default_principal_is_the_documented_json_array() -> None:
    # docs/compat.md tells `statecodec verify --principal` users to pass this form.
    token = AccessToken(token="t", client_id="cli", scopes=[], subject="u-1", claims={"iss": "https://idp"})
    expected = request_state.compact_json(principal_components(token))
    assert compact_json(["cli", "https://idp", "u-1"]) == expected == '["cli","https://idp","u-1"]'


class _Principal:
    """Who the SDK boundary thinks is calling; tests switch it between rounds."""

    value: str | None = "alice"


def make_server(
    principal: _Principal, *, keys: list[bytes] | None = None, ttl: float = 600.0
) -> tuple[Server, list]:
    """A real lowlevel Server whose tool asks for input once, then echoes the state it gets."""
    seen: list[str | None] = []

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
        seen.append(params.request_state)
        if params.request_state is None:
            return types.InputRequiredResult(request_state="round-1")
        return types.CallToolResult(content=[types.TextContent(type="text", text=params.request_state)])

    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="forecast", input_schema={"type": "object"})])

    async def on_read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> Any:
        seen.append(params.request_state)
        if params.request_state is None:
            return types.InputRequiredResult(request_state="resource-round-1")
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=params.uri, text=params.request_state)]
        )

    server = Server(
        "weather-server",
        on_call_tool=on_call_tool,
        on_list_tools=on_list_tools,
        on_read_resource=on_read_resource,
    )
    security = request_state.RequestStateSecurity(
        keys=keys or [SECRET], ttl=ttl, bind_principal=lambda ctx: principal.value, audience=AUDIENCE
    )
    server.middleware.append(request_state.RequestStateBoundary(security, default_audience=None))
    return server, seen


ARGS = {"city": "Zürich", "days": 3}


async def sdk_minted_token(server: Server, args: dict[str, Any] = ARGS) -> str:
    async with Client(server) as client:
        first = await client.session.call_tool("forecast", args, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult)
    assert first.request_state is not None and first.request_state != "round-1"  # sealed by the boundary
    return first.request_state


async def sdk_accepts(server: Server, token: str, args: dict[str, Any] = ARGS) -> str:
    """The state the real tool handler receives for ``token``; MCPError when the boundary rejects."""
    rejected: MCPError | None = None
    async with Client(server) as client:
        try:
            result = await client.session.call_tool(
                "forecast", args, request_state=token, allow_input_required=True
            )
        except MCPError as exc:  # raised outside the client's task group, not as an ExceptionGroup
            rejected = exc
    if rejected is not None:
        raise rejected
    assert isinstance(result, types.CallToolResult)
    text = result.content[0]
    assert isinstance(text, types.TextContent)
    return text.text


def ours_seal(
    state: str, *, clock: Callable[[], float] = time.time, audience: str | None = AUDIENCE, **bound: Any
) -> str:
    """What an SDK server with ``RequestStateSecurity(keys=[SECRET], audience=...)`` mints."""
    return mcp_py_v1_seal([SECRET], state, clock=clock, audience=audience, **bound)


def ours_open(
    token: str,
    *,
    method: str,
    target: str,
    arguments: dict[str, Any] | None = None,
    principal: str | None = None,
    audience: str | None = AUDIENCE,
    clock: Callable[[], float] = time.time,
) -> OpenedMcpPyV1:
    """Everything the SDK boundary checks; ``principal=None`` means "must be anonymous"."""
    expect = Expected(method, target, arguments_digest(arguments), audience, principal)
    return unseal(token, [SECRET], expect=expect, clock=clock)


BOUND: dict[str, Any] = {
    "method": "tools/call",
    "target": "forecast",
    "arguments": ARGS,
    "principal": "alice",
}


async def test_sdk_minted_envelope_opens_with_ours() -> None:
    server, _ = make_server(_Principal())
    token = await sdk_minted_token(server)
    opened = ours_open(token, **BOUND)
    assert opened.state == "round-1"
    assert opened.claims["m"] == "tools/call" and opened.claims["t"] == "forecast"
    assert opened.claims["aud"] == AUDIENCE
    assert opened.claims["a"] == arguments_digest(ARGS)
    assert list(opened.claims) == ["v", "iat", "exp", "m", "t", "a", "s", "aud", "p"]
    assert opened.expires_at - opened.issued_at == pytest.approx(600.0)
    assert abs(opened.issued_at - time.time()) < 60
    assert parse(token).kid.hex() == opened.kid


async def test_our_envelope_is_accepted_by_the_sdk_boundary() -> None:
    server, seen = make_server(_Principal())
    token = ours_seal("minted-by-statecodec", **BOUND)
    assert await sdk_accepts(server, token) == "minted-by-statecodec"
    assert seen == ["minted-by-statecodec"]  # the handler saw our plaintext, nothing else


async def test_sdk_token_round_trips_through_ours_and_back() -> None:
    # A mixed fleet: the SDK instance mints, ours re-seals the next round, the SDK accepts it.
    server, _ = make_server(_Principal())
    opened = ours_open(await sdk_minted_token(server), **BOUND)
    assert await sdk_accepts(server, ours_seal(opened.state + "+1", **BOUND)) == "round-1+1"


async def test_resources_read_binds_the_uri() -> None:
    server, _ = make_server(_Principal())
    uri = "file:///forecasts/zurich.json"
    async with Client(server) as client:
        first = await client.session.read_resource(uri, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.request_state
        opened = ours_open(first.request_state, method="resources/read", target=uri, principal="alice")
        assert opened.state == "resource-round-1"
        token = ours_seal("ours", method="resources/read", target=uri, principal="alice")
        done = await client.session.read_resource(uri, request_state=token, allow_input_required=True)
        assert isinstance(done, types.ReadResourceResult) and done.contents[0].text == "ours"
        with pytest.raises(InvalidState) as err:
            ours_open(first.request_state, method="resources/read", target=uri + "x", principal="alice")
        assert err.value.reason == "binding_mismatch"


MISMATCHES = [
    pytest.param({"method": "prompts/get"}, id="method"),
    pytest.param({"target": "other-tool"}, id="target"),
    pytest.param({"arguments": {"city": "Bern", "days": 3}}, id="arguments"),
    pytest.param({"principal": "mallory"}, id="principal"),
    pytest.param({"principal": None}, id="principal-drift-anonymous"),
]


@pytest.mark.parametrize("change", MISMATCHES)
async def test_binding_mismatch_is_rejected_by_both(change: dict[str, Any]) -> None:
    principal = _Principal()
    server, seen = make_server(principal)
    sdk_token = await sdk_minted_token(server)
    with pytest.raises(InvalidState) as err:
        ours_open(sdk_token, **{**BOUND, **change})
    assert err.value.reason == "binding_mismatch"

    # The same difference seen from the SDK side: we seal for `change`, the SDK checks BOUND.
    sealed_for = {**BOUND, **change}
    token = ours_seal("x", **sealed_for)
    with pytest.raises(MCPError) as wire:
        await sdk_accepts(server, token)
    assert wire.value.error.code == -32602
    assert wire.value.error.data == {"reason": "invalid_request_state"}
    assert "x" not in seen


async def test_audience_mismatch_is_rejected_by_both() -> None:
    server, _ = make_server(_Principal())
    with pytest.raises(InvalidState) as err:
        ours_open(await sdk_minted_token(server), audience="billing", **BOUND)
    assert err.value.reason == "binding_mismatch"
    with pytest.raises(MCPError):
        await sdk_accepts(server, ours_seal("x", audience="billing", **BOUND))
    with pytest.raises(MCPError):  # no aud claim at all
        await sdk_accepts(server, ours_seal("x", audience=None, **BOUND))


async def test_anonymous_tokens_carry_no_principal_claim() -> None:
    anon = _Principal()
    anon.value = None
    server, _ = make_server(anon)
    token = await sdk_minted_token(server)
    opened = ours_open(token, **{**BOUND, "principal": None})
    assert "p" not in opened.claims
    assert await sdk_accepts(server, ours_seal("anon", **{**BOUND, "principal": None})) == "anon"


async def test_expiry_against_the_sdk() -> None:
    server, _ = make_server(_Principal())
    token = await sdk_minted_token(server)
    exp = ours_open(token, **BOUND).expires_at
    assert ours_open(token, **BOUND, clock=lambda: exp - 0.001).state == "round-1"
    with pytest.raises(InvalidState) as err:
        ours_open(token, **BOUND, clock=lambda: exp)  # the SDK accepts only now < exp
    assert err.value.reason == "expired"

    stale = ours_seal("stale", **BOUND, clock=lambda: time.time() - 601)
    with pytest.raises(MCPError):
        await sdk_accepts(server, stale)
    with pytest.raises(InvalidState) as err:
        ours_open(stale, **BOUND)
    assert err.value.reason == "expired"


async def test_future_minted_tokens_against_the_sdk() -> None:
    server, _ = make_server(_Principal())
    # Within the SDK's 60 s future skew: accepted by both.
    near = ours_seal("near", **BOUND, clock=lambda: time.time() + 30)
    assert await sdk_accepts(server, near) == "near"
    assert ours_open(near, **BOUND).state == "near"
    far = ours_seal("far", **BOUND, clock=lambda: time.time() + 300)
    with pytest.raises(MCPError):
        await sdk_accepts(server, far)
    with pytest.raises(InvalidState) as err:
        ours_open(far, **BOUND)
    assert err.value.reason == "not_yet_valid"


async def test_tampered_envelope_token_is_rejected_by_both() -> None:
    server, _ = make_server(_Principal())
    token = ours_seal("x", **BOUND)
    raw = bytearray(unb64(token[3:]))
    raw[20] ^= 0x80
    forged = "v1." + b64(bytes(raw))
    with pytest.raises(MCPError):
        await sdk_accepts(server, forged)
    with pytest.raises(InvalidState) as err:
        ours_open(forged, **BOUND)
    assert err.value.reason == "tampered"


async def test_wrongly_shaped_claims_are_malformed_and_refused_by_the_sdk() -> None:
    # Sealed under the right key, but not an envelope the boundary accepts.
    server, seen = make_server(_Principal())
    plaintexts = [
        b"not json",
        b"[1,2]",
        b'{"v":2,"iat":0,"exp":1e12,"s":"x"}',
        b'{"v":1,"iat":0,"exp":1e12}',
        b'{"v":1,"iat":0,"exp":1e12,"s":5}',
        b'{"v":1,"iat":NaN,"exp":1e12,"s":"x"}',
    ]
    for plaintext in plaintexts:
        token = mcp_py_v1_cipher_seal([SECRET], plaintext)
        with pytest.raises(InvalidState) as err:
            ours_open(token, **BOUND)
        assert err.value.reason == "malformed", plaintext
        with pytest.raises(MCPError):
            await sdk_accepts(server, token)
    assert seen == []
