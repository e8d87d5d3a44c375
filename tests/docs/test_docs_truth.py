"""What the docs and the help say about extras, stores and commands is what exists.

Each check reads the page or the help and holds it to the thing it names: pyproject's
extras, the CLI's real commands, the stores ``store_from_url`` opens.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from click.testing import CliRunner

from statecodec.cli import main

ROOT = Path(__file__).resolve().parents[2]


def page(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def help_text(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_getting_started_lists_every_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    text = page("getting-started.md")
    listed = set(re.findall(r"`(\w+)`", text[text.index("The other extras are") :].split("\n\n")[0]))
    assert set(extras) - {"mcp"} <= listed, set(extras) - listed


def test_fleet_covers_postgresql_and_carries_no_stale_comment() -> None:
    text = page("fleet.md")
    assert "<!--" not in text and "being written" not in text
    store_section = text[text.index("## Replay store") : text.index("## Namespaces")]
    assert "postgresql://" in store_section and "statecodec[postgres]" in store_section
    assert "statecodec replay init --replay postgresql://" in store_section
    assert "PostgreSQL" in text.splitlines()[text.splitlines().index("|---|---|---|") + 3]


def test_serving_checks_its_store_at_start() -> None:
    text = page("serving.md")
    opened = text.index("replay = store_from_url(")
    assert "replay.check()" in text[opened : text.index("protect(server", opened)]


def test_adapters_show_fastmcp_served_over_http() -> None:
    blocks = re.findall(r"```python\n(.*?)```", page("adapters.md"), re.S)
    served = [b for b in blocks if "fastmcp" in b and "http_app(" in b and "streamable_http_client" in b]
    assert served, "no FastMCP block served over Streamable HTTP"


def test_the_top_level_help_names_real_commands() -> None:
    result = CliRunner().invoke(main, ["--help"], env={"COLUMNS": "200"})
    (line,) = [line for line in result.output.splitlines() if line.split()[:1] == ["replay"]]
    described = line.split(None, 1)[1]
    named = re.findall(r"\breplay (\w+)\b", described)
    assert named, line
    assert set(named) <= set(main.commands["replay"].commands), named  # type: ignore[attr-defined]


def test_verify_help_lists_every_replay_store_form() -> None:
    text = help_text("verify")
    forms = text[text.index("--replay URL") :].split("--consume")[0]
    for form in (
        "memory:",
        "sqlite:PATH",
        "redis://",
        "redis+cluster://",
        "redis+sentinel://",
        "postgresql://",
    ):
        assert form in forms, form
