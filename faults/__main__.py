"""``python -m faults run ...`` runs a seeded fault schedule; ``python -m faults check HISTORY`` judges it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .checker import check_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser("check", help="judge a history file; exit 1 when a promise is broken")
    checking.add_argument("history", type=Path)
    checking.add_argument("--json", action="store_true", help="the verdict as JSON")
    args = parser.parse_args(argv)
    verdict = check_file(args.history)
    print(verdict.to_json() if args.json else verdict.summary())
    return 1 if verdict.broken() else 0


if __name__ == "__main__":
    sys.exit(main())
