"""Vault/OpenBao answers that are HTTP 200 but malformed: key-source errors, bounded.

A real OpenBao never sends these documents (``lookup-self`` as ``{}``, an exported key
that is a number, ``latest_version`` of 10**12), so they cannot be made real: a tiny HTTP
server on 127.0.0.1, started and stopped by each test, answers them - a mock of what
cannot be made real. The answers around the bad field are the shapes OpenBao 2 sends
(``tests/kms/test_kms_vault.py`` runs the same code against the real server). Each bad answer
must end ``statecodec keys list`` / ``verify`` with exit 3 (a key-source answer that is
not usable) and a message naming the field - never exit 70 "a bug in statecodec", and
never a list of 10**12 versions in memory.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from fixtures_openbao import clean_vault_env
from loopback import Loopback, Quiet

from statecodec.cli import main
from statecodec.cli._exit import ExitCode

SECRET = base64.b64encode(bytes(range(32))).decode()
GOOD_META: dict[str, Any] = {
    "name": "svc",
    "type": "chacha20-poly1305",
    "exportable": True,
    "latest_version": 1,
    "min_decryption_version": 1,
    "keys": {"1": 1_750_000_000},
}
GOOD_EXPORT: dict[str, Any] = {"name": "svc", "type": "chacha20-poly1305", "keys": {"1": SECRET}}
GOOD_LOOKUP: dict[str, Any] = {"data": {"ttl": 0, "renewable": False, "policies": ["root"]}}


class Answers:
    """What the tiny server answers, per path; each is a full JSON body."""

    def __init__(self) -> None:
        self.lookup: Any = GOOD_LOOKUP
        self.meta: Any = {"data": GOOD_META}
        self.export: Any = {"data": GOOD_EXPORT}


@pytest.fixture
def fake_bao(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[tuple[str, Answers]]:
    answers = Answers()

    class Handler(Quiet):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            body = {
                "/v1/auth/token/lookup-self": answers.lookup,
                "/v1/transit/keys/svc": answers.meta,
                "/v1/transit/export/encryption-key/svc": answers.export,
            }.get(path)
            self.reply_json(200 if body is not None else 404, body if body is not None else {"errors": []})

    with Loopback(Handler) as server:
        clean_vault_env(monkeypatch, tmp_path)
        yield server.base, answers


def run(addr: str, *args: str) -> dict[str, Any]:
    env = {"VAULT_ADDR": addr, "VAULT_TOKEN": "s.test", "VAULT_RETRIES": "0"}
    result = CliRunner().invoke(main, [*args, "--keys", "vault-transit:transit/svc", "--json"], env=env)
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    doc: dict[str, Any] = json.loads(result.stdout)
    assert doc["exit_code"] == result.exit_code
    return doc


def test_the_good_answers_load(fake_bao: tuple[str, Answers]) -> None:
    # The baseline: the same server with well-formed answers serves a ring.
    addr, _ = fake_bao
    doc = run(addr, "keys", "list")
    assert doc["exit_code"] == 0, doc


META_CASES = {
    "latest_version missing": {k: v for k, v in GOOD_META.items() if k != "latest_version"},
    "latest_version a string": {**GOOD_META, "latest_version": "latest"},
    "latest_version 10**12": {**GOOD_META, "latest_version": 10**12},
    "latest_version a float": {**GOOD_META, "latest_version": 1.5},
    "latest_version true": {**GOOD_META, "latest_version": True},
    "a non-integer version": {**GOOD_META, "keys": {"one": 1_750_000_000}},
    "too many live versions": {**GOOD_META, "latest_version": 20_001, "min_decryption_version": 1},
    "metadata not an object": ["a", "list"],
}
WHY = {
    "latest_version missing": "has no latest_version",
    "latest_version a string": "latest_version 'latest' is not a version number",
    "latest_version 10**12": "latest_version 1000000000000 is not a version number",
    "latest_version a float": "latest_version 1.5 is not a version number",
    "latest_version true": "latest_version True is not a version number",
    "a non-integer version": "a version 'one' is not a version number",
    "too many live versions": "loads at most 10000",
    "metadata not an object": "metadata is list, not an object",
}


@pytest.mark.parametrize("case", META_CASES)
@pytest.mark.parametrize("command", [["keys", "list"], ["verify", "sc1s.AAAA"]], ids=["keys-list", "verify"])
def test_malformed_metadata_is_a_key_source_error(
    fake_bao: tuple[str, Answers], case: str, command: list[str]
) -> None:
    addr, answers = fake_bao
    answers.meta = {"data": META_CASES[case]}
    doc = run(addr, *command)
    assert doc["exit_code"] == ExitCode.KEYS, doc
    assert "malformed document" in doc["error"]["message"] and WHY[case] in doc["error"]["message"], doc


@pytest.mark.parametrize(
    ("exported", "why"),
    [
        ({"1": 5}, "version 1 was exported as 5, not base64 text"),
        ({"1": None}, "version 1 was exported as None, not base64 text"),
        ({"1.0": SECRET}, "an exported version '1.0' is not a version number"),
        ({"-1": SECRET}, "an exported version '-1' is not a version number"),
        (7, "the export's keys are int, not an object"),
        (None, "the export's keys are NoneType, not an object"),
    ],
    ids=["number", "null", "float-version", "negative-version", "keys-a-number", "keys-missing"],
)
def test_a_malformed_export_is_a_key_source_error(
    fake_bao: tuple[str, Answers], exported: Any, why: str
) -> None:
    addr, answers = fake_bao
    answers.export = {"data": {**GOOD_EXPORT, "keys": exported}}
    doc = run(addr, "verify", "sc1s.AAAA")
    assert doc["exit_code"] == ExitCode.KEYS, doc
    assert why in doc["error"]["message"], doc


@pytest.mark.parametrize(
    ("lookup", "why"),
    [
        ({}, "lookup-self answered without a data object"),
        ({"data": None}, "lookup-self answered without a data object"),
        ({"data": {"ttl": "1h"}}, "gave the token's ttl as '1h', not seconds"),
        ({"data": {"ttl": 10**12}}, "gave the token's ttl as 1000000000000, not seconds"),
    ],
    ids=["empty", "data-null", "ttl-a-string", "ttl-huge"],
)
def test_a_malformed_lookup_self_is_a_key_source_error(
    fake_bao: tuple[str, Answers], lookup: Any, why: str
) -> None:
    addr, answers = fake_bao
    answers.lookup = lookup
    doc = run(addr, "keys", "list")
    assert doc["exit_code"] == ExitCode.KEYS, doc
    assert why in doc["error"]["message"], doc


def test_an_answer_without_data_is_a_key_source_error(fake_bao: tuple[str, Answers]) -> None:
    addr, answers = fake_bao
    answers.meta = {"no": "data"}
    doc = run(addr, "keys", "list")
    assert doc["exit_code"] == ExitCode.KEYS and "metadata is NoneType" in doc["error"]["message"], doc
