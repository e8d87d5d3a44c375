"""``statecodec proxy --principal-from``: who a state is bound to, and the options of ``jwt-sub``.

Parsed into one :class:`~statecodec.proxy._settings.PrincipalSettings`, refused while
the arguments are parsed (a usage error, exit 2) unless fully configured: a principal
read in a way the operator did not fully configure would bind states to the wrong
party, or to no one. Building the verifier is the proxy's, in each process that serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import click

from ._params import grouped

if TYPE_CHECKING:
    from ..proxy._settings import PrincipalSettings

_PRINCIPAL_FORMS = "none, header:NAME or jwt-sub"


def checked_principal(principal: PrincipalSettings) -> PrincipalSettings:
    """``principal``, or a usage error naming what is missing or out of place."""
    jwt_options = bool(principal.jwks or principal.issuer or principal.jwt_audience or principal.algorithms)
    if principal.source == "jwt-sub":
        if bool(principal.jwks) == bool(principal.introspection):
            raise click.UsageError(
                "--principal-from jwt-sub needs exactly one of --jwks URL or --introspection"
            )
        if principal.jwks and not (principal.issuer and principal.jwt_audience):
            raise click.UsageError(
                "--jwks needs --issuer and --jwt-audience (the token's expected iss and aud)"
            )
        if principal.introspection and jwt_options:
            raise click.UsageError("--issuer, --jwt-audience and --jwt-algorithm go with --jwks only")
    elif jwt_options or principal.introspection:
        raise click.UsageError(
            "--jwks, --issuer, --jwt-audience and --introspection need --principal-from jwt-sub"
        )
    elif principal.source != "none" and not (
        principal.source.startswith("header:") and principal.source[7:].strip()
    ):
        raise click.UsageError(f"--principal-from must be {_PRINCIPAL_FORMS}, not {principal.source!r}")
    return principal


def _principal(
    *,
    principal_source: str,
    jwks: str | None,
    issuer: str | None,
    jwt_audience: tuple[str, ...],
    algorithms: tuple[str, ...],
    introspection: str | None,
) -> PrincipalSettings:
    from ..proxy._settings import PrincipalSettings  # noqa: PLC0415 - loaded only for this command

    settings = PrincipalSettings(
        principal_source.strip(), jwks, issuer, jwt_audience, algorithms, introspection
    )
    return checked_principal(settings)


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
