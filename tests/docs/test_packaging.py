"""The package metadata says what is true: supported Pythons, public extras, licence, changelog.

The built artefacts themselves (sdist contents, the wheel alone in a fresh environment) are
checked by scripts/check-package in CI; .ci/run tests every Python the classifiers name.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from click.testing import CliRunner

from statecodec.cli import main

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
USER_EXTRAS = {"redis", "postgres", "vault", "mcp", "fastmcp", "proxy", "otel", "ops", "all"}
DEV_GROUPS = {"test", "dev", "bench", "fuzz", "docs", "release", "conformance"}


def classifier_versions() -> list[str]:
    prefix = "Programming Language :: Python :: "
    return [c.removeprefix(prefix) for c in PROJECT["classifiers"] if re.fullmatch(r".*:: 3\.\d+", c)]


def test_python_classifiers_run_from_the_minimum_without_gaps() -> None:
    versions = classifier_versions()
    minimum = PROJECT["requires-python"].removeprefix(">=")
    first = int(minimum.split(".")[1])
    assert versions == [f"3.{m}" for m in range(first, first + len(versions))]
    assert len(versions) >= 3


def test_docs_name_the_supported_versions() -> None:
    versions = classifier_versions()
    spelled = ", ".join(versions[:-1]) + " and " + versions[-1]
    for doc in ("README.md", "docs/getting-started.md"):
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert f"CPython {spelled}" in text, f"{doc} does not say 'CPython {spelled}'"


def test_only_user_facing_extras_are_published() -> None:
    assert set(PROJECT["optional-dependencies"]) == USER_EXTRAS


def test_development_sets_are_dependency_groups_that_never_name_the_project() -> None:
    groups = PYPROJECT["dependency-groups"]
    assert set(groups) == DEV_GROUPS
    # pip would fetch "statecodec[...]" from the index, not this checkout: the scripts install
    # the project themselves (-e '.[all]') next to the groups.
    named = [req for reqs in groups.values() for req in reqs if isinstance(req, str)]
    assert not [req for req in named if re.match(r"statecodec\b", req)]


def test_licence_text_and_changelog_match_the_metadata() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in licence
    assert "Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{PROJECT['version']}]" in changelog


def test_project_urls_name_pages_the_docs_site_has() -> None:
    urls = PROJECT["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues", "Changelog"}
    site = "https://statecodec.readthedocs.io/"
    assert all(url.startswith(site) for url in urls.values()), urls
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for name in ("Source", "Issues", "Changelog"):
        path = urls[name].removeprefix(site + "en/latest/")
        page, _, anchor = path.partition("#")
        assert f" {page.rstrip('/')}.md" in nav, f"{name}: {page} is not in the mkdocs nav"
        if anchor:
            text = (ROOT / "docs" / f"{page.rstrip('/')}.md").read_text(encoding="utf-8")
            assert f"\n## {anchor.capitalize()}\n" in text, f"{name}: no section #{anchor} in {page}"


def test_the_wheel_carries_what_help_and_the_docs_point_to() -> None:
    # scripts/check-package checks the built wheel's copies byte for byte against docs/.
    forced = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert forced == {
        "docs/cli-schema.json": "statecodec/data/cli-schema.json",
        "docs/policies": "statecodec/data/policies",
    }
    assert sorted(p.name for p in (ROOT / "docs" / "policies").iterdir()) == sorted(
        p.name for p in (ROOT / "docs" / "policies").glob("*.hcl")
    )
    shown = CliRunner().invoke(main, ["inspect", "--help"], terminal_width=200).output
    assert "statecodec/data/cli-schema.json" in shown, shown
    keys = (ROOT / "docs" / "keys.md").read_text(encoding="utf-8")
    assert "statecodec/data/policies/" in keys
