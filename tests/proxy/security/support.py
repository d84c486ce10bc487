"""The attack suite's parts: a recording upstream that reads requests as vLLM does, a real
`toolsentry serve` process in front of it with keys, and a client that sends paths as spelled."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml
from pydantic import TypeAdapter, ValidationError
from starlette.types import Receive, Scope, Send

from proxy.protocols.base import API
from proxy.testing import SSE, answer, render
from tests.processes import port_options, reported_port, stop_process, tail

REPO = Path(__file__).resolve().parents[3]
CLIENT_KEY = "client-key-A"
ADMIN_KEY = "admin-key-Z"
UPSTREAM_KEY = "upstream-secret-Q"
TURN_ROUTES = {
    "/v1/chat/completions": API.CHAT,
    "/v1/responses": API.RESPONSES,
    "/v1/messages": API.MESSAGES,
}
_SERVE = (sys.executable, "-m", "proxy.cli", "serve")
# vLLM's request models declare `stream: bool | None` and validate in pydantic's lax mode.
_STREAM = TypeAdapter(bool | None)


@dataclass
class Received:
    """One request as the upstream's server handed it over."""

    method: str
    raw_path: str  # as sent on the wire, before any decoding
    path: str  # decoded, as the server routes it
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


@dataclass
class RecordingUpstream:
    """An ASGI upstream that keeps every method, path, header and body it receives. The turn
    routes answer as vLLM does (the `stream` flag read by its request model's rule: a string
    "false" is false, one that is no boolean is a 400); any other path echoes what it got."""

    received: list[Received] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = (await receive())["type"]
                await send({"type": f"{event}.complete"})
                if event == "lifespan.shutdown":
                    return
        body = b""
        while True:  # reading the body is what makes uvicorn answer `100 Continue`
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        got = Received(
            scope["method"],
            scope["raw_path"].decode("latin-1"),
            scope["path"],
            [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]],
            body,
        )
        self.received.append(got)
        api = TURN_ROUTES.get(scope["path"])
        if api is None or scope["method"] != "POST":
            echo = {"method": got.method, "path": got.path, "raw_path": got.raw_path}
            await _answer(send, 200, orjson.dumps(echo), b"application/json")
            return
        request = orjson.loads(body)
        try:
            stream = _STREAM.validate_python(request.get("stream"))
        except ValidationError:
            error = {"error": {"message": "stream: not a boolean", "type": "BadRequestError"}}
            await _answer(send, 400, orjson.dumps(error), b"application/json")
            return
        reply = answer("hello")
        if stream:
            pieces = b"".join(SSE.of(reply).pieces(api, request))
            await _answer(send, 200, pieces, b"text/event-stream")
        else:
            await _answer(send, 200, orjson.dumps(render(reply, api, request)), b"application/json")

    def clear(self) -> None:
        self.received.clear()


async def _answer(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Proxy:
    """`python -m proxy.cli serve --config …` as a child process on loopback, with a client key,
    an admin key and the upstream's own key (from its environment)."""

    def __init__(self, upstream_url: str, directory: Path, **settings: Any) -> None:
        config = {
            "upstreams": [
                {"name": "rec", "base_url": f"{upstream_url}/v1", "api_key_env": "REC_KEY"}
            ],
            "api_keys": [CLIENT_KEY],
            "admin_key": ADMIN_KEY,
            **settings,
        }
        config_file = directory / "proxy.yaml"
        config_file.write_text(yaml.safe_dump(config))
        self.log_path = directory / "proxy.log"
        port_file = directory / "proxy.port"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLSENTRY_")}
        env["REC_KEY"] = UPSTREAM_KEY
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [*_SERVE, "--config", str(config_file), *port_options(port_file)],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self.port = reported_port(self.process, port_file, tail(self.log_path))
        except Exception:
            self.stop()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.process, timeout=30)
        self._log.close()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def checked(self) -> bool:
        """Whether the proxy's turn answered it (its report headers are there)."""
        return "x-toolsentry-session" in self.headers


def send(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    key: str | None = CLIENT_KEY,
) -> Reply:
    """One request with `path` sent exactly as spelled (no client-side normalisation)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        sent = dict(headers or {})
        if key is not None:
            sent.setdefault("authorization", f"Bearer {key}")
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else orjson.dumps(body)
            sent.setdefault("content-type", "application/json")
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        content = response.read()
        names = {k.lower(): v for k, v in response.getheaders()}
        return Reply(response.status, names, content)
    finally:
        connection.close()


def turn_body(route: str, **extra: Any) -> dict[str, Any]:
    """A minimal request body for a turn route."""
    if route == "/v1/responses":
        return {"model": "m", "input": "hi", **extra}
    if route == "/v1/messages":
        return {
            "model": "m",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}],
            **extra,
        }
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
