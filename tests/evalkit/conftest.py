"""Shared fixtures: τ²-bench's reference data (skipped with a reason when absent), domains, and a
scripted OpenAI-compatible server on a loopback port."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from openai import AsyncOpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from evalkit.agent import make_client
from evalkit.domains import get_domain
from evalkit.domains.base import Domain
from tests.require import require

REPO = Path(__file__).resolve().parents[2]


def _tau2_dir() -> Path | None:
    configured = os.environ.get("TAU2_DATA_DIR")
    candidates = [Path(configured)] if configured else []
    candidates.append(REPO.parent / "shared" / "tau2")
    for candidate in candidates:
        if (candidate / "domains" / "retail" / "db.json").is_file():
            return candidate
    return None


@pytest.fixture(scope="session")
def tau2_dir() -> Path:
    found = _tau2_dir()
    if found is None:
        require(
            "tau2",
            "τ²-bench reference data not found: put it at ../shared/tau2 next to the repository "
            "or point TAU2_DATA_DIR at a directory holding domains/retail and results/",
        )
    return found


@pytest.fixture(scope="session")
def tau2_retail(tau2_dir: Path) -> Domain:
    return get_domain("retail", tau2_dir / "domains" / "retail")


def _tau2_results_file(tau2_dir: Path, domain: str) -> Path:
    """τ²-bench's recorded gpt-4.1 run of `domain`; skips the test when it is missing."""
    path = tau2_dir / "results" / f"gpt-4.1_{domain}_1trial.json"
    if not path.is_file():
        require(
            "tau2", f"τ²-bench {domain} results file missing: {path} (see shared/tau2/README.md)"
        )
    return path


@pytest.fixture(scope="session")
def tau2_results_file(tau2_dir: Path) -> Path:
    return _tau2_results_file(tau2_dir, "retail")


@pytest.fixture(scope="session")
def retail() -> Domain:
    return get_domain("retail")


@pytest.fixture(scope="session")
def tau2_telecom(tau2_dir: Path) -> Domain:
    path = tau2_dir / "domains" / "telecom"
    if not (path / "db.toml").is_file():
        require(
            "tau2",
            f"τ²-bench telecom data missing: put db.toml, user_db.toml, tasks.json there: {path}",
        )
    return get_domain("telecom", path)


@pytest.fixture(scope="session")
def tau2_telecom_results_file(tau2_dir: Path) -> Path:
    return _tau2_results_file(tau2_dir, "telecom")


@pytest.fixture(scope="session")
def telecom() -> Domain:
    return get_domain("telecom")


# -- a scripted OpenAI-compatible server on loopback ------------------------------------------


@dataclass
class Reply:
    body: dict[str, Any]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


def completion(
    content: str | None = None, tool_calls: list[tuple[str, str, str]] | None = None
) -> dict[str, Any]:
    """A chat completion body; `tool_calls` are (id, name, arguments text)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in tool_calls
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class ScriptedChatServer:
    """Answers `/v1/chat/completions` with queued replies and records every request."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.base_url = ""

    async def handle(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        reply = self.replies.pop(0) if self.replies else Reply(completion("Goodbye!"))
        return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)


@pytest.fixture
async def chat_server() -> AsyncIterator[ScriptedChatServer]:
    scripted = ScriptedChatServer()
    app = Starlette(routes=[Route("/v1/chat/completions", scripted.handle, methods=["POST"])])
    # IPPROTO_TCP spelled out so asyncio sets TCP_NODELAY (see proxy.testing.LoopbackServer).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", ws="none", http="h11")
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes start-up only as this flag
        await asyncio.sleep(0.01)
    scripted.base_url = f"http://127.0.0.1:{port}/v1"
    try:
        yield scripted
    finally:
        server.should_exit = True
        await serving
        sock.close()


@pytest.fixture
async def chat_client(chat_server: ScriptedChatServer) -> AsyncIterator[AsyncOpenAI]:
    """An `AsyncOpenAI` client on the scripted server, without retries, closed afterwards."""
    client = make_client(chat_server.base_url, max_retries=0)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def chat_server_thread() -> Iterator[ScriptedChatServer]:
    """The scripted server in a thread of its own, for tests that run their own event loop
    (the CLI)."""
    from proxy.testing import LoopbackServer

    scripted = ScriptedChatServer()
    app = Starlette(routes=[Route("/v1/chat/completions", scripted.handle, methods=["POST"])])
    server = LoopbackServer(app)
    server.start()
    scripted.base_url = f"{server.url}/v1"
    try:
        yield scripted
    finally:
        server.stop()
