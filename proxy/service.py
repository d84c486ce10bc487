"""The chat-completions pipeline: forward → validate → repair → account → respond.

One `ChatService` per app. It owns no I/O of its own: the upstream router, the session store and
the metrics are handed in, and the routes in app.py only parse, call it, and return what it gives.
The streaming path (streamservice.py) drives the same `begin`, `settle_choice` and `finish`
steps.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.chatbody import ChatBodyParser
from proxy.config import Settings
from proxy.errors import (
    BadRequestError,
    BudgetExhaustedError,
    UnrepairedToolCallError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    status_of,
)
from proxy.guard.channels import Channel, Violation
from proxy.guard.repair import (
    OnUnrepaired,
    RepairMode,
    corrective_messages,
    local_fix,
    strip_invalid,
)
from proxy.guard.toolcheck import GuardLimits, ToolIndex, compile_tools, validate
from proxy.logs import get_logger
from proxy.metrics import Metrics, UnknownToolStats
from proxy.session.budget import ErrorBudget, ExhaustionPolicy, resolve_session_id, tool_errors_in
from proxy.session.stores import SessionRecord, SessionStore
from proxy.streamservice import ChatStream, completion_stream, open_stream
from proxy.upstream import (
    Router,
    Upstream,
    UpstreamResponse,
    chat_request_headers,
    raise_for_status,
)

CHAT_PATH = "chat/completions"
_MAX_MODEL_LABELS = 64


@dataclass(slots=True)
class ChatResult:
    """What the route returns: a status, headers, and either the upstream's raw bytes or a body."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any] | None = None
    raw: bytes | None = None

    def content(self) -> bytes:
        """The response body as bytes."""
        if self.raw is not None:
            return self.raw
        return orjson.dumps(self.body)


@dataclass(slots=True)
class Turn:
    """One client request as the pipeline sees it, from `begin` to `finish`."""

    body: dict[str, Any]
    model: str
    session: str
    budget: ErrorBudget
    repair: RepairMode
    index: ToolIndex
    upstream: Upstream
    started: float
    record: SessionRecord
    forward: dict[str, str] = field(default_factory=dict)  # the client's headers for the upstream
    upstream_seconds: float = 0.0
    found: list[Violation] = field(default_factory=list)
    repaired: int = 0
    unrepaired: list[Violation] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class SettledChoice:
    """A choice after validation and repair: what the client gets, and what it cost."""

    message: dict[str, Any]
    finish_reason: str | None
    found: list[Violation]
    repaired: bool
    unrepaired: list[Violation]
    extra_usage: list[dict[str, Any]]
    changed: bool


class ChatService:
    """Validates, repairs and accounts every chat completion that passes through the proxy."""

    def __init__(
        self,
        settings: Settings,
        router: Router,
        store: SessionStore,
        metrics: Metrics,
        unknown_tools: UnknownToolStats,
    ) -> None:
        self.settings = settings
        self.router = router
        self.store = store
        self.metrics = metrics
        self.unknown_tools = unknown_tools
        self._limits = GuardLimits(
            max_tools=settings.max_tools,
            max_schema_bytes=settings.max_schema_bytes,
            max_schema_depth=settings.max_schema_depth,
        )
        self.bodies = ChatBodyParser(self._limits)
        self._tool_error_prefix = settings.tool_error_prefix
        self._model_labels: set[str] = set()

    async def handle(
        self,
        body: dict[str, Any],
        headers: Mapping[str, str],
        *,
        raw: bytes | None = None,
        index: ToolIndex | None = None,
    ) -> ChatResult | ChatStream:
        """Serve one chat-completions request (the route's only call).

        `headers` are the client's, keyed by lower-case names (as ASGI servers give them).
        `raw`, when given, is the body as the client sent it (`body` is its parse): the upstream
        gets those bytes as they are instead of `body` serialised again. `index`, when given, is
        `body["tools"]` compiled (`self.bodies` recognised them).
        """
        if body.get("stream"):
            return await self.stream(body, headers, index=index)
        return await self.complete(body, headers, raw=raw, index=index)

    async def stream(
        self, body: dict[str, Any], headers: Mapping[str, str], *, index: ToolIndex | None = None
    ) -> ChatStream:
        """Start one streamed chat completion (`stream: true`); see streamservice.py.

        Everything that can fail before the first byte raises here, as in `complete`:
        BadRequestError, BudgetExhaustedError under `reject`, UpstreamError. The `finish` policy
        is sent as a stream. The caller must `aclose` the returned stream when it is over.
        """
        turn = await self.begin(body, headers, index=index)
        if isinstance(turn, ChatResult):
            include_usage = (body.get("stream_options") or {}).get("include_usage")
            return completion_stream(
                turn.body or {}, turn.headers, include_usage=bool(include_usage)
            )
        return await open_stream(self, turn, CHAT_PATH)

    # -- the non-streaming pipeline -------------------------------------------------------------

    async def complete(
        self,
        body: dict[str, Any],
        headers: Mapping[str, str],
        *,
        raw: bytes | None = None,
        index: ToolIndex | None = None,
    ) -> ChatResult:
        """Run one non-streaming chat completion through the whole pipeline (`raw`, `index`: see
        `handle`).

        Raises BadRequestError for invalid requests, BudgetExhaustedError under the `reject`
        policy, UnrepairedToolCallError under `on_unrepaired: reject`, and UpstreamError.
        """
        turn_or_result = await self.begin(body, headers, index=index)
        if isinstance(turn_or_result, ChatResult):
            return turn_or_result
        turn = turn_or_result
        try:
            response = await self._call(turn, body, raw)
            completion, choices = parse_completion(response.json(), turn.upstream.name)
        except UpstreamError as exc:
            await self.upstream_failed(turn, exc)
            raise
        changed = False
        extra_usage: list[dict[str, Any]] = []
        for choice in choices:
            settled = await self.settle_choice(turn, choice["message"], choice.get("finish_reason"))
            if settled.changed:
                choice["message"] = settled.message
                choice["finish_reason"] = settled.finish_reason
                changed = True
            extra_usage.extend(settled.extra_usage)
        if extra_usage:
            completion["usage"] = sum_usage([completion.get("usage") or {}, *extra_usage])
        result_headers = await self.finish(turn)
        if changed or extra_usage:
            return ChatResult(200, result_headers, body=completion)
        return ChatResult(200, result_headers, raw=response.body)

    # -- the steps, shared with the streaming path ----------------------------------------------

    async def begin(
        self, body: dict[str, Any], headers: Mapping[str, str], *, index: ToolIndex | None = None
    ) -> Turn | ChatResult:
        """Check the request, count tool errors it reports, and apply the budget gate.

        `index`: `body["tools"]` already compiled, when it is known.

        Returns the Turn to continue with, or a ready ChatResult (the `finish` policy).
        Raises BadRequestError or BudgetExhaustedError.
        """
        started = time.perf_counter()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("'messages' must be a non-empty array", param="messages")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequestError("'tools' must be an array", param="tools")
        if index is None:
            index = compile_tools(tools, limits=self._limits)
        model = self._model_label(body.get("model"))
        upstream = self.router.pick(body.get("model"))
        session = resolve_session_id(headers, body, header_name=self.settings.session_header)
        budget, repair = self._overrides(headers)

        tool_errors = await self._claim_tool_errors(session, messages)
        record = await self.store.record(
            session,
            max_errors=budget.max_errors,
            errors=tool_errors,
            channels={Channel.TOOL_ERROR.value: tool_errors} if tool_errors else {},
            requests=1,
            now=time.time(),
        )
        if tool_errors:
            self.metrics.violations.labels(model, Channel.TOOL_ERROR.value).inc(tool_errors)
        turn = Turn(
            body,
            model,
            session,
            budget,
            repair,
            index,
            upstream,
            started,
            record,
            chat_request_headers(headers),
        )
        if budget.exhausted(record.errors) and budget.policy is not ExhaustionPolicy.OBSERVE:
            self.metrics.budget_exhausted.labels(model).inc()
            self.metrics.requests.labels(
                model, "429" if budget.policy is ExhaustionPolicy.REJECT else "200"
            ).inc()
            headers_out = self.headers(turn)
            message = (
                f"session '{session}' has used its error budget: {record.errors} tool errors "
                f"of {budget.max_errors} allowed"
            )
            if budget.policy is ExhaustionPolicy.REJECT:
                raise BudgetExhaustedError(
                    message,
                    code="error_budget_exhausted",
                    headers={**headers_out, "x-should-retry": "false"},
                )
            return ChatResult(200, headers_out, body=finish_completion(body.get("model"), message))
        return turn

    async def settle_choice(
        self, turn: Turn, message: dict[str, Any], finish_reason: str | None
    ) -> SettledChoice:
        """Validate one choice's message, repair it by re-asking if allowed, apply on_unrepaired."""
        tools = turn.body.get("tools")
        tool_choice = turn.body.get("tool_choice")
        found = validate(message, tools, tool_choice, finish_reason=finish_reason, index=turn.index)
        if not found:
            turn.outcomes["valid"] += len(message.get("tool_calls") or ())
            return SettledChoice(message, finish_reason, [], False, [], [], False)

        self._count_found(turn, found)
        current, reason, remaining = message, finish_reason, found
        extra_usage: list[dict[str, Any]] = []
        if self.settings.local_fixes:
            current, fixed = local_fix(current, remaining, turn.index)
            if fixed:
                remaining = validate(
                    current, tools, tool_choice, finish_reason=reason, index=turn.index
                )
                for violation in fixed:
                    self.metrics.repairs.labels(
                        turn.model, violation.channel.value, "local_fix"
                    ).inc()

        if remaining and turn.repair is RepairMode.REASK and self.settings.max_reasks > 0:
            current, reason, remaining, extra_usage = await self._reask(
                turn, current, reason, remaining
            )

        repaired = not remaining
        result = "success" if repaired else "failure"
        for violation in found:
            self.metrics.repairs.labels(turn.model, violation.channel.value, result).inc()
        if repaired:
            turn.repaired += len(found)
            turn.outcomes["repaired"] += len(current.get("tool_calls") or ())
            return SettledChoice(current, reason, found, True, [], extra_usage, True)

        policy = self.settings.on_unrepaired
        if policy is OnUnrepaired.STRIP:
            stripped = strip_invalid(current, remaining)
            # A failure of the message itself (a call leaked into content, an empty answer, a
            # required call not made) has no call to remove: the client gets it, and it counts.
            kept = [v for v in remaining if v.call_index is None]
            turn.outcomes["stripped"] += len(remaining) - len(kept)
            turn.outcomes["valid"] += len(stripped.get("tool_calls") or ())
            if reason == "tool_calls" and not stripped.get("tool_calls"):
                reason = "stop"
            if kept:
                turn.unrepaired.extend(kept)
                self._count_found(turn, beyond(kept, found))
            return SettledChoice(stripped, reason, found, False, kept, extra_usage, True)
        turn.unrepaired.extend(remaining)
        # What the client gets is reported and counted in its channels, also where a re-ask
        # failed otherwise than the original response did.
        self._count_found(turn, beyond(remaining, found))
        bad = {v.call_index for v in remaining}
        calls = current.get("tool_calls") or []
        turn.outcomes["invalid"] += sum(1 for i in range(len(calls)) if i in bad)
        turn.outcomes["valid"] += sum(1 for i in range(len(calls)) if i not in bad)
        if policy is OnUnrepaired.REJECT:
            await self.finish(turn)
            raise UnrepairedToolCallError(
                "the model's tool call could not be repaired: "
                + "; ".join(v.message for v in remaining),
                code=remaining[0].channel.value,
                headers=self.headers(turn),
            )
        return SettledChoice(
            current, reason, found, False, remaining, extra_usage, current is not message
        )

    async def finish(self, turn: Turn, *, status: str = "200") -> dict[str, str]:
        """Account the turn in the session store and metrics; return the x-toolsentry-* headers.

        `status` labels the request in the metrics (499: a streaming client went away).
        """
        errors = len(turn.unrepaired)
        if errors or turn.found or turn.repaired:
            channels = Counter(v.channel.value for v in turn.found)
            passed_ids = [v.call_id for v in turn.unrepaired if v.call_id]
            if passed_ids:
                # A later tool error for a call we already counted must not count twice.
                await self.store.claim_call_ids(turn.session, passed_ids, now=time.time())
            turn.record = await self.store.record(
                turn.session,
                max_errors=turn.budget.max_errors,
                errors=errors,
                repairs=turn.repaired,
                channels=channels,
                now=time.time(),
            )
        series = self.metrics.for_model(turn.model)
        for outcome, count in turn.outcomes.items():
            series.tool_calls(outcome).inc(count)
        series.requests(status).inc()
        total = time.perf_counter() - turn.started
        series.upstream_seconds.observe(turn.upstream_seconds)
        series.overhead_seconds.observe(max(0.0, total - turn.upstream_seconds))
        return self.headers(turn)

    async def upstream_failed(
        self, turn: Turn, exc: UpstreamError, *, ends_request: bool = True
    ) -> None:
        """Count an upstream failure (after retries) in the session and metrics.

        `ends_request`: the client's request fails with it and is counted under its status;
        False for a re-ask, whose failure leaves the turn to finish with the original response.
        """
        # A refusal (4xx) is the upstream answering the request, with the status the client gets.
        refused = exc.status if isinstance(exc, UpstreamStatusError) and exc.status < 500 else None
        if refused is None:
            await self.store.record(
                turn.session,
                max_errors=turn.budget.max_errors,
                channels={Channel.UPSTREAM_ERROR.value: 1},
                now=time.time(),
            )
            self.metrics.violations.labels(turn.model, Channel.UPSTREAM_ERROR.value).inc()
        if ends_request:
            self.metrics.requests.labels(turn.model, str(refused or status_of(exc))).inc()

    # -- internals ------------------------------------------------------------------------------

    def _count_found(self, turn: Turn, violations: list[Violation]) -> None:
        turn.found.extend(violations)
        for violation in violations:
            self.metrics.violations.labels(turn.model, violation.channel.value).inc()
            if violation.channel is Channel.UNKNOWN_TOOL and violation.tool_name is not None:
                self.unknown_tools.add(turn.model, violation.tool_name)

    async def _call(
        self, turn: Turn, body: dict[str, Any], raw: bytes | None = None
    ) -> UpstreamResponse:
        """One non-streamed upstream call; raises UpstreamError, which the caller counts.

        `raw`: the client's body as sent, forwarded unchanged on the first attempt.
        """
        start = time.perf_counter()
        try:
            response = await turn.upstream.request(
                "POST",
                CHAT_PATH,
                body=orjson.dumps(body) if raw is None else raw,
                headers=turn.forward,
            )
            raise_for_status(response, turn.upstream.name)
            return response
        finally:
            turn.upstream_seconds += time.perf_counter() - start

    async def _reask(
        self,
        turn: Turn,
        message: dict[str, Any],
        finish_reason: str | None,
        violations: list[Violation],
    ) -> tuple[dict[str, Any], str | None, list[Violation], list[dict[str, Any]]]:
        """Re-ask up to max_reasks times; return the last message, its reason, violations, usages."""
        tools = turn.body.get("tools")
        tool_choice = turn.body.get("tool_choice")
        conversation = list(turn.body["messages"])
        request = {k: v for k, v in turn.body.items() if k not in ("stream", "stream_options", "n")}
        usages: list[dict[str, Any]] = []
        for _ in range(self.settings.max_reasks):
            conversation.extend(corrective_messages(message, violations, turn.index))
            request["messages"] = conversation
            # A failed re-ask leaves the failure it was to repair in place; the request goes on.
            try:
                response = await self._call(turn, request)
                completion, choices = parse_completion(response.json(), turn.upstream.name)
            except UpstreamError as exc:
                await self.upstream_failed(turn, exc, ends_request=False)
                get_logger().warning(
                    "reask_failed", session=turn.session, model=turn.model, error=exc.message
                )
                break
            if not choices:
                break
            message = choices[0]["message"]
            finish_reason = choices[0].get("finish_reason")
            if isinstance(completion.get("usage"), dict):
                usages.append(completion["usage"])
            violations = validate(
                message, tools, tool_choice, finish_reason=finish_reason, index=turn.index
            )
            if not violations:
                break
        return message, finish_reason, violations, usages

    async def _claim_tool_errors(self, session: str, messages: list[Any]) -> int:
        prefix = self._tool_error_prefix
        ids = tool_errors_in(messages, rule=lambda text: text.startswith(prefix))
        if not ids:
            return 0
        return len(await self.store.claim_call_ids(session, ids, now=time.time()))

    def _overrides(self, headers: Mapping[str, str]) -> tuple[ErrorBudget, RepairMode]:
        max_errors = self.settings.max_errors
        repair = self.settings.repair
        if self.settings.allow_overrides:
            raw = headers.get("x-toolsentry-max-errors")
            if raw is not None:
                try:
                    asked = int(raw)
                except ValueError:
                    raise BadRequestError(
                        f"x-toolsentry-max-errors must be an integer, got {raw!r}",
                        param="x-toolsentry-max-errors",
                    ) from None
                if asked < 1:
                    raise BadRequestError(
                        "x-toolsentry-max-errors must be at least 1",
                        param="x-toolsentry-max-errors",
                    )
                max_errors = min(max_errors, asked)
            mode = headers.get("x-toolsentry-repair")
            if mode is not None:
                try:
                    repair = RepairMode(mode.strip().lower())
                except ValueError:
                    valid = ", ".join(m.value for m in RepairMode)
                    raise BadRequestError(
                        f"x-toolsentry-repair must be one of {valid}, got {mode!r}",
                        param="x-toolsentry-repair",
                    ) from None
        return ErrorBudget(max_errors, self.settings.exhaustion_policy), repair

    def _model_label(self, model: object) -> str:
        name = model if isinstance(model, str) else ""
        if name in self._model_labels:
            return name
        if len(self._model_labels) < _MAX_MODEL_LABELS:
            self._model_labels.add(name)
            return name
        return "other"

    @staticmethod
    def headers(turn: Turn) -> dict[str, str]:
        """The x-toolsentry-* headers for the turn as it stands."""
        channels = list(dict.fromkeys(v.channel.value for v in turn.found))
        return {
            "x-toolsentry-session": turn.session,
            "x-toolsentry-errors": str(turn.record.errors),
            "x-toolsentry-max-errors": str(turn.budget.max_errors),
            "x-toolsentry-repairs": str(turn.repaired),
            "x-toolsentry-violations": ",".join(channels),
        }


def parse_completion(data: Any, upstream: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Check that an upstream's 200 body is a chat completion; return it and its choices.

    Raises UpstreamProtocolError naming the upstream when it is not.
    """
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(choices, list):
        raise UpstreamProtocolError(
            f"upstream '{upstream}' answered 200 with a body that is not a chat completion"
        )
    for choice in choices:
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise UpstreamProtocolError(f"upstream '{upstream}' sent a choice without a message")
    return data, choices


def beyond(delivered: list[Violation], found: list[Violation]) -> list[Violation]:
    """The violations of `delivered` that `found` has no counterpart for, channel by channel.

    A turn counts, per channel, the larger of what the upstream's first response had and what
    the client finally got: a failure repeated on every re-ask is one failure, a different one
    is another. Returns the delivered violations in excess, in order.
    """
    spare = Counter(v.channel for v in found)
    extra = []
    for violation in delivered:
        if spare[violation.channel]:
            spare[violation.channel] -= 1
        else:
            extra.append(violation)
    return extra


def sum_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """Add usage objects field by field (nested detail objects too); non-numbers keep the first."""
    total: dict[str, Any] = {}
    for usage in usages:
        for key, value in usage.items():
            if isinstance(value, bool) or value is None:
                total.setdefault(key, value)
            elif isinstance(value, int | float):
                current = total.get(key)
                total[key] = (current if isinstance(current, int | float) else 0) + value
            elif isinstance(value, dict):
                current = total.get(key)
                total[key] = sum_usage([current, value] if isinstance(current, dict) else [value])
            else:
                total.setdefault(key, value)
    return total


def finish_completion(model: object, message: str) -> dict[str, Any]:
    """A normal chat completion that tells the agent its session has ended (the `finish` policy)."""
    return {
        "id": f"chatcmpl-toolsentry-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model if isinstance(model, str) else "",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": message, "tool_calls": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }
