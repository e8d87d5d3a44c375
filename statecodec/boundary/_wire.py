"""The wire: the MRTR methods and keys, the JSON-RPC codes, :class:`WireError` and the
bodies that carry it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from .._errors import StateCodecError

#: The only methods whose results may be ``input_required`` (spec 2026-07-28).
MRTR_METHODS: Final = frozenset({"tools/call", "resources/read", "prompts/get"})


REQUEST_STATE: Final = "requestState"


INPUT_REQUIRED: Final = "input_required"


#: The params keys of the MRTR requests (2026-07-28). None of them but ``requestState``
#: itself spells ``requestState``, so a request holding only these needs no alias check;
#: the ASGI middleware also refuses any other spelling of them (``"Arguments"``).
PARAMS_KEYS: Final = frozenset({"name", "uri", "arguments", "inputResponses", REQUEST_STATE, "_meta", "task"})


# Result keys of the MRTR methods that are not aliases of requestState (the same shortcut).
RESULT_KEYS: Final = frozenset(
    {
        "resultType",
        REQUEST_STATE,
        "inputRequests",
        "content",
        "structuredContent",
        "isError",
        "contents",
        "messages",
        "description",
        "_meta",
    }
)


#: What every rejected token is answered with (the SDKs' convention).
WIRE_ERROR_CODE: Final = -32602


WIRE_ERROR_MESSAGE: Final = "Invalid or expired requestState"


WIRE_ERROR_DATA: Final[Mapping[str, str]] = MappingProxyType({"reason": "invalid_request_state"})


#: What a result that cannot be sealed is replaced with. Says nothing more.
INTERNAL_ERROR_CODE: Final = -32603


INTERNAL_ERROR_MESSAGE: Final = "Internal error"


#: What a request is answered (with -32603) when the replay store could not record its
#: token: nothing was consumed, so the client should send the same request again.
STORE_UNAVAILABLE_MESSAGE: Final = (
    "Temporarily unavailable: retry the same request (its requestState was not consumed)"
)


STORE_UNAVAILABLE_DATA: Final[Mapping[str, str]] = MappingProxyType({"reason": "temporarily_unavailable"})


#: JSON-RPC's codes for a body that is not JSON, and for JSON that is not a request.
PARSE_ERROR_CODE: Final = -32700


INVALID_REQUEST_CODE: Final = -32600


JSONRPC_VERSION: Final = "2.0"


#: MCP 2026-07-28 (SEP-2243): the ``Mcp-*`` routing headers and the body disagree (HTTP 400).
HEADER_MISMATCH_CODE: Final = -32020


class WireError(StateCodecError):
    """Answer this JSON-RPC error instead: a request refused, or a result that cannot go out.

    ``code``, ``message`` and ``data`` are what the client sees (:meth:`error`); ``status``
    is the HTTP status for byte-level intermediaries (200 for a JSON-RPC answer); ``reason``
    says why, for logs and metrics only: the :class:`~statecodec.InvalidState` reason
    for a token, a short text otherwise. It is never on the wire.
    """

    def __init__(
        self,
        code: int,
        message: str,
        *,
        data: Mapping[str, Any] | None = None,
        status: int = 200,
        reason: str = "",
    ) -> None:
        super().__init__(f"{code} {message}: {reason}" if reason else f"{code} {message}")
        self.code = code
        self.message = message
        self.data = data
        self.status = status
        self.reason = reason

    @classmethod
    def invalid_state(cls, reason: str = "", *, status: int = 200) -> WireError:
        """The uniform -32602 for a token that failed any check."""
        return cls(WIRE_ERROR_CODE, WIRE_ERROR_MESSAGE, data=WIRE_ERROR_DATA, status=status, reason=reason)

    @classmethod
    def refusing(cls, reason: str) -> WireError:
        """The answer to a token the codec refused for ``reason`` (an InvalidState reason).

        -32602 for every reason but ``store_unavailable``: that one is no verdict on the
        token (it passed every check and was not consumed), so it is -32603 asking for
        the same request again, never the answer a forgery gets.
        """
        if reason == "store_unavailable":
            return cls(
                INTERNAL_ERROR_CODE, STORE_UNAVAILABLE_MESSAGE, data=STORE_UNAVAILABLE_DATA, reason=reason
            )
        return cls.invalid_state(reason)

    @classmethod
    def internal(cls, reason: str = "", *, status: int = 200) -> WireError:
        """-32603 for a result whose state cannot be sealed (or an answer that cannot be read)."""
        return cls(INTERNAL_ERROR_CODE, INTERNAL_ERROR_MESSAGE, status=status, reason=reason)

    def error(self) -> dict[str, Any]:
        """A fresh JSON-RPC ``error`` member."""
        member: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            member["data"] = dict(self.data)
        return member

    def response(self, request_id: Any = None) -> dict[str, Any]:
        """The whole JSON-RPC error response to ``request_id`` (``None``: to no request known)."""
        return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "error": self.error()}


def result_response(request_id: Any, result: Mapping[str, Any]) -> dict[str, Any]:
    """The whole JSON-RPC response carrying ``result`` to ``request_id``."""
    return {"jsonrpc": JSONRPC_VERSION, "id": request_id, "result": dict(result)}
