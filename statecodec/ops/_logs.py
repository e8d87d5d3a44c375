"""Log records as one JSON object per line, for log pipelines.

statecodec's records carry their facts as ``extra=`` fields (``event``, ``reason``,
``kid``, ``token_id``...; see :data:`statecodec._telemetry.LOG_FIELDS`), so a JSON
formatter only has to write every field of the record: python-json-logger's does.
"""

from __future__ import annotations

import logging


def json_formatter() -> logging.Formatter:
    """A formatter writing each record as one line of JSON.

    Fields: ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, then every
    ``extra=`` field of the record; an exception's traceback as ``exc_info`` (one string).
    """
    try:
        from pythonjsonlogger.json import JsonFormatter  # noqa: PLC0415 - optional until JSON is asked for
    except ImportError:
        raise ModuleNotFoundError(
            "JSON logs need python-json-logger: pip install 'statecodec[ops]'", name="pythonjsonlogger"
        ) from None
    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
    )
