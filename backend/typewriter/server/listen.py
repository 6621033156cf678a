"""The listening sockets, bound before anything else starts, and one sentence when a port cannot be had.

`typewriter serve` binds its HTTP port before the app starts (so a port in use stops it at once: no model load,
no drain) and hands the sockets to uvicorn, which binds them the same way itself: SO_REUSEADDR, one socket per
address the host name resolves to, IPv6 sockets IPv6 only.
"""

from __future__ import annotations

import errno
import socket

EXIT_CANNOT_LISTEN = 4  # the exit code of a server whose HTTP or gRPC port cannot be bound (docs/deploy.md)


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address of `host` on `port` (0: one free port, the same for each); raises OSError
    (socket.gaierror for a host name that does not resolve) with nothing left open."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # the port the first one got, so the server has one port
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def taken(what: str, host: str, port: int, option: str) -> str | None:
    """Why `what` on host:port cannot be bound now (see cannot_listen), or None when it can; binds nothing. For a
    server that binds it itself (gRPC), so a port in use is one line of ours rather than its own log lines."""
    try:
        for sock in listen(host, port) if port else ():
            sock.close()
    except OSError as error:
        return cannot_listen(what, host, port, error, option)
    return None


def cannot_listen(what: str, host: str, port: int, error: OSError, option: str) -> str:
    """Why `what` ("port", "gRPC port") cannot be bound, and what to do, in one sentence without the prefix."""
    shown = f"[{host}]" if ":" in host else host
    if isinstance(error, socket.gaierror):
        return f"cannot listen on {shown}: the host name does not resolve ({error.strerror}); check --host"
    if error.errno == errno.EADDRINUSE:
        return (f"{what} {port} on {shown} is already in use (another server listens there); stop it, or choose "
                f"another port with {option} (0 picks a free one)")
    if error.errno == errno.EACCES:
        return f"{what} {port} on {shown} needs privileges this user lacks; choose a port of 1024 or more with {option}"
    if error.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {shown}: no network interface of this machine has that address; check --host"
    return f"cannot listen on {shown}:{port}: {error.strerror or error}"
