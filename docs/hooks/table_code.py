"""mkdocs hook: inline code in a table cell reads as on GitHub and wraps between words only.

Browsers break long code at hyphens, slashes and colons, which cuts spec tokens such as
``vault-transit:MOUNT/NAME`` in two inside a narrow cell. CSS cannot forbid only those
breaks, so each word of such a span becomes a ``<span class="sc-word">`` that
docs/stylesheets/extra.css keeps on one line; the spaces between words stay breakable.

A ``|`` in a table cell's code is written ``\\|`` so that GitHub does not split the cell there;
GitHub then shows ``|`` alone; Python-Markdown keeps the backslash, so this hook drops it.
"""

from __future__ import annotations

import re

_TABLE = re.compile(r"<table>.*?</table>", re.S)
_CODE = re.compile(r"<code>([^<]*)</code>")
_WORD = re.compile(r"\S+")


def on_page_content(html: str, **_: object) -> str:
    return _TABLE.sub(lambda table: _CODE.sub(_words, table.group(0)), html)


def _words(code: re.Match[str]) -> str:
    text = code.group(1).replace("\\|", "|")
    words = _WORD.sub(lambda word: f'<span class="sc-word">{word.group(0)}</span>', text)
    return f"<code>{words}</code>"
