"""What a proxy process is built from: its settings as the command line parsed them, and their checks.

``statecodec proxy`` (:mod:`statecodec.cli._proxy`) parses options into one
:class:`ProxySettings`; :mod:`statecodec.proxy._runtime` builds and runs the proxy from
it, once in a single process and once in each ``--workers`` process (so it is picklable:
plain values, no open resource). The settings the proxy hands to an object it builds are
kept as that object's keyword arguments, under the names the constructor takes
(:attr:`ProxySettings.codec` for the :class:`~statecodec.StateCodec`,
:attr:`~ProxySettings.boundary` for the :class:`~statecodec.boundary.BoundaryOptions`,
:attr:`~ProxySettings.forwarding` for the :class:`~statecodec.proxy.ProxyOptions`), and
passed as they are: a setting is named once, by the constructor that validates it.

The checks here are those the command line cannot make while it parses (they need the
process's open-file limit, or several settings at once); each failure is a
:class:`ProxyConfigError`, a usage error (exit 2), raised before anything listens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._errors import StateCodecError

if TYPE_CHECKING:
    from ..adapters.asgi import PrincipalFn
    from ._guard import ClientLimits

#: The parsed options that are the codec's, the boundary's and the forwarder's own
#: arguments (the command line's option names are the constructors' parameter names).
CODEC_SETTINGS: Final = ("mode", "ttl", "namespace", "max_token_bytes", "max_rounds", "max_flow_age")
BOUNDARY_SETTINGS: Final = ("audience", "retry_after", "max_hold", "max_holds", "max_holds_per_token")
FORWARDING_SETTINGS: Final = (
    "upstream",
    "max_body_bytes",
    "max_response_bytes",
    "max_judged_bytes",
    "max_connections",
    "max_streams",
    "max_streams_per_client",
    "passthrough_paths",
)


class ProxyConfigError(StateCodecError, ValueError):
    """Options the proxy cannot run with, found before it listens (a usage error: exit 2)."""


class MissingSettingError(StateCodecError):
    """A setting the proxy will not guess is missing (a configuration error: exit 3)."""


def host_lists(
    listen: str, hosts: tuple[str, ...], origins: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The Host and Origin lists the proxy answers on ``listen`` (DNS-rebinding protection, :mod:`._hosts`).

    On a loopback address the SDKs' loopback lists are the default. Anywhere else no list is
    safe to guess: without ``--allowed-host`` the proxy refuses to start
    (:class:`MissingSettingError`), rather than answer every name a rebinding DNS record could
    point at it. A value that is no Host or Origin is a :class:`ProxyConfigError`.
    """
    from ._hosts import LOOPBACK_HOSTS, LOOPBACK_ORIGINS, HostPolicy, is_loopback  # noqa: PLC0415

    loopback = is_loopback(listen)
    if not hosts and not loopback:
        raise MissingSettingError(
            f"--listen {listen} is not a loopback address: name the Host values clients use with "
            "--allowed-host (e.g. --allowed-host mcp.example.com), or --allowed-host '*' if a "
            "front end checks Host"
        )
    hosts = hosts or LOOPBACK_HOSTS
    origins = origins or (LOOPBACK_ORIGINS if loopback else ())
    try:
        HostPolicy.of(hosts, origins)
    except ValueError as exc:
        raise ProxyConfigError(f"--allowed-host / --allowed-origin: {exc}") from None
    return tuple(hosts), tuple(origins)


#: What ``--principal-from`` takes.
PRINCIPAL_FORMS: Final = "none, header:NAME or jwt-sub"


@dataclass(frozen=True)
class PrincipalSettings:
    """How the proxy learns who is asking (``--principal-from`` and the options of ``jwt-sub``).

    Checked when made (:class:`ProxyConfigError`, which the command line reports while it
    parses): a principal read in a way the operator did not fully configure would bind
    states to the wrong party, or to no one. :meth:`build` makes the principal callable in
    each process that serves.
    """

    source: str
    jwks: str | None = None
    issuer: str | None = None
    jwt_audience: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ()
    introspection: str | None = None

    def __post_init__(self) -> None:
        jwt_options = bool(self.jwks or self.issuer or self.jwt_audience or self.algorithms)
        if self.source == "jwt-sub":
            if bool(self.jwks) == bool(self.introspection):
                raise ProxyConfigError(
                    "--principal-from jwt-sub needs exactly one of --jwks URL or --introspection"
                )
            if self.jwks and not (self.issuer and self.jwt_audience):
                raise ProxyConfigError(
                    "--jwks needs --issuer and --jwt-audience (the token's expected iss and aud)"
                )
            if self.introspection and jwt_options:
                raise ProxyConfigError("--issuer, --jwt-audience and --jwt-algorithm go with --jwks only")
        elif jwt_options or self.introspection:
            raise ProxyConfigError(
                "--jwks, --issuer, --jwt-audience and --introspection need --principal-from jwt-sub"
            )
        elif self.source != "none" and not (self.source.startswith("header:") and self.source[7:].strip()):
            raise ProxyConfigError(f"--principal-from must be {PRINCIPAL_FORMS}, not {self.source!r}")

    def describe(self) -> str:
        """One phrase for the start-up log line."""
        if self.source == "jwt-sub":
            return (
                f"jwt-sub via {'JWKS ' + str(self.jwks) if self.jwks else 'hook ' + str(self.introspection)}"
            )
        return self.source

    def build(self) -> tuple[PrincipalFn | None, Any]:
        """The principal callable, and the object to close at shutdown (or None)."""
        from ._principal import (  # noqa: PLC0415 - PyJWT only for the process that serves
            DEFAULT_ALGORITHMS,
            BearerPrincipal,
            JWKSVerifier,
            header_principal,
            load_hook,
        )

        if self.source == "none":
            return None, None
        if self.source.startswith("header:"):
            return header_principal(self.source[7:]), None
        if self.introspection:
            try:
                hook = load_hook(self.introspection)
            except (ImportError, AttributeError, ValueError, TypeError) as exc:
                raise ProxyConfigError(f"--introspection {self.introspection}: {exc}") from None
            return BearerPrincipal(hook), None
        if not (self.jwks and self.issuer):  # __post_init__ has made sure; this keeps the types honest
            raise ProxyConfigError("--jwks needs --issuer")
        try:
            verifier = JWKSVerifier(
                self.jwks,
                issuer=self.issuer,
                audience=list(self.jwt_audience),
                algorithms=self.algorithms or DEFAULT_ALGORITHMS,
            )
        except ValueError as exc:
            raise ProxyConfigError(str(exc)) from None
        return BearerPrincipal(verifier), verifier


@dataclass(frozen=True)
class ProxySettings:
    """Everything a proxy process builds itself from: picklable, for ``--workers``.

    ``codec``, ``boundary`` and ``forwarding`` are keyword arguments of the
    :class:`~statecodec.StateCodec`, the :class:`~statecodec.boundary.BoundaryOptions` and
    the :class:`~statecodec.proxy.ProxyOptions` (see the module's docstring); an option
    not given is absent, so the constructor's default applies.
    """

    principal: PrincipalSettings
    log_level: str
    log_format: str
    keys_spec: str | None
    replay: str
    codec: Mapping[str, Any]
    boundary: Mapping[str, Any]
    forwarding: Mapping[str, Any]
    connect_timeout: int
    read_timeout: int
    graceful_timeout: int
    head_timeout: int
    body_timeout: int
    idle_timeout: int
    max_client_connections: int | None
    max_concurrent_requests: int | None
    workers: int
    allowed_hosts: tuple[str, ...]
    allowed_origins: tuple[str, ...]
    refresh_interval: int
    staleness_limit: int
    #: ``/readyz`` also asks whether the upstream answers (``--ready-upstream``).
    ready_upstream: bool = False

    @classmethod
    def of(cls, options: dict[str, Any], **rest: Any) -> ProxySettings:
        """The settings of the parsed ``options`` (named as the command's options), and ``rest``."""

        def taken(names: tuple[str, ...]) -> dict[str, Any]:
            given = {name: options.pop(name) for name in names}
            return {name: value for name, value in given.items() if value is not None}

        return cls(
            codec=taken(CODEC_SETTINGS),
            boundary=taken(BOUNDARY_SETTINGS),
            forwarding=taken(FORWARDING_SETTINGS),
            **options,
            **rest,
        )


def timeline(settings: ProxySettings) -> dict[str, float]:
    """The KeyManager's timeline options (``ValueError`` if they cannot work together)."""
    from ..kms import Timeline  # noqa: PLC0415

    options = {
        "refresh_interval": float(settings.refresh_interval),
        "staleness_limit": float(settings.staleness_limit),
        "max_ttl": max(float(settings.codec["ttl"]), 600.0),
    }
    Timeline(**options)
    return options


def client_limits(settings: ProxySettings) -> ClientLimits:
    """The client connections' limits; the open-file limit raised first, as far as it goes.

    Raising it is a process-wide step, taken by whoever owns the process (the command;
    workers inherit the limit). A limit too low to serve is a :class:`ProxyConfigError`.
    """
    from ._guard import ClientLimits, default_max_connections, raise_open_file_limit  # noqa: PLC0415

    raise_open_file_limit()
    upstream = settings.forwarding["max_connections"] + settings.forwarding["max_streams"]
    try:
        most = settings.max_client_connections or default_max_connections(upstream)
    except ValueError as exc:
        raise ProxyConfigError(str(exc)) from None
    return ClientLimits(settings.head_timeout, settings.body_timeout, settings.idle_timeout, most)


def parsed(
    options: dict[str, Any], *, listen: str, principal: PrincipalSettings
) -> tuple[ProxySettings, ClientLimits]:
    """The settings of the command's parsed ``options`` for a proxy on ``listen``, checked; the client limits.

    The Host and Origin lists are completed for the address (:func:`host_lists`), then the
    settings checked together (:func:`checked`): everything before anything starts.
    """
    options["allowed_hosts"], options["allowed_origins"] = host_lists(
        listen, options.pop("allowed_hosts"), options.pop("allowed_origins")
    )
    settings = ProxySettings.of(options, principal=principal)
    return settings, checked(settings)


def checked(settings: ProxySettings) -> ClientLimits:
    """The checks of several settings at once, before anything starts; the client limits."""
    if settings.workers > 1 and settings.replay.strip().lower().startswith("memory"):
        raise ProxyConfigError(
            "--workers N needs a replay store the workers share (sqlite:PATH or redis://...): "
            "with memory: each worker would accept every token once"
        )
    clients = client_limits(settings)
    try:
        timeline(settings)  # validated where it is defined
    except ValueError as exc:
        raise ProxyConfigError(f"key timeline: {exc}") from None
    return clients


__all__ = [
    "BOUNDARY_SETTINGS",
    "CODEC_SETTINGS",
    "FORWARDING_SETTINGS",
    "MissingSettingError",
    "PrincipalSettings",
    "ProxyConfigError",
    "ProxySettings",
    "checked",
    "client_limits",
    "host_lists",
    "parsed",
    "timeline",
]
