"""Tag, MAC and binding-tag comparisons are constant-time: a source-level check.

Timing cannot be asserted reliably on a shared machine, but the property that matters
can be read from the source: every comparison of a secret-dependent value (a computed
MAC or tag, an "expected" value) goes through ``hmac.compare_digest``, and no ``==``,
``!=``, ``in`` or ``not in`` (which exit at the first differing byte) ever touches one.
The checker is tested on snippets too, so it is known to fail when it should.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "statecodec"
# The modules that verify MACs, AEAD tags and binding tags: the codec, the token format
# and binding helpers, and the other SDKs' formats in compat/.
CHECKED = sorted(
    [
        PACKAGE / "_codec.py",
        PACKAGE / "_format.py",
        PACKAGE / "_binding.py",
        *(PACKAGE / "compat").glob("*.py"),
    ]
)
# Names of secret-dependent values. A `len(...)` of one is public, as is a kid.
SECRET = re.compile(
    r"(^|_)(mac|macs|tag|tags|expected|digest|hmac|signature|sig|secret|bind_tag|btag)($|_)", re.IGNORECASE
)
EARLY_EXIT_OPS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _names(node: ast.expr) -> list[str]:
    """Identifiers an operand is made of, except inside len() and other size/type probes."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"len", "type", "isinstance"}
    ):
        return []
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.append(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.append(sub.attr)
    return [n for n in found if not n.isupper()]  # MAC_LEN and friends are public constants


def early_exit_comparisons(source: str) -> list[str]:
    """Every ``==``/``!=``/``in``/``not in`` whose operands involve a secret-named value."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare) or not any(isinstance(op, EARLY_EXIT_OPS) for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        if any(isinstance(o, ast.Constant) and o.value is None for o in operands):
            continue  # `x == None`-style presence checks carry no secret bytes
        names = [n for o in operands for n in _names(o)]
        if any(SECRET.search(n) for n in names):
            bad.append(f"line {node.lineno}: {ast.unparse(node)}")
    return bad


def compare_digest_arguments(source: str) -> list[str]:
    return [
        ast.unparse(arg)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in {"hmac.compare_digest", "compare_digest"}
        for arg in node.args
    ]


def computes_a_mac(source: str) -> bool:
    # AEAD decryption (AES-GCM, XChaCha20-Poly1305) checks its tag inside the library
    # in constant time; only a MAC computed here has to be compared here.
    return bool(re.search(r"hmac\.(digest|new)\(|\bHMAC\(", source))


# ------------------------------------------------------------------ the checker
@pytest.mark.parametrize(
    "snippet",
    [
        "if mac == expected: pass",
        "ok = parsed.mac != hmac.digest(k, m, 'sha256')",
        "if bind_tag in seen: pass",
        "assert expected_tag == parsed.bind_tag",
        "if signature[:16] == other: pass",
        "if token.tag == x: pass",
    ],
)
def test_checker_flags_early_exit_comparisons(snippet: str) -> None:
    assert early_exit_comparisons(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "if hmac.compare_digest(mac, expected): pass",
        "if len(mac) != MAC_LEN: pass",
        "if exc.reason != 'tampered': pass",
        "if kid == primary: pass",
        "if mac is None: pass",
        "if len(parsed.mac) != MAC_LEN: pass",
        "if expected == None: pass",
    ],
)
def test_checker_allows_constant_time_and_public_comparisons(snippet: str) -> None:
    assert early_exit_comparisons(snippet) == []


# -------------------------------------------------------------- the package
@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_early_exit_comparison_of_secret_dependent_values(path: Path) -> None:
    assert early_exit_comparisons(path.read_text(encoding="utf-8")) == []


def test_codec_compares_the_mac_and_the_binding_tag_with_compare_digest() -> None:
    # The token's own fields are named mac and bind_tag (or parsed.mac, parsed.bind_tag).
    fields = {arg.rsplit(".", 1)[-1] for arg in compare_digest_arguments((PACKAGE / "_codec.py").read_text())}
    assert "mac" in fields, "the SIGN-mode MAC must be compared with hmac.compare_digest"
    assert "bind_tag" in fields, "the binding tag must be compared with hmac.compare_digest"


@pytest.mark.parametrize(
    "path",
    [p for p in CHECKED if p.parent.name == "compat" and computes_a_mac(p.read_text(encoding="utf-8"))],
    ids=lambda p: p.name,
)
def test_every_compat_format_that_computes_a_mac_compares_it_in_constant_time(path: Path) -> None:
    assert compare_digest_arguments(path.read_text(encoding="utf-8")), (
        f"{path.name} never calls compare_digest"
    )


def test_the_checked_set_covers_every_compat_module() -> None:
    assert len([p for p in CHECKED if p.parent.name == "compat"]) == len(
        list((PACKAGE / "compat").glob("*.py"))
    )
    assert (PACKAGE / "_codec.py") in CHECKED
