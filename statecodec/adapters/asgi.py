"""Protect any ASGI MCP server (Streamable HTTP) without touching its code.

    from statecodec.adapters.asgi import RequestStateMiddleware
    app = RequestStateMiddleware(app, codec, audience="deploy")

The middleware sits at the JSON-RPC layer of the HTTP transport. On the way in, every
``tools/call``, ``resources/read`` and ``prompts/get`` request is judged by
:func:`statecodec.boundary.judge_request` (the rules the SDK adapters use): a
request whose token fails gets the uniform -32602 error and never reaches the
application; one whose token passes is forwarded with the plaintext state the application
issued. On the way out, **every** answer is watched, whatever request, path or stream it
belongs to: a state in it is sealed by :func:`~statecodec.boundary.seal_result`
when it answers the MRTR request of its exchange, and replaced by -32603 otherwise.

It fails closed in both directions:

- **The application must see exactly the JSON the middleware judged.** A server parsing
  the body differently (duplicate keys, ``"RequestState"`` matched case-insensitively as
  Go's ``encoding/json`` does, invalid UTF-8 repaired, a compressed body, a batch) could
  read a state the middleware never verified. Such requests are refused before the
  application runs, as are ``Mcp-Method``/``Mcp-Name`` headers that disagree with the
  body and percent-encoded paths that another router could read as a different path.
  Every check runs before the token is consumed, and nothing after the consume can fail.
- **No plaintext state the application issued ever reaches a client.** Answers are read
  as the most lenient client reads them (any JSON or event-stream media type or none,
  byte-order marks, UTF-16, any depth: see :mod:`._json`); an answer that might carry a
  state and cannot be read is replaced by HTTP 502 / -32603 and logged.

See docs/proxy.md for the full list of what is and is not bound.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import logging
import re
import secrets
from collections.abc import Awaitable, Callable, Collection, Mapping, MutableMapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any, Final, TypeAlias, TypedDict, Unpack
from urllib.parse import quote, unquote_to_bytes

from .. import _telemetry, boundary
from .._binding import Binding
from .._codec import OpenedState, StateCodec
from ..boundary import (
    HEADER_MISMATCH_CODE,
    INTERNAL_ERROR_CODE,
    INVALID_REQUEST_CODE,
    PARSE_ERROR_CODE,
    Judged,
    WireError,
)
from . import _json, _sse
from ._json import dumps, loads_strict

__all__ = [
    "ACCEPT_IDENTITY",
    "BODY_METHOD",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_JUDGED_BYTES",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "FORWARDER_HEADERS",
    "UNCOUNTED_BYTES",
    "ASGIApp",
    "Message",
    "PrincipalFn",
    "Receive",
    "RequestHeaders",
    "RequestStateMiddleware",
    "Scope",
    "Send",
    "Settings",
    "body_length",
    "dumps",
    "loads_strict",
    "request_path",
]

logger = logging.getLogger("statecodec")
#: One INFO record per MRTR request that carries a state (the proxy's access lines).
access_logger = logging.getLogger("statecodec.access")

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]
#: ``principal(scope, headers) -> str | None`` (or awaitable): who is asking. ``headers``
#: has lower-case names; repeated headers are joined with ", ". Raise when the caller
#: presented credentials that cannot be verified: the request is then never bound to
#: anyone (a token is refused, a new state is not sealed).
PrincipalFn: TypeAlias = Callable[[Scope, Mapping[str, str]], "str | Awaitable[str | None] | None"]


class Settings(TypedDict, total=False):
    """The middleware's :class:`~statecodec.boundary.BoundaryOptions` keywords, given with a codec.

    ``audience`` is required; each is documented at :class:`RequestStateMiddleware`.
    """

    audience: str | None
    principal: PrincipalFn | None
    retry_after: float | None
    max_hold: float
    max_holds: int
    max_holds_per_token: int


#: The TypeScript SDK's default limit on a POST body.
DEFAULT_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
#: The largest JSON answer or single SSE event inspected; larger ones fail closed.
DEFAULT_MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
#: The most bytes of answers held for inspection at once, all requests together.
DEFAULT_MAX_JUDGED_BYTES: Final = 256 * 1024 * 1024

_JSON_HEADERS: Final = [(b"content-type", b"application/json")]
_JSON_SPACE: Final = b" \t\r\n"
# Keys whose exact spelling decides what a server reads. A key equal to one of them
# under Unicode case folding, but not identical, would be read by a case-insensitive
# parser (Go's encoding/json also folds U+017F to "s" and U+212A to "k") and ignored here.
_ENVELOPE_KEYS: Final = frozenset({"jsonrpc", "id", "method", "params", "result", "error"})
# Each set of protocol keys, by the casefolded form of each of its keys.
_FOLDED: Final = {
    keys: {key.casefold(): key for key in keys} for keys in (_ENVELOPE_KEYS, boundary.PARAMS_KEYS)
}
_B64_SENTINEL: Final = re.compile(r"=\?base64\?(.*)\?=", re.DOTALL)
# A percent-encoded "/" or unreserved character (RFC 3986 2.3): routers may or may not
# decode it, so such a path has two readings, and the upstream may pick the other one.
_AMBIGUOUS_ESCAPE: Final = re.compile(rb"%(?:2[dDeEfF]|3[0-9]|[46][1-9a-fA-F]|[57][0-9aA]|5[fF]|7[eE])")


# ---------------------------------------------------------------- requests
def request_path(scope: Scope) -> bytes:
    """The path as the client sent it (percent-encoded, no query): what is decided on and forwarded."""
    raw = scope.get("raw_path")
    if isinstance(raw, bytes) and raw:
        return raw
    return quote(scope.get("path", "/")).encode("ascii")


def _check_keys(obj: Mapping[str, Any], spelled: frozenset[str], where: str) -> None:
    """Refuse a key of ``obj`` that is one of ``spelled`` in another case (``"RequestState"``)."""
    if spelled.issuperset(obj):  # every key spelled exactly as the protocol spells one: nothing to fold
        return
    folded = _FOLDED[spelled]
    for key in obj:
        canonical = folded.get(key.casefold())
        if canonical is not None and key != canonical:
            raise _refusal(
                400, INVALID_REQUEST_CODE, f"{where} key {key[:40]!r} is not spelled {canonical!r}"
            )


def _refusal(status: int, code: int, reason: str) -> WireError:
    """A request refused before the application: the reason is the message (it names no secret)."""
    return WireError(code, reason, status=status, reason=reason)


def _decode_header_value(raw: bytes) -> str | None:
    """An ``Mcp-Name`` value as the SDKs decode it (``=?base64?...?=`` for non-ASCII), or None."""
    text = raw.decode("latin-1")
    match = _B64_SENTINEL.fullmatch(text)
    if match is None:
        return text
    try:
        decoded = base64.b64decode(match.group(1), validate=True)
        if base64.b64encode(decoded).decode("ascii") != match.group(1):
            return None
        return decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


_ROUTING_HEADERS: Final = (b"mcp-method", b"mcp-name")
# RFC 9110 section 5.5: optional whitespace (spaces, tabs) around a field value is not part of it.
_OWS: Final = b" \t"


@dataclass(slots=True)
class RequestHeaders:
    """A request's headers, lower-cased once: every later use reads this.

    ``headers`` as sent, ``lowered`` the same with each name lower-cased. ``index``:
    each header by its lower-case name, the first of repeated ones. ``routing``:
    ``Mcp-Method`` and ``Mcp-Name`` as sent, trimmed; ``repeated``: the first of them that
    is repeated, refused where the body is judged (only the first of repeated headers would
    be compared with the body, while a router reading the last one would dispatch on a
    value nobody compared: HTTP 400, -32020).
    """

    headers: list[tuple[bytes, bytes]]
    lowered: list[tuple[bytes, bytes]]
    index: dict[bytes, bytes]
    routing: dict[bytes, bytes]
    repeated: bytes | None

    @classmethod
    def read(cls, headers: list[tuple[bytes, bytes]]) -> RequestHeaders:
        # Servers hand the names lower-cased (uvicorn does; ASGI asks for it): the names are
        # then checked at once in C (bytes.lower changes A-Z only, as it does name by name)
        # and the headers kept as they are. Else built by comprehension; indexed by dict().
        names = b"\n".join(next(zip(*headers, strict=True), ()))  # split from the values in C
        lowered = headers if names.lower() == names else [(name.lower(), value) for name, value in headers]
        index = dict(reversed(lowered))  # built from the last: the first of repeated ones stays
        routing: dict[bytes, bytes] = {}
        for name in _ROUTING_HEADERS:
            value = index.get(name)
            if value is not None:
                routing[name] = value.strip(_OWS)
        repeated = _first_repeated(lowered) if routing and len(index) < len(lowered) else None
        return cls(headers, lowered, index, routing, repeated)

    def without(self, *dropped: bytes) -> list[tuple[bytes, bytes]]:
        """The headers as sent but those named ``dropped`` (lower-case names)."""
        if self.lowered is self.headers:  # lower-cased as sent: one list to read, not two
            return [header for header in self.headers if header[0] not in dropped]
        pairs = zip(self.lowered, self.headers, strict=True)
        return [header for (name, _), header in pairs if name not in dropped]

    def joined(self) -> dict[str, str]:
        """Each header by its lower-case name as text, repeated ones joined (:data:`PrincipalFn`)."""
        joined: dict[str, str] = {}
        for raw_name, raw_value in self.lowered:
            name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
            joined[name] = f"{joined[name]}, {value}" if name in joined else value
        return joined


def _first_repeated(lowered: list[tuple[bytes, bytes]]) -> bytes | None:
    """The first ``Mcp-Method`` or ``Mcp-Name`` header that comes a second time, or None."""
    seen: set[bytes] = set()
    for name, _ in lowered:
        if name in _ROUTING_HEADERS:
            if name in seen:
                return name
            seen.add(name)
    return None


#: Request headers whoever forwards a request sets itself, never copied from its client: the
#: body's framing (the body goes on whole, and a redeemed state changes its length:
#: :func:`body_length`) and the encodings the answer may take (:data:`ACCEPT_IDENTITY`).
FORWARDER_HEADERS: Final = frozenset({b"accept-encoding", b"content-length", b"transfer-encoding"})
#: What replaces the client's ``Accept-Encoding``, for the middleware's application and the
#: proxy's upstream alike: an answer must come uncompressed to be inspected, and a request
#: without the header would leave the server free to pick any coding (RFC 9110, 12.5.3).
ACCEPT_IDENTITY: Final = (b"accept-encoding", b"identity")


#: The key under ``scope["extensions"]`` where the middleware tells its application the
#: JSON-RPC method it read from the body (the ``method`` member as read, ``None`` for a
#: message without one): set only when the body was read as one strict JSON-RPC message,
#: which every parser reads alike. The server builds the scope, so no client can set it;
#: an application reached without it reads the body itself.
BODY_METHOD: Final = "statecodec.body_method"
_UNREAD: Final = object()
_NONE: Final[Mapping[str, Any]] = MappingProxyType({})


def body_length(body: bytes) -> bytes:
    """The ``Content-Length`` of ``body`` forwarded whole (:data:`FORWARDER_HEADERS`)."""
    return str(len(body)).encode("ascii")


def _header_label(name: bytes) -> str:
    return "Mcp-Method" if name == b"mcp-method" else "Mcp-Name"


def _check_routing_headers(sent: RequestHeaders, message: Mapping[str, Any]) -> None:
    """``Mcp-Method`` and ``Mcp-Name`` must say what the body says (SEP-2243).

    MCP 2026-07-28 mirrors the method and the tool/prompt name or resource URI into
    headers for routing. A server (or a router in front of it) that dispatched on the
    header while this middleware judged the body could run a request whose state was
    never verified, or a target other than the bound one: any disagreement is refused as
    the specification says, HTTP 400 with -32020 (HeaderMismatch). Values are compared
    without the optional whitespace around them (a server MUST accept a padded value),
    and forwarded as sent.
    """
    if sent.repeated is not None:
        raise _refusal(400, HEADER_MISMATCH_CODE, f"the {_header_label(sent.repeated)} header is repeated")
    routing = sent.routing
    if not routing or "method" not in message:
        return
    method_header = routing.get(b"mcp-method")
    name_header = routing.get(b"mcp-name")
    method = message["method"]
    if method_header is not None and method_header.decode("latin-1") != method:
        raise _refusal(400, HEADER_MISMATCH_CODE, "the Mcp-Method header does not match the body")
    if name_header is None or not isinstance(method, str) or not boundary.is_mrtr(method):
        return
    params = message.get("params")
    target = params.get(boundary.target_field(method)) if isinstance(params, dict) else None
    if target is not None and _decode_header_value(name_header) != target:
        raise _refusal(400, HEADER_MISMATCH_CODE, "the Mcp-Name header does not match the body")


def _id_key(value: Any) -> tuple[str, Any]:
    """A request id as a JSON peer compares it: 1 and 1.0 are the same number, "1" is not."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | float):
        try:
            return ("number", float(value))
        except OverflowError:
            return ("number", str(value))
    if isinstance(value, str):
        return ("string", value)
    if value is None:
        return ("null", None)
    return ("other", dumps(value, allow_nan=True))


_NULL_ID: Final = _id_key(None)


def _media_type(content_type: bytes | None) -> str:
    return "" if content_type is None else content_type.decode("latin-1").split(";", 1)[0].strip().lower()


def _index(headers: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """Each header by its lower-case name, the first of repeated ones; built once per message."""
    return {name.lower(): value for name, value in reversed(headers)}


def _without(headers: list[tuple[bytes, bytes]], *names: bytes) -> list[tuple[bytes, bytes]]:
    return [(name, value) for name, value in headers if name.lower() not in names]


def _state_keys(document: Any) -> str | None:
    """The first key anywhere in ``document`` that spells ``requestState``, or None (no recursion)."""
    pending = [document]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if boundary.spells_state(key):
                    return str(key)
                pending.append(value)
        elif isinstance(node, list):
            pending.extend(node)
    return None


def _stray_input_required(message: Mapping[str, Any]) -> str | None:
    """Where ``message`` holds an ``input_required`` result other than its own ``result``, or None.

    An ``input_required`` result is an object with a ``resultType`` member (in any case:
    lenient clients fold it) whose value is the string ``"input_required"``. The one place
    it may stand is a message's ``result`` member, which :func:`~statecodec.boundary.seal_result`
    judges; anywhere else (an error's ``data``, a notification's or a server request's
    ``params``, an object nested in a result) it is a protocol violation that may carry a
    plaintext state no boundary seals. A member merely named ``requestState`` (a tool's own
    content) is not one. No recursion: a document may be nested at any depth.
    """
    pending: list[tuple[str, Any]] = []
    for key, value in message.items():
        if key == "result" and type(value) is dict:
            pending.extend((f"result.{inner}", item) for inner, item in value.items())
        else:
            pending.append((key, value))
    while pending:
        where, node = pending.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if value == boundary.INPUT_REQUIRED and key.casefold() == "resulttype":
                    return where
                pending.append((f"{where}.{key}", value))
        elif isinstance(node, list):
            pending.extend((f"{where}[{index}]", item) for index, item in enumerate(node))
    return None


def _strays_possible(messages: list[Any], text: str) -> bool:
    """Whether ``messages`` (read from ``text``) may hold an ``input_required`` result where none
    may stand: the walk of :func:`_stray_input_required` is skipped when the text names
    ``"input_required"`` only as often as the messages' own results are one (without a
    ``\\u`` escape the value can be written no other way)."""
    if _json.has_unicode_escape(text):
        return True
    named = text.count('"input_required"')
    if not named:
        return False
    for message in messages:  # a loop, not sum(): the usual answer is one message, counted per answer
        if (
            isinstance(message, dict)
            and type(message.get("result")) is dict
            and message["result"].get("resultType") == boundary.INPUT_REQUIRED
        ):
            named -= 1
    return named > 0


def _round_answer(result: object) -> str | None:
    """Where ``result`` gives a round's answer (``input_required``, or a state in any spelling), or None.

    One message per request may give it: a second would ask again, or hand out a second
    token, for one round (:meth:`_Outbound._seal_message`).
    """
    if type(result) is not dict:
        return None
    for key, value in result.items():
        asks = value == boundary.INPUT_REQUIRED and key.casefold() == "resulttype"
        if asks or boundary.spells_state(key):
            return f"result.{key}"
    return None


def _refuse_stray(
    message: Mapping[str, Any],
    where: str,
    *,
    reason: str = "stray_input_required",
    what: str = "an input_required result",
) -> dict[str, Any]:
    """The error that replaces a message holding ``what`` (an ``input_required`` result) at ``where``.

    A response keeps its id; a notification or a server request, which the client answers
    no error to, is replaced by an error without one.
    """
    logger.error(
        "%s at %s of an answer (it may carry a plaintext state); the message was replaced by -32603",
        what,
        where[:100],
        extra=_telemetry.fields("answer_refused", reason=reason, detail=where[:100]),
    )
    request_id = None if "method" in message else message.get("id")
    return WireError.internal().response(request_id)


@dataclass(frozen=True, slots=True)
class _Request:
    """An MRTR request as parsed: the message, its method and params, whether it holds a state."""

    message: dict[str, Any]
    method: str
    params: dict[str, Any] | None
    stated: bool


# ---------------------------------------------------------------- the middleware
class RequestStateMiddleware(boundary.Bounded):
    """ASGI middleware sealing and unsealing MCP ``requestState`` with a StateCodec.

    :param app: the ASGI application serving MCP over Streamable HTTP.
    :param codec: the :class:`~statecodec.StateCodec` (with a replay store for single use).
    :param audience: the service the tokens are for, the same on every instance of one
        service and different between services that share keys.
    :param principal: ``principal(scope, headers) -> str | None`` (may be async); ``None``
        binds no principal. See :data:`PrincipalFn`.
    :param max_body_bytes: larger request bodies get 413 before more is read.
    :param max_response_bytes: the largest JSON answer (or SSE event) that can be
        inspected; a larger one fails closed.
    :param max_judged_bytes: the most bytes of answers held for inspection at once, all
        requests together (:class:`JudgedBytes`); an answer that would take more is
        refused (HTTP 503, -32603, or its stream cut), never waits.
    :param passthrough_paths: exact paths (as sent, percent-encoded) whose requests are
        not judged as MCP, for example a form-encoded OAuth endpoint served by the same
        application. Never the MCP path, and never a bypass: a JSON body there that
        carries a ``requestState`` in any spelling is refused, and the answers are
        watched like every other.
    :param retry_after: seconds a client must wait before retrying a requestState-only
        round; ``None``: no pacing. :param max_hold: an early retry is held until its time
        when that is at most this far away, else answered at once with the same state
        (see :func:`statecodec.adapters.mcp.protect`). Rounds chain automatically.
    :param max_holds: early retries held at once, :param max_holds_per_token: of one
        token; one more is answered at once with the same state
        (:class:`~statecodec.boundary.Holds`). While held, a retry keeps only its
        raw body (not its parse), and a client that disconnects releases it: the token
        is not consumed and the application is not called.
    """

    def __init__(
        self,
        app: ASGIApp,
        codec: StateCodec | boundary.BoundaryOptions,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_judged_bytes: int = DEFAULT_MAX_JUDGED_BYTES,
        passthrough_paths: Collection[str] = (),
        **settings: Unpack[Settings],
    ) -> None:
        if max_body_bytes < 1 or max_response_bytes < 1:
            raise ValueError("max_body_bytes and max_response_bytes must be positive")
        for path in passthrough_paths:
            if not path.startswith("/") or not path.isascii() or "?" in path:
                raise ValueError(
                    f"passthrough path {path[:80]!r} must be a path as clients send it: "
                    "starting with '/', ASCII (percent-encoded), without a query"
                )
        self.app = app
        self.boundary = boundary.Boundary(boundary.BoundaryOptions.of(codec, settings))
        self.max_body_bytes = max_body_bytes
        self.max_response_bytes = max_response_bytes
        self.passthrough_paths = frozenset(passthrough_paths)
        self._passthrough_raw = frozenset(path.encode("utf-8") for path in self.passthrough_paths)
        self.judged_bytes = JudgedBytes(max_judged_bytes)

    @classmethod
    def from_options(
        cls,
        app: ASGIApp,
        options: boundary.BoundaryOptions,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_judged_bytes: int = DEFAULT_MAX_JUDGED_BYTES,
        passthrough_paths: Collection[str] = (),
    ) -> RequestStateMiddleware:
        """The middleware for ``options``: the same as ``RequestStateMiddleware(app, options, ...)``."""
        return cls(
            app,
            options,
            max_body_bytes=max_body_bytes,
            max_response_bytes=max_response_bytes,
            max_judged_bytes=max_judged_bytes,
            passthrough_paths=passthrough_paths,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))
        request_id: Any = None
        try:
            passthrough = self._passthrough(request_path(scope))
            sent = RequestHeaders.read(headers)
            body = await self._read_body(sent.index, receive)
            if body is None:
                return  # the client went away while sending
            judged: Judged | None = None
            read: object = _UNREAD  # the body's method, once read from it
            if passthrough:
                self._check_passthrough(body)
            elif body:
                read, request = self._parse(sent, body)
                if request is not None:
                    request_id = request.message["id"]
                    if not request.stated:  # nothing to hold: the plain call of every flow's first round
                        judged, body = await self._judge(
                            scope, sent, request, body, self.boundary.options.max_hold
                        )
                    else:
                        handed, request = [request], None  # this frame keeps no parse during a hold
                        verdict = await self._judge_holding(scope, sent, handed, body, receive=receive)
                        if verdict is None:
                            return  # the client went away during the hold: nothing consumed, nothing run
                        judged, body = verdict
        except WireError as refusal:
            if refusal.code != boundary.WIRE_ERROR_CODE:  # a token's refusal is logged where judged
                logger.warning(
                    "refused a request with HTTP %d: %s",
                    refusal.status,
                    refusal.reason,
                    extra=_telemetry.fields("request_refused", reason=refusal.reason, status=refusal.status),
                )
            await _respond(send, refusal.status, refusal.response(request_id))
            return
        if judged is not None and judged.early is not None:  # a paced round retried too early
            await _respond(send, 200, boundary.result_response(request_id, judged.early))
            return
        if judged is not None and judged.opened is not None:
            _log_round(judged.method, judged.opened)
        outbound = _Outbound(
            self.boundary, self.max_response_bytes, send, judged, request_id, budget=self.judged_bytes
        )
        try:
            await self.app(_forwarded(scope, sent, body, read), _replay(body, receive), outbound.send)
        finally:
            outbound.release()  # what an answer left unfinished held of the budget
        if judged is not None:  # an answer without a state is relayed unparsed: the boundary ends its flow
            self.boundary.end(judged)

    def _passthrough(self, raw_path: bytes) -> bool:
        """Whether ``raw_path`` is a passthrough path; refuses a path with two readings.

        Decided on the path as sent, which is what the upstream receives. A path with a
        percent-encoded ``/`` or unreserved character, or one that decodes to a passthrough
        path, could be read by a router as another path than the one judged here: refused.
        """
        if raw_path in self._passthrough_raw:
            return True
        if raw_path.find(b"%") != -1 and (  # not `in`: bytes.__contains__ raises a TypeError first
            _AMBIGUOUS_ESCAPE.search(raw_path) or unquote_to_bytes(raw_path) in self._passthrough_raw
        ):
            raise _refusal(400, INVALID_REQUEST_CODE, "percent-encoded path refused: it has another reading")
        return False

    def _check_passthrough(self, body: bytes) -> None:
        """A passthrough path is for non-MCP endpoints: a JSON body with a state is refused.

        Some servers (the TypeScript SDK's ``createMcpHandler`` behind ``node:http``) serve
        MCP on every path, so a ``tools/call`` sent to the passthrough path would reach
        them unjudged.
        """
        if _json.classify(body, final=True) != "json":
            return
        text = _json.decode_answer(body)
        if not _json.may_hold_state(text):
            return
        try:
            document = _json.read_answer(text)
        except ValueError:
            raise _refusal(400, PARSE_ERROR_CODE, "Parse error") from None
        key = _state_keys(document)
        if key is not None:
            logger.warning(
                "refused a JSON body carrying %r on a passthrough path",
                key[:40],
                extra=_telemetry.fields("request_refused", reason="state_on_passthrough", status=400),
            )
            raise WireError.invalid_state("a requestState on a passthrough path", status=400)

    async def _read_body(self, index: Mapping[bytes, bytes], receive: Receive) -> bytes | None:
        encoding = index.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
            # The application might decompress what this middleware cannot read.
            raise _refusal(415, INVALID_REQUEST_CODE, "compressed request bodies are not accepted")
        declared = index.get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                raise _refusal(400, INVALID_REQUEST_CODE, "invalid Content-Length") from None
            if length > self.max_body_bytes:
                raise _refusal(413, INVALID_REQUEST_CODE, "request body too large")
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                raise _refusal(413, INVALID_REQUEST_CODE, "request body too large")
            if not message.get("more_body", False):
                return bytes(body)

    def _parse(self, sent: RequestHeaders, body: bytes) -> tuple[object, _Request | None]:
        """The method in ``body`` (None if none) and the MRTR request it is (None for any other
        message); or a refusal. The message stays in this frame: a held request keeps no parse."""
        try:
            message = loads_strict(body)
        except ValueError as exc:
            logger.info(
                "the request body is not strict JSON: %s",
                str(exc)[:200],
                extra=_telemetry.fields("request_refused", reason="parse_error", detail=str(exc)[:200]),
            )
            raise _refusal(400, PARSE_ERROR_CODE, "Parse error") from None
        if isinstance(message, list):
            # MCP has had no batches since 2025-06-18, and MRTR exists only in 2026-07-28.
            raise _refusal(400, INVALID_REQUEST_CODE, "JSON-RPC batches are not accepted")
        if not isinstance(message, dict):
            raise _refusal(400, INVALID_REQUEST_CODE, "the body is not a JSON-RPC message")
        _check_keys(message, _ENVELOPE_KEYS, "JSON-RPC")
        _check_routing_headers(sent, message)
        method, params = message.get("method"), message.get("params")
        if not isinstance(method, str) or not boundary.is_mrtr(method):
            return method, None  # forwarded byte for byte; its answers are watched all the same
        if isinstance(params, dict):
            _check_keys(params, boundary.PARAMS_KEYS, f"{method} params")
        else:
            params = None
        stated = params is not None and boundary.carries_state(params)
        if "id" not in message:
            if stated:  # a notification cannot be answered: its state would go unjudged
                raise _refusal(400, INVALID_REQUEST_CODE, f"a {method} notification carries a requestState")
            return method, None
        return method, _Request(message, method, params, stated)

    def _judge_holding(
        self,
        scope: Scope,
        sent: RequestHeaders,
        handed: list[_Request],
        body: bytes,
        *,
        receive: Receive,
    ) -> Awaitable[tuple[Judged, bytes] | None]:
        """:meth:`_judge` through the boundary's hold loop; only the raw body is kept during a hold.

        ``handed`` holds the parsed request, emptied by the first judgement so that no frame
        keeps it: after a hold the request is parsed again from the raw body and judged
        from the start. ``None``: the client went away during the hold.
        """

        def judge(max_hold: float) -> Awaitable[tuple[Judged, bytes]]:
            request = handed.pop() if handed else self._parse(sent, body)[1]
            if request is None:  # pragma: no cover - the same body parses the same way
                raise _refusal(400, INVALID_REQUEST_CODE, "the request changed during its hold")
            return self._judge(scope, sent, request, body, max_hold)

        return self.boundary.judge(judge, partial(boundary.client_stays, receive))

    async def _judge(
        self,
        scope: Scope,
        sent: RequestHeaders,
        request: _Request,
        body: bytes,
        max_hold: float,
    ) -> tuple[Judged, bytes]:
        """The verdict on an MRTR request, and the body to forward; an early retry is not held here."""
        bind = await self._binder(scope, sent, request.method, request.params)
        if not request.stated:
            judged = await boundary.judge_request(
                self.boundary.options.codec, request.method, request.params, bind, wait=None
            )
            return judged, body
        # The body to forward is written before the token is consumed, with an unguessable
        # placeholder for the plaintext: nothing that can fail runs after the consume. No ':'
        # in it: ":" then hex reads to dumps as a possible float (':' digits 'e'), which would
        # send a sixth of these bodies the slow way, through json.dumps.
        marker = f"\x00statecodec {secrets.token_hex(16)}\x00"
        params = {**(request.params or {}), boundary.REQUEST_STATE: marker}
        head, _, tail = dumps({**request.message, "params": params}).partition(dumps(marker))
        judged = await boundary.judge_request(
            self.boundary.options.codec, request.method, request.params, bind, max_hold=max_hold, wait=None
        )
        if judged.early is not None:
            return judged, body  # never forwarded: answered at once with the same state
        return judged, head + dumps(judged.params[boundary.REQUEST_STATE]) + tail

    async def _binder(
        self, scope: Scope, sent: RequestHeaders, method: str, params: Mapping[str, Any] | None
    ) -> boundary.Binder:
        """``bind()`` for an MRTR request; the principal is resolved now, the digest on use."""
        try:
            principal = await self.resolve_principal(scope, sent)
        except Exception as exc:  # deny on error: credentials that do not verify bind no one
            failure = exc

            def unbindable() -> Binding:
                raise failure

            return unbindable
        audience = self.boundary.options.audience
        return lambda: boundary.binding_for(method, params, principal=principal, audience=audience)

    async def resolve_principal(
        self, scope: Scope, headers: RequestHeaders | list[tuple[bytes, bytes]]
    ) -> str | None:
        """The request's principal, through the configured callable (sync or async)."""
        resolve: PrincipalFn | None = self.boundary.options.principal
        if resolve is None:
            return None
        sent = headers if isinstance(headers, RequestHeaders) else RequestHeaders.read(headers)
        principal = resolve(scope, sent.joined())
        if inspect.isawaitable(principal):
            principal = await principal
        if principal is not None and not isinstance(principal, str):
            raise TypeError(f"the principal callable returned {type(principal).__name__}, not str or None")
        return principal


def _log_round(method: str, opened: OpenedState) -> None:
    """The access line of a round that came in with a state: its flow and round, as fields."""
    if not access_logger.isEnabledFor(logging.INFO):
        return  # its fields are built only for a line that is written
    access_logger.info(
        "round %d of flow %s: %s",
        opened.round,
        opened.flow_id[:8],
        method,
        extra=_telemetry.fields("round_received", method=method, **boundary.flow_fields(opened)),
    )


def _forwarded(scope: Scope, sent: RequestHeaders, body: bytes, method: object) -> Scope:
    """The scope the application gets: its body's length, an uncompressed answer asked for, and
    the body's JSON-RPC ``method`` when it was read (:data:`BODY_METHOD`)."""
    declared = sent.index.get(b"content-length")
    length = body_length(body)
    if (body or declared is not None) and declared != length:  # one pass drops all three
        headers = sent.without(*FORWARDER_HEADERS)
        headers.append((b"content-length", length))
    else:
        headers = sent.without(b"accept-encoding")
    headers.append(ACCEPT_IDENTITY)
    if method is _UNREAD:
        return {**scope, "headers": headers}
    extensions = {**(scope.get("extensions") or _NONE), BODY_METHOD: method}  # the server's kept
    return {**scope, "headers": headers, "extensions": extensions}


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the application ``body`` once, then the real channel."""
    delivered = False

    async def replayed() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # http.disconnect, which streaming applications watch for

    return replayed


async def _respond(send: Send, status: int, payload: Any) -> None:
    body = dumps(payload)
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode("ascii"))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# ---------------------------------------------------------------- answers
#: The largest answer judged without taking its bytes from :class:`JudgedBytes`: one that
#: comes whole in a single message. The budget is there for the answers held while they wait
#: for more bytes (any number of them at once); a whole answer is judged as it arrives, its
#: decoded text and document made and dropped within one step of the event loop, so only one
#: such judgement is under way at a time, and what stays held until the answer is written is
#: its bytes, at most this many per request in flight (in the proxy, at most one request per
#: upstream connection). Counting it cost every answer a take and a give of the budget.
UNCOUNTED_BYTES: Final = 64 * 1024


class JudgedBytes:
    """The bytes of answers held for inspection, all requests together, within ``limit``.

    Every answer that is buffered to be judged (a JSON body or message not complete yet,
    an SSE event not ended yet) takes its bytes here as they arrive and gives them back
    once judged (an answer of at most :data:`UNCOUNTED_BYTES` that comes whole is judged
    at once, without them); one that would take more than what is left is refused at once, so memory
    stays bounded whatever the number of large answers in flight, and no answer waits.
    """

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("max_judged_bytes must be positive")
        self.limit = limit
        self.held = 0

    def take(self, count: int) -> bool:
        if self.held + count > self.limit:
            return False
        self.held += count
        return True

    def give(self, count: int) -> None:
        self.held -= count


class _Outbound:
    """Wraps ``send``: every answer is read as a client would read it, and its states sealed.

    The body decides, not its media type: clients accept many (the ``mcp`` client takes
    anything starting with ``application/json``), and an attacker reads bytes whatever
    they are labelled. ``text/event-stream`` is parsed event by event (never buffering
    the stream); any other body whose first bytes open a JSON document or an event stream
    is parsed as such; everything else (HTML, text, files) is relayed byte for byte.

    A state in what is parsed is sealed when it answers this exchange's MRTR request and
    replaced by -32603 otherwise; so is an answer to that request after the first that is
    ``input_required`` or carries a state (one round, one token). What might carry a state
    and cannot be read (compressed, too large, not parsable) is replaced by HTTP 502 /
    -32603 (a body) or by an error event (in a stream), and logged.
    """

    _parser: _sse.Parser  # made by _start_stream, the only way into the "sse" mode

    def __init__(
        self,
        owner: boundary.Boundary,
        limit: int,
        send: Send,
        judged: Judged | None,
        request_id: Any,
        *,
        budget: JudgedBytes,
    ) -> None:
        self.boundary = owner
        self.limit = limit
        self.judged = judged
        self.request_key = _id_key(request_id)
        self._send = send
        self._mode = "start"  # then: sniff, json, sse, raw, opaque; done once answered
        self._start: Message = {}
        self._content_type: bytes | None = None
        self._body = bytearray()
        self._ends: _json.MessageEnds | None = None  # a UTF-8 JSON answer that may be a stream
        self._streaming = False  # its head is sent: its messages go out one by one
        self.request_id = request_id
        self._budget = budget
        self._held = 0  # bytes of this answer counted in the budget
        self._answered = False  # a message read so far answers the request

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            await self._on_start(message)
        elif kind == "http.response.body":
            await self._on_body(message.get("body", b""), bool(message.get("more_body", False)))
        elif self._mode != "done":
            await self._send(message)

    async def _on_start(self, message: Message) -> None:
        self._start = message
        index = _index(list(message.get("headers", ())))
        self._content_type = index.get(b"content-type")
        media = _media_type(self._content_type)
        encoding = index.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
            self._mode = "opaque"  # cannot be read, so cannot be sealed
        elif media == "text/event-stream":
            await self._start_stream()
        else:  # application/json, application/json-rpc, application/*+json, text/plain, none...
            self._mode = "sniff"

    def _hold(self, pending: int) -> bool:
        """Count ``pending`` bytes (what this answer buffers now) in the budget; False if over it."""
        if pending > self._held and not self._budget.take(pending - self._held):
            return False
        if pending < self._held:
            self._budget.give(self._held - pending)
        self._held = pending
        return True

    def release(self) -> None:
        """Give back what this answer holds of the budget (it is answered, or abandoned)."""
        if self._held:
            self._budget.give(self._held)
            self._held = 0

    async def _over_budget(self) -> None:
        budget = self._budget
        logger.error(
            "%d bytes of answers are held for inspection, at most %d; this answer was refused",
            budget.held,
            budget.limit,
            extra=_telemetry.fields("answer_refused", reason="judged_bytes", status=503),
        )
        started = self._streaming or self._mode in ("sse", "raw")
        self._mode = "done"
        self.release()
        if started:
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            busy = WireError(INTERNAL_ERROR_CODE, "Too many answers being inspected: retry", status=503)
            await _respond(self._send, busy.status, busy.response(self.request_id))

    async def _on_body(self, chunk: bytes, more: bool) -> None:
        mode = self._mode
        if mode == "sniff" and not more and not self._body and len(chunk) <= UNCOUNTED_BYTES:
            # A small answer whole in one message (the usual one) is classified without the
            # budget: see UNCOUNTED_BYTES for why that keeps memory bounded.
            kind = _json.classify(chunk, final=True)
            if kind is not None:
                await self._classified(chunk, more, kind)
                return
        if mode in ("json", "sniff") and not self._hold(len(self._body) + len(chunk)):
            await self._over_budget()
            return
        if mode == "raw":
            await self._send({"type": "http.response.body", "body": chunk, "more_body": more})
        elif mode == "sse":
            await self._on_sse(chunk, more)
        elif mode == "opaque":
            if chunk:
                await self._fail_closed("a compressed answer cannot be inspected")
            elif not more:
                await self._relay(b"")
        elif mode in ("json", "sniff"):
            self._body += chunk
            if mode == "sniff":
                await self._sniff(more)
            elif self._ends is not None and (more or self._streaming):
                await self._on_messages(more)
            elif len(self._body) > self.limit:
                await self._fail_closed(
                    f"an answer exceeds {self.limit} bytes, the most that can be inspected"
                )
            elif not more:
                await self._finish_json(self._drained())
        # done: a failed-closed answer; the application's remaining output is dropped

    async def _sniff(self, more: bool) -> None:
        kind = _json.classify(bytes(self._body), final=not more)
        if kind is None:
            if len(self._body) > self.limit:
                await self._fail_closed(f"an answer opens with over {self.limit} bytes of whitespace")
            return
        await self._classified(self._drained(), more, kind)

    async def _classified(self, body: bytes, more: bool, kind: _json.Kind) -> None:
        """Go on with ``body``, the answer's first bytes, by what ``kind`` says they are."""
        if kind == "sse":
            await self._start_stream()
        else:
            self._mode = "json" if kind == "json" else "raw"
            if self._mode == "raw":
                await self._send(self._start)
            elif not more and len(body) <= self.limit:  # the whole answer (the usual one): no buffer again
                await self._finish_json(body)
                return
            elif _json.is_utf8(body):
                self._ends = _json.MessageEnds()  # it may go on message after message
        await self._on_body(body, more)

    def _drained(self) -> bytes:
        """The buffered body as bytes, the buffer emptied: the answer is held once, not twice."""
        body, self._body = bytes(self._body), bytearray()
        return body

    async def _relay(self, body: bytes) -> None:
        self._mode = "done"
        await self._send(self._start)
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _finish_json(self, body: bytes) -> None:
        """The whole ``body`` of a JSON answer is in: seal it, replace it, or relay it."""
        if not body:
            await self._relay(body)  # HEAD, 204, 304: nothing to read
            return
        text = _json.decode_answer(body)
        if not _json.may_need_sealing(text):
            await self._relay(body)  # the common answer: no state, nothing input_required
            return
        try:
            document = _json.read_answer(text)
        except ValueError as exc:
            await self._fail_closed(f"an answer that looks like JSON cannot be parsed ({str(exc)[:100]})")
            return
        document, changed = self._seal_document(document, text)
        if not changed:
            del document  # the answer is held once as bytes and once as text while it is checked
            if not _json.has_duplicate_keys(text):  # a shadowed value may be a state
                await self._relay(body)
                return
            document, _ = self._seal_document(_json.read_answer(text), text)
        del body, text  # the answer is held once, as the document, while it is written again
        self._mode = "done"
        body = dumps(document, allow_nan=True)
        del document
        headers = _utf8(_without(list(self._start.get("headers", ())), b"content-length"), self._content_type)
        headers.append((b"content-length", str(len(body)).encode("ascii")))
        await self._send({**self._start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _on_messages(self, more: bool) -> None:
        """A JSON answer that goes on: each message is relayed as soon as it is complete.

        An answer of several messages (a ``subscriptions/listen`` answer written as
        newline-separated JSON under ``application/json``, NDJSON) is never held whole: once
        a message is complete before the end of the body, the head goes out (without a
        length) and each message after it, judged on its own (:meth:`_judged`). A single
        message whose body ends with it takes :meth:`_finish_json`, as before.
        """
        finder = self._ends
        if finder is None:  # set with the "json" mode of a UTF-8 answer, the only way here
            raise RuntimeError("a JSON answer's message ends were asked for before it was sniffed")
        ends = finder.scan(self._body)
        if not more:
            ends.append(len(self._body))  # what is left: whitespace, or an unfinished message
        starts = [0, *ends]
        sizes = [end - start for start, end in zip(starts, ends, strict=False)]
        if max(len(self._body) - starts[-1], *sizes, 0) > self.limit:
            await self._too_large()
            return
        if ends and not self._streaming:
            self._streaming = True
            headers = _without(list(self._start.get("headers", ())), b"content-length")
            await self._send({**self._start, "headers": headers})
        out = []
        for start, end in zip(starts, ends, strict=False):
            raw = bytes(self._body[start:end])
            judged = self._judged(raw)
            if judged is not None:  # the whitespace around the message stays as it was
                raw = (
                    raw[: len(raw) - len(raw.lstrip(_JSON_SPACE))]
                    + judged
                    + raw[len(raw.rstrip(_JSON_SPACE)) :]
                )
            out.append(raw)
        del self._body[: starts[-1]]
        finder.consumed(starts[-1])
        self._hold(len(self._body))
        if out or not more:
            await self._send({"type": "http.response.body", "body": b"".join(out), "more_body": more})
        if not more:
            self._mode = "done"

    async def _too_large(self) -> None:
        """A message of an answer over the limit: a 502, or the stream cut if it has begun."""
        why = f"a message of an answer exceeds {self.limit} bytes, the most that can be inspected"
        if not self._streaming:
            await self._fail_closed(why)
            return
        logger.error(
            "%s; the stream was cut", why, extra=_telemetry.fields("answer_refused", reason="too_large")
        )
        self._mode = "done"
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})

    def _judged(self, data: bytes) -> bytes | None:
        """One message as the client gets it: None when it goes out as written, else its new bytes.

        A message that cannot hold a state and is not ``input_required`` is not parsed; one
        that may is parsed as the most lenient client reads it and its states sealed (or it
        is replaced by -32603); one that looks like JSON and does not parse is replaced.
        """
        text = _json.decode_answer(data)
        if not _json.may_need_sealing(text):
            if self.judged is not None and not self._answered and self._may_answer(text):
                self._answered = self._answers_unread(text)
            return None
        try:
            document = _json.read_answer(text)
        except ValueError as exc:
            logger.error(
                "a message that looks like JSON cannot be parsed (%s); replaced by -32603",
                str(exc)[:100],
                extra=_telemetry.fields("answer_refused", reason="unreadable_event", detail=str(exc)[:100]),
            )
            return dumps(WireError.internal().response())
        document, changed = self._seal_document(document, text)
        if not changed and not _json.has_duplicate_keys(text):
            return None
        return dumps(document, allow_nan=True)

    def _may_answer(self, text: str) -> bool:
        """Whether a message relayed unread (ASCII, no ``\\u`` escape: :func:`_json.may_need_sealing`)
        may answer the request: it names an ``id``, or the request's id is null and an answer
        without one would match it."""
        return '"id"' in text or self.request_key == _NULL_ID

    def _answers_unread(self, text: str) -> bool:
        """Whether a message relayed unread answers the request, as :meth:`_seal_message` counts.

        Only an answer to the MRTR request of the exchange may be sealed, and only the first
        one (one round, one token): the client takes this message as that answer, so what
        comes after it on the stream may not ask again. A message with a repeated key is
        counted as an answer (a client may read another of its ids); one that does not parse
        answers nothing a client can read.
        """
        try:
            document = _json.read_answer(text)
        except ValueError:
            return False
        messages = document if isinstance(document, list) else [document]
        if any(isinstance(message, dict) and self._answers(message) for message in messages):
            return True
        return text.count('"id"') > 1 and _json.has_duplicate_keys(text)

    def _answers(self, message: Mapping[str, Any]) -> bool:
        """Whether ``message`` is a response to the request (a notification or server request is not)."""
        return "method" not in message and _id_key(message.get("id")) == self.request_key

    async def _start_stream(self) -> None:
        # Events are rewritten as they pass: the length is no longer known.
        self._mode = "sse"
        self._parser = _sse.Parser(self.limit)
        headers = _without(list(self._start.get("headers", ())), b"content-length")
        await self._send({**self._start, "headers": headers})

    async def _on_sse(self, chunk: bytes, more: bool) -> None:
        if not self._hold(self._parser.pending + len(chunk)):
            await self._over_budget()
            return
        try:
            events = self._parser.feed(chunk)
            rest = b""
            if not more:
                tail, rest = self._parser.close()
                events += tail
        except _sse.EventTooLargeError as exc:
            logger.error(
                "%s; the stream was cut (it may carry a state that cannot be sealed)",
                exc,
                extra=_telemetry.fields("answer_refused", reason="event_too_large"),
            )
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            self._mode = "done"
            return
        self._hold(self._parser.pending)
        out = b"".join(self._sse_event(event) for event in events)
        if rest:
            logger.warning(
                "dropped an unfinished SSE event at the end of a stream",
                extra=_telemetry.fields("answer_refused", reason="unfinished_event"),
            )
        if out or not more:
            await self._send({"type": "http.response.body", "body": out, "more_body": more})
        if not more:
            self._mode = "done"

    def _sse_event(self, event: _sse.Event) -> bytes:
        data = event.data
        if not data or _json.classify(data, final=True) != "json":
            return event.raw  # priming events, keep-alives, comments, plain text
        judged = self._judged(data)
        return event.raw if judged is None else event.with_data(judged)

    async def _fail_closed(self, why: str) -> None:
        logger.error(
            "%s; answered 502",
            why,
            extra=_telemetry.fields("answer_refused", reason="unreadable", detail=why, status=502),
        )
        self._mode = "done"
        await _respond(self._send, 502, WireError.internal().response())

    # -------------------------------------------------------- sealing results
    def _seal_document(self, document: Any, text: str) -> tuple[Any, bool]:
        """``document`` (read from ``text``) with its states sealed, and whether anything changed."""
        messages = document if isinstance(document, list) else [document]
        strays = _strays_possible(messages, text)
        if not isinstance(document, list):
            return self._seal_message(document, strays)
        # No client sends batches, but a server may answer with one. A list, not a generator,
        # for any(): a generator it stops early is closed by raising GeneratorExit into it.
        sealed = [self._seal_message(message, strays) for message in messages]
        return [message for message, _ in sealed], any([changed for _, changed in sealed])

    def _seal_message(self, message: Any, strays: bool) -> tuple[Any, bool]:
        if not isinstance(message, dict):
            return message, False
        answers = self._answers(message)
        again = _round_answer(message.get("result")) if answers and self._answered else None
        self._answered = self._answered or answers
        if again is not None:  # the client took the first answer: a second round would fork the flow
            what = "a second input_required result or state answering one request"
            return _refuse_stray(message, again, reason="repeated_answer", what=what), True
        stray = _stray_input_required(message) if strays else None
        if stray is not None:
            return _refuse_stray(message, stray), True
        sealed: dict[str, Any] | None = None
        for key, result in message.items():
            if type(result) is not dict or key.casefold() != "result":
                continue
            # Another spelling ("Result") is read by case-insensitive clients, so a state
            # in it is refused like one answering no request of this exchange.
            mine = key == "result" and _id_key(message.get("id")) == self.request_key
            try:
                new = self.boundary.seal(self.judged if mine else None, result)
            except WireError as exc:
                return exc.response(message.get("id")), True
            if new is not result:
                sealed = {**(sealed or message), key: new}
        return (message, False) if sealed is None else (sealed, True)


def _utf8(headers: list[tuple[bytes, bytes]], declared: bytes | None) -> list[tuple[bytes, bytes]]:
    """``headers`` for a body rewritten in UTF-8: a declared other charset would mislead.

    ``declared``: the answer's ``Content-Type`` (the first, as :func:`_index` keeps it).
    """
    if declared is None or declared.lower().find(b"charset") == -1:  # find: see _passthrough
        return headers
    media = _media_type(declared).encode("latin-1") or b"application/json"
    return [*_without(headers, b"content-type"), (b"content-type", media)]
