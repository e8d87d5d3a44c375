"""The upstream's read deadline is one timer per connection: it bounds each silence, not the whole answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from statecodec.proxy._upstream import Pool

READ_TIMEOUT = 2.0
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
REQUEST = b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.fixture
async def upstream() -> AsyncIterator[Callable[[list[float]], asyncio.Future[int]]]:
    """An upstream answering one chunked stream whose chunks follow the given pauses, then ends it."""
    servers: list[asyncio.Server] = []

    async def start(pauses: list[float]) -> int:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(HEAD)
            for pause in pauses:
                await asyncio.sleep(pause)
                writer.write(b"6\r\nevent\n\r\n")
            writer.write(b"0\r\n\r\n")
            await reader.read()  # until the proxy closes
            writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        servers.append(server)
        port: int = server.sockets[0].getsockname()[1]
        return port

    yield lambda pauses: asyncio.ensure_future(start(pauses))
    for server in servers:
        server.close()


async def _read_all(port: int) -> list[bytes]:
    pool = Pool("127.0.0.1", port, tls=None, limit=1, keepalive=4.0, read_timeout=READ_TIMEOUT)
    try:
        response = await pool.request(
            b"GET", REQUEST, b"", chunked=False, pool_timeout=5, connect_timeout=5, write_timeout=5
        )
        chunks = []
        try:
            while chunk := await response.read():
                chunks.append(chunk)
        finally:
            response.close()
        return chunks
    finally:
        pool.close()


async def test_a_stream_longer_than_the_deadline_lives_while_each_silence_is_shorter(
    upstream: Callable[[list[float]], asyncio.Future[int]],
) -> None:
    port = await upstream([0.6] * 5)  # 3 s in all, 0.6 s at a time: the timer set again each wait
    chunks = await _read_all(port)
    assert b"".join(chunks) == b"event\n" * 5


async def test_a_silence_longer_than_the_deadline_times_out_after_earlier_chunks(
    upstream: Callable[[list[float]], asyncio.Future[int]],
) -> None:
    port = await upstream([0.6, 0.6, 3 * READ_TIMEOUT])
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        await _read_all(port)
    # the third wait began ~1.2 s in, so it expires ~3.2 s in: its own deadline, not the first's
    assert READ_TIMEOUT + 1.0 < loop.time() - started < 3 * READ_TIMEOUT
