"""One user's connection to the server under test: the real ``mcp`` client, driven by hand.

The official Python client negotiates 2026-07-28 (``server/discover``, with the legacy
handshake as its fallback) and stamps every request as a real client would: protocol
version, client info and the capabilities the input requests need (elicitation, sampling
and roots are all declared, since servers refuse an elicitation the client did not
declare). The multi-round-trip loop is driven here rather than by the client, one
``tools/call`` at a time, because the probe chooses what goes into each retry.

The server is untrusted, so the HTTP layer is wrapped by :class:`_Recorder`, which notes
what each exchange really was (status, whether a JSON-RPC answer came back, whether the
body failed) and cuts a response off after :data:`MAX_RESPONSE_BYTES`. That is what tells
a server's own JSON-RPC error (a rejection) from the errors the client makes up for a
timeout, a dropped connection or a ``text/html`` page (no answer at all). Every call has
a deadline; nothing here can wait forever.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

import anyio
import httpx2
import mcp_types as types
from mcp.client import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import RootModel, ValidationError

from ._model import Outcome, ProbeError, Reply, clip

PROTOCOL: Final = "2026-07-28"
MAX_RESPONSE_BYTES: Final = 4 * 1024 * 1024
#: Results are judged from their JSON: the probe must see what the server sent, not a model of it.
_RawResult = RootModel[dict[str, Any]]
#: ``state=NO_STATE``: a retry without any requestState (the server sent none).
NO_STATE: Final = object()


class _BodyFailed(httpx2.SSEError, httpx2.StreamError):
    """A body cut off (too large, or broken). Both bases: the client's JSON path catches StreamError,
    its SSE path SSEError, and either answers the pending request with an error at once. Any other
    exception from a body would escape the client's task group and end the connection."""

    def __init__(self, message: str) -> None:
        httpx2.StreamError.__init__(self, message)


@dataclass
class Exchange:
    """One HTTP request and what came back on the wire."""

    status: int | None  # None: no HTTP response at all (see failure)
    content_type: str
    body: bytearray = field(default_factory=bytearray)
    failure: str | None = None  # the body could not be read to its end

    def carries_answer(self) -> bool:
        """Did the body hold a JSON-RPC response or error (JSON, or an SSE ``data:`` event)?"""
        texts = [bytes(self.body)]
        if self.content_type.startswith("text/event-stream"):
            texts = [
                b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
                for event in bytes(self.body).replace(b"\r\n", b"\n").split(b"\n\n")
            ]
        for text in texts:
            try:
                message = json.loads(text)
            except (ValueError, RecursionError):
                continue
            for item in message if isinstance(message, list) else [message]:
                if isinstance(item, dict) and ("result" in item or "error" in item):
                    return True
        return False


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, exchange: Exchange, limit: int) -> None:
        self._inner, self._exchange, self._limit = inner, exchange, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                if len(self._exchange.body) + len(chunk) > self._limit:
                    self._exchange.failure = f"the response was cut off after {self._limit:,} bytes"
                    raise _BodyFailed(self._exchange.failure)
                self._exchange.body += chunk
                yield chunk
        except _BodyFailed:
            raise
        except (httpx2.TransportError, OSError) as exc:
            self._exchange.failure = f"the response broke off: {_describe(exc)}"
            raise _BodyFailed(self._exchange.failure) from None

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Recorder(httpx2.AsyncBaseTransport):
    """Real HTTP, with a record of the last exchange and a cap on every response body."""

    def __init__(self, limit: int) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._limit = limit
        self.last: Exchange | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except (httpx2.TransportError, OSError) as exc:
            # Raised from here, it would end the client's session (its POST task does not catch
            # it): a stand-in answer lets the client fail this one request, and the exchange
            # says that there was no HTTP answer at all.
            self.last = Exchange(None, "", failure=f"connection failed: {_describe(exc)}")
            return httpx2.Response(502, request=request)
        exchange = Exchange(response.status_code, response.headers.get("content-type", "").lower())
        self.last = exchange
        if not isinstance(response.stream, httpx2.AsyncByteStream):  # never, from an async transport
            return response
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, exchange, self._limit),
            extensions=response.extensions,
            request=request,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _ToolCall(types.Request[dict[str, Any], str]):
    """``tools/call`` with params as given: the probe must send what no typed model allows
    (a JSON object as ``requestState``), and send answers exactly as the user wrote them."""

    name_param = "name"


async def _no_server_requests(context: ClientRequestContext, params: Any) -> types.ErrorData:
    # Only declares the capability: at 2026-07-28 input requests arrive inside results,
    # and the probe answers them itself. A server request here is a protocol error.
    return types.ErrorData(
        code=types.INVALID_REQUEST, message="statecodec probe answers input requests in retries"
    )


def _client_info() -> types.Implementation:
    try:
        ours = version("statecodec")
    except PackageNotFoundError:  # a source checkout without metadata
        ours = "0"
    return types.Implementation(name="statecodec-probe", version=ours)


@dataclass
class Connection:
    """One identity (its headers) talking to the server; calls are sequential."""

    client: Client
    recorder: _Recorder
    timeout: float

    @property
    def protocol_version(self) -> str:
        return self.client.protocol_version

    @property
    def server(self) -> dict[str, str] | None:
        info = self.client.server_info
        return None if info is None else {"name": clip(info.name, 80), "version": clip(info.version, 40)}

    async def tool_names(self) -> list[str] | None:
        """The tools the server lists (first pages), or None if listing them failed."""
        names: list[str] = []
        cursor: str | None = None
        try:
            for _ in range(10):
                with anyio.fail_after(self.timeout):
                    page = await self.client.session.list_tools(
                        params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    )
                names += [tool.name for tool in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    break
        except (MCPError, ValidationError, TimeoutError, httpx2.HTTPError, OSError):
            return None
        return names

    async def call(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        *,
        state: Any = NO_STATE,
        responses: Mapping[str, Any] | None = None,
    ) -> Reply:
        """One ``tools/call``; whatever happens, a :class:`Reply` (never an exception)."""
        params: dict[str, Any] = {"name": tool, "arguments": dict(arguments)}
        if responses is not None:
            params["inputResponses"] = dict(responses)
        if state is not NO_STATE:
            params["requestState"] = state
        self.recorder.last = None
        try:
            with anyio.fail_after(self.timeout):
                raw = await self.client.session.send_request(
                    _ToolCall(method="tools/call", params=params), _RawResult
                )
        except TimeoutError:
            return Reply(Outcome.NO_ANSWER, self._status(), detail=f"no answer within {self.timeout:g}s")
        except MCPError as exc:
            return self._error_reply(exc)
        except ValidationError as exc:
            return Reply(
                Outcome.MALFORMED, self._status(), detail=f"not a valid MCP result: {_first_error(exc)}"
            )
        except (httpx2.HTTPError, OSError) as exc:
            return Reply(Outcome.NO_ANSWER, self._status(), detail=f"connection failed: {_describe(exc)}")
        return self._result_reply(raw.root)

    def _status(self) -> int | None:
        return None if self.recorder.last is None else self.recorder.last.status

    def _error_reply(self, exc: MCPError) -> Reply:
        exchange = self.recorder.last
        error: dict[str, Any] = {"code": exc.code, "message": clip(exc.message)}
        if exc.data is not None:
            error["data"] = exc.data if _small(exc.data) else clip(json.dumps(exc.data, default=str))
        if exchange is None:
            return Reply(Outcome.NO_ANSWER, None, detail=f"no HTTP answer ({clip(exc.message)})")
        if exchange.failure is not None or exchange.status is None:
            return Reply(Outcome.NO_ANSWER, exchange.status, detail=exchange.failure or "no HTTP answer")
        if exchange.status >= 400:
            detail = (
                f"error {exc.code} {clip(exc.message, 80)!r}"
                if exchange.carries_answer()
                else "an HTTP error"
            )
            return Reply(Outcome.REJECTED, exchange.status, error, detail=detail)
        if exchange.carries_answer():
            return Reply(
                Outcome.REJECTED, exchange.status, error, detail=f"error {exc.code} {clip(exc.message, 80)!r}"
            )
        what = "a redirect" if 300 <= exchange.status < 400 else exchange.content_type or "no content type"
        return Reply(
            Outcome.NO_ANSWER,
            exchange.status,
            detail=f"{clip(what, 60)} and no JSON-RPC answer ({clip(exc.message, 80)})",
        )

    def _result_reply(self, raw: dict[str, Any]) -> Reply:
        status = self._status()
        if raw.get("resultType") == "input_required":
            requests = raw.get("inputRequests")
            state = raw.get("requestState")
            keys = ", ".join(clip(str(k), 40) for k in requests) if isinstance(requests, dict) else "none"
            return Reply(
                Outcome.INPUT_REQUIRED,
                status,
                detail=f"input_required again (input requests: {keys})",
                state=state,
                input_requests=requests if isinstance(requests, dict) else None,
            )
        text = _first_text(raw.get("content"))
        if raw.get("isError") is True:
            return Reply(Outcome.TOOL_ERROR, status, detail=f"a tool error came back: {text}")
        return Reply(Outcome.COMPLETED, status, detail=f"the final result came back: {text}")


def _small(value: Any) -> bool:
    return len(json.dumps(value, default=str)) <= 200


def _first_text(content: Any) -> str:
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                return repr(clip(block["text"], 100))
    return "(no text content)"


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return clip(str(exc), 120)
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "result"
    return clip(f"{where}: {first.get('msg', '')}", 120)


def _describe(exc: BaseException) -> str:
    return clip(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, 160)


@contextlib.asynccontextmanager
async def connect(url: str, headers: Mapping[str, str], timeout: float) -> AsyncIterator[Connection]:
    """A connection speaking 2026-07-28, or :class:`ProbeError` saying why there is none.

    The handshake has ``timeout`` in all: the client's task groups live inside the cancel
    scope that bounds it (a deadline around their entry alone would not nest), and the
    deadline is lifted once the handshake is done.
    """
    recorder = _Recorder(MAX_RESPONSE_BYTES)
    http_timeout = httpx2.Timeout(timeout + 5.0)  # the per-call deadline fires first
    connected = False
    handshake = anyio.CancelScope(deadline=anyio.current_time() + timeout)
    try:
        async with httpx2.AsyncClient(
            transport=recorder, headers=dict(headers), timeout=http_timeout
        ) as http:
            client = Client(
                streamable_http_client(url, http_client=http),
                mode="auto",
                read_timeout_seconds=timeout,
                elicitation_callback=_no_server_requests,
                sampling_callback=_no_server_requests,
                list_roots_callback=_no_server_requests,  # type: ignore[arg-type]
                client_info=_client_info(),
                cache=None,
            )
            with handshake:
                async with client:
                    handshake.deadline = math.inf
                    if client.protocol_version != PROTOCOL:
                        raise ProbeError(
                            f"{url} speaks MCP {clip(client.protocol_version, 40)}, not {PROTOCOL}: "
                            "multi-round-trip requests and requestState exist only from 2026-07-28, "
                            "so there is nothing to probe"
                        )
                    connected = True
                    yield Connection(client, recorder, timeout)
    except Exception as exc:
        if connected:
            raise
        raise ProbeError(_handshake_failure(url, leaf(exc), recorder.last)) from None
    if handshake.cancelled_caught and not connected:
        raise ProbeError(f"{url} did not complete the MCP handshake within {timeout:g}s")


def leaf(exc: BaseException) -> BaseException:
    """The first exception inside anyio's task-group wrappers (the client's errors come wrapped)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _handshake_failure(url: str, exc: BaseException, exchange: Exchange | None) -> str:
    if isinstance(exc, ProbeError):
        return exc.message
    if isinstance(exc, MCPError):
        return _not_mcp(url, exc, exchange)
    if isinstance(exc, httpx2.HTTPError | OSError):
        return f"cannot reach {url}: {_describe(exc)}"
    return f"{url} answered the MCP handshake with something invalid: {_describe(exc)}"


def _not_mcp(url: str, exc: MCPError, exchange: Exchange | None) -> str:
    if exchange is not None and exchange.failure is not None:
        return f"cannot reach {url}: {exchange.failure}"
    if exchange is not None and not exchange.carries_answer():
        kind = exchange.content_type.split(";")[0] or "no content type"
        return (
            f"{url} is not an MCP server (HTTP {exchange.status}, {clip(kind, 60)}, no JSON-RPC answer "
            "to server/discover or initialize)"
        )
    return f"{url} refused the MCP handshake: error {exc.code} {clip(exc.message)!r}"
