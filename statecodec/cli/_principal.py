"""``statecodec proxy --principal-from``: who a state is bound to, and the options of ``jwt-sub``.

Parsed into one :class:`~statecodec.proxy._settings.PrincipalSettings`, which refuses
options that do not fit together; the refusal is reported while the arguments are parsed
(a usage error, exit 2). Building the verifier is the proxy's, in each process that serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import click

from ._exit import ExtraMissingWhileParsing, missing_extra_error
from ._params import grouped

if TYPE_CHECKING:
    from ..proxy._settings import PrincipalSettings

# --help must not import the proxy (PyJWT and friends): the forms are repeated here, and
# tests/proxy/test_proxy_settings.py keeps them equal to proxy._settings.PRINCIPAL_FORMS.
_PRINCIPAL_FORMS: Final = "none, header:NAME or jwt-sub"


def _principal(
    *,
    principal_source: str,
    jwks: str | None,
    issuer: str | None,
    jwt_audience: tuple[str, ...],
    algorithms: tuple[str, ...],
    introspection: str | None,
) -> PrincipalSettings:
    try:
        from ..proxy._settings import PrincipalSettings, ProxyConfigError  # noqa: PLC0415 - only for this command
    except ModuleNotFoundError as exc:
        if (error := missing_extra_error(exc, "proxy", "proxy")) is None:
            raise
        raise ExtraMissingWhileParsing(error) from None

    try:
        return PrincipalSettings(
            principal_source.strip(), jwks, issuer, jwt_audience, algorithms, introspection
        )
    except ProxyConfigError as exc:
        raise click.UsageError(str(exc)) from None


#: --principal-from/--jwks/--issuer/--jwt-audience/--jwt-algorithm/--introspection, handed
#: on as ``principal`` (a checked :class:`~statecodec.proxy._settings.PrincipalSettings`).
principal_options: Final = grouped(
    "principal",
    _principal,
    click.option(
        "--principal-from",
        "principal_source",
        default="none",
        show_default=True,
        metavar="SOURCE",
        help=f"Who a state is bound to: {_PRINCIPAL_FORMS}.",
    ),
    click.option(
        "--jwks",
        metavar="URL",
        help="jwt-sub: verify bearer JWTs against this JWKS (https, or http on loopback).",
    ),
    click.option("--issuer", help="jwt-sub with --jwks: the required iss claim."),
    click.option(
        "--jwt-audience", multiple=True, help="jwt-sub with --jwks: an accepted aud claim (repeatable)."
    ),
    click.option(
        "--jwt-algorithm",
        "algorithms",
        multiple=True,
        help="jwt-sub with --jwks: an accepted algorithm (default: RS*, PS*, ES256/384, EdDSA).",
    ),
    click.option(
        "--introspection",
        metavar="MODULE:FUNCTION",
        help="jwt-sub: fn(token) -> claims or None (sync or async), e.g. RFC 7662 introspection.",
    ),
)
