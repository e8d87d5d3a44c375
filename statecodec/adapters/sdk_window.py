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
an SDK token starts a new statecodec flow, bound as any other. The window is a
:class:`~statecodec.boundary.TokenReader`: it raises, and the boundary answers as it
answers for every token (the uniform -32602, or -32603 "retry the same request" when the
replay store could not record it); the log record says ``mode=mcp-py-v1`` and the reason.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from mcp.server.request_state import authenticated_principal as sdk_authenticated_principal

from .. import boundary
from .._binding import Binding
from .._codec import StateCodec
from .._errors import InvalidState
from ..compat import mcp_py_v1

__all__ = ["SDKStateWindow", "SDKTokenReader"]

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

    def reader(self, ctx: Any) -> SDKTokenReader:
        """The :class:`~statecodec.boundary.TokenReader` of this window for the request ``ctx``."""
        return SDKTokenReader(self, ctx)

    async def redeem(
        self,
        codec: StateCodec,
        method: str,
        params: Mapping[str, Any],
        *,
        ctx: Any,
        token: str,
        bind: boundary.Binder,
    ) -> tuple[str, Binding]:
        """Every check, then the consumption; ``InvalidState`` for the first that fails.

        The boundary checked the token's shape and size already, and answers the refusal.
        """
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
        target = str(params.get(boundary.target_field(method), ""))
        arguments = {} if method == "resources/read" else params.get("arguments") or {}
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


@dataclass(frozen=True, slots=True)
class SDKTokenReader:
    """The window as a :class:`~statecodec.boundary.TokenReader` for one request ``ctx``."""

    window: SDKStateWindow
    ctx: Any

    @property
    def label(self) -> str:
        return FORMAT

    @property
    def audience(self) -> str | None:
        return self.window.audience

    def reads(self, token: str) -> bool:
        return _sdk_shaped(token)

    async def redeem(
        self, codec: StateCodec, method: str, params: Mapping[str, Any], *, token: str, bind: boundary.Binder
    ) -> tuple[str, Binding]:
        return await self.window.redeem(codec, method, params, ctx=self.ctx, token=token, bind=bind)


def _sdk_shaped(token: str) -> bool:
    """The Python SDK's shape: ``v1.`` then one section (statecodec's tokens start ``sc1``)."""
    return token.startswith(mcp_py_v1.PREFIX) and "." not in token[len(mcp_py_v1.PREFIX) :]
