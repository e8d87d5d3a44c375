"""``python -m statecodec.cli``: the same as the ``statecodec`` console script."""

from . import main

main(prog_name="statecodec")
