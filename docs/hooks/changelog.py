"""mkdocs hook: CHANGELOG.md, kept at the top of the tree, is also the site's changelog/ page.

The package metadata's Changelog URL points at that page, so it must exist on the site, and
the file stays the one place changes are written. Its links into ``docs/`` are made relative
to the site; every other link is left as it is (mkdocs --strict checks them).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

_DOCS_LINK = re.compile(r"\]\(docs/")


def on_files(files: Files, config: Any) -> Files:
    changelog = Path(config.config_file_path).parent / "CHANGELOG.md"
    text = _DOCS_LINK.sub("](", changelog.read_text(encoding="utf-8"))
    files.append(File.generated(config, "changelog.md", content=text))
    return files
