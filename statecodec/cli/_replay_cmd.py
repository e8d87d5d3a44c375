"""``statecodec replay init``: print or apply a replay store's schema, once, as a role that may.

A PostgreSQL store creates its table on first use when its role may create tables. A
least-privileged role (``SELECT, INSERT, DELETE`` on that one table, nothing else) may
not: the table's owner creates it once with this command, and ``--grant ROLE`` adds the
grant for the role the services log in as. ``--print`` only prints the SQL (for a
migration tool or a DBA), without connecting.
"""

from __future__ import annotations

from typing import Any

import click

from ..replay._url import SCHEMA_SCHEMES, redact, scheme
from ._exit import CliError, ExitCode
from ._output import Outcome, Output, command
from ._params import OrderedGroup, replay_option


@click.group("replay", cls=OrderedGroup)
def replay_group() -> None:
    """Replay store setup: replay init creates its PostgreSQL table.

    replay init creates (or, with --print, prints) a PostgreSQL store's table and
    index; the other stores need no setup.
    """


@replay_group.command("init")
@replay_option(
    "replay_url", "The store: postgresql://USER:PASSWORD@HOST[:PORT]/DB[?table=NAME] (postgres:// too)."
)
@click.option(
    "--print", "print_only", is_flag=True, help="Print the SQL and exit, without connecting to the database."
)
@click.option("--grant", "grant_to", metavar="ROLE", help="Also grant ROLE the privileges the store needs.")
@command("replay init")
def init_command(out: Output, *, replay_url: str, print_only: bool, grant_to: str | None) -> Outcome:
    """Create the replay store's table and index (idempotent), or print the SQL with --print.

    Only PostgreSQL stores have a schema to create: SQLite creates its table when the file
    is opened, Redis needs none. Run it as the table's future owner; the services' role
    then needs only SELECT, INSERT and DELETE on it (--grant ROLE).
    """
    if (kind := scheme(replay_url)) not in SCHEMA_SCHEMES:
        raise click.BadParameter(
            f"replay init sets up postgresql:// stores; {kind or 'this'}: stores need no schema",
            param_hint="'--replay'",
        )
    from ._sources import open_store  # noqa: PLC0415 - psycopg loads only for this command

    store: Any = open_store(replay_url)
    try:
        statements = store.schema(grant_to)
        if not print_only:
            try:
                store.create_schema_now(grant_to)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="'--grant'") from None
            except Exception as exc:
                raise CliError(ExitCode.STORE, f"cannot create the replay store's table: {exc}") from None
    finally:
        store.close()
    fields = {
        "store": redact(replay_url),
        "table": store.table,
        "statements": statements,
        "applied": not print_only,
        "grant": grant_to,
    }
    if print_only:
        return Outcome(fields, [f"{statement};" for statement in statements])
    where = f" and granted SELECT, INSERT, DELETE to {grant_to}" if grant_to else ""
    return Outcome(fields, [f"created table {store.table} (if missing) in {redact(replay_url)}{where}"])
