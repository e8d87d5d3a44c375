"""The ``statecodec`` command line.

The group stays small: each command lives in its own private module and is registered
here, so later commands (``demo``, ``proxy``) plug in without touching the others.
"""

from __future__ import annotations

import click

from ._demo import demo_command
from ._exit import EXIT_CODES
from ._inspect import inspect_command
from ._keys_cmd import keys_group
from ._mint import mint_command
from ._params import OrderedGroup
from ._probe import probe_command
from ._proxy import proxy_command
from ._replay_cmd import replay_group
from ._verify import verify_command

__all__ = ["main"]


def _epilog() -> str:
    rows = "\n".join(f"  {int(code):<3} {text}" for code, text in EXIT_CODES.items())
    return f"\b\nExit codes:\n{rows}\n\nSTATECODEC_KEYS is the default --keys. NO_COLOR turns colour off."


@click.group(
    cls=OrderedGroup,
    epilog=_epilog(),
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="statecodec", prog_name="statecodec")
def main() -> None:
    """Inspect, verify and mint MCP requestState tokens; manage statecodec key rings."""


main.add_command(inspect_command)
main.add_command(verify_command)
main.add_command(mint_command)
main.add_command(keys_group)
main.add_command(replay_group)
main.add_command(proxy_command)
main.add_command(demo_command)
main.add_command(probe_command)
