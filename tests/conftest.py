"""Shared test configuration.

The tests live by room (tests/core/, tests/adapters/, tests/replay/, ...: docs/architecture.md
names them). pytest puts this folder on ``sys.path`` (rootdir-relative "prepend" imports, no
``__init__.py``), so the helper modules beside this file (``fixtures_*``, ``processes``,
``loopback``, ...) import by name from every room; a helper only one room uses sits in that
room's folder. Real servers (Valkey, OpenBao, MCP server instances) are started by fixtures in
the ``fixtures_*`` modules listed below, on loopback ports they bind themselves, and stopped
by their PID.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from loopback import refusing_port

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


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that refuses every connection for the whole test (loopback.refusing_port)."""
    with refusing_port() as port:
        yield port


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Each test leaves the logging configuration as it found it.

    ``statecodec proxy`` run in-process (CliRunner) configures logging for the whole
    process, as a server's entry point does: a handler on the root logger and the
    ``statecodec`` logger's level, kept after the command returns. Without this, a later
    test's command output would carry those log lines (test_cli.py after
    test_proxy_workers.py). pytest's own capture handlers, which come and go per phase,
    are left alone.
    """
    root, library = logging.getLogger(), logging.getLogger("statecodec")
    handlers, level, library_level = list(root.handlers), root.level, library.level
    yield
    for handler in root.handlers[:]:
        if handler not in handlers and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
    root.setLevel(level)
    library.setLevel(library_level)
