"""Every Python code sample in README.md and docs/ runs, so the docs cannot rot.

Blocks of one file run in order in one namespace, like a notebook, in a scratch working
directory. A block preceded by ``<!-- docs-test: skip REASON -->`` is not run; the reason
must say what it would need (a Vault address, a production path) and is listed here.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
_BLOCK = re.compile(r"(<!--\s*docs-test:\s*skip(?P<why>[^>]*)-->\s*\n)?```python\n(?P<code>.*?)```", re.S)


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("code")) + 1
        skip = m.group("why").strip() if m.group(0).startswith("<!--") else None
        blocks.append((line, m.group("code"), skip))
    return blocks


DOCS_WITH_CODE = [p for p in DOCS if python_blocks(p)]


def test_docs_have_code_samples() -> None:
    names = {p.name for p in DOCS_WITH_CODE}
    assert "README.md" in names


@pytest.mark.parametrize("path", DOCS_WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_samples_run(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.WARNING, logger="statecodec.kms")
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    ran = 0
    for line, code, skip in python_blocks(path):
        if skip is not None:
            assert skip, f"{path.name}:{line}: a skipped block must say why"
            continue
        exec(compile(code, f"{path}:{line}", "exec"), namespace)
        ran += 1
    assert ran > 0, f"{path.name}: every block is skipped"
    # A sample handles keys the right way: nothing for the key manager to warn about (a key
    # file that others can read, ...). Rejected tokens may be logged: samples show those.
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("statecodec.kms")]
    assert not warnings, f"{path.name}: statecodec.kms warned while the samples ran: {warnings}"
