"""``statecodec probe``: its options, the states it makes, and servers that misbehave.

The states the probe sends are made by pure functions, tested here on real tokens
(statecodec's own, minted with a real key ring) and on the plaintext shapes servers use.
The command itself runs through click's CliRunner against :class:`Misbehaving`, a real HTTP
server on loopback that speaks just enough MCP 2026-07-28 to start a flow and then does
what a broken or hostile server does: hang, flood, answer garbage, close the connection,
put terminal escapes in its errors, speak only the 2025 handshake, or not MCP at all. The
probe must end every time, within its deadlines, with verdicts or a one-line error and
never a traceback. The five real servers are in tests/probe/test_probe_servers.py.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jsonschema
import mcp_types as types
import pytest
from click.testing import CliRunner, Result
from processes import ROOT

from statecodec import KeyRing, Mode, StateCodec
from statecodec.cli import main
from statecodec.probe import CHECKS, with_side_effects
from statecodec.probe._mutate import (
    analyse,
    changed_arguments,
    default_response,
    forge_edited,
    forge_invented,
    json_object,
    non_ascii,
    one_char_changed,
    oversize,
    payload_swapped,
    truncated,
)
from tools.probe_table import render

VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "docs" / "cli-schema.json").read_text()))
PLAN = {"version": "1.2.3", "plan_id": "ab12cd34", "steps": ["canary", "roll"], "retries": 3}


def b64(data: bytes, *, url: bool = True, pad: bool = False) -> str:
    text = (base64.urlsafe_b64encode(data) if url else base64.b64encode(data)).decode()
    return text if pad else text.rstrip("=")


# ------------------------------------------------------------------ reading a state
def test_plaintext_json_is_readable_and_its_values_are_not_reported() -> None:
    r = analyse(json.dumps(PLAN))
    assert r.readable and r.name == "plaintext JSON" and r.format is None
    assert r.fields == ("version: string", "plan_id: string", "steps: array of 2", "retries: number")
    assert "1.2.3" not in json.dumps(r.facts()) and "ab12cd34" not in json.dumps(r.facts())


@pytest.mark.parametrize(("url", "pad"), [(True, False), (False, True), (True, True)])
def test_base64_of_json_is_readable_in_either_alphabet(url: bool, pad: bool) -> None:
    state = b64(json.dumps(PLAN).encode(), url=url, pad=pad)
    r = analyse(state)
    assert r.readable and r.name.endswith(" of JSON") and r.place is not None
    assert r.place.rebuild(state, r.place.value) == state  # re-encoded exactly as it came


def test_a_part_of_an_unknown_signed_format_is_readable() -> None:
    state = "x1." + b64(json.dumps(PLAN).encode()) + "." + b64(bytes(32))  # home-made body.mac
    r = analyse(state)
    assert r.readable and r.name == "unknown format, part 2 of 3 is base64url of JSON"


def test_statecodec_sign_is_readable_and_encrypt_is_not() -> None:
    ring = KeyRing.generate("k1")
    signed = StateCodec(ring, mode=Mode.SIGN).seal(json.dumps(PLAN).encode())
    sealed = StateCodec(ring, mode=Mode.ENCRYPT).seal(json.dumps(PLAN).encode())
    s, e = analyse(signed), analyse(sealed)
    assert s.readable and s.format == "sc1" and s.mode == "sign" and "version: string" in s.fields
    assert not e.readable and e.format == "sc1" and e.mode == "encrypt" and e.fields == ()
    assert e.expires_at is not None  # the header shows it even in ENCRYPT mode


@pytest.mark.parametrize(
    "state", ["f3a9c0e1-1d2b-4c5d-8e9f-001122334455", b64(bytes(range(40))), "", "é" * 9]
)
def test_opaque_states_are_not_readable(state: str) -> None:
    r = analyse(state)
    assert not r.readable and r.place is None and r.name.startswith("opaque")


# ------------------------------------------------------------------ forged and tampered states
def test_an_edit_is_encoded_as_the_server_encoded_the_state() -> None:
    for state in (
        json.dumps(PLAN),
        json.dumps(PLAN, separators=(",", ":")),
        b64(json.dumps(PLAN).encode(), url=False, pad=True),
    ):
        made = forge_edited(state, analyse(state))
        assert made is not None
        forged, sent = made
        assert sent.startswith("field version changed")
        again = analyse(forged)
        assert again.name.endswith("JSON") and again.place is not None
        assert again.place.value == {**PLAN, "version": "1.2.3-forged"}
        assert (", " in forged) == (", " in state)


def test_an_edit_of_a_signed_token_keeps_its_mac_and_changes_its_payload() -> None:
    ring = KeyRing.generate("k1")
    codec = StateCodec(ring, mode=Mode.SIGN)
    token = codec.seal(json.dumps(PLAN).encode())
    made = forge_edited(token, analyse(token))
    assert made is not None
    forged = made[0]
    mac = base64.urlsafe_b64decode(token[5:] + "==")[-32:]
    assert forged.startswith("sc1s.") and base64.urlsafe_b64decode(forged[5:] + "==")[-32:] == mac
    assert json.loads(analyse(forged).info.payload or b"") == {**PLAN, "version": "1.2.3-forged"}  # type: ignore[union-attr]
    with pytest.raises(Exception, match=r"tampered|malformed"):
        codec.unseal(forged)


def test_nothing_to_edit_in_an_encrypted_or_opaque_state() -> None:
    sealed = StateCodec(KeyRing.generate(), mode=Mode.ENCRYPT).seal(b"{}")
    assert forge_edited(sealed, analyse(sealed)) is None
    assert forge_edited("opaque-handle-42", analyse("opaque-handle-42")) is None


def test_an_invented_statecodec_token_is_well_formed_under_the_same_kid_and_rejected() -> None:
    codec = StateCodec(KeyRing.generate("kreal"), mode=Mode.ENCRYPT)
    token = codec.seal(b"{}")
    invented, sent = forge_invented(token, analyse(token))
    info = analyse(invented)
    assert (
        info.format == "sc1"
        and info.info is not None
        and info.info.kid == "kreal"
        and info.info.problem is None
    )
    assert "made-up key" in sent
    with pytest.raises(Exception, match="tampered"):
        codec.unseal(invented)


def test_invented_states_keep_the_shape_of_the_real_one() -> None:
    plain = json.dumps(PLAN)
    invented, _ = forge_invented(plain, analyse(plain))
    assert json.loads(invented) == {**PLAN, "version": "statecodec-probe", "plan_id": "statecodec-probe",
                                    "steps": ["statecodec-probe", "statecodec-probe"]}  # fmt: skip
    signed = "v9." + b64(json.dumps(PLAN).encode()) + "." + b64(bytes(32))
    invented, sent = forge_invented(signed, analyse(signed))
    parts = invented.split(".")
    assert (
        parts[0] == "v9" and parts[2] != signed.split(".")[2] and len(parts[2]) == 43 and "signature" in sent
    )
    opaque = "v1." + b64(bytes(64))
    invented, _ = forge_invented(opaque, analyse(opaque))
    assert invented.startswith("v1.") and len(invented) == len(opaque) and invented != opaque


def test_tampered_states_differ_where_it_counts() -> None:
    token = StateCodec(KeyRing.generate(), mode=Mode.SIGN).seal(b'{"a": 1}')
    changed, sent = one_char_changed(token)
    assert len(changed) == len(token) and sum(a != b for a, b in zip(changed, token, strict=True)) == 1
    assert changed.startswith("sc1s.") and "changed" in sent
    cut, _ = truncated(token)
    assert token.startswith(cut) and len(cut) == len(token) - 8
    assert one_char_changed("")[0] == "A" and truncated("ab")[0] == "a"


def test_payload_swap_needs_a_signed_format_with_a_payload_part() -> None:
    ring = KeyRing.generate()
    sign = StateCodec(ring, mode=Mode.SIGN)
    a, b = sign.seal(b'{"n": 1}'), sign.seal(b'{"n": 2}')
    made = payload_swapped(a, b, analyse(a))
    assert made is not None and made[0] != a and made[0] != b and len(made[0]) == len(b)
    with pytest.raises(Exception, match="tampered"):
        sign.unseal(made[0])
    # An unknown format is never taken for a signed one, however it looks.
    seg_a = "v9." + b64(b'{"p": 1}') + "." + b64(bytes(32))
    seg_b = "v9." + b64(b'{"p": 2}') + "." + b64(bytes([1]) * 32)
    assert payload_swapped(seg_a, seg_b, analyse(seg_a)) is None
    encrypt = StateCodec(ring, mode=Mode.ENCRYPT)
    c, d = encrypt.seal(b"1"), encrypt.seal(b"2")
    assert payload_swapped(c, d, analyse(c)) is None
    plain = json.dumps(PLAN)
    assert payload_swapped(plain, plain, analyse(plain)) is None


def test_garbage_states() -> None:
    big, sent = oversize("abc")
    assert len(big) == 1024 * 1024 and big.startswith("abc") and "1 MiB" in sent
    odd, _ = non_ascii("abcdef")
    assert odd == "abc\u00e9ef"
    obj, _ = json_object("abc")
    assert obj == {"requestState": "abc"}


def test_changed_arguments_prefers_text_and_says_which() -> None:
    assert changed_arguments({"n": 1, "version": "1.2.3"}) == ({"n": 1, "version": "1.2.3-forged"}, "version")
    assert changed_arguments({"filter": {"limit": 5}}) == ({"filter": {"limit": 6}}, "filter.limit")
    assert changed_arguments({"dry_run": False}) == ({"dry_run": True}, "dry_run")
    assert changed_arguments({}) is None and changed_arguments({"x": None}) is None


def test_default_answers_follow_each_schema() -> None:
    def form(properties: dict[str, Any]) -> dict[str, Any]:
        return {
            "method": "elicitation/create",
            "params": {"message": "?", "requestedSchema": {"type": "object", "properties": properties}},
        }

    answer = default_response(form({
        "confirm": {"type": "boolean"},
        "ticket": {"type": "string", "maxLength": 6},
        "email": {"type": "string", "format": "email"},
        "region": {"type": "string", "enum": ["eu", "us"]},
        "count": {"type": "integer", "minimum": 3},
        "tier": {"type": "string", "oneOf": [{"const": "gold", "title": "Gold"}]},
        "note": {"type": "string", "default": "kept"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
    }))  # fmt: skip
    assert answer == {
        "action": "accept",
        "content": {"confirm": True, "ticket": "statec", "email": "probe@example.com", "region": "eu",
                    "count": 3, "tier": "gold", "note": "kept", "tags": ["a"]},
    }  # fmt: skip
    assert default_response(
        {"method": "elicitation/create", "params": {"mode": "url", "url": "https://x"}}
    ) == {"action": "accept"}
    assert default_response({"method": "roots/list"}) == {"roots": []}
    assert default_response({"method": "sampling/createMessage"})["role"] == "assistant"
    for hostile in (None, [], "x", {"params": 5}, {"params": {"requestedSchema": {"properties": [1]}}}):
        assert default_response(hostile) == {"action": "accept", "content": {}}


def test_the_table_renders_any_set_of_runs() -> None:
    doc = {
        "checks": [
            {"check": "replay", "verdict": "FAIL", "attempts": [{"attempt": "replayed", "verdict": "FAIL"}]}
        ]
    }
    table = render([("A", doc), ("B", {"checks": []})])
    assert "| `replay`: the same state again after a completed round | **FAIL** | - |" in table
    assert "| `replay` | replayed FAIL | - |" in table


# ------------------------------------------------------------------ the command line
def run(*args: str) -> Result:
    result = CliRunner().invoke(main, ["probe", *args], env={"NO_COLOR": "1", "STATECODEC_DEBUG": None})
    assert "Traceback" not in result.output, result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"uncaught {result.exception!r}: {result.output}")
    return result


def run_json(*args: str) -> dict[str, Any]:
    result = run(*args, "--json")
    doc = json.loads(result.stdout)
    VALIDATOR.validate(doc)
    assert doc["exit_code"] == result.exit_code
    return doc


U = "http://127.0.0.1:1/mcp"
READ = [U, "--tool", "t", "--only", "readable"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([U, "--tool", "t"], "--i-understand-side-effects"),
        ([U, "--tool", "t", "--only", "readable,replay"], "--i-understand-side-effects"),
        (["ftp://x/mcp", "--tool", "t", "--only", "readable"], "is not an http(s) URL"),
        ([U, "--tool", "t", "--only", "readable,bogus"], "unknown check bogus"),
        ([*READ, "--arguments", "[1]"], "must be a JSON object"),
        ([*READ, "--arguments", "{"], "not valid JSON"),
        ([*READ, "--answers", '{"a": true}'], "full response object"),
        ([*READ, "--header", "nocolon"], "is not 'Name: value'"),
        ([*READ, "--timeout", "0"], "must be positive"),
        ([U, "--only", "readable"], "Missing option '--tool'"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_the_help_warns_about_side_effects_and_lists_the_checks() -> None:
    result = run("--help")
    assert result.exit_code == 0
    assert "STAGING" in result.output and "--i-understand-side-effects" in result.output
    assert all(name in result.output for name in CHECKS)


def test_importing_the_cli_does_not_import_the_mcp_sdk() -> None:
    code = (
        "import sys, statecodec.cli;"
        "print(sorted(m for m in ('mcp', 'httpx2', 'statecodec.probe._engine') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_a_missing_mcp_extra_is_named() -> None:
    code = (
        "import sys; sys.modules.update(mcp=None, mcp_types=None);"
        f"from statecodec.cli import main; main(['probe', {U!r}, '--tool', 't', '--only', 'readable'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert (
        out.returncode == 3
        and "pip install 'statecodec[mcp]'" in out.stderr
        and "Traceback" not in out.stderr
    )


def test_the_side_effects_refusal_comes_before_the_mcp_import() -> None:
    # Without the extra, a run that needs consent is refused for want of consent (exit 2),
    # not for want of mcp: which checks have side effects is the model's, loaded without it.
    code = (
        "import sys; sys.modules.update(mcp=None, mcp_types=None);"
        f"from statecodec.cli import main; main(['probe', {U!r}, '--tool', 't'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "--i-understand-side-effects" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_the_model_loads_without_mcp_and_the_engine_names_it() -> None:
    code = (
        "import sys; sys.modules.update(mcp=None, mcp_types=None)\n"
        "import statecodec.probe as p\n"
        "assert p.with_side_effects(p.CHECKS) == p.CHECKS[1:], p.with_side_effects(p.CHECKS)\n"
        "try:\n"
        "    p.Settings\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() in ("mcp", "mcp_types"), out.stdout


def test_only_the_readable_check_is_free_of_side_effects() -> None:
    assert with_side_effects(("readable",)) == ()
    assert with_side_effects(CHECKS) == tuple(c for c in CHECKS if c != "readable")
    assert with_side_effects(("readable", "replay", "expiry")) == ("replay", "expiry")


# ------------------------------------------------------------------ servers that misbehave
class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """The probe hangs up on purpose (deadlines, cut-off bodies): no traceback on stderr,
        where the CLI runner would read it as the probe's own."""


class Misbehaving:
    """Real HTTP on loopback: enough MCP 2026-07-28 to start a flow, then ``mode``.

    The handshake modes break the start: ``html`` (not MCP), ``legacy`` (2025 handshake
    only), ``hang`` (never answers). The tool modes break the tool: ``at-once`` (no input
    asked), ``no-state`` (asks without a requestState). The others complete a flow whose
    state comes back unchanged, and misbehave on any other state: ``hang-calls``,
    ``flood`` (a 5 MiB body), ``garbage`` (not JSON), ``close`` (the connection drops),
    ``bad-result`` (an invalid result), ``escapes`` (terminal escapes in its error).

    It also lists a tool ``other`` that refuses every call, answers 401 to the bearer token
    ``bad``, and records the params of every ``tools/call`` in :attr:`calls`.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.stop = threading.Event()
        self.issued: set[str] = set()
        self.calls: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
                if self.headers.get("authorization") == "Bearer bad":
                    self.send_response(401)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                outer.answer(self, body)

            def do_GET(self) -> None:
                self.send_response(405)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_DELETE(self) -> None:
                self.do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mcp"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def send(handler: BaseHTTPRequestHandler, payload: bytes, content_type: str = "application/json") -> None:
        handler.send_response(200)
        handler.send_header("content-type", content_type)
        handler.send_header("content-length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def reply(self, handler: BaseHTTPRequestHandler, rid: Any, result: Any) -> None:
        self.send(handler, json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())

    def error(self, handler: BaseHTTPRequestHandler, rid: Any, code: int, message: str) -> None:
        self.send(
            handler,
            json.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}).encode(),
        )

    def answer(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        method, rid, params = body.get("method"), body.get("id"), body.get("params") or {}
        if self.mode == "html":
            self.send(h, b"<html><body>It works!</body></html>", "text/html")
        elif self.mode == "hang":
            self.stop.wait(30)
        elif method == "server/discover":
            if self.mode == "legacy":
                self.error(h, rid, -32601, "Method not found")
            else:
                self.reply(h, rid, dump(types.DiscoverResult(
                    supported_versions=["2026-07-28"], capabilities=TOOLS, result_type="complete", ttl_ms=0,
                    cache_scope="public",
                )))  # fmt: skip
        elif method == "initialize":
            self.reply(h, rid, dump(types.InitializeResult(
                protocol_version="2025-11-25", capabilities=TOOLS,
                server_info=types.Implementation(name="old", version="1"),
            )))  # fmt: skip
        elif method == "tools/list":
            self.reply(
                h,
                rid,
                dump(
                    types.ListToolsResult(
                        tools=[
                            types.Tool(name="deploy", input_schema={"type": "object"}),
                            types.Tool(name="other", input_schema={"type": "object"}),
                        ]
                    )
                ),
            )
        elif method == "tools/call":
            self.call(h, rid, params)
        else:
            self.error(h, rid, -32601, "Method not found")

    def call(self, h: BaseHTTPRequestHandler, rid: Any, params: dict[str, Any]) -> None:
        self.calls.append(params)
        state = params.get("requestState")
        if params.get("name") == "other":
            self.error(h, rid, -32602, "other needs other arguments")
        elif self.mode == "at-once":
            self.reply(
                h, rid, dump(types.CallToolResult(content=[types.TextContent(type="text", text="done")]))
            )
        elif state is None:
            issued = None if self.mode == "no-state" else f"flow-{len(self.issued)}-{'x' * 20}"
            if issued:
                self.issued.add(issued)
            ask = types.ElicitRequest(params=types.ElicitRequestFormParams(
                message="ok?", requested_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
            ))  # fmt: skip
            self.reply(
                h, rid, dump(types.InputRequiredResult(input_requests={"confirm": ask}, request_state=issued))
            )
        elif isinstance(state, str) and state in self.issued:
            self.reply(
                h, rid, dump(types.CallToolResult(content=[types.TextContent(type="text", text="deployed")]))
            )
        elif self.mode == "hang-calls":
            self.stop.wait(30)
        elif self.mode == "flood":
            h.send_response(200)
            h.send_header("content-type", "application/json")
            h.end_headers()
            try:
                h.wfile.write(b'{"jsonrpc": "2.0", "id": 1, "result": {"x": "')
                for _ in range(5 * 1024):
                    h.wfile.write(b"A" * 1024)
            except OSError:
                pass  # the probe hung up: that is the point
            h.close_connection = True
        elif self.mode == "garbage":
            self.send(h, b"{not json at all")
        elif self.mode == "close":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
        elif self.mode == "bad-result":
            self.reply(h, rid, {"resultType": "input_required", "requestState": 12})
        elif self.mode == "escapes":
            self.error(h, rid, -32602, "bad state \x1b[2J\x1b]0;pwned\x07 \x9b31m")


TOOLS = types.ServerCapabilities(tools=types.ToolsCapability())


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


@pytest.fixture
def misbehaving(request: pytest.FixtureRequest) -> Iterator[Misbehaving]:
    server = Misbehaving(request.param)
    try:
        yield server
    finally:
        server.close()


def timeout_for(server: Misbehaving) -> str:
    """Short where the server hangs (that deadline is under test), generous on a loaded machine otherwise."""
    return "2s" if server.mode.startswith("hang") else "30s"


def probe(server: Misbehaving, *extra: str) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    doc = run_json(
        server.url,
        "--tool",
        "deploy",
        "--timeout",
        timeout_for(server),
        "--i-understand-side-effects",
        *extra,
    )
    return doc, time.monotonic() - started


@pytest.mark.parametrize(
    ("misbehaving", "message"),
    [
        ("html", "is not an MCP server (HTTP 200, text/html"),
        ("legacy", "speaks MCP 2025-11-25, not 2026-07-28"),
        ("hang", "did not complete the MCP handshake within 2s"),
        ("at-once", "completed at once"),
        ("no-state", "without a requestState string: the server keeps the flow's state itself"),
    ],
    indirect=["misbehaving"],
)
def test_a_server_the_probe_cannot_use_is_a_one_line_error(misbehaving: Misbehaving, message: str) -> None:
    doc, elapsed = probe(misbehaving)
    assert doc["exit_code"] == 8 and doc["error"]["class"] == "server", doc
    assert message in doc["error"]["message"]
    assert "checks" not in doc and elapsed < 20
    human = run(
        misbehaving.url, "--tool", "deploy", "--timeout", timeout_for(misbehaving), "--only", "readable"
    )
    assert human.exit_code == 8 and human.stdout == "" and message in human.stderr


def test_an_unreachable_server_and_an_unknown_tool(refused_port: int) -> None:
    doc = run_json(f"http://127.0.0.1:{refused_port}/mcp", "--tool", "t", "--only", "readable")
    assert doc["exit_code"] == 8 and doc["error"]["message"].startswith("cannot reach")
    server = Misbehaving("garbage")
    try:
        doc = run_json(server.url, "--tool", "nope", "--only", "readable")
    finally:
        server.close()
    assert (
        doc["exit_code"] == 8 and "lists no tool 'nope' (it lists: deploy, other)" in doc["error"]["message"]
    )


@pytest.mark.parametrize(
    ("misbehaving", "outcome", "detail"),
    [
        ("hang-calls", "no_answer", "no answer within 2s"),
        ("flood", "no_answer", "cut off after 4,194,304 bytes"),
        ("garbage", "no_answer", "no JSON-RPC answer"),
        ("close", "no_answer", ""),
        ("bad-result", "malformed", "not a valid MCP result"),
    ],
    indirect=["misbehaving"],
)
def test_a_hostile_server_gets_verdicts_not_a_crash(
    misbehaving: Misbehaving, outcome: str, detail: str
) -> None:
    doc, elapsed = probe(misbehaving, "--only", "readable,tamper,replay,garbage")
    assert doc["exit_code"] == 1 and doc["error"]["message"].startswith("3 of 4 checks failed")
    assert elapsed < 60
    checks = {c["check"]: c for c in doc["checks"]}
    assert checks["readable"]["verdict"] == "PASS"  # "flow-0-xxx...": an opaque handle
    assert checks["replay"]["attempts"][0]["evidence"]["outcome"] == "completed"  # the exact state: accepted
    tampered = checks["tamper"]["attempts"][0]
    assert tampered["verdict"] == "FAIL" and tampered["evidence"]["outcome"] == outcome, tampered
    assert detail in tampered["evidence"]["detail"]
    assert {a["evidence"]["outcome"] for a in checks["garbage"]["attempts"]} == {outcome}


@pytest.mark.parametrize("misbehaving", ["garbage", "flood", "html"], indirect=True)
def test_hostile_answers_print_no_sdk_traceback(misbehaving: Misbehaving) -> None:
    # The real command in its own process, as a user runs it: the mcp SDK logs an ERROR
    # with a traceback for each answer it cannot parse, which Python printed on stderr.
    # The verdicts stay those of test_a_hostile_server_gets_verdicts_not_a_crash.
    command = [
        sys.executable, "-m", "statecodec.cli", "probe", misbehaving.url, "--tool", "deploy",
        "--timeout", "30s", "--i-understand-side-effects", "--only", "readable,tamper,replay,garbage",
    ]  # fmt: skip
    for output in ("--json", None):
        proc = subprocess.run(
            [*command, *([output] if output else [])],
            capture_output=True, text=True, timeout=300, cwd=ROOT,
        )  # fmt: skip
        for sdk_noise in ("Traceback", "Error parsing JSON response", "Unexpected content type"):
            assert sdk_noise not in proc.stderr, proc.stderr
        if output == "--json":
            assert proc.stderr == ""
            doc = json.loads(proc.stdout)
            if misbehaving.mode == "html":
                assert doc["exit_code"] == 8 and "is not an MCP server" in doc["error"]["message"]
            else:
                assert doc["exit_code"] == 1 and doc["error"]["message"].startswith("3 of 4 checks failed")
                tamper = next(c for c in doc["checks"] if c["check"] == "tamper")
                assert tamper["attempts"][0]["evidence"]["outcome"] == "no_answer"
        else:
            assert proc.stderr.strip() == "" or proc.stderr.startswith("statecodec: error: "), proc.stderr


@pytest.mark.parametrize("misbehaving", ["escapes"], indirect=True)
def test_terminal_escapes_from_the_server_are_shown_not_obeyed(misbehaving: Misbehaving) -> None:
    result = run(misbehaving.url, "--tool", "deploy", "--i-understand-side-effects", "--only", "tamper")
    assert result.exit_code == 0, result.output  # an error is a rejection, whatever it says
    assert "\x1b" not in result.output and "\x9b" not in result.output and "\x07" not in result.output
    assert "\\x1b[2J" in result.output
    assert "rejected, though not with the uniform -32602" in result.output


@pytest.mark.parametrize("misbehaving", ["garbage"], indirect=True)
def test_only_readable_sends_nothing_but_round_one(misbehaving: Misbehaving) -> None:
    doc = run_json(misbehaving.url, "--tool", "deploy", "--only", "readable")
    assert doc["exit_code"] == 0 and [c["check"] for c in doc["checks"]] == ["readable"]
    assert doc["baseline"]["completed"] is False
    assert len(misbehaving.calls) == 1 and "requestState" not in misbehaving.calls[0]


@pytest.mark.parametrize("misbehaving", ["garbage"], indirect=True)
def test_answers_are_sent_as_given_and_defaults_fill_the_rest(misbehaving: Misbehaving) -> None:
    declined = {"action": "decline"}
    probe(misbehaving, "--only", "replay", "--answers", json.dumps({"confirm": declined}))
    probe(misbehaving, "--only", "replay")
    retries = [c["inputResponses"] for c in misbehaving.calls if "requestState" in c]
    # Baseline round 2, then the replay, for each run.
    assert (
        retries
        == [{"confirm": declined}] * 2 + [{"confirm": {"action": "accept", "content": {"ok": True}}}] * 2
    )


@pytest.mark.parametrize("misbehaving", ["garbage"], indirect=True)
def test_a_check_is_skipped_when_its_control_call_is_refused(misbehaving: Misbehaving) -> None:
    doc, _ = probe(
        misbehaving, "--only", "cross-tool,cross-user", "--other-tool", "other",
        "--other-header", "Authorization: Bearer bad",
    )  # fmt: skip
    checks = {c["check"]: c for c in doc["checks"]}
    assert doc["exit_code"] == 0 and {c["verdict"] for c in checks.values()} == {"SKIP"}
    control = checks["cross-tool"]["attempts"][0]
    assert control["attempt"] == "control" and control["evidence"]["outcome"] == "rejected"
    assert "other with these arguments was refused without any state" in control["note"]
    assert "the second user could not connect" in checks["cross-user"]["attempts"][0]["note"]
    assert not any(c.get("name") == "other" and "requestState" in c for c in misbehaving.calls)
    doc, _ = probe(misbehaving, "--only", "cross-tool")
    assert "this server also lists: other" in doc["checks"][0]["attempts"][0]["note"]
    doc, _ = probe(misbehaving, "--only", "cross-tool", "--other-tool", "nope")
    assert "lists no tool 'nope'" in doc["checks"][0]["attempts"][0]["note"]
