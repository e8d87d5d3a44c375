"""``statecodec proxy``: protect an MCP server in any language by deployment alone.

A long-running command, so it does not print the one-shot ``--json`` document of the
other commands: it prints ``admin on URL`` (with ``--admin-listen``) and then
``listening on URL`` on stdout once it accepts connections, logs to stderr (rejections
at WARNING, with the reason and never a token; ``--log-format json``: one JSON object
per line), and exits with the usual codes when it cannot start, before it listens
(3 keys, 4 replay store, 6 address in use, 7 key source down).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from .. import _telemetry
from .._codec import DEFAULT_TTL
from ..adapters.asgi import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_RESPONSE_BYTES, PrincipalFn
from ..boundary import DEFAULT_MAX_HOLD, DEFAULT_MAX_HOLDS, DEFAULT_MAX_HOLDS_PER_TOKEN
from ._exit import CliError, ExitCode
from ._output import classify, echo
from ._params import (
    TIMELINE_HELP,
    F,
    duration_option,
    flow_budget_options,
    keys_option,
    max_token_bytes_option,
    mode_option,
    require_keys,
)

if TYPE_CHECKING:
    from ..proxy._runtime import ProxySettings

logger = logging.getLogger("statecodec.proxy")

_PRINCIPAL_FORMS = "none, header:NAME or jwt-sub"


@dataclass(frozen=True)
class PrincipalOptions:
    source: str
    jwks: str | None
    issuer: str | None
    jwt_audience: tuple[str, ...]
    algorithms: tuple[str, ...]
    introspection: str | None

    def check(self) -> None:
        """Usage errors: a principal read in a way the operator did not fully configure."""
        jwt_options = bool(self.jwks or self.issuer or self.jwt_audience or self.algorithms)
        if self.source == "jwt-sub":
            if bool(self.jwks) == bool(self.introspection):
                raise click.UsageError(
                    "--principal-from jwt-sub needs exactly one of --jwks URL or --introspection"
                )
            if self.jwks and not (self.issuer and self.jwt_audience):
                raise click.UsageError(
                    "--jwks needs --issuer and --jwt-audience (the token's expected iss and aud)"
                )
            if self.introspection and jwt_options:
                raise click.UsageError("--issuer, --jwt-audience and --jwt-algorithm go with --jwks only")
        elif jwt_options or self.introspection:
            raise click.UsageError(
                "--jwks, --issuer, --jwt-audience and --introspection need --principal-from jwt-sub"
            )
        elif self.source != "none" and not (self.source.startswith("header:") and self.source[7:].strip()):
            raise click.UsageError(f"--principal-from must be {_PRINCIPAL_FORMS}, not {self.source!r}")

    def describe(self) -> str:
        if self.source == "jwt-sub":
            return (
                f"jwt-sub via {'JWKS ' + str(self.jwks) if self.jwks else 'hook ' + str(self.introspection)}"
            )
        return self.source

    def build(self) -> tuple[PrincipalFn | None, Any]:
        """The principal callable, and the object to close at shutdown (or None)."""
        from ..proxy import DEFAULT_ALGORITHMS, BearerPrincipal, JWKSVerifier, header_principal, load_hook  # noqa: PLC0415

        if self.source == "none":
            return None, None
        if self.source.startswith("header:"):
            return header_principal(self.source[7:]), None
        if self.introspection:
            try:
                hook = load_hook(self.introspection)
            except (ImportError, AttributeError, ValueError, TypeError) as exc:
                raise CliError(ExitCode.USAGE, f"--introspection {self.introspection}: {exc}") from None
            return BearerPrincipal(hook), None
        if not (self.jwks and self.issuer):  # check() has made sure; this keeps the types honest
            raise click.UsageError("--jwks needs --issuer")
        try:
            verifier = JWKSVerifier(
                self.jwks,
                issuer=self.issuer,
                audience=list(self.jwt_audience),
                algorithms=self.algorithms or DEFAULT_ALGORITHMS,
            )
        except ValueError as exc:
            raise CliError(ExitCode.USAGE, str(exc)) from None
        return BearerPrincipal(verifier), verifier


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8000, [::1]:8000)")
    return host.strip("[]"), int(port)


def _host_lists(
    listen: str, hosts: tuple[str, ...], origins: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The Host and Origin lists the proxy answers (DNS-rebinding protection, see proxy/_hosts.py).

    On a loopback address the SDKs' loopback lists are the default. Anywhere else no list is
    safe to guess: without ``--allowed-host`` the proxy refuses to start (exit 3, a missing
    setting), rather than answer every name a rebinding DNS record could point at it.
    """
    from ..proxy._hosts import LOOPBACK_HOSTS, LOOPBACK_ORIGINS, HostPolicy, is_loopback  # noqa: PLC0415

    loopback = is_loopback(listen)
    if not hosts and not loopback:
        raise CliError(
            ExitCode.KEYS,
            f"--listen {listen} is not a loopback address: name the Host values clients use with "
            "--allowed-host (e.g. --allowed-host mcp.example.com), or --allowed-host '*' if a "
            "front end checks Host",
        )
    hosts = hosts or LOOPBACK_HOSTS
    origins = origins or (LOOPBACK_ORIGINS if loopback else ())
    try:
        HostPolicy.of(hosts, origins)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--allowed-host' / '--allowed-origin'") from None
    return tuple(hosts), tuple(origins)


def _count_option(flag: str, default: int, text: str) -> Callable[[F], F]:
    return click.option(flag, type=click.IntRange(1), default=default, show_default=True, help=text)


@click.command("proxy")
@click.option(
    "--upstream",
    required=True,
    metavar="URL",
    help="The MCP server to protect, e.g. http://127.0.0.1:9000/mcp.",
)
@click.option(
    "--listen",
    default="127.0.0.1:8000",
    show_default=True,
    metavar="HOST:PORT",
    help="Address to serve on (port 0: any free port).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="HOST",
    help="A Host clients may use: NAME or NAME:PORT, [IPv6], * for any (repeatable). Default on a "
    "loopback --listen: localhost, 127.0.0.1, [::1]; required on any other address.",
)
@click.option(
    "--allowed-origin",
    "allowed_origins",
    multiple=True,
    metavar="ORIGIN",
    help="An Origin browsers may send: SCHEME://NAME[:PORT], * for any (repeatable); requests "
    "without Origin always pass. Default: the loopback origins on a loopback --listen, else none.",
)
@keys_option
@click.option(
    "--replay",
    required=True,
    metavar="URL",
    envvar="STATECODEC_REPLAY",
    show_envvar=True,
    help="Replay store shared by every instance: sqlite:PATH, redis://..., or memory: (one instance).",
)
@click.option(
    "--audience", required=True, help="The protected service's name; the same on all its instances."
)
@mode_option("encrypt", "ENCRYPT hides the upstream's state from clients; SIGN only protects it.")
@duration_option("--ttl", DEFAULT_TTL, "Lifetime of sealed states.")
@click.option(
    "--namespace",
    help='Replay-store namespace (default: "default", as for every statecodec codec); '
    "every server accepting the same tokens must use the same one.",
)
@max_token_bytes_option("Largest sealed state; a larger one is answered -32603.")
@click.option(
    "--principal-from",
    "principal_source",
    default="none",
    show_default=True,
    metavar="SOURCE",
    help=f"Who a state is bound to: {_PRINCIPAL_FORMS}.",
)
@click.option(
    "--jwks",
    metavar="URL",
    help="jwt-sub: verify bearer JWTs against this JWKS (https, or http on loopback).",
)
@click.option("--issuer", help="jwt-sub with --jwks: the required iss claim.")
@click.option(
    "--jwt-audience", multiple=True, help="jwt-sub with --jwks: an accepted aud claim (repeatable)."
)
@click.option(
    "--jwt-algorithm",
    "algorithms",
    multiple=True,
    help="jwt-sub with --jwks: an accepted algorithm (default: RS*, PS*, ES256/384, EdDSA).",
)
@click.option(
    "--introspection",
    metavar="MODULE:FUNCTION",
    help="jwt-sub: fn(token) -> claims or None (sync or async), e.g. RFC 7662 introspection.",
)
@_count_option("--max-body-bytes", DEFAULT_MAX_BODY_BYTES, "Larger request bodies get 413.")
@_count_option(
    "--max-response-bytes", DEFAULT_MAX_RESPONSE_BYTES, "Largest inspected JSON response or SSE event."
)
@duration_option("--connect-timeout", "10s", "Connecting to the upstream.")
@duration_option("--read-timeout", "5m", "Silence allowed between two upstream chunks.")
@duration_option("--graceful-timeout", "30s", "On SIGTERM, time left to open requests.")
@duration_option("--head-timeout", "10s", "A client connection must complete each request head within this.")
@duration_option(
    "--body-timeout", "30s", "A request body must arrive whole within this after its head (else 408)."
)
@duration_option("--idle-timeout", "5s", "An idle keep-alive client connection is closed after this.")
@click.option(
    "--max-client-connections",
    type=click.IntRange(1),
    help="Client connections at once; beyond, the oldest idle or half-open one is closed "
    "(default: the open-file limit less --max-connections, --max-streams and 64).",
)
@duration_option(
    "--refresh-interval",
    "1m",  # the KeyManager's default (kms stays unimported until the proxy starts)
    TIMELINE_HELP["refresh_interval"] + " Shorten it after a leak (and give keys rotate/retire the same).",
)
@duration_option("--staleness-limit", "15m", TIMELINE_HELP["staleness_limit"])
@click.option(
    "--max-concurrent-requests",
    type=click.IntRange(1),
    help="Answer 503 beyond this many open requests (default: no limit).",
)
@_count_option("--max-connections", 100, "Upstream connection pool size.")
@_count_option(
    "--max-streams",
    100,
    "Long-lived streams (GET, subscriptions/listen) at once, on connections of their own.",
)
@_count_option("--max-streams-per-client", 10, "Streams one client address may hold at once.")
@flow_budget_options(
    "Most states one flow may have; a later round is refused (the clients' own default is 10).",
    "A flow's states are refused once it started longer ago than this.",
)
@click.option(
    "--retry-after",
    type=click.FloatRange(0, min_open=True),
    metavar="SECONDS",
    help="Pace requestState-only rounds: their retries run no earlier than this (default: no pacing).",
)
@click.option(
    "--max-hold",
    type=click.FloatRange(0, 300),
    default=DEFAULT_MAX_HOLD,
    show_default=True,
    metavar="SECONDS",
    help="Hold an early retry until its time if at most this far away; else answer at once with its state.",
)
@_count_option(
    "--max-holds",
    DEFAULT_MAX_HOLDS,
    "Early retries held at once; one more is answered at once with its state.",
)
@_count_option(
    "--max-holds-per-token", DEFAULT_MAX_HOLDS_PER_TOKEN, "Early retries of one token held at once."
)
@click.option(
    "--passthrough-path",
    "passthrough_paths",
    multiple=True,
    metavar="PATH",
    help="An exact path, as clients send it, not judged as MCP (e.g. a form-encoded OAuth "
    "endpoint); a JSON body carrying a requestState there is refused. Never the MCP path.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Processes serving the same socket (one core each); they share keys and the replay "
    "store, so memory: is refused with more than one.",
)
@click.option(
    "--admin-listen",
    metavar="HOST:PORT",
    help="Serve /livez, /readyz and /metrics (Prometheus) on this separate address "
    "(default: off). Keep it private: clients never need it.",
)
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON object per line on stderr, with every record field (event, reason, kid...).",
)
def proxy_command(**params: Any) -> None:
    """Reverse proxy sealing every requestState of an unprotected MCP server.

    Clients talk to the proxy; the upstream receives only the plaintext states it issued
    itself. Forged, tampered, expired, replayed and mis-bound states are answered with
    -32602 "Invalid or expired requestState" and never reach the upstream.
    """
    principal = PrincipalOptions(
        params.pop("principal_source").strip(),
        params.pop("jwks"),
        params.pop("issuer"),
        params.pop("jwt_audience"),
        params.pop("algorithms"),
        params.pop("introspection"),
    )
    principal.check()
    host, port = _listen(params.pop("listen"))
    admin = params.pop("admin_listen")
    admin_address = None if admin is None else _listen(admin)
    log_format = params.pop("log_format")
    log_level = params.pop("log_level")
    try:
        from ..proxy._runtime import configure_logging  # noqa: PLC0415 - loaded only for this command

        configure_logging(log_level, log_format)
        params["allowed_hosts"], params["allowed_origins"] = _host_lists(
            host, params.pop("allowed_hosts"), params.pop("allowed_origins")
        )
        from ..proxy._runtime import ProxySettings  # noqa: PLC0415

        settings = ProxySettings(principal=principal, log_level=log_level, log_format=log_format, **params)
        _run(settings, host, port, admin_address)
    except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, KeyboardInterrupt):
        raise
    except Exception as exc:
        if os.environ.get("STATECODEC_DEBUG"):
            raise
        error = classify(exc)
        message = error.message  # one line (CliError)
        if log_format == "json":  # the one line is a JSON object too
            logger.critical(
                "%s",
                message,
                extra={
                    **_telemetry.fields("proxy_failed", reason=error.code.slug),
                    "exit_code": int(error.code),
                },
            )
        else:
            click.echo(f"statecodec: error: {message}", err=True)
        sys.exit(int(error.code))


def _run(settings: ProxySettings, host: str, port: int, admin_address: tuple[str, int] | None) -> None:
    from ..proxy import _runtime  # noqa: PLC0415 - loaded only for this command

    if settings.ttl <= 0:
        raise click.BadParameter("must be positive", param_hint="'--ttl'")
    for name in ("head_timeout", "body_timeout", "idle_timeout"):
        if getattr(settings, name) <= 0:
            raise click.BadParameter("must be positive", param_hint=f"'--{name.replace('_', '-')}'")
    clients = _client_limits(settings)  # an open-file limit too low to serve: a usage error, before listening
    try:
        _runtime.timeline(settings)  # validated where it is defined, before anything starts
    except ValueError as exc:
        raise click.UsageError(f"key timeline: {exc}") from None
    if settings.workers > 1 and settings.replay.strip().lower().startswith("memory"):
        raise click.UsageError(
            "--workers N needs a replay store the workers share (sqlite:PATH or redis://...): "
            "with memory: each worker would accept every token once"
        )
    code = _runtime.run(
        settings,
        host,
        port,
        admin_address,
        build=_built,
        clients=clients,
        worker=functools.partial(_serve_worker, settings),
        announce=echo,
    )
    if code:
        sys.exit(code)


@contextlib.contextmanager
def _built(settings: ProxySettings) -> Iterator[tuple[Any, Any, Any]]:
    """:func:`statecodec.proxy._runtime.built`, its failures in the command's exit codes."""
    from ..proxy._runtime import ProxyConfigError, built  # noqa: PLC0415
    from ._sources import open_store  # noqa: PLC0415

    keys = require_keys(settings.keys_spec)
    try:
        with built(settings, keys, functools.partial(open_store, check=True)) as running:
            yield running
    except ProxyConfigError as exc:
        raise CliError(ExitCode.USAGE, str(exc)) from None


def _client_limits(settings: ProxySettings) -> Any:
    from ..proxy import ClientLimits  # noqa: PLC0415
    from ..proxy._guard import default_max_connections, raise_open_file_limit  # noqa: PLC0415

    raise_open_file_limit()  # the command owns its process (workers inherit the limit)
    try:
        most = settings.max_client_connections or default_max_connections(_descriptors_upstream(settings))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return ClientLimits(settings.head_timeout, settings.body_timeout, settings.idle_timeout, most)


def _descriptors_upstream(settings: ProxySettings) -> int:
    """The most connections the proxy opens to the upstream at once."""
    return settings.max_connections + settings.max_streams


def _serve_worker(settings: ProxySettings, sock: socket.socket, announce: Any) -> None:
    """One ``--workers`` process: the same proxy as a single one, on the inherited socket."""
    from ..proxy._runtime import configure_logging, said_by_the_supervisor, serve_on  # noqa: PLC0415

    configure_logging(settings.log_level, settings.log_format)
    try:
        _telemetry.resolve()
        with contextlib.ExitStack() as stack:
            with said_by_the_supervisor():
                app, closer, _ = stack.enter_context(_built(settings))
            clients = _client_limits(settings)
            serve_on(
                app, closer, sock, settings, clients=clients, ready=lambda url: announce(), announce=echo
            )
    except Exception as exc:
        error = classify(exc) if not isinstance(exc, click.ClickException) else None
        logger.error(
            "worker cannot serve: %s",
            error.message if error else exc,
            extra=_telemetry.fields("worker_failed", reason=error.code.slug if error else "usage"),
        )
        sys.exit(int(error.code) if error else 2)
