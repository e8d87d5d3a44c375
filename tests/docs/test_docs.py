"""Every page's Python samples run as a reader runs them, so the docs cannot rot.

A page's ``python`` blocks, in order, are one program: they are written to one file (each
block at its own line of the page, so a traceback names the page's line) and run by a
fresh interpreter from an empty directory, as ``python page.py`` would. Each block also
runs alone, as a reader who copies just that block runs it: every block carries its own
imports and setup.

- The interpreter is ``$STATECODEC_DOCS_PYTHON`` when set: scripts/check-package points it
  at a virtual environment holding only the built wheel (outside the tree), so the samples
  see what a user installs. Otherwise it is this one (the development install).
- A sample that needs a server reads its address from the environment, as the reader's
  own program would (docs/index.md, "Running the samples"): ``VAULT_ADDR`` and
  ``VAULT_TOKEN`` name a Vault/OpenBao with transit mounted at ``transit/`` and KV v2 at
  ``secret/``; ``STATECODEC_REPLAY`` names a Redis/Valkey replay store. The runner starts
  real ones (an OpenBao dev server, a Valkey) on loopback ports for the samples. Without
  one, a sample stops at a ``KeySourceError`` of kind ``unreachable`` (tested below).
- A block preceded by ``<!-- docs-test: skip REASON -->`` is not run; the reason must say
  what it would need (a production path, a real identity provider).
- The key manager must have nothing to warn about while the samples run (a key file that
  others can read, ...): a sample handles keys the right way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_pages import ROOT, page_program, python_blocks
from fixtures_openbao import OpenBao, start_dev
from fixtures_valkey import ValkeyServer, running

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
#: The interpreter the samples run in (see the module's docstring).
PYTHON = os.environ.get("STATECODEC_DOCS_PYTHON") or sys.executable
#: True when the samples run on the built wheel (scripts/check-package), not the tree.
ON_WHEEL = bool(os.environ.get("STATECODEC_DOCS_PYTHON"))
#: Runs one page's program; reports where statecodec came from and each warning of the key
#: manager (the harness's only addition: the program itself runs as __main__, unchanged).
_HARNESS = """
import logging, runpy, sys
import statecodec
print("docs-test: statecodec from", statecodec.__file__, file=sys.stderr)
class Warned(logging.Handler):
    def emit(self, record):
        print("docs-test: statecodec.kms warned:", record.getMessage(), file=sys.stderr)
logging.getLogger("statecodec.kms").addHandler(Warned(logging.WARNING))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


DOCS_WITH_CODE = [p for p in DOCS if python_blocks(p)]


@pytest.fixture(scope="module")
def docs_vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenBao]:
    """A Vault of the samples' own (they create `transit/mcp-state`), laid out as docs/keys.md says."""
    server = start_dev(tmp_path_factory.mktemp("docs-openbao"))
    try:
        server.client().sys.enable_secrets_engine("transit")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def docs_valkey() -> Iterator[ValkeyServer]:
    with running(ValkeyServer) as server:
        yield server


def reader_env(tmp_path: Path, **servers: str) -> dict[str, str]:
    """A reader's shell: PATH and a home of its own (``tmp_path/home``), no VAULT_*/BAO_*; then SERVERS.

    PYTHONPATH goes too when the samples run on the wheel; otherwise it stays, since it is how
    scripts/check-package's run from the unpacked sdist finds the sdist's package.
    """
    (tmp_path / "home").mkdir()
    names = {"PATH", "LANG", "LC_ALL", "TMPDIR"} | (set() if ON_WHEEL else {"PYTHONPATH"})
    kept = {k: v for k, v in os.environ.items() if k in names}
    return {**kept, "HOME": str(tmp_path / "home"), **servers}


@pytest.fixture
def served_env(tmp_path: Path, docs_vault: OpenBao, docs_valkey: ValkeyServer) -> dict[str, str]:
    """:func:`reader_env` with VAULT_ADDR, VAULT_TOKEN and STATECODEC_REPLAY naming the docs' servers."""
    return reader_env(
        tmp_path, VAULT_ADDR=docs_vault.addr, VAULT_TOKEN=docs_vault.token, STATECODEC_REPLAY=docs_valkey.url
    )


def run_program(program: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``program`` under the harness, as a reader runs it: from an empty directory beside it."""
    workdir = program.parent / "cwd"
    workdir.mkdir(exist_ok=True)
    return subprocess.run(
        [PYTHON, "-c", _HARNESS, str(program)],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def run_page(path: Path, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    program = tmp_path / f"{path.stem}.py"
    program.write_text(page_program(path), encoding="utf-8")
    return run_program(program, env)


def test_docs_have_code_samples() -> None:
    names = {p.name for p in DOCS_WITH_CODE}
    assert {"README.md", "keys.md", "fleet.md", "serving.md"} <= names


def test_page_program_keeps_the_pages_line_numbers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n```python\na = 1\n```\n\n<!-- docs-test: skip x -->\n```python\nb\n```\n"
        "text\n```python\nc = a\n```\n"
    )
    program = page_program(page).splitlines()
    assert (program[3], program[12]) == ("a = 1", "c = a")
    assert "b" not in program


@pytest.mark.parametrize("path", DOCS_WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_samples_run(path: Path, tmp_path: Path, served_env: dict[str, str]) -> None:
    done = run_page(path, tmp_path, served_env)
    where = f"{path.name} (run by {PYTHON}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert done.returncode == 0, where
    warnings = [
        line for line in done.stderr.splitlines() if line.startswith("docs-test: statecodec.kms warned")
    ]
    assert not warnings, where
    imported = re.search(r"^docs-test: statecodec from (.*)$", done.stderr, re.M)
    assert imported, where
    if ON_WHEEL:  # the wheel, never the tree
        assert not Path(imported.group(1)).resolve().is_relative_to(ROOT), imported.group(1)


BLOCKS = [
    (path, line, code) for path in DOCS_WITH_CODE for line, code, skip in python_blocks(path) if skip is None
]


@pytest.mark.parametrize(
    ("path", "line", "code"), BLOCKS, ids=[f"{p.relative_to(ROOT)}:{line}" for p, line, _ in BLOCKS]
)
def test_each_block_runs_alone(
    path: Path, line: int, code: str, tmp_path: Path, served_env: dict[str, str]
) -> None:
    """A reader copies one block into a file of its own: it carries its imports and setup.

    Run as the page's program is (same harness, same servers, an empty directory), with the
    block at its own line of the page so that a traceback names it.
    """
    program = tmp_path / f"{path.stem}_{line}.py"
    program.write_text("\n" * (line - 1) + code, encoding="utf-8")
    done = run_program(program, served_env)
    assert done.returncode == 0, f"{path.name}:{line} alone:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_vault_samples_stop_at_unreachable_without_a_server(tmp_path: Path, refused_port: int) -> None:
    # The other half of the convention: a reader whose VAULT_ADDR answers nothing sees the
    # page stop with the source's own diagnosis, not a NameError or a hang.
    env = reader_env(tmp_path, VAULT_ADDR=f"http://127.0.0.1:{refused_port}", VAULT_TOKEN="t")
    done = run_page(ROOT / "docs" / "keys.md", tmp_path, env)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert re.search(
        r"KeySourceError: .* at http://127\.0\.0\.1:\d+: cannot connect .*connection refused", last
    ), last
    assert re.search(r"^unreachable vault-transit:transit/no-such-key", done.stdout, re.M), done.stdout
