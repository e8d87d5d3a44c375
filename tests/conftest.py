"""Shared test configuration.

Real servers (Valkey, OpenBao, MCP server instances) are started by fixtures in the
``fixtures_*`` modules listed below, on free loopback ports, and stopped by their PID.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Each fixture module owns one kind of real server.
pytest_plugins: list[str] = [
    "fixtures_mcp",
    "fixtures_openbao",
    "fixtures_postgres",
    "fixtures_proxy",
    "fixtures_valkey",
]
