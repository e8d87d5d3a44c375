"""statecodec.compat.ts_v1 against the real TypeScript SDK under Node.

``tests/node/compat_ts.mjs`` imports ``createRequestStateCodec`` from
``@modelcontextprotocol/server`` 2.4.0 (installed by ``npm ci`` in tests/node, as
scripts/test does) and mints/verifies whatever these tests send it on stdin. Each test runs
one batch in one Node process. The SDK has no clock option: the script pins ``Date.now``
per call so both sides can be compared at the same instants.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from typing import Any

import pytest
from processes import NODE_DIR, node_marks

from statecodec import InvalidState
from statecodec.compat import ts_v1

NODE = shutil.which("node")

pytestmark = node_marks(NODE_DIR, "@modelcontextprotocol/server")

KEY = "ts-sdk-request-state-key-0123456789abcdef"
BIN_KEY = bytes(range(200, 240))  # not UTF-8: exercises the bytes form of `key`
NOW = 1_780_000_000.25
# The TS SDK's verify() error messages, mapped to statecodec reasons.
TS_REASON = {"malformed": "malformed", "mac": "tampered", "expired": "expired", "bind": "binding_mismatch"}


def run_ts(
    ops: list[dict[str, Any]],
    *,
    key: str | bytes = KEY,
    ttl: float | None = None,
    bind_field: str | None = None,
) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {
        "key": {"hex": key.hex()} if isinstance(key, bytes) else {"utf8": key},
        "bindField": bind_field,
        "ops": ops,
    }
    if ttl is not None:
        spec["ttlSeconds"] = ttl
    assert NODE is not None
    proc = subprocess.run(
        [NODE, "compat_ts.mjs"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        cwd=NODE_DIR,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["sdkVersion"] == "2.4.0"
    return list(out["results"])


def bind_value(ctx: dict[str, Any] | None) -> str | None:
    """What the Node script's ``bind`` returns for ``ctx``; ``None`` for a codec without one."""
    return None if ctx is None else str(ctx["principal"])


def our_reason(token: str, ctx: dict[str, Any] | None, now: float) -> str | None:
    try:
        ts_v1.unseal(token, KEY, clock=lambda: now, bind=bind_value(ctx))
    except InvalidState as exc:
        return exc.reason
    return None


PAYLOADS: list[Any] = [
    {"step": 2, "answers": {"confirm": True}},
    "plain string",
    ["list", 1, None, False],
    {"unicode": "Zürich ☃ 🚀 \u2028", "ctrl": "\n\t\u0001\u007f", "quote": '"\\/'},
    0,
    -17,
    None,
    {"nested": [[[{"deep": [1, 2, 3]}]]]},
    1.5,
    {},
]


@pytest.mark.parametrize("bind", [False, True], ids=["unbound", "bound"])
def test_mint_is_byte_identical_to_the_sdk(bind: bool) -> None:
    ctx = {"principal": "alice"} if bind else None
    results = run_ts(
        [{"op": "mint", "payload": p, "ctx": ctx, "now": NOW} for p in PAYLOADS],
        bind_field="principal" if bind else None,
    )
    for payload, result in zip(PAYLOADS, results, strict=True):
        assert result["ok"], result
        assert ts_v1.seal(KEY, payload, clock=lambda: NOW, bind=bind_value(ctx)) == result["token"], payload


def test_binary_key_and_custom_ttl_are_byte_identical() -> None:
    (result,) = run_ts([{"op": "mint", "payload": {"a": 1}, "now": NOW}], key=BIN_KEY, ttl=30)
    assert ts_v1.seal(BIN_KEY, {"a": 1}, clock=lambda: NOW, ttl_seconds=30) == result["token"]
    assert ts_v1.unseal(result["token"], BIN_KEY, clock=lambda: NOW, bind=None).expires_at == int(NOW) + 30


@pytest.mark.parametrize("bind", [False, True], ids=["unbound", "bound"])
def test_sdk_tokens_open_with_ours(bind: bool) -> None:
    ctx = {"principal": "alice"} if bind else None
    results = run_ts(
        [{"op": "mint", "payload": p, "ctx": ctx} for p in PAYLOADS], bind_field="principal" if bind else None
    )
    for payload, result in zip(PAYLOADS, results, strict=True):
        opened = ts_v1.unseal(result["token"], KEY, bind=bind_value(ctx))
        assert opened.payload == payload
        assert opened.bound is bind


@pytest.mark.parametrize("bind", [False, True], ids=["unbound", "bound"])
def test_our_tokens_verify_in_the_sdk(bind: bool) -> None:
    ctx = {"principal": "alice"} if bind else None
    tokens = [ts_v1.seal(KEY, p, bind=bind_value(ctx)) for p in PAYLOADS]
    results = run_ts(
        [{"op": "verify", "token": t, "ctx": ctx} for t in tokens], bind_field="principal" if bind else None
    )
    for payload, result in zip(PAYLOADS, results, strict=True):
        assert result == {"ok": True, "payload": payload}


def _flip(token: str, index: int) -> str:
    chars = list(token)
    chars[index] = "A" if chars[index] != "A" else "B"
    return "".join(chars)


def test_every_rejection_reason_agrees_with_the_sdk() -> None:
    """One token per failure the SDK distinguishes, judged by both at the same instant."""
    good = ts_v1.seal(KEY, {"n": 1}, clock=lambda: NOW, bind="alice")
    plain = ts_v1.seal(KEY, {"n": 1}, clock=lambda: NOW)
    exp = int(NOW) + 600
    body, mac = good[3:].split(".")
    cases: list[tuple[str, str, dict[str, Any] | None, float]] = [
        ("valid", good, {"principal": "alice"}, NOW),
        ("valid at the last second", good, {"principal": "alice"}, exp + 0.999),
        ("expired one second later", good, {"principal": "alice"}, exp + 1),
        ("other principal", good, {"principal": "bob"}, NOW),
        ("no bind tag in the token", plain, {"principal": "alice"}, NOW),
        ("body byte changed", _flip(good, 10), {"principal": "alice"}, NOW),
        ("mac byte changed", _flip(good, len(good) - 5), {"principal": "alice"}, NOW),
        (
            "minted with another key",
            ts_v1.seal("x" * 40, 1, clock=lambda: NOW, bind="alice"),
            {"principal": "alice"},
            NOW,
        ),
        ("mac of another token", f"v1.{plain[3:].split('.')[0]}.{mac}", {"principal": "alice"}, NOW),
        ("wrong prefix", "v2." + good[3:], {"principal": "alice"}, NOW),
        ("no mac", "v1." + body, {"principal": "alice"}, NOW),
        ("empty body", "v1.." + mac, {"principal": "alice"}, NOW),
        ("not base64 mac", f"v1.{body}.!!!!", {"principal": "alice"}, NOW),
    ]
    results = run_ts(
        [{"op": "verify", "token": t, "ctx": c, "now": now} for _, t, c, now in cases], bind_field="principal"
    )
    for (name, token, ctx, now), result in zip(cases, results, strict=True):
        sdk = None if result["ok"] else TS_REASON[result["error"]]
        assert our_reason(token, ctx, now) == sdk, name
    # And a tag in the token when no bind function is configured: "bind" in the SDK.
    (result,) = run_ts([{"op": "verify", "token": good, "now": NOW}])
    assert result == {"ok": False, "error": "bind", "name": "Error"}
    assert our_reason(good, None, NOW) == "binding_mismatch"


def test_stricter_than_the_sdk_on_non_canonical_mac_encodings() -> None:
    """The SDK's atob() accepts other spellings of the same MAC; we reject them as malformed.

    This documents a real difference (a TS token string is malleable without the key), so a
    replay store keyed on the token string must only see tokens this reader accepted.
    """
    token = ts_v1.seal(KEY, "x", clock=lambda: NOW)
    body, mac = token[3:].split(".")
    raw = base64.urlsafe_b64decode(mac + "=")
    last_bits_set = base64.urlsafe_b64encode(raw).decode().rstrip("=")[:-1]
    # 32 bytes -> 43 chars; the last char carries 2 unused bits. Set one of them.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    variant = last_bits_set + alphabet[alphabet.index(mac[-1]) | 1]
    assert variant != mac
    spellings = [f"v1.{body}.{mac}=", f"v1.{body}.{variant}"]
    results = run_ts([{"op": "verify", "token": t, "now": NOW} for t in spellings])
    assert all(r == {"ok": True, "payload": "x"} for r in results)
    for spelling in spellings:
        assert our_reason(spelling, None, NOW) == "malformed"


def test_lone_surrogates_in_the_bind_value_match_text_encoder() -> None:
    odd = "user-\ud800-half"  # TextEncoder turns the lone surrogate into U+FFFD
    (minted,) = run_ts(
        [{"op": "mint", "payload": 1, "ctx": {"principal": odd}, "now": NOW}], bind_field="principal"
    )
    assert ts_v1.seal(KEY, 1, clock=lambda: NOW, bind=odd) == minted["token"]
    assert ts_v1.unseal(minted["token"], KEY, clock=lambda: NOW, bind="user-\ufffd-half").payload == 1
