"""The `statecodec` command line through click's CliRunner: inspect, verify, mint, errors.

Keys come from real key-ring files (`file:`) and environment variables (`env:`); replay
stores are real SQLite files. Every `--json` document is validated against the published
schema docs/cli-schema.json. Times are pinned with --at so relative phrases are exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result
from compat_writers import mcp_py_v1_seal, rs1_token

from statecodec import Key, KeyRing, StateCodec
from statecodec.cli import main
from statecodec.cli._exit import EXIT_CODES, CliError, ExitCode, explain_missing_extra
from statecodec.compat import ts_v1

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "cli-schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
T0 = 1_785_240_000  # 2026-07-28T12:00:00Z
# Settings from the developer's shell must not leak into the runs (None unsets).
CLEAN_ENV: dict[str, str | None] = {"STATECODEC_KEYS": None, "STATECODEC_DEBUG": None, "NO_COLOR": None}


def run(*args: str, input: str | bytes | None = None, env: dict[str, str | None] | None = None) -> Result:
    """Invoke the CLI; every run must end without a traceback, whatever the input."""
    result = CliRunner().invoke(main, list(args), input=input, env={**CLEAN_ENV, **(env or {})})
    assert "Traceback" not in result.output, result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {result.exception!r}: {result.output}")
    return result


def run_json(
    *args: str, input: str | bytes | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run with --json: stdout is one document valid under the schema, matching the exit code."""
    result = run(*args, "--json", input=input, env=env)
    doc = json.loads(result.stdout)
    VALIDATOR.validate(doc)
    assert doc["exit_code"] == result.exit_code
    return doc


@pytest.fixture
def ring() -> KeyRing:
    return KeyRing.generate("k8", created_at=T0 - 86400)


@pytest.fixture
def keys(tmp_path: Path, ring: KeyRing) -> str:
    path = tmp_path / "keys.json"
    path.write_text(ring.to_json())
    path.chmod(0o600)
    return f"file:{path}"


def mint(keys: str, payload: str = '{"step": 2}', *extra: str) -> str:
    result = run("mint", "--keys", keys, "--at", str(T0), *extra, payload)
    assert result.exit_code == 0, result.output
    return result.stdout.strip()


# ------------------------------------------------------------------------ mint
def test_mint_prints_only_the_token_and_it_verifies(keys: str, ring: KeyRing) -> None:
    token = mint(keys)
    assert token.startswith("sc1s.") and "\n" not in token
    doc = run_json("verify", token, "--keys", keys, "--at", str(T0 + 60))
    assert doc["valid"] is True and doc["claims"]["kid"] == "k8"
    assert doc["claims"]["payload"] == {"encoding": "json", "bytes": 11, "value": {"step": 2}}


def test_mint_json_reports_what_it_made(keys: str) -> None:
    doc = run_json("mint", "--keys", keys, "--at", str(T0), "--ttl", "90s", "--principal", "alice", "x")
    assert doc["ok"] is True
    assert doc["expires_at"]["unix"] - doc["issued_at"]["unix"] == 90
    assert doc["binding"]["principal"] == "alice" and doc["binding"]["audience"] is None
    assert doc["token"].startswith("sc1s.")


def test_mint_reads_the_payload_from_stdin_and_encrypts(keys: str) -> None:
    result = run("mint", "--keys", keys, "--mode", "encrypt", "-", input=b"secret \x00 bytes")
    token = result.stdout.strip()
    assert result.exit_code == 0 and token.startswith("sc1e.")
    doc = run_json("verify", token, "--keys", keys)
    assert doc["mode"] == "encrypt"
    assert doc["claims"]["payload"] == {"encoding": "text", "bytes": 14, "value": "secret \x00 bytes"}


def test_mint_refuses_a_payload_too_big_for_a_token(keys: str) -> None:
    doc = run_json("mint", "--keys", keys, "x" * 9000)
    assert doc["exit_code"] == ExitCode.IO
    assert "max_token_bytes" in doc["error"]["message"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--ttl", "0"], "must be positive"),
        (["--ttl", "ten minutes"], "not a duration"),
        (["--at", "yesterday"], "not a time"),
        (["--arguments", "{not json"], "not valid JSON"),
        (["--arguments", str(2**60)], "interoperable range"),
        (["--extra", "novalue"], "KEY=VALUE"),
        (["--mode", "rot13"], "rot13"),
        # Out of range: these were exit 6 ("times must satisfy...") or 70 ("a bug").
        (["--ttl", "99999999999d"], "'99999999999d' is out of range; the longest duration is"),
        (["--ttl", "9" * 5000], "is out of range"),
        (["--at", "99999999999"], "'99999999999' is out of range; a time is between 1970-01-01 and 2106"),
        (["--at", "9999-12-31T00:00:00Z"], "is out of range"),
        (["--at", "+99999999999d"], "is out of range"),
        (["--at", "4000000000", "--ttl", "1000000000"], "expire after 2106-02-07T06:28:15Z"),
    ],
)
def test_mint_usage_errors_exit_2_and_name_the_option(keys: str, args: list[str], needle: str) -> None:
    result = run("mint", "--keys", keys, *args, "payload")
    assert result.exit_code == ExitCode.USAGE
    assert needle in result.stderr


# --------------------------------------------------------------------- inspect
def test_inspect_shows_everything_readable_and_says_unverified(keys: str) -> None:
    token = mint(keys, '{"cart": ["a", "b"]}')
    result = run("inspect", token, "--at", str(T0 + 348))
    assert result.exit_code == 0
    out = result.stdout
    assert out.startswith("UNVERIFIED")
    for needle in ("statecodec sc1", "SIGN", "k8", "2026-07-28T12:00:00Z", "expires in 4m12s", '"cart": ['):
        assert needle in out, needle


def test_inspect_relative_expiry_in_the_past(keys: str) -> None:
    token = mint(keys)
    assert "expired 3m ago" in run("inspect", token, "--at", str(T0 + 600 + 180)).stdout


def test_inspect_json_matches_the_header(keys: str) -> None:
    doc = run_json("inspect", mint(keys, "plain text"), "--at", str(T0))
    assert doc["verified"] is False and doc["warning"].startswith("UNVERIFIED")
    tok = doc["token"]
    assert (tok["format"], tok["mode"], tok["kid"], tok["version"]) == ("sc1", "sign", "k8", 1)
    assert tok["issued_at"] == {"unix": T0, "iso": "2026-07-28T12:00:00Z", "relative": "in 0s"}
    assert tok["lifetime_seconds"] == 600
    assert tok["payload"] == {"encoding": "text", "bytes": 10, "value": "plain text"}


def test_inspect_reads_stdin(keys: str) -> None:
    token = mint(keys)
    doc = run_json("inspect", "-", input=token + "\n")
    assert doc["token"]["kid"] == "k8"


def test_inspect_never_shows_an_encrypted_payload(keys: str) -> None:
    result = run("mint", "--keys", keys, "--mode", "encrypt", "top secret payload")
    out = run("inspect", result.stdout.strip()).stdout
    assert "ENCRYPT" in out and "(encrypted)" in out and "top secret" not in out


def test_inspect_escapes_terminal_control_sequences_in_the_payload(keys: str) -> None:
    token = mint(keys, "\x1b[2J\x1b]0;pwned\x07\u009b31m")
    out = run("inspect", token).stdout
    assert "\x1b" not in out and "\x07" not in out and "\u009b" not in out
    assert "\\x1b[2J" in out and "\\x9b31m" in out


def test_inspect_binary_payload_as_hex(keys: str) -> None:
    result = run("mint", "--keys", keys, "-", input=b"\xff\xfe\x00")
    doc = run_json("inspect", result.stdout.strip())
    assert doc["token"]["payload"] == {"encoding": "hex", "bytes": 3, "value": "fffe00"}


def test_inspect_flags_a_token_over_the_default_limit(keys: str) -> None:
    token = mint(keys, "x" * 7000, "--max-token-bytes", "20000")
    assert "over the default 8192 limit" in run("inspect", token).stdout
    assert run_json("verify", token, "--keys", keys)["error"]["reason"] == "too_large"


def test_inspect_names_the_other_sdks_formats(ring: KeyRing) -> None:
    secret = ring.primary.secret
    ts = ts_v1.seal(secret, {"step": 1}, clock=lambda: T0, bind="user:alice")
    py = mcp_py_v1_seal([secret], "state", clock=lambda: T0, method="tools/call", target="t")
    rs = rs1_token(secret, b"hello", clock=lambda: T0)
    for token, fmt, name in (
        (ts, "ts-v1", "TypeScript SDK v1"),
        (py, None, "Python SDK v1 or Ruby SDK v1"),  # the Ruby SDK's tokens look alike
        (rs, "rs1", "rmcp rs1"),
    ):
        doc = run_json("inspect", token, "--at", str(T0))
        assert (doc["token"]["format"], doc["token"]["format_name"]) == (fmt, name)
        text = run("inspect", token).stdout
        assert all(part in text for part in name.split(" or "))
    py_doc = run_json("inspect", py, "--at", str(T0))["token"]
    assert [c["format"] for c in py_doc["candidates"]] == ["mcp-py-v1", "ruby-v1"] and py_doc["ambiguity"]
    assert run_json("inspect", ts, "--at", str(T0))["token"]["payload"]["value"] == {"step": 1}
    assert run_json("inspect", rs, "--at", str(T0))["token"]["expires_at"]["unix"] == T0 + 600


@pytest.mark.parametrize(
    ("data", "code", "needle"),
    [
        (b"\x00\xff\xfebinary\x89PNG", ExitCode.INVALID, "not printable ASCII"),
        (b"", ExitCode.INVALID, "stdin was empty"),
        (b"   \n", ExitCode.INVALID, "stdin was empty"),
        (b"A" * (1024 * 1024 + 10), ExitCode.IO, "over 1 MiB"),
        (b"hello world", ExitCode.INVALID, "not printable ASCII"),
        (b"just-some-text", ExitCode.INVALID, "not a recognised requestState token"),
        (b"sc1s.!!!", ExitCode.INVALID, "base64url"),
        (b"sc9s.AAAA", ExitCode.INVALID, "version 9"),
        (b"sc1s.AAAA", ExitCode.INVALID, "unreadable statecodec sc1 token"),
        (b"v1.a.b.c", ExitCode.INVALID, "neither the TypeScript"),
    ],
)
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_garbage_input_is_one_clear_error(
    keys: str, command: str, data: bytes, code: int, needle: str
) -> None:
    args = [command, "-"] + (["--keys", keys] if command == "verify" else [])
    result = run(*args, input=data)
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    if command == "inspect":  # verify words token-level failures as the codec does (next test)
        assert result.stderr.startswith("statecodec: error: ") and needle in result.stderr
    doc = run_json(*args, input=data)
    assert doc["ok"] is False and doc["error"]["message"]


def test_verify_reports_the_codecs_reason_for_unreadable_tokens(keys: str) -> None:
    cases = {
        "just-some-text": "malformed",
        "sc1s.!!!": "malformed",
        "sc9s.AAAA": "unsupported_version",
        "sc1s.AAAA": "malformed",
        "x" * 9000: "too_large",
    }
    for token, reason in cases.items():
        result = run("verify", token, "--keys", keys)
        assert result.exit_code == ExitCode.INVALID
        assert result.stdout.startswith(f"INVALID  {reason}: "), result.stdout
        assert run_json("verify", token, "--keys", keys)["error"]["reason"] == reason


def test_one_megabyte_argument_is_refused(keys: str) -> None:
    doc = run_json("inspect", "A" * (1024 * 1024 + 1))
    assert doc["exit_code"] == ExitCode.IO


def test_empty_token_argument(keys: str) -> None:
    result = run("inspect", "")
    assert result.exit_code == ExitCode.INVALID
    assert "the TOKEN argument is empty" in result.stderr


# ---------------------------------------------------------------------- verify
def test_verify_without_binding_says_binding_not_checked(keys: str) -> None:
    token = mint(keys, "{}", "--principal", "alice")
    result = run("verify", token, "--keys", keys, "--at", str(T0 + 10))
    assert result.exit_code == 0
    assert result.stdout.startswith("VALID")
    assert "binding    NOT CHECKED" in result.stdout
    doc = run_json("verify", token, "--keys", keys, "--at", str(T0 + 10))
    assert doc["binding_checked"] is False and doc["binding"] is None and doc["replay"] == "not_checked"


def test_verify_with_the_full_binding(keys: str) -> None:
    bind = [
        "--principal",
        "alice",
        "--audience",
        "https://mcp.example",
        "--method",
        "tools/call",
        "--target",
        "book",
        "--arguments",
        '{"when": "friday", "seats": 2}',
        "--extra",
        "tenant=acme",
    ]
    token = mint(keys, "{}", *bind)
    # Argument order and whitespace do not matter: the digest is over canonical JSON.
    bind[9] = '{ "seats":2, "when":"friday" }'
    doc = run_json("verify", token, "--keys", keys, "--at", str(T0), *bind)
    assert doc["valid"] and doc["binding_checked"]
    assert doc["binding"]["extra"] == {"tenant": "acme"} and len(doc["binding"]["argument_digest"]) == 64
    out = run("verify", token, "--keys", keys, "--at", str(T0), *bind).stdout
    assert "checked (principal, audience, method, target, arguments, extra)" in out


@pytest.mark.parametrize(
    "wrong",
    [
        ["--principal", "bob"],
        ["--principal", "alice", "--target", "other"],
        ["--principal", "alice", "--extra", "a=b"],
        ["--principal", "alice", "--arguments", "{}"],
    ],
)
def test_verify_binding_mismatch(keys: str, wrong: list[str]) -> None:
    token = mint(keys, "{}", "--principal", "alice")
    doc = run_json("verify", token, "--keys", keys, "--at", str(T0), *wrong)
    assert doc["exit_code"] == ExitCode.INVALID and doc["error"]["reason"] == "binding_mismatch"
    assert doc["valid"] is False and doc["kid"] == "k8" and len(doc["token_id"]) == 32
    assert "different principal" in run("verify", token, "--keys", keys, "--at", str(T0), *wrong).stdout


def test_verify_unbound_checks_a_token_minted_without_binding(keys: str) -> None:
    plain, bound = mint(keys), mint(keys, "{}", "--principal", "alice")
    assert run_json("verify", plain, "--keys", keys, "--unbound", "--at", str(T0))["binding_checked"] is True
    assert run_json("verify", bound, "--keys", keys, "--unbound", "--at", str(T0))["exit_code"] == 1


def test_verify_expired_and_not_yet_valid(keys: str) -> None:
    token = mint(keys)
    result = run("verify", token, "--keys", keys, "--at", str(T0 + 600 + 180))
    assert result.exit_code == ExitCode.INVALID
    assert result.stdout.strip() == "INVALID  expired: expired 3m ago (expiry grace 0s)"
    # Strict by default: a TTL is at most its TTL (ttl 600: valid while now < exp).
    assert run("verify", token, "--keys", keys, "--at", str(T0 + 599.5)).exit_code == 0
    at_exp = run("verify", token, "--keys", keys, "--at", str(T0 + 600))
    assert at_exp.exit_code == ExitCode.INVALID
    assert at_exp.stdout.strip() == "INVALID  expired: expired 0s ago (expiry grace 0s)"
    assert run("verify", token, "--keys", keys, "--at", str(T0 + 600.5)).exit_code == ExitCode.INVALID
    # The grace is a duration option, and --at takes ISO 8601.
    graced = ("--at", "2026-07-28T12:11:59Z", "--expiry-grace", "2m")
    assert run("verify", token, "--keys", keys, *graced).exit_code == 0
    assert run("verify", token, "--keys", keys, *graced, "--max-skew", "1h").exit_code == 0
    assert (
        run("verify", token, "--keys", keys, "--at", "2026-07-28T12:11:59Z", "--max-skew", "1h").exit_code
        == ExitCode.INVALID
    )
    at_grace_end = ("--at", "2026-07-28T12:12:00Z", "--expiry-grace", "2m")
    assert run("verify", token, "--keys", keys, *at_grace_end).exit_code == ExitCode.INVALID
    # --max-skew: issued up to that far in the future.
    doc = run_json("verify", token, "--keys", keys, "--at", str(T0 - 61))
    assert doc["error"]["reason"] == "not_yet_valid" and "60s skew allowance" in doc["error"]["message"]
    assert run("verify", token, "--keys", keys, "--at", str(T0 - 60)).exit_code == 0
    assert run("verify", token, "--keys", keys, "--at", str(T0 - 61), "--max-skew", "61s").exit_code == 0


def _flow_tokens(ring: KeyRing, *, max_rounds: int = 10) -> list[str]:
    """The tokens of one flow, a round every 30 s from T0, the last one paced 1.5 s."""
    now = [float(T0)]
    codec = StateCodec(ring, max_rounds=max_rounds, clock=lambda: now[0])
    tokens, parent = [], None
    for i in range(max_rounds):
        last = i == max_rounds - 1
        tokens.append(codec.seal(b"{}", parent=parent, retry_after=1.5 if last else None))
        now[0] += 1.5 if last else 0
        parent = codec.unseal(tokens[-1])
        now[0] += 30
    return tokens


def test_inspect_and_verify_show_the_flow(keys: str, ring: KeyRing) -> None:
    tokens = _flow_tokens(ring, max_rounds=3)
    first = run_json("inspect", tokens[0], "--at", str(T0))["token"]["flow"]
    assert first["round"] == 1 and first["not_before"] is None
    assert first["flow_id"] == run_json("inspect", tokens[0])["token"]["token_id"]
    doc = run_json("inspect", tokens[2], "--at", str(T0 + 60))["token"]
    assert doc["flow"]["flow_id"] == first["flow_id"] and doc["flow"]["round"] == 3
    assert doc["flow"]["started_at"]["unix"] == T0
    assert doc["flow"]["not_before"]["unix"] == T0 + 61  # issued at T0 + 60, paced 1.5 s
    human = run("inspect", tokens[2], "--at", str(T0 + 60)).stdout
    assert f"{first['flow_id']} round 3, started 2026-07-28T12:00:00Z" in human
    assert "the server paces this round" in human
    claims = run_json("verify", tokens[1], "--keys", keys, "--at", str(T0 + 40))["claims"]
    assert (claims["flow"]["flow_id"], claims["flow"]["round"]) == (first["flow_id"], 2)
    # Too early, and past a budget: the reason, with the flow it belongs to.
    early = run_json("verify", tokens[2], "--keys", keys, "--at", str(T0 + 60.5))
    assert (early["error"]["reason"], early["flow_id"], early["round"]) == ("too_early", first["flow_id"], 3)
    tight = run_json("verify", tokens[2], "--keys", keys, "--at", str(T0 + 62), "--max-rounds", "2")
    assert (tight["error"]["reason"], tight["round"]) == ("round_limit", 3)
    old = run_json("verify", tokens[2], "--keys", keys, "--at", str(T0 + 62), "--max-flow-age", "61s")
    assert old["error"]["reason"] == "flow_expired"
    at_end = run_json("verify", tokens[2], "--keys", keys, "--at", str(T0 + 62), "--max-flow-age", "62s")
    assert at_end["error"]["reason"] == "flow_expired"  # a flow ends like a token: at its end
    assert (
        run("verify", tokens[2], "--keys", keys, "--at", str(T0 + 62), "--max-flow-age", "63s").exit_code == 0
    )


def test_verify_tampered(keys: str) -> None:
    token = mint(keys)
    i = len(token) - 12
    forged = token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1 :]
    doc = run_json("verify", forged, "--keys", keys, "--at", str(T0))
    assert doc["error"]["reason"] == "tampered" and doc["exit_code"] == ExitCode.INVALID


def test_verify_unknown_key_names_the_ring(tmp_path: Path, keys: str) -> None:
    token = mint(keys)
    other = KeyRing.generate("k9", created_at=T0).with_key(KeyRing.generate("k10", created_at=T0).primary)
    path = tmp_path / "other.json"
    path.write_text(other.to_json())
    path.chmod(0o600)
    result = run("verify", token, "--keys", f"file:{path}", "--at", str(T0))
    assert result.exit_code == ExitCode.INVALID
    assert "unknown key id k8 - the ring has k9, k10" in result.stdout


def test_verify_wrong_mode(keys: str) -> None:
    doc = run_json("verify", mint(keys), "--keys", keys, "--mode", "encrypt", "--at", str(T0))
    assert doc["error"]["reason"] == "wrong_mode"


def test_verify_reads_keys_from_the_environment(ring: KeyRing) -> None:
    env = {"MY_RING": ring.to_json()}
    token = run("mint", "--keys", "env:MY_RING", "x", env=env).stdout.strip()
    assert run("verify", token, "--keys", "env:MY_RING", env=env).exit_code == 0
    # STATECODEC_KEYS is the default --keys.
    env["STATECODEC_KEYS"] = "env:MY_RING"
    assert run("verify", token, env=env).exit_code == 0
    assert run("verify", token, "--keys", "env:NOT_SET_ANYWHERE", env=env).exit_code == ExitCode.KEYS


def test_verify_never_consumes_without_consume(tmp_path: Path, keys: str) -> None:
    token = run("mint", "--keys", keys, "--principal", "alice", "{}").stdout.strip()
    store = f"sqlite:{tmp_path / 'replay.db'}"
    bind = ["--principal", "alice"]
    for _ in range(3):  # asked read-only: not yet redeemed, and still not after asking
        doc = run_json("verify", token, "--keys", keys, *bind, "--replay", store)
        assert doc["valid"] and doc["replay"] == "not_redeemed"
    first = run_json("verify", token, "--keys", keys, *bind, "--replay", store, "--consume")
    assert first["valid"] and first["replay"] == "consumed"
    second = run_json("verify", token, "--keys", keys, *bind, "--replay", store, "--consume")
    assert second["exit_code"] == ExitCode.REPLAYED and second["error"]["reason"] == "replayed"
    assert second["error"]["class"] == "replayed"
    asked = run_json("verify", token, "--keys", keys, *bind, "--replay", store)  # read-only, once redeemed
    assert asked["exit_code"] == ExitCode.REPLAYED and asked["error"]["reason"] == "replayed"


def test_verify_consume_in_another_namespace_is_independent(tmp_path: Path, keys: str) -> None:
    token = run("mint", "--keys", keys, "x").stdout.strip()
    store = f"sqlite:{tmp_path / 'replay.db'}"
    base = ["verify", token, "--keys", keys, "--unbound", "--replay", store, "--consume"]
    assert run(*base).exit_code == 0
    assert run(*base, "--namespace", "other-service").exit_code == 0
    assert run(*base).exit_code == ExitCode.REPLAYED


def test_verify_store_unavailable_leaves_the_token_unconsumed(tmp_path: Path, keys: str) -> None:
    token = run("mint", "--keys", keys, "x").stdout.strip()
    base = ["verify", token, "--keys", keys, "--unbound", "--consume"]
    # Nothing listens on port 1 of the loopback interface: connection refused.
    down = run_json(*base, "--replay", "redis://127.0.0.1:1/0?retries=0&connect_timeout=1")
    assert down["exit_code"] == ExitCode.STORE and down["error"]["reason"] == "store_unavailable"
    missing_dir = run_json(*base, "--replay", f"sqlite:{tmp_path / 'no' / 'such' / 'dir.db'}")
    assert missing_dir["exit_code"] == ExitCode.STORE
    bad_url = run(*base, "--replay", "carrier-pigeon://x")
    assert bad_url.exit_code == ExitCode.STORE and "Accepted forms" in bad_url.stderr
    # The failures consumed nothing: the token still redeems once.
    assert run(*base, "--replay", f"sqlite:{tmp_path / 'ok.db'}").exit_code == 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--consume"], "--consume needs --replay"),
        (["--replay", "memory:", "--consume"], "only after a full check"),
        (["--replay", "memory:", "--consume", "--unbound", "--at", "now"], "do not combine it with --at"),
        (["--unbound", "--principal", "a"], "do not combine"),
        (["--at", "noon"], "not a time"),
        (["--max-skew", "-5"], "not a duration"),
        (["--expiry-grace", "1.5"], "not a duration"),
        (["--leeway", "5"], "No such option"),
        (
            ["--max-skew", "99999999999999d"],
            "Invalid value for '--max-skew': '99999999999999d' is out of range",
        ),
        (
            ["--expiry-grace", "99999999999d"],
            "Invalid value for '--expiry-grace': '99999999999d' is out of range",
        ),
        (["--at", "99999999999"], "Invalid value for '--at': '99999999999' is out of range"),
        (["--format", "jwt"], "jwt"),
        (["--bind-value", "x"], "--bind-value (ts-v1 only)"),
    ],
)
def test_verify_usage_errors(keys: str, args: list[str], needle: str) -> None:
    result = run("verify", mint(keys), "--keys", keys, *args)
    assert result.exit_code == ExitCode.USAGE
    assert needle in result.stderr


# --------------------------------------------------------- keys & configuration
def test_no_keys_names_the_fix(keys: str) -> None:
    token = mint(keys)
    result = run("verify", token)
    assert result.exit_code == ExitCode.KEYS
    assert result.stderr.strip() == (
        "statecodec: error: no keys: pass --keys SPEC or set STATECODEC_KEYS (e.g. file:keys.json)"
    )
    assert run_json("mint", "x")["error"]["class"] == "keys"


@pytest.mark.parametrize(
    ("content", "needle"),
    [("not json", "not valid JSON"), ('{"keys": []}', "not a statecodec key ring"), (None, "keys.json")],
)
def test_bad_key_file_is_a_key_error(tmp_path: Path, content: str | None, needle: str) -> None:
    path = tmp_path / "keys.json"
    if content is not None:
        path.write_text(content)
        path.chmod(0o600)
    result = run("mint", "--keys", f"file:{path}", "x")
    assert result.exit_code == ExitCode.KEYS, result.output
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_ring_of_retired_keys_cannot_mint_or_verify(tmp_path: Path, ring: KeyRing) -> None:
    path = tmp_path / "retired.json"
    path.write_text(KeyRing([Key("old", ring.primary.secret, T0 - 90000, T0 - 3600)]).to_json())
    path.chmod(0o600)
    doc = run_json("mint", "--keys", f"file:{path}", "--at", str(T0), "x")
    assert doc["exit_code"] == ExitCode.KEYS and "all are retired" in doc["error"]["message"]


def test_a_key_file_readable_by_others_draws_a_warning(tmp_path: Path, ring: KeyRing) -> None:
    path = tmp_path / "open.json"
    path.write_text(ring.to_json())
    path.chmod(0o644)
    result = run("mint", "--keys", f"file:{path}", "x")
    assert result.exit_code == 0
    assert "statecodec: warning:" in result.stderr and "chmod 600" in result.stderr
    path.chmod(0o600)
    assert run("mint", "--keys", f"file:{path}", "x").stderr == ""


# ------------------------------------------------------------ other SDKs' formats
def test_verify_typescript_sdk_tokens(keys: str, ring: KeyRing) -> None:
    token = ts_v1.seal(ring.primary.secret, {"step": 1}, clock=lambda: T0, bind="user:alice")
    unbound = run_json("verify", token, "--keys", keys, "--at", str(T0))
    assert unbound["format"] == "ts-v1" and unbound["binding_checked"] is False
    assert unbound["claims"]["payload"]["value"] == {"step": 1}
    ok = run_json("verify", token, "--keys", keys, "--at", str(T0), "--bind-value", "user:alice")
    assert ok["valid"] and ok["binding"] == {"bind": "user:alice"}
    bad = run_json("verify", token, "--keys", keys, "--at", str(T0), "--bind-value", "user:bob")
    assert bad["error"]["reason"] == "binding_mismatch"
    assert run_json("verify", token, "--keys", keys, "--at", str(T0 + 601))["error"]["reason"] == "expired"
    usage = run("verify", token, "--keys", keys, "--principal", "alice")
    assert usage.exit_code == ExitCode.USAGE and "--bind-value" in usage.stderr


def test_verify_python_sdk_tokens(keys: str, ring: KeyRing) -> None:
    token = mcp_py_v1_seal(
        [ring.primary.secret],
        '{"n": 1}',
        clock=lambda: T0,
        audience="srv",
        method="tools/call",
        target="book",
        arguments={"a": 1},
        principal="alice",
    )
    bind = ["--method", "tools/call", "--target", "book", "--arguments", '{"a": 1}', "--principal", "alice"]
    doc = run_json("verify", token, "--keys", keys, "--at", str(T0), *bind)
    assert doc["valid"] and doc["format"] == "mcp-py-v1" and doc["mode"] == "encrypt"
    assert doc["claims"]["payload"]["value"] == {"n": 1} and doc["claims"]["extra"]["aud"] == "srv"
    assert "not checked: audience" in run("verify", token, "--keys", keys, "--at", str(T0), *bind).stdout
    wrong = run_json(
        "verify", token, "--keys", keys, "--at", str(T0), "--target", "other", "--format", "mcp-py-v1"
    )
    assert wrong["error"]["reason"] == "binding_mismatch"


def test_verify_says_what_of_the_binding_it_checked(keys: str, ring: KeyRing) -> None:
    """The binding row: what was compared; for another SDK's token, then what nobody gave."""

    def binding_row(*args: str) -> str:
        text = run("verify", *args, "--keys", keys, "--at", str(T0)).stdout
        return next(line.split(None, 1)[1] for line in text.splitlines() if line.startswith("  binding "))

    py = mcp_py_v1_seal([ring.primary.secret], "s", clock=lambda: T0, method="tools/call", target="t")
    assert binding_row(py, "--method", "tools/call") == (
        "checked (method); not checked: target, arguments, audience, principal"
    )
    sc1 = mint(keys, "{}", "--principal", "alice")
    assert binding_row(sc1, "--principal", "alice") == "checked (principal)"
    assert binding_row(sc1).startswith("NOT CHECKED - no binding options given; add --principal/--audience/")


def test_verify_rmcp_tokens(keys: str, ring: KeyRing) -> None:
    token = rs1_token(ring.primary.secret, b"hello", b"session-7", clock=lambda: T0)
    ok = run_json("verify", token, "--keys", keys, "--at", str(T0), "--associated-data", "session-7")
    assert ok["valid"] and ok["claims"]["payload"]["value"] == "hello"
    missing = run("verify", token, "--keys", keys, "--at", str(T0))
    assert missing.exit_code == ExitCode.INVALID and "give it" in missing.stdout


def test_consume_is_refused_for_formats_without_token_id(keys: str, ring: KeyRing) -> None:
    token = rs1_token(ring.primary.secret, b"x", clock=lambda: T0)
    result = run("verify", token, "--keys", keys, "--replay", "memory:", "--consume")
    assert result.exit_code == ExitCode.USAGE and "--replay" in result.stderr


# ------------------------------------------------------------ output contract
def test_internal_errors_are_one_line_and_exit_70(monkeypatch: pytest.MonkeyPatch, keys: str) -> None:
    # A bug cannot be produced for real on purpose: simulate one inside the codec.
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("simulated bug")

    monkeypatch.setattr(StateCodec, "verify_unbound", broken)
    token = mint(keys)
    result = run("verify", token, "--keys", keys)
    assert result.exit_code == ExitCode.INTERNAL
    assert result.stderr.startswith("statecodec: error: internal error (ZeroDivisionError: simulated bug)")
    assert len(result.stderr.strip().splitlines()) == 1
    assert run_json("verify", token, "--keys", keys)["error"]["class"] == "internal"
    # STATECODEC_DEBUG=1 lets the traceback through for the developer.
    debug = CliRunner().invoke(main, ["verify", token, "--keys", keys], env={"STATECODEC_DEBUG": "1"})
    assert isinstance(debug.exception, ZeroDivisionError)


def test_an_error_quoting_several_lines_is_one_line_everywhere(
    monkeypatch: pytest.MonkeyPatch, keys: str
) -> None:
    """A dependency's message may span lines (Vault's error lists): the terminal and --json get one."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ZeroDivisionError("1 error occurred:\n\t* simulated bug\n\n")

    monkeypatch.setattr(StateCodec, "verify_unbound", broken)
    token = mint(keys)
    text = run("verify", token, "--keys", keys).stderr
    assert text.count("\n") == 1 and "(ZeroDivisionError: 1 error occurred: * simulated bug" in text
    message = run_json("verify", token, "--keys", keys)["error"]["message"]
    assert message == text.removeprefix("statecodec: error: ").rstrip("\n")


def test_no_colour_when_not_a_terminal(keys: str) -> None:
    token = mint(keys)
    out = CliRunner().invoke(main, ["verify", token, "--keys", keys], color=True).output
    assert "\x1b[" not in out


def test_help_lists_every_exit_code() -> None:
    out = run("--help").stdout
    for code, text in EXIT_CODES.items():
        assert f"{int(code):<3} {text}" in out


def test_schema_rejects_what_the_cli_must_not_print() -> None:
    # The schema is strict, so validating outputs against it is a real check.
    good = {
        "schema_version": 1,
        "command": "mint",
        "ok": False,
        "exit_code": 3,
        "error": {"class": "keys", "reason": None, "message": "no keys"},
    }
    VALIDATOR.validate(good)
    for bad in (
        {**good, "surprise": 1},
        {**good, "ok": True},
        {**good, "exit_code": 2},
        {**good, "error": {**good["error"], "message": "two\nlines"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            VALIDATOR.validate(bad)


def test_verify_principal_is_the_compact_json_the_adapters_bind(ring: KeyRing, keys: str) -> None:
    # A token sealed by protect() for an OAuth access token is bound to the compact JSON
    # [client_id, issuer, subject]; --help says so, and only that exact text verifies.
    from statecodec.boundary import binding_for, principal_string  # noqa: PLC0415

    bound = principal_string("deploy-cli", "https://idp.example", "alice")
    assert bound == '["deploy-cli","https://idp.example","alice"]'
    binding = binding_for("tools/call", {"name": "book"}, principal=bound, audience="svc")
    token = StateCodec(ring, clock=lambda: T0).seal(b"{}", binding)
    base = ("verify", token, "--keys", keys, "--at", str(T0), "--audience", "svc", "--arguments", "{}")
    assert run(*base, "--method", "tools/call", "--target", "book", "--principal", bound).exit_code == 0
    spaced = '["deploy-cli", "https://idp.example", "alice"]'  # json.dumps' default separators
    doc = run_json(*base, "--method", "tools/call", "--target", "book", "--principal", spaced)
    assert doc["error"]["reason"] == "binding_mismatch"
    help_text = " ".join(run("verify", "--help").stdout.split())
    example = principal_string("app", "https://idp.example", "alice")
    assert f"compact JSON [client_id, issuer, subject], no spaces: '{example}'" in help_text
    assert example in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("missing", "hinted"),
    [
        ("mcp", True),
        ("httpx2._client", True),
        ("starlette", True),
        ("ssl", False),
        ("statecodec.probe", False),
    ],
)
def test_only_a_module_the_extra_brings_is_told_to_install_it(missing: str, hinted: bool) -> None:
    # Whatever the mcp extra's code imports, scripts/deps holds to the extra's packages: a
    # missing module that is not statecodec's own or the standard library's is one of them.
    exc = ModuleNotFoundError(f"No module named {missing!r}", name=missing)
    if hinted:
        with pytest.raises(CliError, match=r"pip install 'statecodec\[mcp\]'") as info:
            explain_missing_extra(exc, "probe")
        assert info.value.code is ExitCode.KEYS and missing in info.value.message
    else:
        assert explain_missing_extra(exc, "probe") is None  # the command lets it through: a bug


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--arguments", "null"], "--arguments (sc1, mcp-py-v1, ruby-v1 only); they take --bind-value"),
        (["--associated-data", "x"], "--associated-data (rs1, rs2 only); they take --bind-value"),
        (["--extra", "k=v"], "not applicable to ts-v1 tokens: --extra"),
    ],
)
def test_options_a_foreign_format_does_not_bind_are_usage_errors_before_the_keys(
    ring: KeyRing, args: list[str], needle: str
) -> None:
    token = ts_v1.seal(ring.primary.secret, {"step": 1}, clock=lambda: T0, bind="user:alice")
    result = run("verify", token, "--keys", "file:/nonexistent/keys.json", *args)  # never read
    assert result.exit_code == ExitCode.USAGE and needle in result.stderr
