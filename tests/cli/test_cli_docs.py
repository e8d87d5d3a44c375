"""docs/cli.md is generated from the click app, and the committed copy is up to date."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from statecodec.cli import main
from statecodec.cli._exit import EXIT_CODES
from tools.cli_docs import render

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cli.md"


def test_committed_reference_matches_the_app() -> None:
    assert DOC.read_text(encoding="utf-8") == render(main), (
        "docs/cli.md is stale: regenerate it with `python tools/cli_docs.py > docs/cli.md`"
    )


def _all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, cmd in group.commands.items():
        paths.append((*prefix, name))
        if isinstance(cmd, click.Group):
            paths += _all_commands(cmd, (*prefix, name))
    return paths


@pytest.mark.parametrize("path", _all_commands(main), ids=" ".join)
def test_every_command_is_documented_with_its_options(path: tuple[str, ...]) -> None:
    text = render(main)
    assert f"### `statecodec {' '.join(path)}`" in text
    cmd = main
    for name in path:
        assert isinstance(cmd, click.Group)
        cmd = cmd.commands[name]
    for param in cmd.params:
        if isinstance(param, click.Option):
            assert f"`{param.opts[0]}" in text or any(f" {o}" in text for o in param.opts), param.opts
    assert CliRunner().invoke(main, [*path, "--help"]).exit_code == 0


def test_exit_code_table_is_in_the_reference() -> None:
    text = render(main)
    for code, meaning in EXIT_CODES.items():
        assert f"| {int(code)} | {meaning} |" in text
