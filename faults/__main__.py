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
    checking.add_argument("--row", action="store_true", help="the verdict as a docs/guarantees.md table row")
    running = commands.add_parser("run", help="run one seeded fault schedule against one store, then check")
    running.add_argument(
        "--store", required=True, choices=["memory", "sqlite", "sentinel", "cluster", "postgres"]
    )
    running.add_argument(
        "--faults", default="", help="comma-separated fault kinds (none: a run without faults)"
    )
    running.add_argument("--seconds", type=float, default=60.0)
    running.add_argument("--seed", type=int, default=1)
    running.add_argument("--clients", type=int, default=4, help="honest client processes")
    running.add_argument("--attackers", type=int, default=2, help="attacker processes")
    running.add_argument("--wait", type=int, default=None, help="Redis wait=N (default: the replica count)")
    running.add_argument(
        "--pg-standby", choices=["sync", "async"], default="sync",
        help="PostgreSQL's standby: synchronous (synchronous_standby_names='*', the default) or asynchronous",
    )  # fmt: skip
    running.add_argument("--workdir", type=Path, default=None)
    running.add_argument("--history", type=Path, default=None, help="copy the history here")
    args = parser.parse_args(argv)
    if args.command == "check":
        verdict = check_file(args.history)
        print(verdict.to_json() if args.json else verdict.row() if args.row else verdict.summary())
    else:
        from .run import run  # noqa: PLC0415 - the checker alone needs no store

        verdict = run(args.store, [f for f in args.faults.split(",") if f], args.seconds, args.seed,
                      honest=args.clients, attackers=args.attackers, wait=args.wait,
                      pg_standby=args.pg_standby, workdir=args.workdir, history=args.history)  # fmt: skip
        print(verdict.summary())
    return 1 if verdict.broken() else 0


if __name__ == "__main__":
    sys.exit(main())
