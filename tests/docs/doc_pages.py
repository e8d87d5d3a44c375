"""A docs page's Python samples as one program, each block on the page's own lines.

For the tests that run the pages as a reader would (test_docs.py, test_serving_docs.py). A
block preceded by ``<!-- docs-test: skip REASON -->`` is left out, and must say why.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"(<!--\s*docs-test:\s*skip(?P<why>[^>]*)-->\s*\n)?```python\n(?P<code>.*?)```", re.S)


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("code")) + 1
        skip = m.group("why").strip() if m.group(0).startswith("<!--") else None
        blocks.append((line, m.group("code"), skip))
    return blocks


def page_program(path: Path) -> str:
    """The page's blocks that run, each on its own lines of the page (blank lines between)."""
    lines: list[str] = []
    for line, code, skip in python_blocks(path):
        if skip is not None:
            assert skip, f"{path.name}:{line}: a skipped block must say why"
            continue
        lines += [""] * (line - 1 - len(lines))
        lines += code.splitlines()
    return "\n".join(lines) + "\n"
