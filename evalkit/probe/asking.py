"""Asking contexts of live endpoints: targets, answers, the journal, and the bounded async run.

Every (context, target, sample, route) is asked once. The route is `direct` (the target's own
base URL) or `proxy` (the same model through a toolsentry proxy, for repair success). Each answer
is classified by `proxy.guard` — the validator the proxy runs online — and appended to the run's
journal (`answers.jsonl`, one JSON object a line, flushed as it lands), so Ctrl-C or a dead
endpoint loses nothing that finished and `--resume` asks only what is missing.

Retries (tenacity, exponential backoff with jitter) are for infrastructure errors alone: a
connection that fails, a timeout, HTTP 5xx. A prompt longer than the model's window (vLLM's
HTTP 400 naming its maximum context length) is an answer of its own, `too_long`, with the
limit; any other 400 or a 429 is `rejected` with the server's message. An endpoint that is still
failing after the retries, or that refuses the model or the key (401, 403, 404), stops the run
with `EndpointError`.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import httpx
import openai
from openai import AsyncOpenAI
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from evalkit.agent import SEED_HEADER, SESSION_HEADER, TASK_HEADER
from evalkit.agent import parse_tool_call as episode_tool_call
from evalkit.errors import EndpointError, UsageError, WrongDataError
from evalkit.messages import AssistantMessage, dump_message, now_iso
from evalkit.probe.contexts import Context, RecordedCall
from proxy.guard.toolcheck import compile_tools, validate
from proxy.headers import HEADER_PREFIX

Route = Literal["direct", "proxy"]
Status = Literal["answered", "too_long", "rejected"]

INFRASTRUCTURE_ERRORS: Final = (openai.APIConnectionError, openai.InternalServerError)
"""What is retried: no connection, a timeout (a subclass of the first), an HTTP 5xx."""

# vLLM: "This model's maximum context length is 4096 tokens. However, you requested …", or
# "… 'max_tokens' is too large: 256. This model's maximum context length is 4096 tokens and your
# request has 4000 input tokens …"; OpenAI's own wording is the same.
_WINDOW: Final = re.compile(r"maximum (?:context|model) length (?:is|of) (\d+)", re.IGNORECASE)
_CONFIG_STATUSES: Final = frozenset({401, 403, 404})


@dataclass(frozen=True, slots=True)
class Target:
    """One model to probe: a name for tables, its OpenAI base URL and model id."""

    name: str
    base_url: str
    model: str

    @classmethod
    def parse(cls, spec: str) -> Target:
        """`NAME=URL,MODEL` (as `--target` takes it).

        Raises:
            UsageError: on any other shape.
        """
        name, sep, rest = spec.partition("=")
        url, comma, model = rest.rpartition(",")
        if not (sep and comma and name.strip() and url.strip() and model.strip()):
            raise UsageError(
                f"--target {spec!r}: expected NAME=URL,MODEL, e.g. "
                "q4=http://127.0.0.1:8001/v1,gemma-270m"
            )
        return cls(name.strip(), url.strip().rstrip("/"), model.strip())

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "base_url": self.base_url, "model": self.model}


@dataclass(frozen=True, slots=True)
class Key:
    """Which question an answer answers."""

    context: str
    target: str
    sample: int
    route: Route


@dataclass
class Answer:
    """One answer, as the journal and the output file keep it.

    `message` is the answer in τ²-bench's shape (`role`, `content`, `tool_calls` with parsed
    `arguments`, `raw_data` the choice as the server sent it); `violations` what `proxy.guard`
    found in it; `agreement` how it matches the recorded turn; `proxy` the `x-toolsentry-*`
    headers of a proxied answer. Skipped answers carry `status` and `error` (and `limit`, the
    model's window, when the prompt was too long) instead.
    """

    key: Key
    status: Status
    message: dict[str, Any] | None = None
    finish_reason: str | None = None
    violations: list[dict[str, Any]] = field(default_factory=list)
    agreement: dict[str, bool | None] = field(default_factory=dict)
    proxy: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    limit: int | None = None
    seconds: float | None = None

    @property
    def channels(self) -> set[str]:
        """The channels of this answer's violations."""
        return {str(v["channel"]) for v in self.violations}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "context": self.key.context,
            "target": self.key.target,
            "sample": self.key.sample,
            "route": self.key.route,
            "status": self.status,
        }
        optional = {
            "message": self.message,
            "finish_reason": self.finish_reason,
            "violations": self.violations,
            "agreement": self.agreement,
            "proxy": self.proxy,
            "error": self.error,
            "limit": self.limit,
            "seconds": self.seconds,
        }
        out.update({k: v for k, v in optional.items() if v is not None and v != {}})
        if self.status == "answered":
            out["violations"] = self.violations
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Answer:
        key = Key(str(data["context"]), str(data["target"]), int(data["sample"]), data["route"])
        return cls(
            key=key,
            status=data["status"],
            message=data.get("message"),
            finish_reason=data.get("finish_reason"),
            violations=list(data.get("violations") or []),
            agreement=dict(data.get("agreement") or {}),
            proxy=dict(data.get("proxy") or {}),
            error=data.get("error"),
            limit=data.get("limit"),
            seconds=data.get("seconds"),
        )


# -- classification and agreement (pure) ---------------------------------------------------------


def agreement(
    recorded: Sequence[RecordedCall], answer: Sequence[RecordedCall]
) -> dict[str, bool | None]:
    """How an answer matches the recorded turn, as vendor verifiers measure tool calling.

    `trigger`: both called a tool, or both answered in text. `name`: where both called, the same
    tool names in the same order (None otherwise). `arguments`: where the names agree, the same
    arguments after canonical JSON (None otherwise).
    """
    trigger = bool(recorded) == bool(answer)
    name = None
    arguments = None
    if recorded and answer:
        name = [c.name for c in recorded] == [c.name for c in answer]
        if name:
            arguments = [c.arguments for c in recorded] == [c.arguments for c in answer]
    return {"trigger": trigger, "name": name, "arguments": arguments}


def classify(
    context: Context, key: Key, choice: dict[str, Any], headers: dict[str, str], seconds: float
) -> Answer:
    """The answer of one chat-completion choice (as JSON): guard violations and agreement."""
    message = choice.get("message")
    if not isinstance(message, dict):
        message = {}
    finish_reason = choice.get("finish_reason")
    finish = finish_reason if isinstance(finish_reason, str) else None
    found = validate(
        message, list(context.tools), finish_reason=finish, index=compile_tools(list(context.tools))
    )
    calls = [
        c for c in (message.get("tool_calls") or []) if isinstance(c, dict) and c.get("function")
    ]
    parsed = [
        episode_tool_call(
            str(c.get("id") or ""),
            str(c["function"].get("name") or ""),
            c["function"].get("arguments"),
        )
        for c in calls
    ]
    content = message.get("content")
    episode_message = AssistantMessage(
        content=content if isinstance(content, str) else None,
        tool_calls=parsed or None,
        timestamp=now_iso(),
        raw_data=choice,
        proxy_headers=headers or None,
    )
    return Answer(
        key=key,
        status="answered",
        message=dump_message(episode_message),
        finish_reason=finish,
        violations=[v.to_dict() for v in found],
        agreement=agreement(context.recorded, [RecordedCall.of(c) for c in parsed]),
        proxy=headers,
        seconds=round(seconds, 3),
    )


def window_limit(message: str) -> int | None:
    """The model's maximum context length named in a server's error text, if it names one."""
    found = _WINDOW.search(message)
    return int(found.group(1)) if found else None


def is_window_error(message: str) -> bool:
    """Whether an HTTP 400's text says the prompt does not fit the model's window."""
    text = message.lower()
    return window_limit(message) is not None or "context length" in text or "too long" in text


# -- the journal ---------------------------------------------------------------------------------


class Journal:
    """`answers.jsonl`: every finished answer, one line each, appended and flushed as it lands."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> tuple[dict[Key, Answer], int]:
        """The answers written so far (the last of a key wins) and how many lines were unreadable
        (a line cut by a kill; its question is simply asked again)."""
        answers: dict[Key, Answer] = {}
        broken = 0
        if not self.path.exists():
            return answers, 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                answer = Answer.from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                broken += 1
                continue
            answers[answer.key] = answer
        return answers, broken

    def append(self, answer: Answer) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(answer.to_dict(), ensure_ascii=False) + "\n")
            handle.flush()


# -- asking --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AskSettings:
    """How every question is asked."""

    temperature: float = 0.0
    max_tokens: int = 256
    seed: int = 0
    retries: int = 3
    timeout: float = 600.0
    concurrency: int = 4
    retry_wait: float = 1.0


@dataclass(frozen=True, slots=True)
class Question:
    context: Context
    target: Target
    base_url: str
    key: Key


def plan(
    contexts: Sequence[Context],
    targets: Sequence[Target],
    samples: int,
    proxy_url: str | None,
    done: Mapping[Key, Answer] | None = None,
    *,
    proxy_failing_only: bool = False,
) -> list[Question]:
    """Every question not yet answered, target by target and context by context (so that one
    server at a time works through contexts that share their prefix).

    With `proxy_failing_only`, a context goes through the proxy only once its direct answer (of
    the same target and sample) is known to have a violation: repair success is measured on
    failures, and at temperature 0 the proxy's first attempt is the same question again.
    """
    finished = done or {}
    routes: list[tuple[Route, str | None]] = [("direct", None)]
    if proxy_url is not None:
        routes.append(("proxy", proxy_url.rstrip("/")))
    out = []
    for target in targets:
        for route, url in routes:
            for context in contexts:
                for sample in range(samples):
                    key = Key(context.id, target.name, sample, route)
                    if key in finished:
                        continue
                    if route == "proxy" and proxy_failing_only:
                        direct = finished.get(Key(context.id, target.name, sample, "direct"))
                        if direct is None or not direct.violations:
                            continue
                    out.append(Question(context, target, url or target.base_url, key))
    return out


OnAnswer = Callable[[Answer], None]


async def ask_all(
    questions: Sequence[Question],
    settings: AskSettings,
    on_answer: OnAnswer,
) -> None:
    """Ask every question with at most `settings.concurrency` in flight; `on_answer` gets each
    answer as it lands (the journal and the progress bar).

    Raises:
        EndpointError: when an endpoint still fails after the retries, or refuses the model or the
            key; the questions in flight are cancelled, every finished answer has been delivered.
        WrongDataError: when an endpoint does not know a context's task (the simulator started
            on other data than the file's), the same way.
    """
    clients: dict[str, AsyncOpenAI] = {}
    semaphore = asyncio.Semaphore(settings.concurrency)

    def client_for(base_url: str) -> AsyncOpenAI:
        if base_url not in clients:
            clients[base_url] = AsyncOpenAI(
                base_url=base_url, api_key="EMPTY", max_retries=0, timeout=settings.timeout
            )
        return clients[base_url]

    async def one(question: Question) -> None:
        async with semaphore:
            answer = await ask(client_for(question.base_url), question, settings)
        on_answer(answer)

    try:
        async with asyncio.TaskGroup() as group:
            for question in questions:
                group.create_task(one(question))
    except* (EndpointError, WrongDataError) as failures:
        raise failures.exceptions[0] from None
    finally:
        for client in clients.values():
            await client.close()


async def ask(client: AsyncOpenAI, question: Question, settings: AskSettings) -> Answer:
    """Ask one question (with retries on infrastructure errors) and classify the answer."""
    context, key = question.context, question.key
    headers = {
        # A session per question: the proxy's budget must not carry over between contexts.
        SESSION_HEADER: f"probe-{uuid.uuid4().hex}",
        TASK_HEADER: context.task_id,
        SEED_HEADER: str(settings.seed + key.sample),
    }
    where = f"{question.target.name} ({question.base_url}, model {question.target.model})"
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(INFRASTRUCTURE_ERRORS),
            stop=stop_after_attempt(settings.retries + 1),
            wait=wait_exponential_jitter(initial=settings.retry_wait, max=30.0),
            reraise=True,
        ):
            with attempt:
                raw = await client.chat.completions.with_raw_response.create(
                    model=question.target.model,
                    messages=list(context.messages),  # type: ignore[arg-type]
                    tools=list(context.tools),  # type: ignore[arg-type]
                    temperature=settings.temperature,
                    max_tokens=settings.max_tokens,
                    seed=settings.seed + key.sample,
                    extra_headers=headers,
                )
    except INFRASTRUCTURE_ERRORS as exc:
        raise EndpointError(
            f"{where} failed after {settings.retries + 1} attempts: {_describe(exc)}"
        ) from exc
    except openai.APIStatusError as exc:
        if exc.status_code == 404 and _param(exc) == TASK_HEADER.lower():
            raise WrongDataError(
                f"{where} does not know task {context.task_id!r} of the results file "
                f"({_describe(exc)}): it serves other data than the file was run on; start it "
                "on that data (evalkit sim serve --data-dir DIR, τ²-bench's data directory)"
            ) from exc
        if exc.status_code in _CONFIG_STATUSES:
            raise EndpointError(
                f"{where} answered HTTP {exc.status_code}: {_describe(exc)}",
                status=exc.status_code,
            ) from exc
        text = _describe(exc)
        if exc.status_code == 400 and is_window_error(text):
            return Answer(key, "too_long", error=text, limit=window_limit(text))
        return Answer(key, "rejected", error=f"HTTP {exc.status_code}: {text}")
    elapsed = loop.time() - started
    try:
        body = json.loads(raw.text)
    except json.JSONDecodeError:
        return Answer(key, "rejected", error="the endpoint's 200 body is not JSON")
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Answer(key, "rejected", error="the endpoint's answer has no choice")
    proxy_headers = {
        k.lower(): v for k, v in raw.headers.items() if k.lower().startswith(HEADER_PREFIX)
    }
    return classify(context, key, choices[0], proxy_headers, elapsed)


def _param(exc: openai.APIStatusError) -> str | None:
    """The `error.param` of an error body (the simulator names the task header there)."""
    body = exc.body
    inner = body.get("error", body) if isinstance(body, dict) else None
    param = inner.get("param") if isinstance(inner, dict) else None
    return param.lower() if isinstance(param, str) else None


def _describe(exc: openai.OpenAIError) -> str:
    if isinstance(exc, openai.APIStatusError):
        body = exc.body
        inner = body.get("error", body) if isinstance(body, dict) else None
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        return exc.message
    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPError) and str(cause):
        return f"{exc} ({cause})"
    return str(exc) or type(exc).__name__


async def model_windows(targets: Sequence[Target]) -> dict[str, int | None]:
    """Each target's `max_model_len` as its server's `/models` reports it (vLLM does), else None.

    Raises:
        EndpointError: when a target's server does not answer at all (is it running?).
    """
    out: dict[str, int | None] = {}
    async with httpx.AsyncClient(timeout=30.0) as http:
        for target in targets:
            url = f"{target.base_url}/models"
            try:
                response = await http.get(url)
            except httpx.HTTPError as exc:
                raise EndpointError(
                    f"cannot reach {target.name} at {target.base_url}: "
                    f"{exc or type(exc).__name__} (is the server running?)"
                ) from None
            out[target.name] = None
            try:
                data = response.json().get("data", [])
            except (ValueError, AttributeError):
                continue
            for card in data if isinstance(data, list) else []:
                if isinstance(card, dict) and card.get("id") == target.model:
                    limit = card.get("max_model_len")
                    out[target.name] = limit if isinstance(limit, int) else None
    return out
