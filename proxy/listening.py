"""Serving an ASGI app on a socket bound before the server starts.

`toolsentry serve` and `evalkit sim serve` bind and listen first, then report where they listen
(the startup line's URL and, with `--port-file`, a file holding the port), then start uvicorn on
that socket. So `--port 0` takes a port the kernel picks, and whoever started the server reads the
port it got instead of choosing a free one beforehand and racing another process for it: the
report comes after `listen()`, so a connection made as soon as it is read waits in the backlog
until the server accepts it, and is never refused.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from pathlib import Path
from typing import Final

import uvicorn

from proxy.errors import ConfigError

BACKLOG: Final = 2048
"""The listen backlog, uvicorn's default."""

STARTUP_FAILURE: Final = 3
"""The exit status when the app did not start (uvicorn's own for the same failure)."""


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host`:`port` (0: a free port the kernel picks).

    Raises ConfigError naming the address when it cannot be bound (in use, not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says TCP.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)  # worker processes serve it too
    return sock


def url_of(host: str, sock: socket.socket) -> str:
    """The root URL of a server listening on `sock`, bound to `host`."""
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def write_port_file(path: Path, sock: socket.socket) -> None:
    """Write the port `sock` listens on to `path` (one line), whole or not at all: a reader sees
    no file, the one before, or the complete port. It stays after the server stops (uvicorn ends
    on SIGTERM by re-raising it): whoever reads it removes an old one before starting a server."""
    path = path.absolute()
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        out.write(f"{sock.getsockname()[1]}\n")
    os.replace(temporary, path)


def serve(config: uvicorn.Config, sock: socket.socket) -> int:
    """Run uvicorn on `sock` until it stops: one server in this process, or `config.workers`
    worker processes sharing the socket. Returns the exit status: 0, or STARTUP_FAILURE when the
    app did not start."""
    if config.workers > 1:
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=[sock]).run()
        return 0
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock])
    return 0 if server.started else STARTUP_FAILURE
