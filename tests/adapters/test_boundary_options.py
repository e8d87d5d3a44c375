"""The boundary's one options object.

:class:`statecodec.boundary.BoundaryOptions` is validated once, when built, and every
adapter takes it: the checks that used to follow each adapter's signature now run only
there, so a bad setting is refused the same way whichever adapter is assembled.
"""

from __future__ import annotations

import dataclasses

import pytest

from statecodec import KeyRing, StateCodec, boundary
from statecodec.adapters.asgi import RequestStateMiddleware
from statecodec.adapters.mcp import StateCodecMiddleware
from statecodec.replay.memory import MemoryReplayStore


def _codec() -> StateCodec:
    return StateCodec(KeyRing.generate(), mode="sign", ttl=60, replay=MemoryReplayStore())


async def _app(scope: object, receive: object, send: object) -> None:  # never called here
    raise AssertionError("not reached")


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"retry_after": 60}, "retry_after"),  # not below the codec's ttl
        ({"retry_after": 0}, "retry_after"),
        ({"retry_after": "1"}, "retry_after"),
        ({"max_hold": 301}, "max_hold"),
        ({"max_hold": -1}, "max_hold"),
        ({"max_holds": -1}, "max_holds"),
        ({"max_holds_per_token": 1.5}, "max_holds"),
    ],
)
def test_options_refuse_settings_that_cannot_work(settings: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        boundary.BoundaryOptions(_codec(), **settings)  # type: ignore[arg-type]


def test_options_refuse_what_is_not_a_codec() -> None:
    with pytest.raises(TypeError, match="StateCodec"):
        boundary.BoundaryOptions(object())  # type: ignore[arg-type]


def test_options_are_frozen_and_shared_by_the_adapters() -> None:
    codec = _codec()
    options = boundary.BoundaryOptions(codec, audience="deploy", retry_after=2, max_hold=3, max_holds=7)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_hold = 100  # type: ignore[misc]
    middleware = RequestStateMiddleware(
        _app, codec, audience="deploy", retry_after=2, max_hold=3, max_holds=7
    )
    assert middleware.options == options
    assert (middleware.holds.total, middleware.holds.per_token) == (7, boundary.DEFAULT_MAX_HOLDS_PER_TOKEN)
    assert options.holds() is not options.holds()  # each adapter instance counts its own holds


def test_sdk_middleware_takes_options_built_already() -> None:
    codec = _codec()
    options = boundary.BoundaryOptions(codec, audience="deploy", retry_after=1.5, max_hold=2, max_holds=4)
    middleware = StateCodecMiddleware.from_options(options)
    built = StateCodecMiddleware(
        codec, audience="deploy", principal=None, retry_after=1.5, max_hold=2, max_holds=4
    )
    assert middleware.options is options and built.options == options
    assert (middleware.retry_after, middleware.max_hold, middleware.holds.total) == (1.5, 2, 4)
    assert middleware.sdk_window is None and middleware.codec is codec
