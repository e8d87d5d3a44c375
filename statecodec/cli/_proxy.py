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
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from .. import _telemetry
from .._codec import DEFAULT_TTL
from ..adapters.asgi import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_JUDGED_BYTES, DEFAULT_MAX_RESPONSE_BYTES
from ..boundary import DEFAULT_MAX_HOLD, DEFAULT_MAX_HOLDS, DEFAULT_MAX_HOLDS_PER_TOKEN, MAX_HOLD_LIMIT
from ._exit import CliError, ExitCode, missing_extra_error
from ._output import classify, echo, log_format_option, reported
from ._params import (
    HOST_PORT,
    count_option,
    duration_option,
    flow_budget_options,
    keys_option,
    max_token_bytes_option,
    mode_option,
    replay_option,
    require_keys,
    timeline_option,
)
from ._principal import principal_options
from ._sources import open_store

if TYPE_CHECKING:
    from ..proxy._settings import PrincipalSettings

logger = logging.getLogger("statecodec.proxy")


@click.command("proxy")
@click.option(
    "--upstream",
    required=True,
    metavar="URL",
    help="The MCP server to protect, e.g. http://127.0.0.1:9000/mcp.",
)
@click.option(
    "--listen",
    type=HOST_PORT,
    default="127.0.0.1:8000",
    show_default=True,
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
@replay_option(
    "replay", "Replay store shared by every instance: sqlite:PATH, redis://..., or memory: (one instance)."
)
@click.option(
    "--audience", required=True, help="The protected service's name; the same on all its instances."
)
@mode_option("encrypt", "ENCRYPT hides the upstream's state from clients; SIGN only protects it.")
@duration_option("--ttl", DEFAULT_TTL, "Lifetime of sealed states.", positive=True)
@click.option(
    "--namespace",
    help='Replay-store namespace (default: "default", as for every statecodec codec); '
    "every server accepting the same tokens must use the same one.",
)
@max_token_bytes_option("Largest sealed state; a larger one is answered -32603.")
@principal_options
@count_option("--max-body-bytes", DEFAULT_MAX_BODY_BYTES, "Larger request bodies get 413.")
@count_option(
    "--max-response-bytes", DEFAULT_MAX_RESPONSE_BYTES, "Largest inspected JSON response or SSE event."
)
@count_option(
    "--max-judged-bytes",
    DEFAULT_MAX_JUDGED_BYTES,
    "Bytes of answers held for inspection at once, all requests of a process together; "
    "an answer that would take more gets 503. A whole answer of at most 64 KiB is judged "
    "as it arrives, outside this budget (docs/proxy.md).",
)
@duration_option("--connect-timeout", "10s", "Connecting to the upstream.")
@duration_option("--read-timeout", "5m", "Silence allowed between two upstream chunks.")
@duration_option("--graceful-timeout", "30s", "On SIGTERM, time left to open requests.")
@duration_option(
    "--head-timeout", "10s", "A client connection must complete each request head within this.", positive=True
)
@duration_option(
    "--body-timeout",
    "30s",
    "A request body must arrive whole within this after its head (else 408).",
    positive=True,
)
@duration_option(
    "--idle-timeout", "5s", "An idle keep-alive client connection is closed after this.", positive=True
)
@count_option(
    "--max-client-connections",
    None,
    "Client connections at once; beyond, the oldest idle or half-open one is closed "
    "(default: the open-file limit less --max-connections, --max-streams and 64).",
)
@timeline_option("refresh_interval", "Shorten it after a leak (and give keys rotate/retire the same).")
@timeline_option("staleness_limit")
@count_option(
    "--max-concurrent-requests", None, "Answer 503 beyond this many open requests (default: no limit)."
)
@count_option("--max-connections", 100, "Upstream connection pool size.")
@count_option(
    "--max-streams",
    100,
    "Long-lived streams (GET, subscriptions/listen) at once, on connections of their own.",
)
@count_option("--max-streams-per-client", 10, "Streams one client address may hold at once.")
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
    type=click.FloatRange(0, MAX_HOLD_LIMIT),  # shown in the help; BoundaryOptions checks it
    default=DEFAULT_MAX_HOLD,
    show_default=True,
    metavar="SECONDS",
    help="Hold an early retry until its time if at most this far away; else answer at once with its state.",
)
@count_option(
    "--max-holds",
    DEFAULT_MAX_HOLDS,
    "Early retries held at once; one more is answered at once with its state.",
)
@count_option(
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
    type=HOST_PORT,
    help="Serve /livez, /readyz and /metrics (Prometheus) on this separate address "
    "(default: off). Keep it private: clients never need it.",
)
@click.option(
    "--ready-upstream",
    is_flag=True,
    help="/readyz also fails while the upstream does not answer (for an upstream per "
    "instance, a sidecar). Off: readiness covers keys and the replay store only.",
)
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True
)
@log_format_option(
    "json: one JSON object per line on stderr, with every record field (event, reason, kid...)."
)
def proxy_command(principal: PrincipalSettings, **params: Any) -> None:
    """Reverse proxy sealing every requestState of an unprotected MCP server.

    Clients talk to the proxy; the upstream receives only the plaintext states it issued
    itself. Forged, tampered, expired, replayed and mis-bound states are answered with
    -32602 "Invalid or expired requestState" and never reach the upstream.
    """
    (host, port), admin = params.pop("listen"), params.pop("admin_listen")
    log_format = params["log_format"]
    # The proxy's logging lasts as long as the command (its failure line too), and no longer.
    with contextlib.ExitStack() as logs:
        try:
            from ..proxy import _runtime, _settings  # noqa: PLC0415 - loaded only for this command

            logs.enter_context(_runtime.logging_configured(params["log_level"], log_format))
            try:
                settings, clients = _settings.parsed(params, listen=host, principal=principal)
            except _settings.ProxyConfigError as exc:
                raise click.UsageError(str(exc)) from None
            # Keys and store as this command opens them, in the process and in each worker.
            store = functools.partial(open_store, check=True)
            keys = require_keys(settings.keys_spec)
            build = functools.partial(_runtime.built, keys=keys, open_store=store)
            code = _runtime.run(
                settings, host, port, admin, build=build, failure=_failure, clients=clients, announce=echo
            )
        except Exception as exc:
            _report(exc, log_format)
    if code:
        sys.exit(code)


def _report(exc: Exception, log_format: str) -> NoReturn:
    """The one line a proxy that cannot start or serve prints, and its exit code."""
    error = reported(exc, _error)
    if log_format == "json" and not isinstance(exc, ModuleNotFoundError):  # the one line is a JSON object too
        logger.critical(
            "%s",
            error.message,  # one line (CliError)
            extra={**_telemetry.fields("proxy_failed", reason=error.code.slug), "exit_code": int(error.code)},
        )
    else:
        click.echo(f"statecodec: error: {error.message}", err=True)
    sys.exit(int(error.code))


def _error(exc: Exception) -> CliError:
    """:func:`~statecodec.cli._output.classify`, the proxy's own usage errors (exit 2) and its extra."""
    if isinstance(exc, ModuleNotFoundError) and (missing := missing_extra_error(exc, "proxy", "proxy")):
        return missing
    from ..proxy._settings import MissingSettingError, ProxyConfigError  # noqa: PLC0415

    if isinstance(exc, ProxyConfigError | click.ClickException):
        return CliError(ExitCode.USAGE, str(exc))
    if isinstance(exc, MissingSettingError):
        return CliError(ExitCode.KEYS, str(exc))
    return classify(exc)


def _failure(exc: Exception) -> tuple[int, str, str]:
    """How a worker that cannot serve reports ``exc``: its exit code, reason and message."""
    error = _error(exc)
    return int(error.code), error.code.slug, error.message
