"""Protect an official ``mcp`` SDK server (2.3+) in one line.

    from statecodec.adapters.mcp import protect
    protect(server, codec)   # a lowlevel Server or an MCPServer

:func:`protect` puts a :class:`StateCodecMiddleware` where the SDK's own
``RequestStateBoundary`` was (``MCPServer`` installs one with a per-process key), or, on a
lowlevel ``Server`` that has none, right inside the SDK's OpenTelemetry middleware. Two
boundaries must never run together: the outer one would seal the inner one's token and
the handler would receive a token instead of its state.

On ``tools/call``, ``resources/read`` and ``prompts/get`` the middleware unseals an
inbound ``requestState`` (awaiting the replay store, so each token redeems once, on any
instance sharing the store) before validation and the handler run, and seals the
``requestState`` of every ``input_required`` result on the way out. Every other method
passes untouched.

For users who keep the SDK's boundary (its claims envelope, its principal hashing) but
want statecodec's keys, modes and rotation underneath, :func:`sdk_codec` adapts a
:class:`~statecodec.StateCodec` to the SDK's ``RequestStateCodec`` protocol.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableSequence
from dataclasses import fields, is_dataclass, replace
from functools import partial
from typing import Any, Final, TypeAlias, TypedDict, Unpack, cast

from .._extras import missing_extra

try:
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.provider import principal_components
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp.server.lowlevel import Server
    from mcp.server.mcpserver import MCPServer
    from mcp.server.request_state import InvalidRequestState, RequestStateBoundary
    from mcp.server.streamable_http import REQUEST_CANCELLED
    from mcp.shared.exceptions import MCPError
    from mcp.types import InputRequiredResult
    from pydantic import BaseModel
except ModuleNotFoundError as _exc:
    raise (missing_extra(_exc, "mcp", __name__) or _exc) from None

from .. import _telemetry, boundary
from .._binding import Binding
from .._codec import StateCodec
from .._errors import InvalidState
from .sdk_window import SDKStateWindow

__all__ = [
    "AudienceFn",
    "BindingFn",
    "MiddlewareSettings",
    "PrincipalFn",
    "SDKRequestStateCodec",
    "Settings",
    "StateCodecMiddleware",
    "authenticated_principal",
    "install",
    "protect",
    "sdk_codec",
]

logger = logging.getLogger("statecodec")

Context: TypeAlias = ServerRequestContext[Any, Any]
#: ``principal(ctx) -> str | None``: who the token belongs to; ``None`` binds to nobody.
PrincipalFn: TypeAlias = Callable[[Context], "str | None"]
#: ``audience(ctx) -> str | None``: which service the token is for.
AudienceFn: TypeAlias = Callable[[Context], "str | None"]
#: ``binding(ctx, default) -> Binding``: the last word on what a token is bound to.
BindingFn: TypeAlias = Callable[[Context, Binding], Binding]


class Settings(TypedDict, total=False):
    """The keywords :func:`protect`, the FastMCP ``protect`` and :class:`StateCodecMiddleware` share.

    Declared once, here; each is documented at :func:`protect`. Left out, each takes
    :class:`~statecodec.boundary.BoundaryOptions`' default, but ``principal``: the SDK's
    (or FastMCP's) authenticated access token.
    """

    principal: PrincipalFn | None
    binding: BindingFn | None
    retry_after: float | None
    max_hold: float
    max_holds: int
    max_holds_per_token: int


def authenticated_principal(ctx: Context) -> str | None:
    """The default principal: the SDK's authenticated access token, or ``None``.

    ``(client_id, issuer, subject)`` from ``principal_components`` (the triple the SDK's
    own boundary and session ownership use) as :func:`~statecodec.boundary.principal_string`.
    ``None`` on unauthenticated transports such as stdio: the token is then bound to no one.
    """
    token = get_access_token()
    if token is None:
        return None
    return boundary.principal_string(*principal_components(token))


class MiddlewareSettings(Settings, total=False):
    """:class:`Settings` and the ``audience``, which the middleware's constructor requires."""

    audience: str | AudienceFn | None


class StateCodecMiddleware(boundary.Bounded):
    """SDK server middleware sealing and unsealing ``requestState`` with a StateCodec.

    Build it with :func:`protect`; the constructor is public for servers assembled by
    hand (``MCPServer(middleware=[...])`` would put it *inside* the SDK boundary, which
    is wrong: use :func:`install` or :func:`protect`). It takes a codec and
    :func:`protect`'s keywords (:class:`Settings`, ``sdk_window``), but ``audience`` is
    required; or a :class:`~statecodec.boundary.BoundaryOptions` built already (then
    only ``sdk_window``), which is held as it is.
    """

    def __init__(
        self,
        codec: StateCodec | boundary.BoundaryOptions,
        *,
        sdk_window: SDKStateWindow | None = None,
        **settings: Unpack[MiddlewareSettings],
    ) -> None:
        if not isinstance(codec, boundary.BoundaryOptions):
            settings.setdefault("principal", authenticated_principal)
        self.boundary = boundary.Boundary(boundary.BoundaryOptions.of(codec, settings))
        self.sdk_window = sdk_window

    @classmethod
    def from_options(
        cls, options: boundary.BoundaryOptions, *, sdk_window: SDKStateWindow | None = None
    ) -> StateCodecMiddleware:
        """The middleware for ``options``: the same as ``StateCodecMiddleware(options, sdk_window=...)``."""
        return cls(options, sdk_window=sdk_window)

    async def __call__(self, ctx: Context, call_next: CallNext) -> HandlerResult:
        # This runs on every request of the server, so the common cases take the fewest
        # steps (see docs/performance.md); no check is skipped on any path.
        method = ctx.method
        if method not in boundary.MRTR_METHODS:
            return await call_next(ctx)
        # One binding per request, for the inbound check and the outbound seal alike (the
        # next round's token is bound to exactly what this round was), computed only when
        # a state arrives or leaves, never for plain calls.
        judge = partial(
            boundary.judge_request,
            self.boundary.options.codec,
            method,
            ctx.params,
            partial(self._binding, ctx),
            wait=None,
            reader=None if self.sdk_window is None else self.sdk_window.reader(ctx),
        )
        try:
            # A hold ends early when its client goes away (_client_stays) or the SDK cancels
            # the request: nothing is consumed and the handler never runs.
            verdict = await self.boundary.judge(
                lambda left: _paired(judge(max_hold=left)), _client_stays(ctx)
            )
        except boundary.WireError as exc:
            raise _mcp_error(exc) from None
        if verdict is None:  # the client left during the hold: an answer on a closed connection
            raise MCPError(code=REQUEST_CANCELLED, message="Request cancelled")
        judged = verdict[0]
        if judged.early is not None:  # a paced round retried too early: the same state, no handler
            return dict(judged.early)
        if judged.opened is not None or (ctx.params is not None and judged.params is not ctx.params):
            ctx = _with_params(ctx, judged.params)  # a state was redeemed (an SDK one has no opened)
        answer = await self._answer(judged, ctx, call_next)
        self.boundary.end(judged)
        return answer

    async def _answer(self, judged: boundary.Judged, ctx: Context, call_next: CallNext) -> HandlerResult:
        """The handler's result, its state sealed (or the SDK's error for one that cannot go out)."""
        result = await call_next(ctx)
        try:
            if type(result) is dict:  # the runner's wire form
                return cast("dict[str, Any]", self.boundary.seal(judged, result))
            return self._seal_other(judged, result)
        except boundary.WireError as exc:
            raise _mcp_error(exc) from None

    def _binding(self, ctx: Context) -> Binding:
        """The request's binding: the default one, then the ``binding`` callback's word."""
        options = self.boundary.options
        audience, principal, custom = options.audience, options.principal, options.binding
        binding = boundary.binding_for(
            ctx.method,
            ctx.params,
            principal=None if principal is None else principal(ctx),
            audience=audience(ctx) if callable(audience) else audience,
        )
        return binding if custom is None else custom(ctx, binding)

    def _seal_other(self, judged: boundary.Judged, result: HandlerResult) -> HandlerResult:
        """A result that is not the runner's wire dict: a model, or another mapping.

        A middleware further in (or a caller composing middleware by hand) may hand back
        the SDK's result model: it comes back as the same model, its state sealed, as the
        SDK's own boundary returns it. The model is judged by its wire fields, as a dict is.
        """
        if isinstance(result, Mapping):
            return dict(self.boundary.seal(judged, result))
        if not isinstance(result, BaseModel):
            return result
        state = getattr(result, "request_state", None)
        wire: dict[str, Any] = {}
        if isinstance(result, InputRequiredResult):
            wire = {"resultType": boundary.INPUT_REQUIRED, "inputRequests": result.input_requests}
        elif state is None:
            return result
        if state is not None:
            wire[boundary.REQUEST_STATE] = state
        sealed = self.boundary.seal(judged, wire)
        return (
            result
            if state is None
            else result.model_copy(update={"request_state": sealed[boundary.REQUEST_STATE]})
        )


async def _paired(judged: Awaitable[boundary.Judged]) -> tuple[boundary.Judged]:
    return (await judged,)


def _client_stays(ctx: Context) -> boundary.ClientStays:
    """How ``ctx``'s early retry waits: watching its HTTP client, which may leave meanwhile.

    The SDK ends a request whose client leaves only on some transports: it cancels one
    answered by SSE, but one answered with JSON (``json_response=True``) runs on in the
    HTTP task with nobody watching, so at the pacing time the hold would consume the
    token and run the handler for no one, and the client's on-time retry would be refused
    as replayed. So the hold watches the request itself (its body is read, and the next
    ASGI message is ``http.disconnect`` when the client leaves). Not watched: a request
    without HTTP (stdio; the SDK's cancellation still ends the hold), and a resumable SSE
    stream (``ctx.close_sse_stream`` is set: the 2025-era wire with an event store),
    whose client may reconnect for the answer, so its leaving is no cancellation.
    """
    receive = getattr(ctx.request, "receive", None)
    if not callable(receive) or ctx.close_sse_stream is not None:
        return boundary.sleeping
    return partial(boundary.client_stays, receive)


def _with_params(ctx: Context, params: Mapping[str, Any]) -> Context:
    """A copy of ``ctx`` with other ``params``; the original is never mutated, so the
    middleware further out (OpenTelemetry, the user's) keeps the wire form.

    ``dataclasses.replace``, the public way: copying the instance dictionary instead saves
    less than the 1% a private seam must earn (docs/performance.md).
    """
    return replace(ctx, params=params)


def _mcp_error(exc: boundary.WireError) -> MCPError:
    """The SDK's exception for a :class:`~statecodec.boundary.WireError`: same code, message, data."""
    return MCPError(code=exc.code, message=exc.message, data=None if exc.data is None else dict(exc.data))


def install(chain: MutableSequence[Any], middleware: StateCodecMiddleware) -> None:
    """Put ``middleware`` in ``chain`` in place of the SDK boundary, in place.

    Every ``RequestStateBoundary`` and every earlier :class:`StateCodecMiddleware` is
    removed; the new one takes the position of the first of them. With none present it
    goes right after the middleware the SDK installs by default (its OpenTelemetry
    middleware: spans then record the sealed wire form, as with the SDK boundary), else
    first, so user middleware always sees plaintext.
    """

    def replaced(item: Any) -> bool:
        return isinstance(item, RequestStateBoundary | StateCodecMiddleware)

    positions = [i for i, item in enumerate(chain) if replaced(item)]
    if positions:
        at = positions[0]
    else:
        outer = _sdk_default_middleware()
        defaults = [i for i, item in enumerate(chain) if isinstance(item, outer)]
        at = defaults[-1] + 1 if defaults else 0
    kept = [item for item in chain if not replaced(item)]
    kept.insert(at, middleware)
    chain[:] = kept


@functools.cache
def _sdk_default_middleware() -> tuple[type, ...]:
    """The types of the middleware a new lowlevel ``Server`` starts with.

    Read from a fresh server rather than imported from ``mcp.server._otel`` (a private
    module that may move): whatever the SDK puts there by default stays outside.
    """
    return tuple({type(item) for item in Server("statecodec").middleware})


def _sdk_chain(server: Server[Any] | MCPServer[Any]) -> MutableSequence[Any]:
    """``server.middleware``, or a clear error now if this SDK no longer has it.

    The SDK marks ``Server.middleware`` provisional in mcp 2.3. If a release renames it
    or changes what a middleware receives, :func:`protect` fails here, when the server
    is assembled, instead of on its first request.
    """
    chain = getattr(server, "middleware", None)
    # The middleware copies the context with new params (see _with_params): a dataclass with both.
    names = {f.name for f in fields(ServerRequestContext)} if is_dataclass(ServerRequestContext) else set()
    if not isinstance(chain, MutableSequence) or not {"method", "params"} <= names:
        raise RuntimeError(
            f"this mcp SDK ({_version('mcp')}) has no Server.middleware list taking a dataclass context "
            "with method and params (provisional in mcp 2.3): statecodec.adapters.mcp cannot protect it. "
            "Install the mcp versions statecodec supports, or put statecodec.adapters.asgi."
            "RequestStateMiddleware in front of the server's ASGI app instead."
        )
    return chain


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


#: The name ``MCPServer`` gives a server constructed without one (``MCPServer(None)``, ``MCPServer("")``).
SDK_PLACEHOLDER_NAME: Final = "mcp-server"


def service_audience(name: str, unnamed: bool, audience: str | AudienceFn | None) -> str | AudienceFn:
    """The audience :func:`protect` binds: ``audience`` if given, else the server's name.

    An unnamed server is refused, as the SDK refuses one with shared keys: every unnamed
    server stamps the same placeholder, so services sharing keys would tell each other's
    tokens apart only by tool and arguments, and a state minted by one would redeem on
    another with a tool of the same name.
    """
    if isinstance(audience, str) and not audience.strip():
        raise ValueError('audience= must name the service (audience="my-service"), not be empty')
    if audience is not None:
        return audience
    if unnamed or not name.strip():
        raise ValueError(
            f"this server has no name of its own ({name!r}), and its name is the audience its "
            "tokens are bound to: services sharing keys would then tell their tokens apart only "
            'by tool and arguments. Pass protect(server, codec, audience="my-service"), or name '
            'the server (MCPServer("my-service"))'
        )
    return name


def protect(
    server: Server[Any] | MCPServer[Any],
    codec: StateCodec,
    *,
    audience: str | AudienceFn | None = None,
    sdk_window: SDKStateWindow | None = None,
    **settings: Unpack[Settings],
) -> StateCodecMiddleware:
    """Seal and verify every ``requestState`` of ``server`` with ``codec``.

    :param server: a ``mcp.server.lowlevel.Server`` or a ``mcp.server.mcpserver.MCPServer``.
    :param audience: the service the tokens are for; ``None`` (the default) means the
        server's name. Give every instance of one service the same name (or audience),
        and different services different ones, even when they share keys. A callable
        ``audience(ctx)`` decides per request. An unnamed server (``MCPServer(None)``,
        ``MCPServer("")``, whose name is the SDK's placeholder ``"mcp-server"``, or
        ``Server("")``) without ``audience=`` is refused with ``ValueError``.
    :param principal: ``principal(ctx) -> str | None``; by default the authenticated
        access token's (client id, issuer, subject). ``None`` binds no principal.
    :param binding: ``binding(ctx, default) -> Binding`` to add or change fields, for
        example ``lambda ctx, b: b.replace(extra={"tenant": tenant_of(ctx)})``.
    :param retry_after: seconds a client must wait before retrying a requestState-only
        round (an ``input_required`` result without ``inputRequests``); ``None``: no pacing.
    :param max_hold: an early retry is held (asynchronously) until its time when that is
        at most this many seconds away, then runs; a retry earlier than that is answered
        at once with the same state. The handler never runs early, and no early retry
        consumes the token. Keep ``retry_after <= max_hold`` for clients that retry after a
        fixed pause (the TypeScript client waits 250 ms and counts every answer).
    :param sdk_window: while migrating off the SDK's own boundary, an
        :class:`~statecodec.adapters.sdk_window.SDKStateWindow`: the SDK's tokens are
        accepted (once each, with the SDK's keys and binding rules) until it closes;
        every new state is statecodec's. The codec needs a replay store.
    :param max_holds: early retries held at once; :param max_holds_per_token: of one
        token. One more is answered at once with the same state, unconsumed
        (:class:`~statecodec.boundary.Holds`). A held retry whose client closes its
        HTTP connection (JSON or SSE answers alike), or whose request the SDK cancels
        (``notifications/cancelled``), is released: nothing consumed, the handler not run.
    :returns: the installed middleware.

    Rounds chain automatically: a round that came in with a state and answers
    ``input_required`` again is sealed as the next round of the same flow, so the codec's
    ``max_rounds`` and ``max_flow_age`` hold for the whole flow.
    """
    if not isinstance(server, MCPServer | Server):
        raise TypeError(
            f"protect() takes an mcp lowlevel Server or an MCPServer, not {type(server).__name__}; "
            "for FastMCP use statecodec.adapters.fastmcp.protect"
        )
    chain = _sdk_chain(server)
    unnamed = not server.name or (isinstance(server, MCPServer) and server.name == SDK_PLACEHOLDER_NAME)
    middleware = StateCodecMiddleware(
        codec,
        audience=service_audience(server.name, unnamed, audience),
        sdk_window=None if sdk_window is None else sdk_window.for_server(server.name, codec),
        **settings,
    )
    install(chain, middleware)
    return middleware


class SDKRequestStateCodec:
    """A StateCodec behind the SDK's synchronous ``RequestStateCodec`` protocol.

    The SDK boundary keeps doing its own claims (expiry, request binding, audience,
    hashed principal) inside the payload; statecodec adds key ids and rotation, SIGN or
    ENCRYPT, its own expiry, and single use when the codec has a replay store. Tokens
    are sealed unbound (the SDK binds inside its envelope). Set the codec's ``ttl`` at
    least as long as the SDK policy's.

    With a replay store, :meth:`unseal` consumes the token *before* the SDK checks its
    claims, so a stolen token presented by the wrong user is burnt (denial of service,
    never acceptance), and the store is called synchronously on the event loop: prefer
    :func:`protect` when you can.
    """

    def __init__(self, codec: StateCodec, *, consume: bool = True) -> None:
        self.codec = codec
        self.consume = consume

    def seal(self, payload: bytes) -> str:
        try:
            token = self.codec.seal(payload)
        except Exception:
            _telemetry.record_seal(self.codec.mode.value, "-", "error", None)
            raise  # the SDK boundary logs it and answers -32603
        _telemetry.record_seal(self.codec.mode.value, "-", "ok", len(token))
        return token

    def unseal(self, token: str) -> bytes:
        # The SDK does not tell the codec which method it serves: metrics say "-".
        size = len(token) if isinstance(token, str) else None
        try:
            payload = self.codec.unseal(token, consume=self.consume).payload
        except InvalidState as exc:
            _telemetry.record_unseal(self.codec.mode.value, "-", exc.reason, size)
            # The SDK logs this message and answers its uniform -32602; the message is a
            # reason for the server log, not for the client.
            logger.warning(
                "rejected requestState (SDK boundary): reason=%s detail=%r kid=%s token=%s",
                exc.reason,
                exc.detail,
                exc.kid or "-",
                exc.token_id[:8] if exc.token_id else "-",
                extra=_telemetry.rejection(exc, mode=self.codec.mode.value, size=size),
            )
            raise InvalidRequestState(exc.reason) from None
        _telemetry.record_unseal(self.codec.mode.value, "-", "ok", size)
        return payload


def sdk_codec(codec: StateCodec, *, consume: bool = True) -> SDKRequestStateCodec:
    """``codec`` as the SDK's ``RequestStateCodec``, for ``RequestStateSecurity(codec=...)``."""
    return SDKRequestStateCodec(codec, consume=consume)
