"""Without an extra, what needs it says so in one line naming the extra, and exits 3.

Each case runs the CLI (or imports the module) in a fresh interpreter whose first
``sys.meta_path`` finder refuses the modules the extra installs, and only those. That is
what an environment without the extra looks like from inside Python: an import asks the
finders on ``sys.meta_path`` in turn, and for a distribution that is not installed none
finds it and the import raises ``ModuleNotFoundError`` with ``name`` set; the refusing
finder raises that same exception before any other finder is asked, for the module and
its submodules, so statecodec's imports and those of the packages it uses (which test
optional modules with ``try: import ... except ImportError``) see what they would see
without it. Only the distribution's metadata stays visible, which no code path here reads.
Hidden are the modules of the extra (and of the extras it includes) that no other extra
also installs: the environment holds every other extra, as after ``pip install
'statecodec[mcp]'`` for the proxy.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from statecodec._extras import EXTRA_INCLUDES, EXTRA_MODULES, extra_for, missing_extra, modules_of

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 120

HIDING = """
import sys
HIDDEN = frozenset({hidden!r})

class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Uninstalled())
"""


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _pyproject_extras() -> dict[str, list[str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {name: reqs for name, reqs in data["project"]["optional-dependencies"].items() if name != "all"}


def _norm(dist: str) -> str:
    return dist.lower().replace("_", "-")


def _modules_installed_by(dist: str, provided: dict[str, set[str]]) -> set[str]:
    """The top-level modules of an installed distribution; a metapackage's are those of its requirements."""
    own = provided.get(_norm(dist), set())
    if own:
        return own
    requires = importlib.metadata.requires(dist) or []
    return set().union(
        *(_modules_installed_by(_requirement_name(r), provided) for r in requires if ";" not in r)
    )


def test_the_table_is_pyprojects_extras_package_by_package() -> None:
    extras = _pyproject_extras()
    assert set(EXTRA_MODULES) == set(extras)
    provided: dict[str, set[str]] = {}  # every extra is installed here
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            provided.setdefault(_norm(dist), set()).add(module)
    for extra, requirements in extras.items():
        names = {_requirement_name(r) for r in requirements}
        included = tuple(sorted(re.findall(r"statecodec\[(\w+)\]", " ".join(requirements))))
        assert tuple(sorted(EXTRA_INCLUDES.get(extra, ()))) == included, extra
        by_package = {name: _modules_installed_by(name, provided) for name in names - {"statecodec"}}
        # Each package of the extra installs one of the modules listed for it...
        for package, modules in by_package.items():
            assert modules & set(EXTRA_MODULES[extra]), (extra, package, modules)
        # ...and each module listed comes from one of the extra's packages.
        for module in EXTRA_MODULES[extra]:
            assert any(module in modules for modules in by_package.values()), (extra, module)


@pytest.mark.parametrize(
    ("module", "needed", "extra"),
    [
        ("httptools", None, "proxy"),
        ("hvac.exceptions", None, "vault"),
        ("psycopg_pool", None, "postgres"),
        ("pythonjsonlogger.json", None, "ops"),
        ("opentelemetry", None, "otel"),
        ("starlette", "mcp", "mcp"),  # a package the mcp SDK needs
        ("uvicorn", "proxy", "proxy"),  # in two extras: the one the code needs
        ("ssl", "proxy", None),  # the standard library's: a bug, not an extra
        ("statecodec.probe", "mcp", None),
        ("starlette", None, None),  # nothing lists it and nothing says what was loaded
    ],
)
def test_which_extra_a_missing_module_names(module: str, needed: str | None, extra: str | None) -> None:
    assert extra_for(module, needed) == extra
    error = missing_extra(ModuleNotFoundError(name=module), needed, "X")
    if extra is None:
        assert error is None
    else:
        assert (
            str(error)
            == f"X needs the {extra} extra ({module} is missing): pip install 'statecodec[{extra}]'"
        )


def _hidden(extra: str) -> frozenset[str]:
    others = [other for other in EXTRA_MODULES if extra not in modules_of_closure(other)]
    kept = frozenset().union(*(modules_of(other) for other in others))
    return modules_of(extra) - kept


def modules_of_closure(extra: str) -> set[str]:
    """``extra`` and every extra it includes."""
    return {extra}.union(*(modules_of_closure(inner) for inner in EXTRA_INCLUDES.get(extra, ())))


def _run(extra: str, code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = HIDING.format(hidden=sorted(_hidden(extra))) + code
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=TIMEOUT
    )


def _cli(*args: str) -> str:
    return f"from statecodec.cli import main\nmain({list(args)!r}, prog_name='statecodec')\n"


@pytest.fixture
def key_file(tmp_path: Path) -> str:
    spec = f"file:{tmp_path / 'keys.json'}"
    subprocess.run(
        [sys.executable, "-m", "statecodec.cli", "keys", "init", "--keys", spec],
        check=True,
        capture_output=True,
    )
    return spec


def _mint(key_file: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "statecodec.cli", "mint", "--keys", key_file, "{}"],
        check=True,
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip()


def _one_line_naming(proc: subprocess.CompletedProcess[str], extra: str) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 3, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("statecodec: error: ") and lines[0].endswith(
        f"pip install 'statecodec[{extra}]'"
    )
    return lines[0]


def test_the_proxy_without_its_extra(tmp_path: Path, key_file: str) -> None:
    assert {"httptools", "uvloop"} <= _hidden("proxy") and "uvicorn" not in _hidden("proxy")
    args = ["proxy", "--upstream", "http://127.0.0.1:9/mcp", "--keys", key_file, "--replay", "memory:"]
    line = _one_line_naming(_run("proxy", _cli(*args, "--audience", "a"), tmp_path), "proxy")
    assert line.startswith("statecodec: error: statecodec proxy needs the proxy extra (")


def test_a_vault_key_source_without_its_extra(tmp_path: Path) -> None:
    for spec in ("vault-transit:transit/mcp-state", "vault-kv:secret/mcp-state"):
        proc = _run("vault", _cli("keys", "init", "--keys", spec), tmp_path)
        line = _one_line_naming(proc, "vault")
        assert f"the key source {spec!r} needs the vault extra (hvac is missing)" in line


@pytest.mark.parametrize(
    ("extra", "url"),
    [("redis", "redis://127.0.0.1:9/0"), ("postgres", "postgresql://u:secret@127.0.0.1:9/db")],
)
def test_a_replay_store_without_its_extra(extra: str, url: str, tmp_path: Path, key_file: str) -> None:
    proc = _run(
        extra,
        _cli("verify", "--keys", key_file, "--replay", url, "--consume", "--unbound", _mint(key_file)),
        tmp_path,
    )
    line = _one_line_naming(proc, extra)
    assert "secret" not in line and f"needs the {extra} extra" in line


def test_json_logs_without_the_ops_extra(tmp_path: Path, key_file: str) -> None:
    proc = _run(
        "ops",
        _cli(
            "keys",
            "rotate",
            "--keys",
            key_file,
            "--min-age",
            "0s",
            "--retire-after",
            "1h",
            "--log-format",
            "json",
        ),
        tmp_path,
    )
    line = _one_line_naming(proc, "ops")
    assert "statecodec keys rotate needs the ops extra (pythonjsonlogger is missing)" in line


@pytest.mark.parametrize(
    "command", [["probe", "http://127.0.0.1:9/mcp", "--tool", "t", "--only", "readable"]]
)
def test_the_mcp_commands_without_their_extra(command: list[str], tmp_path: Path) -> None:
    _one_line_naming(_run("mcp", _cli(*command), tmp_path), "mcp")


@pytest.mark.parametrize(
    ("extra", "module"), [("mcp", "statecodec.adapters.mcp"), ("fastmcp", "statecodec.adapters.fastmcp")]
)
def test_an_adapter_without_its_extra(extra: str, module: str, tmp_path: Path) -> None:
    code = (
        f"try:\n    import {module}\nexcept ModuleNotFoundError as exc:\n    print(exc)\n"
        "else:\n    raise SystemExit('imported')\n"
    )
    proc = _run(extra, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{module} needs the {extra} extra (")
    assert proc.stdout.strip().endswith(f"pip install 'statecodec[{extra}]'")


def test_nothing_needs_the_otel_extra(tmp_path: Path, key_file: str) -> None:
    # OpenTelemetry is counted into when installed and skipped otherwise: no command fails
    # without it, so there is no line to print. A mint and a verify show it.
    assert _hidden("otel") == {"opentelemetry"}
    code = _cli(
        "verify", "--keys", key_file, "--replay", "memory:", "--consume", "--unbound", _mint(key_file)
    )
    proc = _run("otel", code, tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("VALID"), proc.stdout + proc.stderr


@pytest.mark.parametrize("page", ["README.md", "docs/proxy.md"])
def test_the_proxy_quick_starts_install_its_extra(page: str) -> None:
    blocks = re.findall(r"```console\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), re.S)
    first = next(block for block in blocks if "$ statecodec proxy " in block)
    commands = [line[2:] for line in first.splitlines() if line.startswith("$ ")]
    assert commands[0].startswith("pip install 'statecodec[proxy]'"), commands
