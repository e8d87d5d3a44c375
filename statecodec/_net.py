"""Listening sockets for the servers statecodec runs itself (demo, proxy, examples)."""

from __future__ import annotations

import socket


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket (port 0 picks a free one), IPv6 when ``host`` has a colon.

    proto=IPPROTO_TCP matters: asyncio turns Nagle off (TCP_NODELAY) only on sockets
    whose proto says TCP, and accepted sockets inherit it. With the default proto 0,
    a response written as headers then body waits ~40 ms for the client's delayed ACK.
    Binding before serving also means no other process can take the port in between.
    """
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def socket_url(sock: socket.socket) -> str:
    """``http://HOST:PORT`` of a listening socket, the address in brackets for IPv6.

    The one place a server statecodec runs names its own address: what it announces
    (``listening on URL``, ``READY URL``) is where it actually listens, port 0 resolved.
    """
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"
