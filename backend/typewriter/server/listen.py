"""The listening sockets, bound as uvicorn would before the app starts, so a port in use stops the server before
the model loads; and one sentence when a port cannot be had."""

from __future__ import annotations

import errno
import socket

EXIT_CANNOT_LISTEN = 4  # docs/deploy.md


def listen(host: str, port: int) -> list[socket.socket]:
    """One socket per address of `host` (port 0: one free port for all); raises OSError with nothing left open."""
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
    """None if the port can be bound now; for gRPC, so that a port in use is one line of ours, not its log lines."""
    try:
        for sock in listen(host, port) if port else ():
            sock.close()
    except OSError as error:
        return cannot_listen(what, host, port, error, option)
    return None


def cannot_listen(what: str, host: str, port: int, error: OSError, option: str) -> str:
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
