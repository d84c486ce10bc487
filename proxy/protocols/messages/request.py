"""A Messages request read for the turn (session hints, its history, tool results) and continued
for a re-ask.

A re-ask continues the conversation with the assistant turn (thinking, text, the `tool_use` blocks
as sent) and a user turn of `tool_result` blocks (`is_error: true`) carrying the corrective texts,
plus a text block for what has no call.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any, Final

import orjson

from proxy.guard.channels import Violation
from proxy.guard.repair import corrective_messages
from proxy.guard.toolcheck import ToolIndex
from proxy.protocols.base import Message, ToolResult
from proxy.protocols.messages.reply import content_blocks
from proxy.session.budget import SessionHints, content_text
from proxy.session.history import (
    SYSTEM,
    TOOL,
    USER,
    History,
    Item,
    arguments_text,
    assistant,
    canonical_json,
    digest_history,
)

# Every request resends the whole conversation, so its blocks are walked on every request: these
# feed `dict.get` over a block list in C (`map(_GET, blocks, _TYPE)`), which raises TypeError
# when a block is not an object.
_TYPE: Final = repeat("type")
_TEXT: Final = repeat("text")
_GET: Final[Callable[[Any, str], Any]] = dict.get


def session_hints(body: Mapping[str, Any]) -> SessionHints:
    """The session hints of a Messages body: the `session_id` inside `metadata.user_id` (Claude
    Code writes a JSON string there), else that user id as the `user`; the fingerprint of the
    model, the first system text and the first user text."""
    metadata = body.get("metadata")
    # Most bodies have no metadata: None is told without the ABC's instance check.
    user_id = (
        metadata.get("user_id")
        if metadata is not None and (type(metadata) is dict or isinstance(metadata, Mapping))
        else None
    )
    declared, user = None, user_id
    if isinstance(user_id, str) and user_id.startswith("{"):
        inner = _json_object(user_id)
        if isinstance(inner, dict) and inner.get("session_id"):
            declared, user = inner["session_id"], None
    first_user = None
    for message in body.get("messages") or ():
        if isinstance(message, dict) and message.get("role") == "user":
            first_user = message.get("content")
            break
    model = body.get("model")
    # Positional: the named tuple's keyword arguments cost a third of its making.
    return SessionHints(
        (model if isinstance(model, str) else "", body.get("system"), first_user),
        declared,
        "metadata.user_id",
        None,
        user,
        _blocks_text,
        history,
    )


def history(body: Mapping[str, Any]) -> History:
    """The digests of the body's model, `system` and `messages`: text blocks as `_blocks_text`
    reads them (a string and one text block alike; `cache_control` and citations not read),
    a user turn's `tool_result` blocks as tool results (id, text) before its other blocks'
    text, an assistant turn's text and `tool_use` blocks (id, name, input); thinking blocks
    are left out (clients drop or keep them)."""
    return digest_history(body.get("model"), _items(body))


def _items(body: Mapping[str, Any]) -> Iterator[Item]:
    system = body.get("system")
    if system is not None:
        yield (SYSTEM, _blocks_text(system))
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict):
            yield ("", canonical_json(message))
            continue
        role, content = message.get("role"), message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if role == "assistant":
            yield assistant(*_assistant_turn(blocks))
            continue
        rest = []
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                text = _blocks_text(block.get("content"))
                yield (TOOL, str(block.get("tool_use_id") or ""), text)
            else:
                rest.append(block)
        if rest or not blocks:
            yield (USER if role == "user" else str(role), _other_text(rest))


def _assistant_turn(blocks: list[Any]) -> tuple[str, list[tuple[str, str, str]]]:
    calls, rest = [], []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            name = str(block.get("name") or "")
            calls.append((str(block.get("id") or ""), name, arguments_text(block.get("input"))))
        elif kind not in ("thinking", "redacted_thinking"):
            rest.append(block)
    return _other_text(rest), calls


def _other_text(blocks: list[Any]) -> str:
    """The text of blocks: text blocks' texts, any other block as its canonical JSON."""
    return "".join(
        _blocks_text([block])
        if isinstance(block, dict) and block.get("type") == "text"
        else canonical_json(block)
        for block in blocks
    )


def _json_object(text: str) -> object:
    """`text` parsed as JSON, None when it is not JSON. orjson first; what it refuses and
    Python's parser takes (NaN, Infinity, lone surrogates) is read as Python reads it."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except ValueError:
        return None


def tool_results(messages: Sequence[Any]) -> list[ToolResult]:
    """The `tool_result` blocks of the user turns, in order; `is_error: true` is a tool error."""
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        try:
            if "tool_result" not in map(_GET, content, _TYPE):
                continue
        except TypeError:
            pass  # a block that is not an object: the walk below skips it
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            call_id = block.get("tool_use_id")
            if isinstance(call_id, str) and call_id:
                text = _blocks_text(block.get("content"))
                out.append(ToolResult(call_id, text, block.get("is_error") is True))
    return out


def _blocks_text(content: object) -> str:
    """The text of a string or of content blocks (their `text` parts, as `content_text` reads
    each: a text that is not a string by its block's canonical JSON)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return content_text(content)
    if len(content) == 1:  # a user turn of one text block, the most usual: no iterators made
        block = content[0]
        if type(block) is dict and block.get("type") == "text":
            text = block.get("text")
            if type(text) is str:
                return text
    try:  # the usual case, in C: every block a text block whose text is a string
        if all(map(operator.eq, map(_GET, content, _TYPE), _TEXT)):
            return "".join(map(_GET, content, _TEXT))
    except TypeError:  # a block that is not an object, or a text that is not a string
        pass
    pieces = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            pieces.append(text if isinstance(text, str) else content_text([block]))
    return "".join(pieces)


def reask_turns(
    message: Message, violations: Sequence[Violation], index: ToolIndex
) -> list[dict[str, Any]]:
    """The model's answer and the corrective answers to it, as Messages turns: the assistant turn
    (without an empty text block), then one user turn of `tool_result` blocks (`is_error: true`)
    for the calls and a text block for what has no call."""
    assistant, *answers = corrective_messages(message, violations, index)
    turns: list[dict[str, Any]] = []
    blocks = [
        b for b in content_blocks({**message, **assistant}) if b != {"type": "text", "text": ""}
    ]
    for block in blocks:
        if block["type"] == "tool_use" and not isinstance(block["input"], dict):
            block[
                "input"
            ] = {}  # the server takes only an object; the tool_result says what was wrong
    if blocks:
        turns.append({"role": "assistant", "content": blocks})
    user: list[dict[str, Any]] = []
    for answer in answers:
        if answer.get("role") == "tool":
            user.append(
                {
                    "type": "tool_result",
                    "tool_use_id": answer.get("tool_call_id"),
                    "content": content_text(answer.get("content")),
                    "is_error": True,
                }
            )
        else:
            user.append({"type": "text", "text": content_text(answer.get("content"))})
    if user:
        turns.append({"role": "user", "content": user})
    return turns
