"""The NL-assertion judge: a model behind an OpenAI-compatible endpoint decides whether each
natural-language assertion of a task holds for a conversation (τ²-bench's NL_ASSERTION check).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import openai
from openai import AsyncOpenAI

from evalkit.agent import endpoint_error
from evalkit.messages import AssistantMessage, UserMessage
from evalkit.scoring import NLAssertionCheck

JUDGE_INSTRUCTIONS = """\
You review a conversation between a customer service agent and a customer. For each numbered
assertion, decide whether the conversation shows it to be true. Answer with JSON only:
{"results": [{"assertion": "<the assertion>", "met": true or false, "justification": "<one sentence>"}]}
in the order of the assertions.\
"""


def transcript(messages: Sequence[Any]) -> str:
    """The conversation's text turns as 'role: text' lines (tool traffic left out)."""
    lines = []
    for m in messages:
        if isinstance(m, AssistantMessage | UserMessage) and m.has_text():
            lines.append(f"{m.role}: {m.content}")
    return "\n".join(lines)


class LLMJudge:
    """Judges NL assertions with one request per conversation.

    An answer that is not the expected JSON counts every assertion as not met, with the reason
    in the justification (a judge that cannot answer must not pass a run).
    """

    def __init__(
        self, client: AsyncOpenAI, model: str, *, llm_args: Mapping[str, Any] | None = None
    ) -> None:
        self._client = client
        self.model = model
        self.llm_args = dict(llm_args or {"temperature": 0.0})

    async def judge(
        self, assertions: Sequence[str], messages: Sequence[Any]
    ) -> list[NLAssertionCheck]:
        """One check per assertion, in order.

        Raises:
            EndpointError: when the endpoint fails.
        """
        numbered = "\n".join(f"{i + 1}. {a}" for i, a in enumerate(assertions))
        prompt = f"Conversation:\n{transcript(messages)}\n\nAssertions:\n{numbered}"
        try:
            completion = await self._client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": JUDGE_INSTRUCTIONS},
                    {"role": "user", "content": prompt},
                ],
                **self.llm_args,
            )
        except openai.OpenAIError as exc:
            raise endpoint_error(exc, "judge") from exc
        text = completion.choices[0].message.content if completion.choices else None
        return parse_verdicts(assertions, text or "")


def parse_verdicts(assertions: Sequence[str], text: str) -> list[NLAssertionCheck]:
    """The judge's JSON answer as checks; anything unreadable fails every assertion."""
    body = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        results = json.loads(body)["results"]
        if not isinstance(results, list) or len(results) != len(assertions):
            raise ValueError("wrong number of results")
        return [
            NLAssertionCheck(
                nl_assertion=assertion,
                met=result.get("met") is True,
                justification=str(result.get("justification", "")),
            )
            for assertion, result in zip(assertions, results, strict=True)
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return [
            NLAssertionCheck(
                nl_assertion=a, met=False, justification=f"unreadable judge answer: {exc}"
            )
            for a in assertions
        ]
