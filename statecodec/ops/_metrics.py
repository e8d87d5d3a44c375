"""``/metrics``: the counters statecodec records, and the key ring's gauges, as Prometheus text.

The counters and histograms are recorded by :mod:`statecodec._telemetry` into a
prometheus-client registry of their own (never the global one, which an application
or OpenTelemetry's Prometheus exporter may fill with the same names). The gauges are
read when scraped, from the server's key provider:

- ``statecodec_minting``: 1 while the keys can mint, 0 once minting stopped;
- ``statecodec_key_ring_age_seconds``: how old the ring is, and
  ``statecodec_key_refresh_interval_seconds``: how often it is reloaded (a
  :class:`~statecodec.kms.KeyManager` only; a healthy ring is younger than the interval).

**Several worker processes.** Each process counts on its own. With
``PROMETHEUS_MULTIPROC_DIR`` set (to an empty directory) in the environment of every
process *before* ``prometheus_client`` is first imported, prometheus-client writes every
process's values to files there, and :func:`exposition` in any one process (the
supervisor's admin listener) sums them: counters and histograms are fleet totals of the
host, whichever worker counted. The gauges are computed by the process that serves
``/metrics``, from its own key provider, which reads the same source as the workers'.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from .. import _telemetry
from ._health import Health

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"


class KeyGauges:
    """A prometheus-client collector: the key ring's gauges, computed at each scrape."""

    def __init__(self, health: Health) -> None:
        self.health = health

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415 - optional dependency

        minting = GaugeMetricFamily(
            "statecodec_minting", "1 while the key ring can mint new tokens, 0 once minting stopped"
        )
        minting.add_metric([], 1.0 if self.health.keys_check().ok else 0.0)
        yield minting
        status = getattr(self.health.keys, "status", None)
        state: dict[str, Any] = status() if callable(status) else {}
        age = state.get("age")
        if age is not None:
            ring_age = GaugeMetricFamily(
                "statecodec_key_ring_age_seconds",
                "seconds since the key ring was last loaded from its source",
            )
            ring_age.add_metric([], float(age))
            yield ring_age
        interval = state.get("timeline", {}).get("refresh_interval")
        if interval is not None:
            # Exported so an alert compares the age with this instance's own setting
            # (docs/ops/alerts.yml: older than three intervals), not a number copied by hand.
            refresh = GaugeMetricFamily(
                "statecodec_key_refresh_interval_seconds",
                "how often the key ring is reloaded from its source (a healthy ring is younger)",
            )
            refresh.add_metric([], float(interval))
            yield refresh


class _Exported:
    """Everything ``/metrics`` shows, as one collector for prometheus-client's encoders."""

    def __init__(self, health: Health | None) -> None:
        self.gauges = None if health is None else KeyGauges(health)

    def collect(self) -> Iterator[Any]:
        directory = os.environ.get(MULTIPROCESS_ENV)
        if directory:
            from prometheus_client.multiprocess import MultiProcessCollector  # noqa: PLC0415

            yield from MultiProcessCollector(None, path=directory).collect()  # type: ignore[no-untyped-call]
        else:
            yield from _telemetry.prometheus_registry().collect()
        if self.gauges is not None:
            yield from self.gauges.collect()


def exposition(health: Health | None = None, accept: str | None = None) -> tuple[bytes, str]:
    """The ``/metrics`` body and its content type.

    ``accept`` is the scraper's ``Accept`` header: OpenMetrics when it asks for it, the
    Prometheus text format otherwise (prometheus-client's own negotiation).
    """
    try:
        from prometheus_client.exposition import choose_encoder  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise ModuleNotFoundError(
            "statecodec's /metrics needs prometheus-client: pip install 'statecodec[ops]'",
            name="prometheus_client",
        ) from None
    encode, content_type = choose_encoder(accept or "")
    return encode(_Exported(health)), content_type
