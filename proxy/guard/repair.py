"""Repairs for an invalid assistant message (DESIGN §6): the messages of a corrective re-ask, the
plan of a constrained re-ask, the message with its invalid calls stripped, and the local fixes that
need no model call.

A re-ask appends to the request's messages the assistant's message, one `role: tool` answer per
call it made (a corrective text for an invalid call, "not executed" for a valid one), and one
`role: user` message for what has no call id to answer (leaked calls, an empty response, a
`tool_choice` that required a call, calls without an id). Every function here copies; none changes
its input.

A constrained re-ask (`repair: constrain`) also asks the upstream to decode the answer under its
structured outputs; `plan_reask` decides how, per channel (see its docstring), and the protocol
adapters write the plan in their own form (`mark_strict` writes the tools of a chat request).
"""

from __future__ import annotations

import copy
import enum
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.guard.channels import Channel, Violation
from proxy.guard.strict import StrictForm, strict_form
from proxy.guard.toolcheck import ToolIndex, written_calls

NOT_EXECUTED: Final = (
    "Not executed: another tool call in the same message was invalid. "
    "Repeat this call if it is still needed."
)
_SCHEMA_TEXT_LIMIT: Final = 800
_DECODER: Final = json.JSONDecoder()


class RepairMode(enum.StrEnum):
    """Whether an invalid response is passed on as it is (`off`), re-asked with a corrective text
    (`reask`), or re-asked with that text under the upstream's structured outputs (`constrain`)."""

    OFF = "off"
    REASK = "reask"
    CONSTRAIN = "constrain"

    @property
    def reasks(self) -> bool:
        """Whether this mode re-asks at all."""
        return self is not RepairMode.OFF


class OnUnrepaired(enum.StrEnum):
    """What the client gets when repair failed: the last response, it without its invalid calls,
    or an error."""

    PASSTHROUGH = "passthrough"
    STRIP = "strip"
    REJECT = "reject"


class StructuredOutputs(enum.StrEnum):
    """Whether an upstream is asked for constrained calls: always (`on`), never (`off`), or until
    it refuses the fields once (`auto`)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


CONSTRAINT_FIELDS: Final = ("strict", "tool_choice")
"""The request fields a constrained re-ask adds; a 400 naming one of them is a refusal."""


def refuses_constraint(status: int, body: object) -> bool:
    """Whether an upstream's error answer to a constrained request refuses its fields.

    True for a 400 whose error (message, param, code, or the body's text) names `strict` or
    `tool_choice` — what an OpenAI-compatible server without structured outputs answers.
    """
    if status != 400:
        return False
    error = body.get("error", body) if isinstance(body, dict) else body
    text = json.dumps(error, ensure_ascii=False) if not isinstance(error, str) else error
    return any(name in text for name in CONSTRAINT_FIELDS)


class ConstraintSupport:
    """Which upstreams refused a constrained request, for `structured_outputs: auto`.

    Kept per process for its lifetime: an upstream that refused once is sent plain re-asks from
    then on. Safe to share between tasks and threads.
    """

    def __init__(self) -> None:
        self._refused: set[str] = set()
        self._lock = threading.Lock()

    def allows(self, upstream: str, setting: StructuredOutputs) -> bool:
        """Whether a request to `upstream` (configured `setting`) may carry the constraint."""
        if setting is StructuredOutputs.OFF:
            return False
        with self._lock:
            return setting is StructuredOutputs.ON or upstream not in self._refused

    def refuse(self, upstream: str) -> bool:
        """Remember that `upstream` refused; True the first time."""
        with self._lock:
            if upstream in self._refused:
                return False
            self._refused.add(upstream)
            return True

    def refused(self) -> frozenset[str]:
        """The upstreams that refused so far."""
        with self._lock:
            return frozenset(self._refused)


def corrective_messages(
    message: dict[str, Any], violations: Sequence[Violation], index: ToolIndex
) -> list[dict[str, Any]]:
    """The messages to append to the original request's messages for a corrective re-ask.

    Returns `[assistant, *tool answers, user?]`: the assistant message as the model sent it,
    reduced to `role`, `content` and the `tool_calls` that have an id (an OpenAI-compatible server
    rejects a call without one, and every call it carries is answered); one `role: tool` message
    per such call, in order; and one `role: user` message gathering everything else. Returns an
    empty list when there is nothing to correct.
    """
    if not violations:
        return []
    calls = _calls_of(message)
    per_call: dict[int, list[Violation]] = {}
    message_level: list[Violation] = []
    for violation in violations:
        if violation.call_index is not None and 0 <= violation.call_index < len(calls):
            per_call.setdefault(violation.call_index, []).append(violation)
        else:
            message_level.append(violation)

    kept_calls: list[dict[str, Any]] = []
    answers: list[dict[str, Any]] = []
    notes: list[str] = []
    for position, call in enumerate(calls):
        problems = per_call.get(position, [])
        call_id = call.get("id")
        name = _name_of(call)
        if not isinstance(call_id, str) or not call_id:
            prefix = f"Your tool call to '{name}'" if name else "Your tool call"
            if problems:
                notes += [
                    f"{prefix} was not executed. {_call_text(v, name, index)}" for v in problems
                ]
            else:
                notes.append(
                    f"{prefix} was not executed because another call was invalid; repeat it if still needed."
                )
            continue
        kept_calls.append(_clean_call(call))
        text = "\n".join(_call_text(v, name, index) for v in problems) if problems else NOT_EXECUTED
        answers.append({"role": "tool", "tool_call_id": call_id, "content": text})
    notes += [_message_text(v, index) for v in message_level]

    content = message.get("content")
    assistant: dict[str, Any] = {"role": "assistant", "content": content}
    if kept_calls:
        assistant["tool_calls"] = kept_calls
    elif content is None:
        assistant["content"] = ""  # an assistant message without calls needs content
    out = [assistant, *answers]
    if notes:
        out.append({"role": "user", "content": "\n".join(notes)})
    return out


def strip_invalid(message: dict[str, Any], violations: Sequence[Violation]) -> dict[str, Any]:
    """A copy of `message` without the calls that have a violation.

    Returns the copy; when no call remains it has no `tool_calls` key. Content is kept, and
    message-level violations change nothing.
    """
    out = copy.deepcopy(message)
    invalid = {v.call_index for v in violations if v.call_index is not None}
    calls = out.get("tool_calls")
    if not invalid or not isinstance(calls, list):
        return out
    kept = [call for position, call in enumerate(calls) if position not in invalid]
    if kept:
        out["tool_calls"] = kept
    else:
        del out["tool_calls"]
    return out


_CALL_CHANNELS_WITH_A_TOOL: Final = (
    Channel.MALFORMED_ARGUMENTS,
    Channel.SCHEMA_VIOLATION,
    Channel.TRUNCATED,
)


@dataclass(frozen=True, slots=True)
class ReaskPlan:
    """How a constrained re-ask asks the upstream for a call it cannot get wrong the same way.

    `tool_choice` is in the chat form the guard reads: `"none"`, `"required"`, or
    `{"type": "function", "function": {"name": …}}`; None leaves the request's own (there was
    nothing to constrain). `strict` holds the tools to declare `strict: true`, with the
    parameters to declare (their strict form); `loose` the tools the plan leaves as declared,
    with the reason; `single_call` asks for one call only (`parallel_tool_calls: false`): under
    `required` a grammar that allows several calls lets a small model repeat its call until the
    token limit cuts it off (seen on the CPU vLLM); `reason` says why this choice, for the log.
    """

    tool_choice: str | dict[str, Any] | None
    reason: str
    strict: Mapping[str, StrictForm] = field(default_factory=dict)
    loose: Mapping[str, str] = field(default_factory=dict)
    single_call: bool = False

    @property
    def named(self) -> str | None:
        """The tool the plan names, or None when it does not name one."""
        if isinstance(self.tool_choice, dict):
            name = self.tool_choice["function"]["name"]
            return name if isinstance(name, str) else None
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary for logs: the choice, the strict and the loose tools."""
        return {
            "tool_choice": self.named or self.tool_choice,
            "reason": self.reason,
            "strict": sorted(self.strict),
            "loose": dict(sorted(self.loose.items())),
            "single_call": self.single_call,
        }


def plan_reask(
    message: Mapping[str, Any],
    violations: Sequence[Violation],
    index: ToolIndex,
    tool_choice: object = None,
) -> ReaskPlan:
    """The constrained re-ask for `message`'s `violations`, under the request's `tool_choice`.

    - `tool_choice: "none"` in the request (a call was not wanted): `"none"`, nothing strict.
    - The request names a tool: that tool, strict.
    - The message meant exactly one call and its tool is clear — a schema violation, malformed
      arguments or a truncated call to a declared tool, an unknown name with exactly one close
      match, a leaked call naming a declared tool (or one close match; the same call written
      again and again counts once), a call a named `tool_choice` did not allow: that tool,
      named and strict.
    - Otherwise (several calls, no clear tool, an empty answer, a required call not made):
      `"required"`, every declared tool strict, and one call only unless several were meant.
    - No tools declared: the request's own `tool_choice` (a plain re-ask).

    A tool whose schema cannot be made strict without changing its meaning stays as declared and
    is listed in `loose` with the reason (the named or required choice still applies).
    """
    if not index.names:
        return ReaskPlan(None, "the request declares no tools")
    if tool_choice == "none":
        return ReaskPlan("none", "the request's tool_choice is 'none'")
    required_name = _named_choice(tool_choice)
    if required_name is not None and index.has(required_name):
        return _named(required_name, "the request's tool_choice names it", index)
    intents = _intended_tools(message, violations, index)
    if len(intents) == 1 and intents[0] is not None:
        return _named(intents[0], "the one call's tool is clear", index)
    forms = strict_forms(index)
    reason = (
        f"{len(intents)} calls were meant" if len(intents) > 1 else "the intended tool is not clear"
    )
    return ReaskPlan(
        "required",
        reason,
        {name: form for name, form in forms.items() if form.convertible},
        {name: form.reason or "" for name, form in forms.items() if not form.convertible},
        single_call=len(intents) <= 1,
    )


def mark_strict(tools: Sequence[object], forms: Mapping[str, StrictForm]) -> list[object]:
    """Chat `tools` with each function named in `forms` declared `strict: true` in its strict form.

    Other tools, and every tool's other fields, are copied as they are.
    """
    out: list[object] = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        form = forms.get(name) if isinstance(name, str) else None
        if (
            not isinstance(tool, dict)
            or not isinstance(function, dict)
            or form is None
            or form.schema is None
        ):
            out.append(copy.deepcopy(tool))
            continue
        marked = dict(tool)
        marked["function"] = {**function, "parameters": form.schema, "strict": True}
        out.append(marked)
    return out


_FORMS_SIZE: Final = 256
_forms: OrderedDict[int, tuple[ToolIndex, dict[str, StrictForm]]] = OrderedDict()
_forms_lock = threading.Lock()


def strict_forms(index: ToolIndex) -> Mapping[str, StrictForm]:
    """The strict form of every tool of `index`, computed once per compiled tool list.

    The mapping is shared: read it, do not change it.
    """
    key = id(index)
    with _forms_lock:
        entry = _forms.get(key)
        if entry is not None and entry[0] is index:
            _forms.move_to_end(key)
            return entry[1]
    forms = {name: strict_form(index.schema(name)) for name in index.names}
    with _forms_lock:
        # the index is kept in the entry, so its id cannot be reused while the entry lives
        _forms[key] = (index, forms)
        while len(_forms) > _FORMS_SIZE:
            _forms.popitem(last=False)
    return forms


def _named(name: str, why: str, index: ToolIndex) -> ReaskPlan:
    form = strict_forms(index)[name]
    choice = {"type": "function", "function": {"name": name}}
    if form.convertible:
        return ReaskPlan(choice, why, {name: form}, single_call=True)
    return ReaskPlan(choice, why, {}, {name: form.reason or ""}, single_call=True)


def _named_choice(tool_choice: object) -> str | None:
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        return name if isinstance(name, str) else None
    return None


def _intended_tools(
    message: Mapping[str, Any], violations: Sequence[Violation], index: ToolIndex
) -> list[str | None]:
    """The tool each call of the message meant (None where unclear), message-level intents after.

    A call cut off at the token limit after calls made whole is left out: the answer had no room
    for it, and a re-ask that allows several calls runs into the same limit (a small model
    writes call after call until it is cut off; seen on the CPU vLLM).
    """
    calls = _calls_of(dict(message))
    per_call = {v.call_index: v for v in violations if v.call_index is not None}
    intents: list[str | None] = []
    cut_off: list[str | None] = []
    for position, call in enumerate(calls):
        name = _name_of(call)
        violation = per_call.get(position)
        if violation is None:
            intents.append(name if index.has(name) else None)
        elif violation.channel is Channel.UNKNOWN_TOOL:
            intents.append(closest_tool_name(name, index.names) if name else None)
        elif violation.channel is Channel.TRUNCATED:
            cut_off.append(name if index.has(name) else None)
        elif violation.channel in _CALL_CHANNELS_WITH_A_TOOL:
            intents.append(name if index.has(name) else None)
        else:
            intents.append(None)
    written: list[Violation] = []
    for violation in violations:
        if violation.call_index is not None and 0 <= violation.call_index < len(calls):
            continue
        if violation.channel is Channel.TRUNCATED:  # a call written as text, cut off
            cut_off.append(_declared_or_close(violation.tool_name, index))
        elif violation.format is not None:  # a call written as text, whole
            written.append(violation)
        else:  # a required call not made, an empty answer
            unclear = violation.channel is Channel.EMPTY_RESPONSE
            intents.append(None if unclear else _declared_or_close(violation.tool_name, index))
    intents += _written_intents(message, written, index)
    return intents if intents else cut_off


def _written_intents(
    message: Mapping[str, Any], written: Sequence[Violation], index: ToolIndex
) -> list[str | None]:
    """The tools the calls written whole as text (`written`) meant, a call written again counted
    once.

    A small model that writes its call as text often writes it again and again (until the token
    limit cuts it off; seen on the CPU vLLM): one call, not several. Calls to one tool with
    different arguments are different calls; a call whose name cannot be read counts on its own.
    """
    arguments: dict[str, set[str]] = {}
    for leak, _ in written_calls(message):
        if leak.complete and leak.arguments is not None:
            text = json.dumps(leak.arguments, sort_keys=True, ensure_ascii=False)
            arguments.setdefault(leak.name, set()).add(text)
    intents: list[str | None] = []
    seen: set[str] = set()
    for violation in written:
        name = violation.tool_name
        if not name:
            intents.append(None)
        elif name not in seen:
            seen.add(name)
            tool = _declared_or_close(name, index)
            intents += [tool] * max(1, len(arguments.get(name, ())))
    return intents


def _declared_or_close(name: str | None, index: ToolIndex) -> str | None:
    if not name:
        return None
    if index.has(name):
        return name
    return closest_tool_name(name, index.names)


def local_fix(
    message: dict[str, Any], violations: Sequence[Violation], index: ToolIndex
) -> tuple[dict[str, Any], list[Violation]]:
    """Fix what needs no model call: a near-miss tool name, arguments in a fence or with trailing text.

    An unknown name becomes the one declared name `closest_tool_name` finds; malformed arguments
    become the JSON object `recover_arguments` finds. Returns a fixed copy of `message` and the
    violations it fixed (the copy equals the message when the list is empty). The copy must be
    validated again: a renamed call may not match its new tool's schema.
    """
    fixed = copy.deepcopy(message)
    calls = fixed.get("tool_calls")
    done: list[Violation] = []
    if not isinstance(calls, list):
        return fixed, done
    for violation in violations:
        position = violation.call_index
        if (
            position is None
            or not 0 <= position < len(calls)
            or not isinstance(calls[position], dict)
        ):
            continue
        function = calls[position].get("function")
        if not isinstance(function, dict):
            continue
        if violation.channel is Channel.UNKNOWN_TOOL:
            name = function.get("name")
            match = closest_tool_name(name, index.names) if isinstance(name, str) else None
            if match is None:
                continue
            function["name"] = match
            recovered = recover_arguments(function.get("arguments"))
            if recovered is not None:
                function["arguments"] = recovered
            done.append(violation)
        elif violation.channel is Channel.MALFORMED_ARGUMENTS:
            recovered = recover_arguments(function.get("arguments"))
            if recovered is not None:
                function["arguments"] = recovered
                done.append(violation)
    return fixed, done


def closest_tool_name(name: str, names: Sequence[str]) -> str | None:
    """The one declared name within edit distance 2 of `name`, ignoring case; None if none or several.

    The distance may also be at most a third of the name's length, so that short names are not
    guessed (`get` is not a misspelt `set`).
    """
    wanted = name.lower()
    limit = min(2, len(wanted) // 3)
    if limit == 0:
        return None
    found = [
        candidate for candidate in names if edit_distance(wanted, candidate.lower(), limit) <= limit
    ]
    found = [candidate for candidate in found if candidate != name]
    return found[0] if len(found) == 1 else None


def edit_distance(a: str, b: str, limit: int) -> int:
    """Levenshtein distance of `a` and `b`, or `limit + 1` as soon as it must exceed `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b))
            )
        if min(current) > limit:
            return limit + 1
        previous = current
    return previous[-1]


def recover_arguments(arguments: object) -> str | None:
    """The JSON object text inside fenced or trailing-text arguments, or None if there is none.

    Accepts "```json\\n{…}\\n```" and "{…} followed by text"; the object must start the text (after
    the fence) so that nothing the model wrote before it is guessed away.
    """
    if not isinstance(arguments, str):
        return None
    text = arguments.strip()
    if text.startswith("```"):
        first_line_end = text.find("\n")
        text = text[first_line_end + 1 :] if first_line_end != -1 else text[3:]
        closing = text.rfind("```")
        text = (text[:closing] if closing != -1 else text).strip()
    if not text.startswith("{"):
        return None
    try:
        value, end = _DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or text[:end] == arguments:
        return None
    return text[:end]


def _call_text(violation: Violation, name: str, index: ToolIndex) -> str:
    shown = name or "(no name)"
    channel = violation.channel
    if channel is Channel.UNKNOWN_TOOL:
        return _unknown_tool_text(name, index)
    if channel is Channel.MALFORMED_ARGUMENTS:
        return (
            f"Error: {violation.message}. The arguments must be one JSON object"
            f"{_expected(index.schema(name), ' matching this schema: ')}. Call '{shown}' again."
        )
    if channel is Channel.SCHEMA_VIOLATION:
        schema = index.schema(name)
        expected = [
            f"{pointer or '/'} must match {_compact(part)}"
            for pointer in violation.pointers
            if (part := schema_at(schema, pointer)) is not None
        ]
        hint = "; ".join(expected) if expected else _expected(schema, "the parameters are ")
        return f"Error: {violation.message}. Expected: {hint}. Call '{shown}' again with corrected arguments."
    if channel is Channel.TRUNCATED:
        return (
            f"Error: the call to '{shown}' was cut off at the token limit before its arguments were "
            "complete. Call it again with complete arguments, and keep them short."
        )
    if channel is Channel.TOOL_CHOICE_VIOLATION:
        return f"Error: not executed: {violation.message}."
    return f"Error: {violation.message}."


def _unknown_tool_text(name: str, index: ToolIndex) -> str:
    subject = f"tool '{name}' does not exist" if name else "the tool call names no tool"
    if not index.names:
        return f"Error: {subject}. No tools are available; answer without a tool."
    text = (
        f"Error: {subject}. Available tools: {', '.join(index.names)}. "
        "Call one of these, or answer without a tool."
    )
    suggestion = closest_tool_name(name, index.names) if name else None
    return f"{text} Did you mean '{suggestion}'?" if suggestion else text


def _message_text(violation: Violation, index: ToolIndex) -> str:
    available = f" Available tools: {', '.join(index.names)}." if index.names else ""
    name = violation.tool_name
    channel = violation.channel
    if channel is Channel.LEAKED_TOOL_CALL:
        what = f"a call to '{name}'" if name else "a tool call"
        where = "in your reasoning" if violation.in_reasoning else "in the message"
        return (
            f"Your last reply wrote {what} as text {where} instead of making a tool call, so "
            f"it was not executed. Make the call as a tool call, or answer without a tool.{available}"
        )
    if channel is Channel.TRUNCATED:
        return (
            "Your last reply was cut off at the token limit in the middle of a tool call. "
            "Make the call again with complete arguments, and keep them short."
        )
    if channel is Channel.EMPTY_RESPONSE:
        return f"Your last reply was empty. Answer, or call one of the available tools.{available}"
    if channel is Channel.TOOL_CHOICE_VIOLATION:
        if name:
            return f"You must call the tool '{name}' now."
        return f"You must call a tool now: {violation.message}.{available}"
    return f"Your last reply could not be used: {violation.message}."


def schema_at(schema: object, pointer: str) -> object | None:
    """The part of `schema` that describes the instance at JSON `pointer`, or None if unknown.

    Follows `properties` and `items` only (no `$ref`, no combinators), enough to name a field.
    """
    node = schema
    parts = (
        [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]] if pointer else []
    )
    for part in parts:
        if not isinstance(node, dict):
            return None
        properties = node.get("properties")
        if isinstance(properties, dict) and part in properties:
            node = properties[part]
        elif part.isdigit() and isinstance(node.get("items"), dict):
            node = node["items"]
        else:
            return None
    return node


def _expected(schema: object, prefix: str) -> str:
    return f"{prefix}{_compact(schema)}" if schema else ""


def _compact(schema: object) -> str:
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= _SCHEMA_TEXT_LIMIT else text[: _SCHEMA_TEXT_LIMIT - 1] + "…"


def _calls_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [call if isinstance(call, dict) else {} for call in calls]


def _name_of(call: dict[str, Any]) -> str:
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else ""


def _clean_call(call: dict[str, Any]) -> dict[str, Any]:
    """The call as a request accepts it back: id, type, and function name and arguments (a string)."""
    kind = call.get("type") or "function"
    if kind != "function":
        return copy.deepcopy(call)
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = "" if arguments is None else json.dumps(arguments, ensure_ascii=False)
    return {
        "id": call["id"],
        "type": "function",
        "function": {"name": _name_of(call), "arguments": arguments},
    }
