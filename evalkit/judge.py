"""The NL-assertion judge: a model behind any OpenAI-compatible endpoint decides whether each
natural-language assertion of a task holds for a conversation — τ²-bench's NL_ASSERTION check.

The semantics are τ²-bench's (`NLAssertionsEvaluator`): the conversation is every message as a
`role: content` line; the judge grades each expected outcome on its own and answers JSON
`{"results": [{"expectedOutcome", "reasoning", "metExpectation"}]}`; the reward of the check is
1 only when every outcome is met. The instructions below are evalkit's wording of that protocol.

A failed request or an answer that is not that JSON (one result per assertion) is retried with
tenacity (exponential backoff with jitter); when every attempt fails the judge raises
`JudgeError`, which the episode reports as an infrastructure error — a judge that cannot answer
never passes an assertion.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import openai
from openai import AsyncOpenAI
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from evalkit.agent import TASK_HEADER, endpoint_error, make_client
from evalkit.errors import JudgeError
from evalkit.scoring import NLAssertionCheck

DEFAULT_ATTEMPTS: Final = 3

JUDGE_INSTRUCTIONS: Final = """\
TASK
- You get a list of expected outcomes and a conversation recorded during a test run.
- The conversation is between a customer service agent and a customer.
- Decide for each expected outcome, on its own, whether the agent satisfies it.

FORMAT
- Answer with one JSON object and nothing else:
  {"results": [{"expectedOutcome": "<the expected outcome, repeated>",
                "reasoning": "<a short explanation>",
                "metExpectation": true or false}]}
- One result per expected outcome, in the order given.\
"""


def transcript(messages: Sequence[Any]) -> str:
    """The conversation as τ²-bench shows it to its judge: one `role: content` line per message
    (tool calls and tool results included, as their role and content)."""
    return "\n".join(f"{m.role}: {m.content}" for m in messages)


def judge_prompt(assertions: Sequence[str], messages: Sequence[Any]) -> str:
    """The user message of a judge request."""
    return (
        f"conversation:\n{transcript(messages)}\n\n"
        f"expectedOutcomes:\n{json.dumps(list(assertions), ensure_ascii=False)}"
    )


class LLMJudge:
    """Judges NL assertions with one request per conversation, retried on failure.

    `attempts` is how many requests one conversation may take (failed requests and unreadable
    answers alike); `wait_initial` the first backoff in seconds. `info` describes the judge for
    the records (`reward_info.info["judge"]`).
    """

    def __init__(
        self,
        client: AsyncOpenAI,
        model: str,
        *,
        llm_args: Mapping[str, Any] | None = None,
        attempts: int = DEFAULT_ATTEMPTS,
        wait_initial: float = 0.5,
        base_url: str | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError("a judge needs at least one attempt")
        self._client = client
        self.model = model
        self.llm_args = dict(llm_args or {"temperature": 0.0})
        self.attempts = attempts
        self.wait_initial = wait_initial
        self.info: dict[str, Any] = {"model": model, "base_url": base_url, "attempts": attempts}

    @classmethod
    def at(cls, base_url: str, model: str, **options: Any) -> LLMJudge:
        """A judge on the endpoint `base_url` (the client does not retry: the judge does)."""
        return cls(make_client(base_url, max_retries=0), model, base_url=base_url, **options)

    async def close(self) -> None:
        """Close the judge's client."""
        await self._client.close()

    async def judge(
        self, assertions: Sequence[str], messages: Sequence[Any], *, task_id: str | None = None
    ) -> list[NLAssertionCheck]:
        """One check per assertion, in order. `task_id` travels in the `x-evalkit-task` header
        (a deterministic judge may use it).

        Raises:
            JudgeError: when every attempt failed or answered something unreadable (the last
                reason in the message).
        """
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=self.wait_initial, max=10.0)
            + wait_random(0, self.wait_initial),
            retry=retry_if_exception_type(JudgeError),
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._ask(assertions, messages, task_id)
        except RetryError as failed:
            last = failed.last_attempt.exception()
            raise JudgeError(f"the judge failed {self.attempts} time(s); last: {last}") from None
        raise AssertionError("unreachable: tenacity either returns or raises")

    async def _ask(
        self, assertions: Sequence[str], messages: Sequence[Any], task_id: str | None
    ) -> list[NLAssertionCheck]:
        headers = {TASK_HEADER: task_id} if task_id is not None else {}
        try:
            completion = await self._client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": JUDGE_INSTRUCTIONS},
                    {"role": "user", "content": judge_prompt(assertions, messages)},
                ],
                extra_headers=headers,
                **self.llm_args,
            )
        except openai.OpenAIError as exc:
            raise JudgeError(endpoint_error(exc, "judge").message) from exc
        text = completion.choices[0].message.content if completion.choices else None
        return parse_verdicts(assertions, text or "")


def parse_verdicts(assertions: Sequence[str], text: str) -> list[NLAssertionCheck]:
    """The judge's JSON answer as one check per assertion, in order.

    Raises:
        JudgeError: when the answer is not the expected JSON or has another number of results.
    """
    body = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        results = json.loads(body)["results"]
        if not isinstance(results, list):
            raise TypeError("results is not a list")
        if len(results) != len(assertions):
            raise ValueError(f"{len(results)} results for {len(assertions)} assertions")
        checks = []
        for assertion, result in zip(assertions, results, strict=True):
            met = result["metExpectation"]
            if not isinstance(met, bool):
                raise TypeError(f"metExpectation is {met!r}, not true or false")
            checks.append(
                NLAssertionCheck(
                    nl_assertion=assertion,
                    met=met,
                    justification=str(result.get("reasoning", "")),
                )
            )
        return checks
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise JudgeError(f"unreadable judge answer ({exc}): {text[:200]!r}") from None
