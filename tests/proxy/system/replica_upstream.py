"""A replica of a deployment for whole-proxy tests: a scripted upstream (`proxy.testing`) as a
process of its own, so that a test can kill it as a crash would and start it again on its port.
It waits `--delay` seconds before each answer (requests are in flight when it dies) and names
itself in every answer's text.

    python -m tests.proxy.system.replica_upstream --name r0 --port-file F [--port P] [--delay S]
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import uvicorn

from proxy import listening
from proxy.testing import ScriptedUpstream, completion


class Delayed:
    """An ASGI app whose every POST waits `delay` seconds before `app` answers it."""

    def __init__(self, app: Any, delay: float) -> None:
        self.app = app
        self.delay = delay

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            await asyncio.sleep(self.delay)
        await self.app(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    options = parser.parse_args()
    script = ScriptedUpstream(handler=lambda body: completion(f"from {options.name}"))
    sock = listening.listen("127.0.0.1", options.port)
    listening.write_port_file(options.port_file, sock)
    config = uvicorn.Config(
        Delayed(script.app, options.delay), log_level="warning", access_log=False, lifespan="off"
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
