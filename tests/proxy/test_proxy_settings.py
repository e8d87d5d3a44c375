"""What the proxy is built from: one BoundaryOptions handed through as is, settings sorted once.

``statecodec proxy`` parses options into :class:`statecodec.proxy._settings.ProxySettings`,
whose codec, boundary and forwarding settings are those constructors' own keyword
arguments; :func:`statecodec.proxy.build_proxy` takes a :class:`ProxyOptions` holding the
boundary's :class:`~statecodec.boundary.BoundaryOptions`, and the middleware keeps that
very object (validated once, never rebuilt).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket

import click
import pytest

from statecodec import KeyRing, StateCodec
from statecodec._net import bind_socket
from statecodec.boundary import BoundaryOptions
from statecodec.cli._params import HOST_PORT, POSITIVE_DURATION
from statecodec.proxy import HostPolicy, ProxyOptions, build_proxy
from statecodec.proxy._admin import admin_listener
from statecodec.proxy._settings import (
    BOUNDARY_SETTINGS,
    CODEC_SETTINGS,
    FORWARDING_SETTINGS,
    MissingSettingError,
    PrincipalSettings,
    ProxyConfigError,
    ProxySettings,
    checked,
    host_lists,
)


def _codec() -> StateCodec:
    return StateCodec(KeyRing.generate(), mode="sign")


def test_the_middleware_keeps_the_boundary_options_it_was_given() -> None:
    boundary = BoundaryOptions(_codec(), audience="deploy", retry_after=2.0, max_hold=3.0, max_holds=7)
    app = build_proxy(ProxyOptions("http://127.0.0.1:9/mcp", boundary, hosts=HostPolicy.loopback()))
    middleware = app.app.app  # type: ignore[attr-defined]  # MeteredApp(HostGuard(middleware))
    assert middleware.options is boundary
    assert (middleware.audience, middleware.retry_after, middleware.max_hold) == ("deploy", 2.0, 3.0)
    assert middleware.holds.total == 7


def test_a_proxy_without_an_audience_is_refused_when_its_options_are_built() -> None:
    with pytest.raises(ValueError, match="needs an audience"):
        ProxyOptions("http://127.0.0.1:9/mcp", BoundaryOptions(_codec()))


def _settings(**changes: object) -> ProxySettings:
    options: dict[str, object] = {
        "mode": "sign", "ttl": 600, "namespace": None, "max_token_bytes": 4096, "max_rounds": 10,
        "max_flow_age": 3600, "audience": "deploy", "retry_after": None, "max_hold": 10.0,
        "max_holds": 100, "max_holds_per_token": 2, "upstream": "http://127.0.0.1:9/mcp",
        "max_body_bytes": 1 << 20, "max_response_bytes": 1 << 20, "max_judged_bytes": 1 << 26,
        "max_connections": 10,
        "max_streams": 10, "max_streams_per_client": 2, "passthrough_paths": (),
        "log_level": "info", "log_format": "text", "keys_spec": "file:k.json", "replay": "memory:",
        "connect_timeout": 10, "read_timeout": 300, "graceful_timeout": 30, "head_timeout": 10,
        "body_timeout": 30, "idle_timeout": 5, "max_client_connections": 50,
        "max_concurrent_requests": None, "workers": 1, "allowed_hosts": ("localhost",),
        "allowed_origins": (), "refresh_interval": 60, "staleness_limit": 900,
    }  # fmt: skip
    options.update(changes)
    return ProxySettings.of(options, principal=PrincipalSettings("none"))


def test_settings_are_sorted_into_their_constructors_arguments_an_absent_one_left_out() -> None:
    settings = _settings()
    assert set(settings.codec) == set(CODEC_SETTINGS) - {"namespace"}  # None: the codec's default
    assert set(settings.boundary) == set(BOUNDARY_SETTINGS) - {"retry_after"}
    assert set(settings.forwarding) == set(FORWARDING_SETTINGS)
    StateCodec(KeyRing.generate(), **settings.codec)  # the names are the codec's own
    BoundaryOptions(_codec(), **settings.boundary)


def test_settings_that_cannot_work_together_are_refused_before_anything_starts() -> None:
    with pytest.raises(ProxyConfigError, match="--workers N needs a replay store"):
        checked(_settings(workers=2))
    with pytest.raises(ProxyConfigError, match="key timeline"):
        checked(_settings(refresh_interval=0))
    assert checked(_settings()).max_connections == 50


def test_host_lists_default_to_loopback_and_are_required_elsewhere() -> None:
    assert "localhost" in host_lists("127.0.0.1", (), ())[0]
    with pytest.raises(MissingSettingError, match="--allowed-host"):
        host_lists("192.0.2.1", (), ())
    with pytest.raises(ProxyConfigError, match="--allowed-host / --allowed-origin"):
        host_lists("127.0.0.1", ("bad host/",), ())


def test_option_types_refuse_bad_values_while_click_parses() -> None:
    assert HOST_PORT.convert("[::1]:8000", None, None) == ("::1", 8000)
    with pytest.raises(click.BadParameter, match="is not HOST:PORT"):
        HOST_PORT.convert("8000", None, None)
    assert POSITIVE_DURATION.convert("1m", None, None) == 60
    with pytest.raises(click.BadParameter, match="must be positive"):
        POSITIVE_DURATION.convert("0s", None, None)


def test_the_admin_listener_leaves_logging_to_the_process() -> None:
    # uvicorn's default logging configuration put a stderr handler of its own on "uvicorn"
    # (propagate off): once the admin listener served, uvicorn's records left in its format,
    # not the proxy's (one JSON object per line with --log-format json).
    uvicorn_logger = logging.getLogger("uvicorn")
    before = (list(uvicorn_logger.handlers), uvicorn_logger.propagate)

    async def asgi(scope: dict[str, object], receive: object, send: object) -> None:
        raise AssertionError("not called")

    async def serve(sock: socket.socket) -> str:
        async with admin_listener(asgi, sock) as url:  # type: ignore[arg-type]
            return url

    sock = bind_socket("127.0.0.1", 0)
    try:
        url = asyncio.run(serve(sock))
    finally:
        sock.close()
    assert url.startswith("http://127.0.0.1:")
    assert (list(uvicorn_logger.handlers), uvicorn_logger.propagate) == before


@pytest.mark.parametrize(
    ("source", "options", "says"),
    [
        ("jwt-sub", {}, "exactly one of --jwks URL or --introspection"),
        ("jwt-sub", {"jwks": "https://idp.example/jwks"}, "--jwks needs --issuer and --jwt-audience"),
        ("none", {"issuer": "https://idp.example"}, "need --principal-from jwt-sub"),
        ("header:", {}, "must be none, header:NAME or jwt-sub, not 'header:'"),
    ],
)
def test_principal_settings_refuse_options_that_do_not_fit_together_when_made(
    source: str, options: dict[str, str], says: str
) -> None:
    """The check is the settings' own: a Python caller gets it too, not only the command line."""
    with pytest.raises(ProxyConfigError, match=re.escape(says)):
        PrincipalSettings(source, **options)  # type: ignore[arg-type]
    assert PrincipalSettings("header:X-User").source == "header:X-User"


def test_the_principal_forms_in_the_help_are_the_settings_own() -> None:
    from statecodec.cli._principal import _PRINCIPAL_FORMS  # noqa: PLC0415 - the copy --help shows
    from statecodec.proxy._settings import PRINCIPAL_FORMS  # noqa: PLC0415

    assert _PRINCIPAL_FORMS == PRINCIPAL_FORMS
