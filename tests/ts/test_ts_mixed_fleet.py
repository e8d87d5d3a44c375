"""A mixed fleet, end to end, with real processes: Python and TypeScript instances serve one flow.

A Python instance (tests/ts/mixed_fleet_server.py: an ``MCPServer`` with
``statecodec.adapters.mcp.protect``) and a TypeScript instance (ts/test/fixtures/fleet_server.ts:
the official SDK's low-level ``Server`` whose tools/call is ``@statecodec/ts/mcp``
``protect().callTool``), each a process serving HTTP
on a port it picked, share a transit key on a real OpenBao (each through its own KeyManager,
refreshed every second) and a real Valkey replay store. The official TypeScript client
(ts/test/fixtures/fleet_client.ts) drives the three-round tool ``relay``; its load balancer
sends round 1 and 3 to one language and round 2 to the other, in both orders. Between rounds
1 and 2 the key is rotated through ``statecodec.kms.rotate`` against OpenBao; the test waits
until both instances mint with the new kid (asking each one), with no restart. Round 1's token
(old key) still opens in the other language, round 2's is minted under the new key. Each
round's token, once redeemed by one language, is replayed to the other and refused.

Both languages refuse a replay with the same JSON-RPC error, -32602 "Invalid or expired
requestState" with ``data.reason`` "invalid_request_state" (the client's callTool throws it).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures_openbao import OpenBao
from processes import await_line, spawn, stop, wait_for_log
from ts_package import NODE, SKIPS, TS_DIR, build

import statecodec as sc
from statecodec.kms import VaultSettings, rotate, source_from_url

pytestmark = SKIPS
HERE = Path(__file__).resolve().parent
TIMEOUT = 120.0  # generous: the machine may be loaded; every wait below ends on a state


class Driver:
    """The TypeScript client process: JSON commands in, JSON answers out, matched by id."""

    def __init__(self, log: Path) -> None:
        assert NODE is not None
        self.log = log.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [NODE, "dist/test/fixtures/fleet_client.js"],
            cwd=TS_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.ids = iter(range(1, 1_000_000))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def next(self, id_: int) -> dict[str, Any]:
        """The next answer to command ``id_`` (commands here run one at a time)."""
        answer = self.lines.get(timeout=TIMEOUT)
        assert answer["id"] == id_, answer
        return answer

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        id_ = next(self.ids)
        self.send({"op": op, "id": id_, **fields})
        return self.next(id_)

    def stop(self) -> None:
        stop(self.proc)
        self.log.close()


@dataclass
class Fleet:
    urls: dict[str, str]
    logs: dict[str, Path]
    client: Driver
    key: str
    openbao: OpenBao

    def primaries(self) -> dict[str, str]:
        return {lang: self.client.ask("keys", url=url)["keys"]["primary"] for lang, url in self.urls.items()}

    def wait_minting_with(self, kid: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while (seen := self.primaries()) != {"python": kid, "typescript": kid}:
            assert time.monotonic() < deadline, f"waiting for both instances to mint with {kid}: {seen}"
            time.sleep(0.2)  # a polling interval; the loop ends on the state, not on the time

    def source(self) -> Any:
        settings = VaultSettings(addr=self.openbao.addr, token=self.openbao.token)
        return source_from_url(f"vault-transit:transit/{self.key}", vault=settings)

    def kid_of(self, token: str) -> str:
        return sc.StateCodec(self.source().load(), mode="encrypt").verify_unbound(token).kid


@pytest.fixture
def fleet(openbao: OpenBao, valkey_url: str, tmp_path: Path) -> Iterator[Fleet]:
    build()
    assert NODE is not None
    key = f"fleet-{uuid.uuid4().hex[:8]}"
    openbao.client().secrets.transit.create_key(key, key_type="chacha20-poly1305", exportable=True)
    vault = ["--vault-addr", openbao.addr, "--vault-token", openbao.token]
    commands = {
        "python": [
            sys.executable,
            str(HERE / "mixed_fleet_server.py"),
            "--keys",
            f"vault-transit:transit/{key}",
            *vault,
        ],
        "typescript": [NODE, "dist/test/fixtures/fleet_server.js", "--transit", f"transit/{key}", *vault],
    }
    # A prefix of this test's own in the shared Valkey: the store keys never meet another test's.
    replay = ["--replay", valkey_url, "--replay-prefix", f"{key}:"]
    logs = {lang: tmp_path / f"{lang}.log" for lang in commands}
    procs: dict[str, subprocess.Popen[str]] = {}
    client = None
    try:
        for lang, command in commands.items():
            cwd = TS_DIR if lang == "typescript" else HERE.parents[1]
            procs[lang] = spawn([*command, *replay, "--port", "0"], logs[lang], cwd=cwd)
        urls = {lang: await_line(proc, "READY ", logs[lang]) for lang, proc in procs.items()}
        client = Driver(tmp_path / "client.log")
        yield Fleet(urls, logs, client, key, openbao)
    finally:
        if client is not None:
            client.stop()
        for proc in procs.values():
            stop(proc)


def refusal(lang: str, answer: dict[str, Any]) -> None:
    """What each language answers to a replayed token: the same wire error."""
    assert "error" in answer, (lang, answer)
    assert answer["error"]["code"] == -32602, (lang, answer)
    assert answer["error"]["message"] == "Invalid or expired requestState", (lang, answer)
    assert answer["error"]["data"] == {"reason": "invalid_request_state"}, (lang, answer)


@pytest.mark.parametrize("first", ["python", "typescript"])
def test_one_flow_across_languages_with_a_rotation(fleet: Fleet, first: str) -> None:
    second = "typescript" if first == "python" else "python"
    old = f"{fleet.key}-v1"
    fleet.wait_minting_with(old)
    client = fleet.client
    id_ = next(client.ids)
    flow = f"flow-{first}"
    client.send(
        {
            "op": "flow",
            "id": id_,
            "urls": [fleet.urls[first], fleet.urls[second], fleet.urls[first]],
            "flow": flow,
        }
    )

    # Round 1 served by `first`; before round 2 goes out, the key rotates in OpenBao.
    to_second = client.next(id_)
    assert (to_second["event"], to_second["round"], to_second["url"]) == ("send", 2, fleet.urls[second])
    t1 = to_second["requestState"]
    assert fleet.kid_of(t1) == old
    report = rotate(fleet.source(), min_age=0, retire_after=3600)
    new = f"{fleet.key}-v2"
    assert (report.rotated, report.new_kid) == (True, new)
    fleet.wait_minting_with(new)  # both picked it up, neither restarted

    # Round 2 served by `second`: the old key's token opens; the next is minted under the new key.
    client.send({"op": "go", "id": id_})
    to_first = client.next(id_)
    assert (to_first["event"], to_first["round"], to_first["url"]) == ("send", 3, fleet.urls[first])
    t2 = to_first["requestState"]
    assert fleet.kid_of(t2) == new
    # Round 1's token, redeemed by `second`, is a replay for `first`.
    refusal(first, client.ask("call", url=fleet.urls[first], flow=flow, requestState=t1))

    # Round 3 served by `first` ends the flow: each round was served where it was sent.
    client.send({"op": "go", "id": id_})
    done = client.next(id_)
    assert "result" in done, done
    assert json.loads(done["result"]["content"][0]["text"]) == {"flow": flow, "path": [first, second, first]}
    # Round 2's token, redeemed by `first`, is a replay for `second`.
    refusal(second, client.ask("call", url=fleet.urls[second], flow=flow, requestState=t2))
    # Each language logged the precise reason it kept from the client.
    for lang, needle in (("python", "reason=replayed"), ("typescript", "refused replayed")):
        assert needle in wait_for_log(fleet.logs[lang], needle, timeout=TIMEOUT), lang
