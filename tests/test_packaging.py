"""The package metadata says what is true: supported Pythons, public extras, licence, changelog.

The built artefacts themselves (sdist contents, the wheel alone in a fresh environment) are
checked by scripts/check-package in CI; .ci/run tests every Python the classifiers name.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
USER_EXTRAS = {"redis", "postgres", "vault", "mcp", "fastmcp", "proxy", "otel", "ops", "all"}
DEV_GROUPS = {"test", "dev", "bench", "fuzz", "docs", "release"}


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
