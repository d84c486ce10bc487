"""The simulated upstream as an OpenAI-compatible HTTP server (Starlette, run under uvicorn).

`POST /v1/chat/completions` answers as the agent of the task the request names — header
`x-evalkit-task` (with `x-evalkit-trial` and `x-evalkit-seed`), or, since a proxy need not forward
a client's headers, the same keys in the body's `metadata` (`evalkit_task`, `evalkit_trial`,
`evalkit_seed`). The request's `model` picks the damage profile (`sim-int4` → `int4`); any other
name gets the server's default profile. Non-streaming and streaming (SSE) answers; every answer
says it is simulated: `model: sim-<profile>`, `system_fingerprint: evalkit-sim-<profile>`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from evalkit.agent import SEED_HEADER, TASK_HEADER, TRIAL_HEADER
from evalkit.domains.base import Domain
from evalkit.sim.model import EpisodeKey, SimReply, SimulatedModel, UnknownTaskError
from evalkit.sim.profiles import DamageProfile
from proxy.errors import ToolsentryError

_JSON = "application/json"
_STREAM_PIECE = 24  # characters of content or arguments per streamed delta


def fingerprint(profile: DamageProfile) -> str:
    """The `system_fingerprint` of every answer under `profile`."""
    return f"evalkit-sim-{profile.name}"


def create_sim_app(
    domain: Domain,
    profiles: Mapping[str, DamageProfile],
    *,
    default_profile: str,
    seed: int = 0,
) -> Starlette:
    """The simulated upstream for `domain`, serving `profiles` (by name) as models `sim-<name>`.

    `seed` is the seed of requests that do not carry one.

    Raises:
        KeyError: when `default_profile` is not one of `profiles`.
    """
    model = SimulatedModel(domain)
    by_model = {p.model: p for p in profiles.values()}
    fallback = profiles[default_profile]

    async def chat(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _error(400, "the request body is not JSON", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "'messages' must be an array", "invalid_request_error", "messages")
        try:
            key = episode_key(request.headers, body, default_seed=seed)
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request_error")
        profile = by_model.get(str(body.get("model")), fallback)
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        try:
            reply = model.reply(body["messages"], tools, key, profile)
        except UnknownTaskError as exc:
            return _error(404, exc.message, "not_found_error", "x-evalkit-task")
        except ToolsentryError as exc:  # the request's tools cannot be compiled
            return _error(400, exc.message, "invalid_request_error", "tools")
        completion_id = _completion_id(key, len(body["messages"]))
        usage = _usage(len(await request.body()), reply)
        if body.get("stream"):
            options = body.get("stream_options")
            with_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            chunks = stream_chunks(reply, profile, completion_id, usage if with_usage else None)
            return StreamingResponse(_sse(chunks), media_type="text/event-stream")
        return Response(
            orjson.dumps(completion(reply, profile, completion_id, usage)), media_type=_JSON
        )

    async def models(request: Request) -> Response:
        data = [
            {"id": p.model, "object": "model", "created": 0, "owned_by": "evalkit-sim"}
            for p in profiles.values()
        ]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type=_JSON)

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=_JSON)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


def episode_key(
    headers: Mapping[str, str], body: Mapping[str, Any], *, default_seed: int = 0
) -> EpisodeKey:
    """The episode a request belongs to, from its headers or else its body's `metadata`.

    Raises:
        ValueError: when no task is named, or trial or seed is not an integer.
    """
    metadata = body.get("metadata")
    meta: Mapping[str, Any] = metadata if isinstance(metadata, dict) else {}
    task = headers.get(TASK_HEADER) or meta.get("evalkit_task")
    if not task:
        raise ValueError(
            "the simulated model plays a task: name it in the x-evalkit-task header or in "
            "metadata.evalkit_task (evalkit's agent sends both)"
        )
    trial = headers.get(TRIAL_HEADER) or meta.get("evalkit_trial") or 0
    seed = headers.get(SEED_HEADER) or meta.get("evalkit_seed") or default_seed
    try:
        return EpisodeKey(str(task), int(trial), int(seed))
    except ValueError:
        raise ValueError(f"trial and seed must be integers, got {trial!r} and {seed!r}") from None


def completion(
    reply: SimReply, profile: DamageProfile, completion_id: str, usage: dict[str, int]
) -> dict[str, Any]:
    """A `chat.completion` body for `reply`."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": profile.model,
        "system_fingerprint": fingerprint(profile),
        "choices": [
            {
                "index": 0,
                "message": reply.message(),
                "finish_reason": reply.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage,
    }


def stream_chunks(
    reply: SimReply,
    profile: DamageProfile,
    completion_id: str,
    usage: dict[str, int] | None,
) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` events of `reply`, as an OpenAI server streams them.

    Role first, content in pieces, each call's id and name then its arguments in pieces, a
    final chunk with the finish reason, and a usage chunk (no choices) when asked for.
    """
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": profile.model,
            "system_fingerprint": fingerprint(profile),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": piece}) for piece in _pieces(reply.content or "")]
    for index, call in enumerate(reply.tool_calls):
        function = call["function"]
        head = {"index": index, "id": call["id"], "type": "function"}
        out.append(
            chunk(
                {"tool_calls": [{**head, "function": {"name": function["name"], "arguments": ""}}]}
            )
        )
        out += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in _pieces(function["arguments"])
        ]
    out.append(chunk({}, reply.finish_reason))
    if usage is not None:
        tail = chunk({})
        tail["choices"] = []
        tail["usage"] = usage
        out.append(tail)
    return out


async def _sse(chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    for event in chunks:
        yield b"data: " + orjson.dumps(event) + b"\n\n"
    yield b"data: [DONE]\n\n"


def _completion_id(key: EpisodeKey, position: int) -> str:
    text = f"{key.seed}|{key.task_id}|{key.trial}|{position}"
    return f"chatcmpl-sim-{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def _pieces(text: str) -> list[str]:
    return [text[i : i + _STREAM_PIECE] for i in range(0, len(text), _STREAM_PIECE)]


def _usage(request_bytes: int, reply: SimReply) -> dict[str, int]:
    # A rough four characters per token: enough for cost columns, and marked simulated anyway.
    written = len(reply.content or "") + sum(
        len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in reply.tool_calls
    )
    prompt, completion_tokens = max(1, request_bytes // 4), max(1, written // 4)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


def _error(status: int, message: str, error_type: str, param: str | None = None) -> Response:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": None}}
    return Response(orjson.dumps(body), status_code=status, media_type=_JSON)
