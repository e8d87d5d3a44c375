"""The proxy process's runtime: its logging, its event loop, the workers' metrics, the admin thread.

``statecodec proxy`` (:mod:`statecodec.cli._proxy`) parses options and prints results;
everything a running proxy process does between the two lives here, so that the command
line holds no runtime and the runtime no option parsing. Nothing here prints: what the
operator reads on stdout (``admin on URL``, ``listening on URL``) is handed to the
``announce`` callables of the caller. Failures a command reports with an exit code are
ordinary exceptions (``OSError`` for a socket or a listener that cannot start), which the
command line classifies as it classifies any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import queue
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TextIO

from .. import _telemetry
from .._codec import StateCodec
from .._net import bind_socket, socket_url
from ..adapters.asgi import ASGIApp
from ._admin import START_TIMEOUT, admin_listener
from ._settings import ProxyConfigError, ProxySettings, client_limits, timeline

if TYPE_CHECKING:
    from ..ops import Health
    from ..replay import ReplayStore
    from ._guard import ClientLimits

logger = logging.getLogger("statecodec.proxy")

#: ``announce(url)``: what the operator is told once a listener accepts connections.
Announce = Callable[[str], None]
#: The admin endpoints and their socket, served beside the proxy.
Admin = tuple[ASGIApp, socket.socket]
#: ``build(settings)``: :func:`built` with the caller's keys and store opener (a context
#: manager, picklable: each ``--workers`` process builds its own with it).
Build = Callable[[ProxySettings], contextlib.AbstractContextManager[tuple[ASGIApp, Any, "Health"]]]
#: ``failure(exc) -> (exit code, reason, one-line message)``: how the caller reports ``exc``.
Failure = Callable[[Exception], tuple[int, str, str]]


# ---------------------------------------------------------------- logging
class _ProxyLogHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """One line per record on the current stderr; installed once even if the command runs twice.

    The stream is looked up at each record, as ``click.echo`` does, so a stream replaced
    since (a test runner's capture, already closed) is never written to.
    """

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


class _TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: message``, with the message on one line (JSON does that by itself)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return super().formatMessage(record).replace("\n", " ")


def configure_logging(level: str, log_format: str) -> None:
    """Every record of the process (statecodec's, uvicorn's, httpx's) through one handler on the root."""
    if log_format == "json":
        from ..ops import json_formatter  # noqa: PLC0415 - python-json-logger only when asked for

        formatter: logging.Formatter = json_formatter()
    else:
        formatter = _TextFormatter()
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _ProxyLogHandler)), None)
    if handler is None:
        handler = _ProxyLogHandler()
        root.addHandler(handler)
    handler.setFormatter(formatter)
    logging.getLogger("statecodec").setLevel(level.upper())


@contextlib.contextmanager
def logging_configured(level: str, log_format: str) -> Iterator[None]:
    """:func:`configure_logging` for as long as the proxy runs, then the logging found before.

    The command runs in a caller's process too (``statecodec.cli.main([...])``, a test's
    runner): a proxy that stopped, or never started, must not leave its handler on the root
    logger and ``statecodec`` at its level for whatever that process does next.
    """
    root, ours = logging.getLogger(), logging.getLogger("statecodec")
    handlers, level_before = list(root.handlers), ours.level
    configure_logging(level, log_format)
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        ours.setLevel(level_before)


@contextlib.contextmanager
def said_by_the_supervisor() -> Iterator[None]:
    """While a worker builds its proxy, its log records below ERROR are dropped.

    The supervisor built the same proxy a moment before and logged what it found (a key
    file readable by others, the key it mints with) once; each worker's copy would say it
    again (``--workers 2`` printed every start-up warning three times). Errors still pass:
    a worker that cannot start says why. Once built, a worker logs as usual.
    """
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(_errors_only)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(_errors_only)


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


# ---------------------------------------------------------------- metrics
@contextlib.contextmanager
def metrics_shared_by_workers() -> Iterator[None]:
    """``PROMETHEUS_MULTIPROC_DIR`` for the workers, so the supervisor's /metrics sums them.

    Set before any worker starts (each is a fresh interpreter that inherits it): an empty
    directory of this run's own, removed at exit, unless the operator set one.
    """
    from ..ops import MULTIPROCESS_ENV  # noqa: PLC0415

    if os.environ.get(MULTIPROCESS_ENV):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="statecodec-proxy-metrics-") as directory:
        os.environ[MULTIPROCESS_ENV] = directory
        try:
            yield
        finally:
            del os.environ[MULTIPROCESS_ENV]


def without_created_series() -> None:
    """No ``*_created`` series next to each counter: they double what Prometheus stores.

    A process-wide prometheus-client setting, so only the proxy command (which owns its
    process) sets it, never the library.
    """
    with contextlib.suppress(ImportError):
        from prometheus_client import disable_created_metrics  # noqa: PLC0415

        disable_created_metrics()  # type: ignore[no-untyped-call]


# ---------------------------------------------------------------- sockets
def listening_socket(host: str, port: int) -> socket.socket:
    """:func:`~statecodec._net.bind_socket`, or an ``OSError`` naming the address (exit 6)."""
    try:
        return bind_socket(host, port)
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------- the admin listener
def _admin_started(url: str, announce: Announce) -> None:
    logger.info("admin endpoints on %s", url, extra={**_telemetry.fields("admin_started"), "url": url})
    announce(f"admin on {url}")


@contextlib.contextmanager
def admin_in_thread(admin: Admin, announce: Announce) -> Iterator[str]:
    """The admin listener on a thread and event loop of its own, while the supervisor's
    main thread watches the workers; its URL is announced before the proxy's."""
    loop = asyncio.new_event_loop()
    started: queue.Queue[str | BaseException] = queue.Queue()
    stop: asyncio.Future[None] | None = None

    async def serve_admin() -> None:
        nonlocal stop
        stop = loop.create_future()
        try:
            async with admin_listener(*admin) as url:
                started.put(url)
                await stop
        except BaseException as exc:
            started.put(exc)
            raise

    thread = threading.Thread(
        target=loop.run_until_complete, args=(serve_admin(),), name="statecodec-admin", daemon=True
    )
    thread.start()
    try:
        result = started.get(timeout=START_TIMEOUT + 10)
        if isinstance(result, BaseException):
            raise OSError(f"the admin listener did not start: {result}")
        _admin_started(result, announce)
        yield result
    finally:
        loop.call_soon_threadsafe(_release, stop)
        thread.join(15)
        if not thread.is_alive():
            loop.close()


def _release(stop: asyncio.Future[None] | None) -> None:
    if stop is not None and not stop.done():
        stop.set_result(None)


# ---------------------------------------------------------------- building the proxy
@contextlib.contextmanager
def built(
    settings: ProxySettings, keys: str, open_store: Callable[[str], ReplayStore]
) -> Iterator[tuple[ASGIApp, Any, Health]]:
    """The proxy application, the object to close at shutdown, and the readiness checks.

    ``keys`` is the key source's spec; ``open_store(url)`` opens the replay store and checks
    that it answers. Keys, store and options are checked here, before anything listens.
    """
    from .. import ops  # noqa: PLC0415
    from ..boundary import BoundaryOptions  # noqa: PLC0415
    from ..kms import KeyManager  # noqa: PLC0415 - loaded only for this command
    from ._forward import Timeouts  # noqa: PLC0415
    from ._hosts import HostPolicy  # noqa: PLC0415
    from ._readiness import UpstreamHealth  # noqa: PLC0415
    from ._server import ProxyOptions, build_proxy  # noqa: PLC0415

    principal, closer = settings.principal.build()
    tl = timeline(settings)
    manager = KeyManager(
        keys,
        refresh_interval=tl["refresh_interval"],
        staleness_limit=tl["staleness_limit"],
        max_ttl=tl["max_ttl"],
    )
    manager.start()  # exit 3 or 7 before listening if no keys can be had
    try:
        store = open_store(settings.replay)  # exit 4 before listening if it cannot serve
        try:
            # No namespace of its own: a proxy and a protect() server sharing keys, audience and
            # store must share single use too, so both take the codec's default.
            codec = StateCodec(manager, replay=store, **settings.codec)
            try:
                options = ProxyOptions(
                    boundary=BoundaryOptions(codec, principal=principal, **settings.boundary),
                    timeouts=Timeouts(connect=settings.connect_timeout, read=settings.read_timeout),
                    hosts=HostPolicy.of(settings.allowed_hosts, settings.allowed_origins),
                    **settings.forwarding,
                )
                app = build_proxy(options)
            except ValueError as exc:
                raise ProxyConfigError(str(exc)) from None
            _warn_if_upstream_silent(settings.forwarding["upstream"])
            health = (
                UpstreamHealth(manager, store, settings.forwarding["upstream"])
                if settings.ready_upstream
                else ops.Health(manager, store)
            )
            try:
                yield app, closer, health
            finally:
                health.close()
        finally:
            store.close()
    finally:
        manager.stop()


def _warn_if_upstream_silent(upstream: str) -> None:
    """A warning before the proxy listens when its upstream does not answer (it starts anyway:
    the upstream may come up after it, and until then clients get 502 naming no secret)."""
    from ..replay._url import redact  # noqa: PLC0415
    from ._readiness import probe_upstream  # noqa: PLC0415

    why = probe_upstream(upstream)
    if why is not None:
        logger.warning(
            "the upstream %s does not answer (%s); serving anyway: requests get HTTP 502 until it does",
            redact(upstream),
            why,
            extra={**_telemetry.fields("upstream_silent", detail=why), "upstream": redact(upstream)},
        )


def serve_on(
    app: ASGIApp,
    closer: Any,
    sock: socket.socket,
    settings: ProxySettings,
    *,
    clients: ClientLimits,
    ready: Announce,
    admin: Admin | None = None,
    announce: Announce = print,
) -> int | None:
    """Serve the proxy on ``sock`` until SIGINT/SIGTERM; the signal that stopped it (:func:`run_serving`)."""
    from ._server import serve  # noqa: PLC0415

    serving = serve(
        app,
        sock,
        graceful_timeout=settings.graceful_timeout,
        limit_concurrency=settings.max_concurrent_requests,
        clients=clients,
        on_ready=ready,
    )
    return run_serving(serving, closer, admin=admin, announce=announce)


# ---------------------------------------------------------------- the process
def run(
    settings: ProxySettings,
    host: str,
    port: int,
    admin_address: tuple[str, int] | None,
    *,
    build: Build,
    failure: Failure,
    clients: ClientLimits,
    announce: Announce,
) -> int:
    """Run the proxy process until SIGINT/SIGTERM: one server, or a supervisor of workers; its exit code.

    ``build`` builds the proxy (:func:`built`, with the caller's keys and store opener): keys,
    store and options are checked then, before anything listens. With workers they stay
    open in the supervisor for ``/readyz``; each worker builds its own (:func:`serve_worker`).
    """
    from .. import ops  # noqa: PLC0415
    from ._workers import Supervisor  # noqa: PLC0415

    with contextlib.ExitStack() as stack:
        if settings.workers > 1 and admin_address is not None:
            stack.enter_context(metrics_shared_by_workers())
        _telemetry.resolve()  # the metrics libraries load now, not on the first request
        without_created_series()
        ready = functools.partial(_listening, settings, announce)
        app, closer, health = stack.enter_context(build(settings))
        sock = stack.enter_context(contextlib.closing(listening_socket(host, port)))
        admin = None
        if admin_address is not None:
            admin = (
                ops.app(health),
                stack.enter_context(contextlib.closing(listening_socket(*admin_address))),
            )
        if settings.workers == 1:
            stopped_by = serve_on(
                app, closer, sock, settings, clients=clients, ready=ready, admin=admin, announce=announce
            )
            log_stopped(stopped_by, settings)
            return 0
        if admin is not None:
            stack.enter_context(admin_in_thread(admin, announce))
        worker = functools.partial(serve_worker, settings, build, failure)
        supervisor = Supervisor(worker, sock, settings.workers, stop_timeout=settings.graceful_timeout)
        code = supervisor.run(lambda: ready(socket_url(sock)))
        if not code:
            log_stopped(supervisor.stopped_by, settings)
    return code


def serve_worker(
    settings: ProxySettings, build: Build, failure: Failure, sock: socket.socket, ready: Callable[[], None]
) -> None:
    """One ``--workers`` process: the same proxy as a single one, on the inherited socket.

    It runs in a fresh interpreter, so ``build`` and ``failure`` are module-level functions,
    or partials of them (found again by name). A worker that cannot serve logs why and
    exits with the code ``failure`` gives, which the supervisor makes the group's.
    """
    configure_logging(settings.log_level, settings.log_format)
    try:
        _telemetry.resolve()
        with contextlib.ExitStack() as stack:
            with said_by_the_supervisor():
                app, closer, _ = stack.enter_context(build(settings))
            clients = client_limits(settings)
            serve_on(app, closer, sock, settings, clients=clients, ready=lambda url: ready())
    except Exception as exc:
        code, reason, message = failure(exc)
        logger.error(
            "worker cannot serve: %s", message, extra=_telemetry.fields("worker_failed", reason=reason)
        )
        sys.exit(code)


def _listening(settings: ProxySettings, announce: Announce, url: str) -> None:
    from ..replay._url import redact  # noqa: PLC0415

    audience, mode = settings.boundary["audience"], settings.codec["mode"]
    logger.info(
        "%s -> %s mode=%s audience=%r principal=%s replay=%s workers=%d",
        url, redact(settings.forwarding["upstream"]), mode, audience,
        settings.principal.describe(), redact(settings.replay), settings.workers,
        extra={
            **_telemetry.fields("proxy_started", audience=audience, mode=mode, workers=settings.workers),
            "url": url,
        },
    )  # fmt: skip
    announce(f"listening on {url}")


# ---------------------------------------------------------------- the event loop
def run_serving(
    serving: Awaitable[None], closer: Any, *, admin: Admin | None = None, announce: Announce = print
) -> int | None:
    """Run ``serving`` (the proxy until SIGINT/SIGTERM) on the proxy's event loop, then close ``closer``.

    uvicorn handles SIGINT/SIGTERM itself (graceful shutdown), then re-raises the signal
    to the handler it found: that one only notes the signal for the run, so shutdown ends
    here, with the store closed and exit code 0, rather than by the default handler; the
    signal noted is returned (``None``: the server ended by itself). ``admin``, when given,
    is served on the same loop first (its URL announced before the proxy's).
    """
    from ._server import event_loop_factory  # noqa: PLC0415

    received: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, frame: received.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_serve_then_close(serving, closer, admin, announce))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return received[0] if received else None


def log_stopped(signum: int | None, settings: ProxySettings) -> None:
    """One record when the proxy has stopped: operators see a SIGTERM was obeyed, not a crash."""
    name = signal.Signals(signum).name if signum is not None else None
    logger.info(
        "proxy stopped%s: open requests drained (graceful timeout %ds)",
        f" on {name}" if name else "",
        settings.graceful_timeout,
        extra=_telemetry.fields("proxy_stopped", signal=name, workers=settings.workers),
    )


async def _serve_then_close(
    serving: Awaitable[None], closer: Any, admin: Admin | None, announce: Announce
) -> None:
    """The admin listener first (its URL announced), then the proxy until shutdown."""
    try:
        async with contextlib.AsyncExitStack() as stack:
            if admin is not None:
                url = await stack.enter_async_context(admin_listener(*admin))
                _admin_started(url, announce)
            await serving
    finally:
        if closer is not None:
            await closer.aclose()


__all__ = [
    "Admin",
    "Announce",
    "Build",
    "Failure",
    "admin_in_thread",
    "built",
    "configure_logging",
    "logging_configured",
    "listening_socket",
    "log_stopped",
    "metrics_shared_by_workers",
    "run",
    "run_serving",
    "said_by_the_supervisor",
    "serve_on",
    "serve_worker",
    "without_created_series",
]
