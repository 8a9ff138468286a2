"""Free TCP ports for the processes gangflow starts: a dev server, a gang's rendezvous, a local run."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` right now ("" for every interface: what other machines connect to).

    The kernel picks it and the socket is closed again: another process could take it before the caller's
    process binds it, which is why a gang asks for a fresh one on every attempt.
    """
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
