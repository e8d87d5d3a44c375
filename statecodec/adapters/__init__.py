"""Adapters that put a :class:`~statecodec.StateCodec` in front of MCP servers.

Import the one you need; each imports its framework only when imported itself:

- :mod:`statecodec.boundary`: framework-free rules on raw JSON-RPC dicts, the owner of a
  round (``Boundary``: judge, hold, seal, end of flow) that every adapter here holds and
  feeds with its I/O, and the wire errors (``WIRE_ERROR_CODE``, ``WIRE_ERROR_MESSAGE``,
  ``WIRE_ERROR_DATA``, ``WireError``);
- :mod:`statecodec.adapters.mcp`: ``protect()`` for the official ``mcp`` SDK's lowlevel
  ``Server`` and ``MCPServer``, and ``sdk_codec()`` for the SDK's own boundary
  (``statecodec[mcp]``);
- :mod:`statecodec.adapters.fastmcp`: ``protect()`` for FastMCP (``statecodec[fastmcp]``);
- :mod:`statecodec.adapters.asgi`: ``RequestStateMiddleware`` around any ASGI MCP app
  (Streamable HTTP, JSON and SSE), the core of ``statecodec proxy`` for servers written
  in other languages (``statecodec[proxy]``).
"""
