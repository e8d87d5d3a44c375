"""Protect any ASGI MCP server (Streamable HTTP) without touching its code.

    from statecodec.adapters.asgi import RequestStateMiddleware
    app = RequestStateMiddleware(app, codec, audience="deploy")

The middleware sits at the JSON-RPC layer of the HTTP transport. On the way in, every
``tools/call``, ``resources/read`` and ``prompts/get`` request carrying a
``requestState`` is unsealed (verified, binding checked, consumed in the replay store)
and the body is rewritten so the application receives the plaintext state it issued; a
request whose token fails gets the uniform -32602 error and never reaches the
application. On the way out, the ``requestState`` of every ``input_required`` result is
sealed, in ``application/json`` bodies and in ``text/event-stream`` streams alike (event
by event, never buffering a stream). Everything else passes through byte for byte.

The rules on *what* is bound and *what* a rejection looks like come from
:mod:`statecodec.adapters.jsonrpc`, shared with the SDK adapters. This module adds what
only a byte-level intermediary needs, above all: **the application must see exactly the
JSON the middleware judged.** A server parsing the body differently (duplicate keys,
``"RequestState"`` matched case-insensitively as Go's ``encoding/json`` does, invalid
UTF-8 repaired into U+FFFD, a compressed body) could read a state the middleware never
verified. So a request body that is not strict JSON, or that spells a protocol key in
another case, is refused before the application runs, and compressed bodies are refused
too, as are ``Mcp-Method``/``Mcp-Name`` headers that disagree with the body. See
docs/proxy.md for the full list of what is and is not bound.

Batches: each element is judged on its own. An element whose token fails is answered
with the -32602 error by the middleware and removed from the batch; the rest is
forwarded, and the middleware's answers are merged into the application's response.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Collection, Mapping, MutableMapping
from typing import Any, Final, TypeAlias

from .._binding import Binding
from .._codec import StateCodec
from .._errors import InvalidState
from . import _sse, jsonrpc

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "ASGIApp",
    "Message",
    "PrincipalFn",
    "Receive",
    "RequestStateMiddleware",
    "Scope",
    "Send",
    "dumps",
    "loads_strict",
]

logger = logging.getLogger("statecodec")

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

#: The TypeScript SDK's default limit on a POST body.
DEFAULT_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
#: The largest JSON response or single SSE event inspected; larger ones fail closed.
DEFAULT_MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
_JSON_HEADERS: Final = [(b"content-type", b"application/json")]
_INSPECTED_MEDIA: Final = frozenset({"application/json", "text/event-stream"})
# Keys whose exact spelling decides what a server reads. A key equal to one of them
# under Unicode case folding, but not identical, would be read by a case-insensitive
# parser (Go's encoding/json also folds U+017F to "s" and U+212A to "k") and ignored here.
_ENVELOPE_KEYS: Final = frozenset({"jsonrpc", "id", "method", "params", "result", "error"})
_PARAMS_KEYS: Final = frozenset({"name", "uri", "arguments", "requestState", "inputResponses", "_meta"})
_FOLDED_ENVELOPE: Final = {key.casefold(): key for key in _ENVELOPE_KEYS}
_FOLDED_PARAMS: Final = {key.casefold(): key for key in _PARAMS_KEYS}
_B64_SENTINEL: Final = re.compile(r"=\?base64\?(.*)\?=", re.DOTALL)


class _Refused(Exception):  # noqa: N818 - control flow, never leaves this module
    """The whole request is refused with an HTTP status and a JSON-RPC error."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class _Missing:
    pass


_MISSING: Final = _Missing()


# ---------------------------------------------------------------- strict JSON
def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key[:40]!r}")
        obj[key] = value
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_STRICT: Final = json.JSONDecoder(object_pairs_hook=_unique, parse_constant=_no_constant)


def loads_strict(data: bytes) -> Any:
    """JSON that every conforming parser reads the same way, or ``ValueError``.

    UTF-8 only (no BOM, no lone surrogates repaired), no duplicate keys, no NaN or
    Infinity. Deeply nested input raises ``ValueError`` too, never ``RecursionError``.
    """
    try:
        return _STRICT.decode(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _loads_lenient(data: bytes) -> Any:
    """A response body as a lenient JSON client reads it, or ``_MISSING``.

    Responses come from the protected server, not from the attacker, so the question is
    only whether a client would find a result in them: decode as browsers do
    (replacing invalid UTF-8), accept duplicate keys (the last wins, as in JavaScript).
    """
    try:
        return json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return _MISSING


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON, never containing a raw line break (safe as one SSE data line).

    Strings holding a lone surrogate (legal in JSON as an escape, not encodable as UTF-8)
    are written escaped, so any decoded document can be written back.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii")


def _check_keys(obj: Mapping[str, Any], folded: Mapping[str, str], where: str) -> None:
    for key in obj:
        canonical = folded.get(key.casefold())
        if canonical is not None and key != canonical:
            raise _Refused(400, INVALID_REQUEST, f"{where} key {key[:40]!r} is not spelled {canonical!r}")


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


def _check_routing_headers(headers: list[tuple[bytes, bytes]], messages: list[Any]) -> None:
    """``Mcp-Method`` and ``Mcp-Name`` must say what the body says.

    MCP 2026-07-28 mirrors the method and the tool/prompt name or resource URI into
    headers for routing. A server (or a router in front of it) that dispatched on the
    header while this middleware judged the body could run a request whose state was
    never verified, or a target other than the bound one: refuse any disagreement.
    """
    method_header = _header(headers, b"mcp-method")
    name_header = _header(headers, b"mcp-name")
    if method_header is None and name_header is None:
        return
    for message in messages:
        if not isinstance(message, dict) or "method" not in message:
            continue
        method = message["method"]
        if method_header is not None and method_header.decode("latin-1") != method:
            raise _Refused(400, INVALID_REQUEST, "the Mcp-Method header does not match the body")
        if name_header is None or not isinstance(method, str) or not jsonrpc.is_mrtr(method):
            continue
        params = message.get("params")
        field = "uri" if method == "resources/read" else "name"
        target = params.get(field) if isinstance(params, dict) else None
        if target is not None and _decode_header_value(name_header) != target:
            raise _Refused(400, INVALID_REQUEST, "the Mcp-Name header does not match the body")


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
    return ("other", dumps(value))


def _error(request_id: Any, error: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": dict(error)}


def _media_type(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.decode("latin-1").split(";", 1)[0].strip().lower()
    return ""


def _header(headers: list[tuple[bytes, bytes]], wanted: bytes) -> bytes | None:
    for name, value in headers:
        if name.lower() == wanted:
            return value
    return None


def _without(headers: list[tuple[bytes, bytes]], *names: bytes) -> list[tuple[bytes, bytes]]:
    return [(name, value) for name, value in headers if name.lower() not in names]


def _header_map(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    joined: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        joined[name] = f"{joined[name]}, {value}" if name in joined else value
    return joined


# ---------------------------------------------------------------- the middleware
class RequestStateMiddleware:
    """ASGI middleware sealing and unsealing MCP ``requestState`` with a StateCodec.

    :param app: the ASGI application serving MCP over Streamable HTTP.
    :param codec: the :class:`~statecodec.StateCodec` (with a replay store for single use).
    :param audience: the service the tokens are for, the same on every instance of one
        service and different between services that share keys.
    :param principal: ``principal(scope, headers) -> str | None`` (may be async); ``None``
        binds no principal. See :data:`PrincipalFn`.
    :param max_body_bytes: larger request bodies get 413 before more is read.
    :param max_response_bytes: the largest JSON response (or SSE event) that can be
        inspected; a larger one to an MRTR request fails closed.
    :param passthrough_paths: exact paths forwarded without any inspection (for example a
        form-encoded OAuth endpoint served by the same application). Never the MCP path.
    """

    def __init__(
        self,
        app: ASGIApp,
        codec: StateCodec,
        *,
        audience: str | None,
        principal: PrincipalFn | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        passthrough_paths: Collection[str] = (),
    ) -> None:
        if not isinstance(codec, StateCodec):
            raise TypeError(f"codec must be a statecodec.StateCodec, not {type(codec).__name__}")
        if max_body_bytes < 1 or max_response_bytes < 1:
            raise ValueError("max_body_bytes and max_response_bytes must be positive")
        self.app = app
        self.codec = codec
        self.audience = audience
        self.principal = principal
        self.max_body_bytes = max_body_bytes
        self.max_response_bytes = max_response_bytes
        self.passthrough_paths = frozenset(passthrough_paths)

    def __repr__(self) -> str:
        return f"RequestStateMiddleware(codec={self.codec!r}, audience={self.audience!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.passthrough_paths:
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))
        try:
            body = await self._read_body(headers, receive)
            if body is None:
                return  # the client went away while sending
            if not body:
                # No JSON-RPC in it (GET streams, DELETE). A stream's events are still
                # watched: a resumed stream must not replay a result's plaintext state.
                watch = _Outbound(self, send, {}, [], batch=False, inspect_json=False)
                await self.app(scope, _replay(body, receive), watch.send)
                return
            exchange = await _Exchange.judge(self, scope, headers, body)
        except _Refused as refusal:
            logger.warning("statecodec: refused a request with HTTP %d: %s", refusal.status, refusal.message)
            await _respond(
                send, refusal.status, _error(None, {"code": refusal.code, "message": refusal.message})
            )
            return
        await exchange.run(self, scope, receive, send)

    async def _read_body(self, headers: list[tuple[bytes, bytes]], receive: Receive) -> bytes | None:
        encoding = _header(headers, b"content-encoding")
        if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
            # The application might decompress what this middleware cannot read.
            raise _Refused(415, INVALID_REQUEST, "compressed request bodies are not accepted")
        declared = _header(headers, b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                raise _Refused(400, INVALID_REQUEST, "invalid Content-Length") from None
            if length > self.max_body_bytes:
                raise _Refused(413, INVALID_REQUEST, "request body too large")
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > self.max_body_bytes:
                raise _Refused(413, INVALID_REQUEST, "request body too large")
            if not message.get("more_body", False):
                return bytes(body)

    async def resolve_principal(self, scope: Scope, headers: list[tuple[bytes, bytes]]) -> str | None:
        """The request's principal, through the configured callable (sync or async)."""
        if self.principal is None:
            return None
        principal = self.principal(scope, _header_map(headers))
        if inspect.isawaitable(principal):
            principal = await principal
        if principal is not None and not isinstance(principal, str):
            raise TypeError(f"the principal callable returned {type(principal).__name__}, not str or None")
        return principal


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


class _Exchange:
    """One POST: what to forward, what the middleware answers itself, and the bindings."""

    def __init__(self, original: bytes) -> None:
        self.original = original
        self.forward: Any = None  # the JSON to forward, when it differs from ``original``
        self.changed = False
        self.batch = False
        self.empty = False  # nothing left to forward
        self.pending: dict[tuple[str, Any], Binding | Exception] = {}
        self.answers: list[dict[str, Any]] = []

    @classmethod
    async def judge(
        cls, middleware: RequestStateMiddleware, scope: Scope, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> _Exchange:
        exchange = cls(body)
        try:
            document = loads_strict(body)
        except ValueError as exc:
            logger.info("statecodec: the request body is not strict JSON: %s", str(exc)[:200])
            raise _Refused(400, PARSE_ERROR, "Parse error") from None
        exchange.batch = isinstance(document, list)
        messages = document if exchange.batch else [document]
        exchange._check(messages)
        _check_routing_headers(headers, messages)
        principal = _Lazy(middleware, scope, headers)
        kept: list[Any] = []
        for message in messages:
            outcome = await exchange._inbound(middleware, principal, message)
            if outcome is not _MISSING:
                kept.append(outcome)
        if exchange.changed:
            exchange.empty = not kept
            exchange.forward = kept if exchange.batch else (kept[0] if kept else None)
        return exchange

    def _check(self, messages: list[Any]) -> None:
        seen: set[tuple[str, Any]] = set()
        for message in messages:
            if not isinstance(message, dict):
                continue
            _check_keys(message, _FOLDED_ENVELOPE, "JSON-RPC")
            method = message.get("method")
            params = message.get("params")
            if isinstance(method, str) and jsonrpc.is_mrtr(method) and isinstance(params, dict):
                _check_keys(params, _FOLDED_PARAMS, f"{method} params")
            if isinstance(method, str) and "id" in message:
                key = _id_key(message["id"])
                if key in seen:
                    # The answer to a duplicated id could not be told apart, nor bound.
                    raise _Refused(400, INVALID_REQUEST, "duplicate request id in a batch")
                seen.add(key)

    async def _inbound(self, middleware: RequestStateMiddleware, principal: _Lazy, message: Any) -> Any:
        """The message to forward, or ``_MISSING`` when the middleware answers or drops it."""
        if not isinstance(message, dict):
            return message
        method = message.get("method")
        if not isinstance(method, str) or not jsonrpc.is_mrtr(method):
            return message
        params = message.get("params")
        # carries_state also catches aliases such as "request_state", which some
        # upstreams (FastMCP, Go's case-insensitive decoding) would read unverified.
        stated: dict[str, Any] | None = (
            params if isinstance(params, dict) and jsonrpc.carries_state(params) else None
        )
        if "id" not in message:
            if stated is None:
                return message
            # A notification cannot be answered; never let its state through unverified.
            logger.warning("statecodec: dropped a %s notification carrying a requestState", method)
            self.changed = True
            return _MISSING
        if stated is not None:
            try:  # cheap checks (aliases, type, size cap) before the argument digest
                jsonrpc.check_state_shape(middleware.codec, method, stated)
            except InvalidState:
                self.answers.append(_error(message["id"], jsonrpc.invalid_state_error()))
                self.changed = True
                return _MISSING
        binding = await self._bind(middleware, principal, method, params)
        self.pending[_id_key(message["id"])] = binding
        if stated is None:
            return message
        try:
            if isinstance(binding, Exception):
                exc = InvalidState(
                    "malformed",
                    f"the request cannot be bound: {type(binding).__name__}: {str(binding)[:200]}",
                )
                jsonrpc.log_rejection(middleware.codec, method, params, exc)
                raise exc
            plaintext = await jsonrpc.unseal_params(middleware.codec, method, stated, binding)
        except InvalidState:
            self.pending.pop(_id_key(message["id"]), None)
            self.answers.append(_error(message["id"], jsonrpc.invalid_state_error()))
            self.changed = True
            return _MISSING
        self.changed = True
        return {**message, "params": plaintext}

    @staticmethod
    async def _bind(
        middleware: RequestStateMiddleware, principal: _Lazy, method: str, params: Any
    ) -> Binding | Exception:
        try:
            mapping = params if isinstance(params, dict) else None
            return jsonrpc.binding_for(
                method, mapping, principal=await principal.get(), audience=middleware.audience
            )
        except Exception as exc:  # deny on error: a request that cannot be bound is never bound to no one
            return exc

    async def run(
        self, middleware: RequestStateMiddleware, scope: Scope, receive: Receive, send: Send
    ) -> None:
        if self.empty:
            await self._answer_alone(send)
            return
        if not (self.pending or self.answers or self.changed):
            await middleware.app(scope, _replay(self.original, receive), send)  # byte for byte, both ways
            return
        body = dumps(self.forward) if self.changed else self.original
        outbound = _Outbound(middleware, send, self.pending, self.answers, batch=self.batch)
        await middleware.app(_with_body(scope, body), _replay(body, receive), outbound.send)

    async def _answer_alone(self, send: Send) -> None:
        if not self.answers:
            await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await _respond(send, 200, self.answers if self.batch else self.answers[0])


def _with_body(scope: Scope, body: bytes) -> Scope:
    # The application must see the body it receives, and must answer in a form this
    # middleware can read: no compressed response.
    headers = _without(
        list(scope.get("headers", ())), b"content-length", b"accept-encoding", b"transfer-encoding"
    )
    headers.append((b"content-length", str(len(body)).encode("ascii")))
    return {**scope, "headers": headers}


class _Lazy:
    """The principal, resolved once per request and only when an MRTR request needs it."""

    def __init__(
        self, middleware: RequestStateMiddleware, scope: Scope, headers: list[tuple[bytes, bytes]]
    ) -> None:
        self._middleware = middleware
        self._scope = scope
        self._headers = headers
        self._done = False
        self._value: str | None = None
        self._error: Exception | None = None

    async def get(self) -> str | None:
        if not self._done:
            self._done = True
            try:
                self._value = await self._middleware.resolve_principal(self._scope, self._headers)
            except Exception as exc:
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._value


# ---------------------------------------------------------------- responses
class _Outbound:
    """Wraps ``send``: seals the results of MRTR requests in JSON bodies and SSE streams."""

    def __init__(
        self,
        middleware: RequestStateMiddleware,
        send: Send,
        pending: dict[tuple[str, Any], Binding | Exception],
        answers: list[dict[str, Any]],
        *,
        batch: bool,
        inspect_json: bool = True,
    ) -> None:
        self.middleware = middleware
        self.inspect_json = inspect_json
        self._send = send
        self.pending = pending
        self.answers = answers
        self.batch = batch
        self._mode = "raw"
        self._start: Message = {}
        self._body = bytearray()
        self._parser = _sse.Parser(middleware.max_response_bytes)
        self._finished = False

    async def send(self, message: Message) -> None:
        if self._finished:
            return  # a failed-closed response: the application's remaining output is dropped
        kind = message["type"]
        if kind == "http.response.start":
            await self._on_start(message)
        elif kind == "http.response.body" and self._mode != "raw":
            await self._on_body(message.get("body", b""), bool(message.get("more_body", False)))
        else:
            await self._send(message)

    async def _on_start(self, message: Message) -> None:
        headers: list[tuple[bytes, bytes]] = list(message.get("headers", ()))
        media = _media_type(headers)
        encoding = _header(headers, b"content-encoding")
        if message["status"] == 202 and self.answers:
            self._mode = "accepted"  # nothing forwarded needed an answer, but the middleware has some
            self._start = message
        elif (
            media in _INSPECTED_MEDIA
            and (self.inspect_json or media == "text/event-stream")
            and encoding is not None
            and encoding.strip().lower() != b"identity"
        ):
            self._mode = "opaque"  # cannot be read, so cannot be sealed: fail closed at the end
            self._start = message
        elif media == "application/json" and self.inspect_json:
            self._mode = "json"
            self._start = message
        elif media == "text/event-stream":
            self._mode = "sse"
            await self._send({**message, "headers": _without(headers, b"content-length")})
            for answer in self.answers:
                await self._send(
                    {"type": "http.response.body", "body": _sse.encode(dumps(answer)), "more_body": True}
                )
        else:
            if self.answers:
                logger.warning(
                    "statecodec: the application answered a batch with %s (status %s); "
                    "%d rejected element(s) could not be reported",
                    media or "no content type",
                    message["status"],
                    len(self.answers),
                )
            await self._send(message)

    async def _on_body(self, chunk: bytes, more: bool) -> None:
        if self._mode == "sse":
            await self._on_sse(chunk, more)
            return
        self._body += chunk
        if len(self._body) > self.middleware.max_response_bytes:
            logger.error(
                "statecodec: a response to an MRTR request exceeds %d bytes; answered 502",
                self.middleware.max_response_bytes,
            )
            await self._fail_closed()
            return
        if more:
            return
        if self._mode == "accepted":
            await _respond(self._send, 200, self.answers)
        elif self._mode == "opaque":
            logger.error(
                "statecodec: a compressed response to an MRTR request cannot be sealed; answered 502"
            )
            await self._fail_closed()
        else:
            await self._finish_json()
        self._finished = True

    async def _finish_json(self) -> None:
        document = _loads_lenient(bytes(self._body))
        changed = False
        if document is not _MISSING:
            document, changed = self._seal_document(document)
        if self.answers and self._start["status"] == 200 and document is not _MISSING:
            document = [*(document if isinstance(document, list) else [document]), *self.answers]
            changed = True
        body = dumps(document) if changed else bytes(self._body)
        headers = _without(list(self._start.get("headers", ())), b"content-length")
        headers.append((b"content-length", str(len(body)).encode("ascii")))
        await self._send({**self._start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _on_sse(self, chunk: bytes, more: bool) -> None:
        try:
            events = self._parser.feed(chunk)
            rest = b""
            if not more:
                tail, rest = self._parser.close()
                events += tail
        except _sse.EventTooLargeError as exc:
            logger.error(
                "statecodec: %s; the stream was cut (it may carry a state that cannot be sealed)", exc
            )
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            self._finished = True
            return
        out = b"".join(self._sse_event(event) for event in events)
        if rest:
            logger.warning("statecodec: dropped an unfinished SSE event at the end of a stream")
        if out or not more:
            await self._send({"type": "http.response.body", "body": out, "more_body": more})
        if not more:
            self._finished = True

    def _sse_event(self, event: _sse.Event) -> bytes:
        if not event.data:
            return event.raw  # priming events, keep-alives, comments
        document = _loads_lenient(event.data)
        if document is _MISSING:
            return event.raw  # no JSON client would read a result in it
        document, changed = self._seal_document(document)
        return event.with_data(dumps(document)) if changed else event.raw

    async def _fail_closed(self) -> None:
        await _respond(self._send, 502, _error(None, jsonrpc.seal_failed_error()))
        self._finished = True

    # -------------------------------------------------------- sealing results
    def _seal_document(self, document: Any) -> tuple[Any, bool]:
        if isinstance(document, list):
            sealed = [self._seal_message(item) for item in document]
            return [item for item, _ in sealed], any(changed for _, changed in sealed)
        return self._seal_message(document)

    def _seal_message(self, message: Any) -> tuple[Any, bool]:
        if not isinstance(message, dict) or "result" not in message or "method" in message:
            return message, False
        binding = self.pending.pop(_id_key(message.get("id")), _MISSING)
        result = message["result"]
        if (
            not isinstance(result, dict)
            or result.get("resultType") != jsonrpc.INPUT_REQUIRED
            or result.get(jsonrpc.REQUEST_STATE) is None
        ):
            return message, False
        if not isinstance(binding, Binding):
            # No MRTR request of this exchange has that id (or it could not be bound):
            # a state nobody can be held to is never sent, sealed or not.
            why = "an unknown request id" if binding is _MISSING else f"an unbindable request ({binding!r})"
            logger.error("statecodec: input_required result for %s; answered -32603", why)
            return _error(message.get("id"), jsonrpc.seal_failed_error()), True
        try:
            sealed = jsonrpc.seal_result(self.middleware.codec, result, binding)
        except jsonrpc.SealFailed:
            return _error(message.get("id"), jsonrpc.seal_failed_error()), True
        return {**message, "result": dict(sealed)}, True
