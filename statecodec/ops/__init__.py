"""Operating a statecodec server: health, readiness, Prometheus metrics, JSON logs.

``statecodec proxy --admin-listen HOST:PORT`` serves these on a listener of its own. A
Python server using ``protect()`` or the ASGI middleware mounts the same endpoints::

    from statecodec import ops
    health = ops.Health(manager, store)          # the codec's key provider and replay store
    routes.append(Mount("/ops", app=ops.app(health)))   # /ops/livez, /ops/readyz, /ops/metrics

or calls the functions from any framework: ``health.check()`` (``.status``, ``.to_dict()``)
and ``ops.exposition(health, accept)`` (the ``/metrics`` body and content type). The
OpenTelemetry instruments (``statecodec[otel]``) keep counting alongside.

Needs ``statecodec[ops]`` (prometheus-client, python-json-logger) for metrics and JSON
logs; docs/operations.md lists the metrics, the log fields and the alerting rules.
Importing this module turns on the Prometheus side of statecodec's counters (before, a
server that serves no ``/metrics`` pays nothing for them).
"""

from .. import _telemetry
from ._app import app
from ._health import Check, Health, Readiness
from ._logs import json_formatter
from ._metrics import MULTIPROCESS_ENV, KeyGauges, exposition

_telemetry.enable_prometheus()  # a server importing this serves /metrics: count for it

__all__ = [
    "MULTIPROCESS_ENV",
    "Check",
    "Health",
    "KeyGauges",
    "Readiness",
    "app",
    "exposition",
    "json_formatter",
]
