"""Write the seed corpus for fuzz_unseal.py: one file per seed, named by its SHA-1.

Seeds are (1) every token the harness mints (valid, expired, future, retired-key,
unbound, both modes), (2) every token-like string in tests/vectors/*.json, and (3) the
regression inputs in fuzz/regressions/. Good seeds matter more than hours: libFuzzer
mutates from them, and only they reach the code behind a verified MAC.

Usage: python fuzz/build_corpus.py OUT_DIR
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))

from fuzz_unseal import MINTED  # noqa: E402 - needs the path above


def _strings(doc: Any) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for value in doc.values():
            yield from _strings(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _strings(value)


def vector_tokens(vectors_dir: Path = ROOT / "tests" / "vectors") -> list[str]:
    """Strings in the test vectors that look like tokens (any format version or mode)."""
    found: set[str] = set()
    for path in sorted(vectors_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a vector file being written right now; the tests judge the vectors
        found.update(s for s in _strings(doc) if s.startswith("sc") and "." in s[:8])
    return sorted(found)


def seeds() -> list[bytes]:
    out = [t.encode("ascii") for t in MINTED]
    out += [t.encode("utf-8", "surrogateescape") for t in vector_tokens()]
    out += [
        p.read_bytes()
        for p in sorted((ROOT / "fuzz" / "regressions").glob("*"))
        if p.is_file() and p.suffix != ".md"
    ]
    out += [b"", b"sc1s.", b"sc1e.", b"sc2s.AAAA", b"sc1x.AAAA", b"sc1s.AA==", b"sc1s.\x00"]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for seed in seeds():
        path = out / hashlib.sha1(seed, usedforsecurity=False).hexdigest()
        if not path.exists():
            path.write_bytes(seed)
            written += 1
    print(f"{written} new seeds in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
