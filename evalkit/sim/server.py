"""The simulated upstream as an HTTP server speaking the three wire protocols (Starlette, run under
uvicorn).

`POST /v1/chat/completions`, `/v1/responses` and `/v1/messages` (any query string) answer as the
agent of the task the request names — header `x-evalkit-task` (with `x-evalkit-trial` and
`x-evalkit-seed`), or, since a proxy need not forward a client's headers, the same keys in the
body's `metadata` (`evalkit_task`, `evalkit_trial`, `evalkit_seed`); a request that names no task
gets a generic scripted turn (`evalkit.sim.generic`). The request's `model` picks the
damage profile (`sim-int4` → `int4`); any other name gets the server's default profile. Each
request is read as one chat conversation (`evalkit.sim.requests`), the simulated model decides once,
and the writers of `proxy.protocols` write the decision in the request's protocol, plain or streamed: the same
episode plays the same on every protocol. Every answer says it is simulated: `model:
sim-<profile>`, `system_fingerprint: evalkit-sim-<profile>` in every body and stream envelope,
and an `x-evalkit-simulated: <profile>` header.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Final

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from evalkit.agent import SEED_HEADER, TASK_HEADER, TRIAL_HEADER
from evalkit.domains.base import Domain
from evalkit.sim.generic import generic_reply
from evalkit.sim.model import EpisodeKey, SimReply, SimulatedModel, UnknownTaskError
from evalkit.sim.profiles import DamageProfile
from evalkit.sim.requests import (
    RequestShapeError,
    chat_tools,
    messages_conversation,
    responses_conversation,
)
from proxy.errors import ToolsentryError, error_body
from proxy.protocols.answer import Answer, Call, Usage
from proxy.protocols.base import API
from proxy.protocols.chat import answer as chat_wire
from proxy.protocols.messages import answer as messages_wire
from proxy.protocols.responses import answer as responses_wire
from proxy.sse import DONE, encode_event, encode_typed_event

_JSON = "application/json"
_STREAM_PIECE: Final = 24  # characters of content or arguments per streamed delta
SIMULATED_HEADER: Final = "x-evalkit-simulated"
"""The response header naming the damage profile that produced an answer."""


def fingerprint(profile: DamageProfile) -> str:
    """The `system_fingerprint` of every answer under `profile`."""
    return f"evalkit-sim-{profile.name}"


def _chat_request(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestShapeError("'messages' must be an array")
    tools = body.get("tools")
    return messages, tools if isinstance(tools, list) else None


_READERS: Final[
    dict[API, Callable[[dict[str, Any]], tuple[list[dict[str, Any]], list[dict[str, Any]] | None]]]
] = {
    API.CHAT: _chat_request,
    API.RESPONSES: lambda body: (responses_conversation(body), chat_tools(body.get("tools"))),
    API.MESSAGES: lambda body: (messages_conversation(body), chat_tools(body.get("tools"))),
}


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

    def endpoint(api: API) -> Callable[[Request], Any]:
        async def answer(request: Request) -> Response:
            raw = await request.body()
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return _error(api, 400, "the request body is not JSON", "invalid_request_error")
            if not isinstance(body, dict):
                return _error(
                    api, 400, "the request body must be a JSON object", "invalid_request_error"
                )
            try:
                messages, tools = _READERS[api](body)
                key = episode_key(request.headers, body, default_seed=seed)
            except ValueError as exc:
                return _error(api, 400, str(exc), "invalid_request_error")
            profile = by_model.get(str(body.get("model")), fallback)
            try:
                reply = (
                    generic_reply(messages, tools)
                    if key is None
                    else model.reply(messages, tools, key, profile)
                )
            except UnknownTaskError as exc:
                return _error(api, 404, exc.message, "not_found_error", "x-evalkit-task")
            except ToolsentryError as exc:  # the request's tools cannot be compiled
                return _error(api, 400, exc.message, "invalid_request_error", "tools")
            decided = as_answer(reply, profile, _answer_id(key, messages), len(raw))
            headers = {SIMULATED_HEADER: profile.name}
            if body.get("stream"):
                events = _stream(api, decided, body)
                return StreamingResponse(events, media_type="text/event-stream", headers=headers)
            return Response(
                orjson.dumps(_body(api, decided, body)), media_type=_JSON, headers=headers
            )

        return answer

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
            Route("/v1/chat/completions", endpoint(API.CHAT), methods=["POST"]),
            Route("/v1/responses", endpoint(API.RESPONSES), methods=["POST"]),
            Route("/v1/messages", endpoint(API.MESSAGES), methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


def as_answer(
    reply: SimReply, profile: DamageProfile, answer_id: str, request_bytes: int
) -> Answer:
    """The simulated model's reply as a protocol-neutral answer, marked simulated."""
    calls = tuple(
        Call(c["function"]["name"], c["function"]["arguments"], c["id"]) for c in reply.tool_calls
    )
    return Answer(
        text=reply.content,
        calls=calls,
        usage=_usage(request_bytes, reply),
        model=profile.model,
        id=answer_id,
        created=int(time.time()),
        extra={"system_fingerprint": fingerprint(profile)},
    )


def _body(api: API, answer: Answer, request: Mapping[str, Any]) -> dict[str, Any]:
    if api is API.RESPONSES:
        return responses_wire.body(answer, request)
    if api is API.MESSAGES:
        return messages_wire.body(answer)
    return chat_wire.completion(answer)


async def _stream(api: API, answer: Answer, request: Mapping[str, Any]) -> AsyncIterator[bytes]:
    if api is API.RESPONSES:
        for event in responses_wire.events(answer, request, fragment=_STREAM_PIECE):
            yield encode_typed_event(event)
        return
    if api is API.MESSAGES:
        for event in messages_wire.events(answer, fragment=_STREAM_PIECE):
            yield encode_typed_event(event)
        return
    options = request.get("stream_options")
    with_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    for chunk in chat_wire.chunks(answer, fragment=_STREAM_PIECE, include_usage=with_usage):
        yield encode_event(chunk)
    yield DONE


def episode_key(
    headers: Mapping[str, str], body: Mapping[str, Any], *, default_seed: int = 0
) -> EpisodeKey | None:
    """The episode a request belongs to, from its headers or else its body's `metadata`; None
    when it names no task (it gets the generic turn, `evalkit.sim.generic`).

    Raises:
        ValueError: when trial or seed is not an integer.
    """
    metadata = body.get("metadata")
    meta: Mapping[str, Any] = metadata if isinstance(metadata, dict) else {}
    task = headers.get(TASK_HEADER) or meta.get("evalkit_task")
    if not task:
        return None
    trial = headers.get(TRIAL_HEADER) or meta.get("evalkit_trial") or 0
    seed = headers.get(SEED_HEADER) or meta.get("evalkit_seed") or default_seed
    try:
        return EpisodeKey(str(task), int(trial), int(seed))
    except ValueError:
        raise ValueError(f"trial and seed must be integers, got {trial!r} and {seed!r}") from None


def _answer_id(key: EpisodeKey | None, messages: Sequence[dict[str, Any]]) -> str:
    if key is None:  # the generic turn: the same conversation gets the same id
        text = orjson.dumps(messages, option=orjson.OPT_SORT_KEYS).decode()
    else:
        text = f"{key.seed}|{key.task_id}|{key.trial}|{len(messages)}"
    return f"sim-{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def _usage(request_bytes: int, reply: SimReply) -> Usage:
    # A rough four characters per token: enough for cost columns, and marked simulated anyway.
    written = len(reply.content or "") + sum(
        len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in reply.tool_calls
    )
    return Usage(max(1, request_bytes // 4), max(1, written // 4))


def _error(
    api: API, status: int, message: str, error_type: str, param: str | None = None
) -> Response:
    if api is API.MESSAGES:
        body = messages_wire.error_body(message, status, error_type)
    else:
        body = error_body(message, error_type, param=param)
    return Response(orjson.dumps(body), status_code=status, media_type=_JSON)
