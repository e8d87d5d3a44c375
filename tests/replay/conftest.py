"""Fixtures of the replay-store tests that more than one of their files uses."""

from __future__ import annotations

import pytest

from statecodec.replay import redis as redis_store


@pytest.fixture(params=["direct", "public"])
def redis_pipelines(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each way the Redis store's batcher sends, for the tests that must hold on both.

    ``direct``: redis-py's connection-level calls (a private seam, docs/performance.md
    "Private seams"); ``public``: its public ``pipeline()``, as on a redis-py release without
    those calls (``_direct_calls_available()`` says so; the calls themselves stay, redis-py's
    own pipeline needs them).
    """
    if request.param == "public":
        monkeypatch.setattr(redis_store, "_direct_calls_available", lambda: False)
    return str(request.param)
