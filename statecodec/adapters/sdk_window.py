"""Moving off the Python SDK's own requestState boundary without breaking a flow in flight.

A server that replaces ``RequestStateSecurity`` (``MCPServer(request_state_security=...)``,
or FastMCP's, which is the same SDK class) with :func:`statecodec.adapters.mcp.protect`
would refuse every token its instances handed out before the switch: the flows in
flight fail. :class:`SDKStateWindow`, passed as ``protect(..., sdk_window=...)``, lets
the server accept the SDK's own tokens for a bounded window, and only them besides
statecodec's:

- with the SDK's keys (``RequestStateSecurity(keys=...)``), the SDK's format
  (:mod:`statecodec.compat.mcp_py_v1`, the kid selects the key) and every binding rule
  as the SDK's ``RequestStateBoundary`` checks it: method, target, the SDK's argument
  digest, its audience (the server's name unless one was set) and its principal
  (``bind_principal``, the SDK's default unless given), its 60 s issued-at skew and
  ``now < exp``;
- no longer than the SDK's ``ttl``: a token whose ``exp - iat`` exceeds it is refused;
- until ``until`` (Unix time, on the codec's clock), after which every SDK token is
  refused: set it to the moment the last SDK instance stopped minting plus the SDK's ttl;
- ONCE: the SDK's tokens carry no token id, so the token itself is consumed, as a
  SHA-256 digest, in the codec's replay store (the one every instance shares) after
  every other check passed. This is sound because the reader accepts one spelling per
  token (canonical base64url only), so a re-encoded copy cannot redeem it again.

Every state the server seals is statecodec's: the answer to a round that came in with
an SDK token starts a new statecodec flow, bound as any other. Refusals are the same
uniform -32602 on the wire; the log record says ``format=mcp-py-v1`` and the reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from mcp.server.request_state import authenticated_principal as sdk_authenticated_principal

from .. import _format, _telemetry, boundary
from .._codec import StateCodec
from .._errors import InvalidState
from ..compat import mcp_py_v1

__all__ = ["SDKStateWindow"]

logger = logging.getLogger("statecodec")

#: The format and metrics label of the tokens this window accepts.
FORMAT: Final = "mcp-py-v1"
#: Replay entries of SDK tokens: "<namespace>:mcp-py-v1:<sha256 of the token>".
_REPLAY_LABEL: Final = ":" + FORMAT + ":"
#: Kept this long past ``exp`` in the store: covers stores whose clock lags the server's.
_KEPT_AFTER_EXPIRY: Final = 60.0
#: exp - iat may exceed the ttl by float rounding of ``now + ttl`` in the SDK, no more.
_TTL_SLACK: Final = 1e-3


@dataclass(frozen=True, slots=True)
class SDKStateWindow:
    """Accept the Python SDK's (or FastMCP's) own ``requestState`` tokens until ``until``.

    :param keys: the secrets of the SDK's ``RequestStateSecurity(keys=...)`` /
        ``AESGCMRequestStateCodec``, every one still in use.
    :param until: Unix time at which the window closes (the codec's clock): from then
        on every SDK token is refused.
    :param ttl: the SDK policy's ``ttl`` (600 s by default, as in the SDK).
    :param audience: the SDK policy's ``audience``; ``None``: the server's name, which is
        what the SDK's boundary binds when the policy sets none.
    :param bind_principal: the SDK policy's ``bind_principal(ctx) -> str | None``: by
        default the SDK's own (``[client_id, issuer, subject]`` of the access token);
        ``None`` for a policy that bound no principal.
    """

    keys: Sequence[bytes | str]
    until: float
    ttl: float = 600.0
    audience: str | None = None
    bind_principal: Callable[[Any], str | None] | None = sdk_authenticated_principal

    def __post_init__(self) -> None:
        if isinstance(self.keys, bytes | bytearray | str) or not self.keys:
            raise ValueError("keys must be a non-empty sequence of the SDK's secrets, e.g. [secret]")
        for secret in self.keys:  # TypeError/ValueError now, not on the first request
            mcp_py_v1.derive_key(secret)
        if not (isinstance(self.until, int | float) and math.isfinite(self.until)):
            raise ValueError(f"until must be a finite Unix time, got {self.until!r}")
        if not (isinstance(self.ttl, int | float) and math.isfinite(self.ttl) and self.ttl > 0):
            raise ValueError(f"ttl must be a positive number of seconds, got {self.ttl!r}")

    def for_server(self, name: str | None, codec: StateCodec) -> SDKStateWindow:
        """This window with the server's name as audience when none is set; checks the codec."""
        if codec.replay is None:
            raise ValueError(
                "sdk_window needs a codec with a replay store: the SDK's tokens have no single use of "
                "their own, and the window gives them one in the store every instance shares"
            )
        return self if self.audience is not None else replace(self, audience=name)

    def is_open(self, now: float) -> bool:
        return now < self.until

    async def judge_request(
        self,
        ctx: Any,
        codec: StateCodec,
        method: str,
        params: Mapping[str, Any] | None,
        bind: boundary.Binder,
        *,
        max_hold: float = boundary.DEFAULT_MAX_HOLD,
        holds: boundary.Holds | None = None,
        wait: boundary.Waiter | None = asyncio.sleep,
    ) -> boundary.Judged:
        """:func:`statecodec.boundary.judge_request`, plus the SDK's tokens while open.

        A ``requestState`` of the SDK's shape (``v1.`` and one section) is judged here;
        anything else, a state of statecodec's included, goes to ``judge_request``.
        """
        token = None if params is None else params.get(boundary.REQUEST_STATE)
        if (
            params is None
            or not isinstance(token, str)
            or not _sdk_shaped(token)
            or boundary.state_aliases(params)
        ):
            return await boundary.judge_request(
                codec, method, params, bind, max_hold=max_hold, holds=holds, wait=wait
            )
        try:
            state, binding = await self._redeem(
                ctx, codec, method=method, params=params, token=token, bind=bind
            )
        except InvalidState as exc:
            self._log_rejection(codec, method, params, token, exc)
            raise boundary.WireError.invalid_state(exc.reason) from None
        _telemetry.record_unseal(FORMAT, method, "ok", len(token))
        logger.debug(
            "redeemed an SDK requestState on %s (migration window)",
            method,
            extra=_telemetry.fields("sdk_token_redeemed", method=method, format=FORMAT),
        )
        return boundary.Judged(method, {**params, boundary.REQUEST_STATE: state}, bind, None, binding)

    async def _redeem(
        self,
        ctx: Any,
        codec: StateCodec,
        *,
        method: str,
        params: Mapping[str, Any],
        token: str,
        bind: boundary.Binder,
    ) -> tuple[str, Any]:
        """Every check, then the consumption; ``InvalidState`` for the first that fails."""
        _format.check_size(token, codec.max_token_bytes)
        try:  # deny on error: a clock that fails (or says NaN) accepts nothing
            now = float(codec.clock())
        except Exception:
            now = math.nan
        if not math.isfinite(now):
            raise InvalidState("internal_error", "the clock failed")
        if not self.is_open(now):
            raise InvalidState("expired", "an SDK requestState after the migration window closed")
        try:  # the binding of the answer's new (statecodec) state: never sealed to no one
            binding = bind()
        except Exception as exc:
            raise InvalidState("malformed", f"the request cannot be bound: {type(exc).__name__}") from None
        opened = mcp_py_v1.unseal(
            token, self.keys, expect=self._expected(ctx, method, params), clock=lambda: now
        )
        if not opened.expires_at - opened.issued_at <= self.ttl + _TTL_SLACK:
            raise InvalidState("expired", f"lives longer than the SDK's ttl of {self.ttl:g}s", kid=opened.kid)
        key = codec.namespace + _REPLAY_LABEL + hashlib.sha256(token.encode("ascii")).hexdigest()
        try:
            first = await codec.replay.aconsume(key, opened.expires_at - now + _KEPT_AFTER_EXPIRY)  # type: ignore[union-attr]
        except Exception as exc:  # deny on error: an unrecorded redemption is never accepted
            raise InvalidState(
                "store_unavailable", f"replay store: {type(exc).__name__}", kid=opened.kid
            ) from None
        if not first:
            raise InvalidState("replayed", "this SDK token was already redeemed", kid=opened.kid)
        return opened.state, binding

    def _expected(self, ctx: Any, method: str, params: Mapping[str, Any]) -> mcp_py_v1.Expected:
        """What the SDK's ``RequestStateBoundary`` compares, computed as it computes it."""
        arguments: Any
        if method == "resources/read":
            target, arguments = str(params.get("uri", "")), {}
        else:
            target, arguments = str(params.get("name", "")), params.get("arguments") or {}
        try:
            digest = mcp_py_v1.arguments_digest(arguments)
            principal = None if self.bind_principal is None else self.bind_principal(ctx)
        except Exception as exc:  # deny on error, as the SDK does
            raise InvalidState(
                "malformed", f"the SDK binding cannot be computed: {type(exc).__name__}"
            ) from None
        if principal is not None and not isinstance(principal, str):
            raise InvalidState("malformed", f"bind_principal returned {type(principal).__name__}, not str")
        return mcp_py_v1.Expected(method, target, digest, self.audience, principal)

    def _log_rejection(
        self, codec: StateCodec, method: str, params: Mapping[str, Any], token: str, exc: InvalidState
    ) -> None:
        _telemetry.record_unseal(FORMAT, method, exc.reason, len(token))
        target = params.get("uri" if method == "resources/read" else "name")
        logger.warning(
            "rejected an SDK requestState on %s: reason=%s detail=%r kid=%s",
            method,
            exc.reason,
            exc.detail,
            exc.kid or "-",
            extra=_telemetry.rejection(
                exc,
                audience=self.audience,
                method=method,
                target=target if isinstance(target, str) else None,
                mode=FORMAT,
                size=len(token),
            ),
        )


def _sdk_shaped(token: str) -> bool:
    """The Python SDK's shape: ``v1.`` then one section (statecodec's tokens start ``sc1``)."""
    return token.startswith(mcp_py_v1.PREFIX) and "." not in token[len(mcp_py_v1.PREFIX) :]
