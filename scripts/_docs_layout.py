"""Lay out every page of a built docs site in a real Chromium and report what a reader cannot read.

    python scripts/_docs_layout.py SITE_DIR CHROMIUM [--width 1280 --width 390] [--screenshots DIR]

At each width, on every page:
- no line of a code block wraps: each source line is laid out on one line of the screen
  (a folded line reads as two: a comment as code, a diagram garbled);
- a code block wider than its box scrolls sideways (never cuts its lines off unseen);
- in a block that does not scroll, no code text lies under the block's copy button,
- an inline code span in a table cell may wrap between words, never inside one (a spec token
  such as ``vault-transit:MOUNT/NAME`` stays whole),
- the page itself must not scroll sideways.
Exit 1 with one line per finding, 0 when there is none. The site is served on a loopback
port; every request elsewhere (web fonts, analytics) is refused, so the run needs no network.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Route, sync_playwright

# Debian's Chromium as root or in a container has no usable sandbox; the rest keeps it quiet
# and off the network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# Runs in the page; returns one finding per problem, as text.
FIND_PROBLEMS = r"""() => {
  const found = [];
  const snippet = (el) => el.textContent.trim().split("\n")[0].slice(0, 60);
  const overlaps = (a, b) =>
    a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  // Every visible character of an element: its box, the text from it on, whether white
  // space precedes it and whether a line break does (white space itself is skipped: a
  // wrapped line's trailing blanks hang into the padding, unseen).
  const glyphs = (el) => {
    const out = [];
    const range = document.createRange();
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    let afterSpace = false;
    let afterBreak = true;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        if (/\s/.test(node.data[i])) {
          afterSpace = true;
          afterBreak = afterBreak || node.data[i] === "\n";
          continue;
        }
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        out.push({rect: range.getBoundingClientRect(), text: node.data.slice(i), afterSpace, afterBreak});
        afterSpace = false;
        afterBreak = false;
      }
    }
    return out;
  };
  for (const code of document.querySelectorAll("pre > code")) {
    // A character lower than the one before it, with no line break between them, starts a
    // folded line.
    let last = null;
    let line = "";
    for (const g of glyphs(code)) {
      if (g.afterBreak) line = g.text.split("\n")[0];
      if (last && !g.afterBreak && g.rect.top > last.rect.top + 2) {
        found.push(`code line wraps before ${JSON.stringify(g.text.split("\n")[0].slice(0, 20))}: ` +
                   JSON.stringify(line.slice(0, 70)));
        break;
      }
      last = g;
    }
    const scrolls = code.scrollWidth > code.clientWidth + 1;
    if (scrolls && !["auto", "scroll"].includes(getComputedStyle(code).overflowX)) {
      found.push(`code block cut off (${code.scrollWidth} px of text in ${code.clientWidth} px, ` +
                 `not scrollable): ${JSON.stringify(snippet(code))}`);
    }
    const button = code.parentElement.querySelector(".md-code__nav");
    if (!scrolls && button && button.offsetParent !== null) {
      const box = button.getBoundingClientRect();
      const hidden = glyphs(code).find((g) => overlaps(g.rect, box));
      if (hidden) {
        found.push(`code under the copy button: ${JSON.stringify(hidden.text.slice(0, 60))}`);
      }
    }
  }
  // A line break inside a table cell's code span is fine between words, not inside one;
  // the GitHub escape of a pipe in a cell (\|) must not show.
  for (const code of document.querySelectorAll("td code, th code")) {
    if (code.textContent.includes("\\|")) {
      found.push(`table cell shows the escape \\| in ${JSON.stringify(code.textContent)}`);
    }
    if (code.getClientRects().length < 2) continue;
    let last = null;
    for (const g of glyphs(code)) {
      if (last && !g.afterSpace && g.rect.top > last.rect.top + 2) {
        found.push(`table cell breaks ${JSON.stringify(code.textContent)} before ` +
                   JSON.stringify(g.text.slice(0, 12)));
      }
      last = g;
    }
  }
  const page = document.documentElement;
  if (page.scrollWidth > page.clientWidth + 1) {
    found.push(`page scrolls sideways (${page.scrollWidth} px wide in ${page.clientWidth} px)`);
  }
  return found;
}"""


@contextmanager
def serve(site: Path) -> Iterator[str]:
    """Serve SITE on a free loopback port for as long as the block runs."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=site))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def pages(site: Path) -> list[str]:
    """Every page of the site, as paths relative to its root ('' is the home page)."""
    found = sorted(p.relative_to(site).as_posix() for p in site.glob("**/index.html"))
    return [p.removesuffix("index.html") for p in found]


def check(site: Path, chromium: str, widths: list[int], screenshots: Path | None) -> list[str]:
    problems: list[str] = []
    with serve(site) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            for width in widths:
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.route("**/*", lambda route: _only_local(route, base))
                for path in pages(site):
                    page.goto(base + path, wait_until="load")
                    page.evaluate("document.fonts.ready.then(() => true)")
                    problems += [f"{path or '/'} at {width} px: {p}" for p in page.evaluate(FIND_PROBLEMS)]
                    if screenshots is not None:
                        name = (path.strip("/").replace("/", "-") or "index") + f"-{width}.png"
                        page.screenshot(path=screenshots / name, full_page=True)
                page.close()
        finally:
            browser.close()
    return problems


def _only_local(route: Route, base: str) -> None:
    if route.request.url.startswith(base):
        route.continue_()
    else:
        route.abort()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("site", type=Path, help="a site built by `mkdocs build`")
    parser.add_argument("chromium", help="the browser to run (scripts/chromium prints one)")
    parser.add_argument("--width", type=int, action="append", dest="widths", help="px (default 1280 and 390)")
    parser.add_argument("--screenshots", type=Path, help="save a full-page PNG of every page here")
    args = parser.parse_args()
    widths = args.widths or [1280, 390]
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    problems = check(args.site, args.chromium, widths, args.screenshots)
    for problem in problems:
        print(problem, file=sys.stderr)
    count = len(pages(args.site))
    print(f"docs layout: {count} pages at {', '.join(map(str, widths))} px: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
