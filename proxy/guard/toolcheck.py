"""Check one assistant message's tool calls against the tools its request declared (DESIGN §4).

`compile_tools` turns a request's `tools` into a `ToolIndex` of compiled argument validators,
cached by content so an agent that resends the same tools every turn compiles them once.
`validate` returns the `Violation`s of one message.

Decisions worth knowing:

- Validator: jsonschema-rs (chosen by `bench/validate.py`), draft taken from the schema's
  `$schema` (2020-12 when absent), `format` not asserted (as the reference `jsonschema` does by
  default), remote `$ref`s never fetched. `pattern`s run on fancy-regex with a backtrack limit:
  plain patterns go to a linear-time engine, and a pattern that needs backtracking gives up
  instead of hanging (ReDoS, DESIGN §9). A pattern that gives up cannot prove the call wrong, so
  it is not reported.
- Empty or whitespace-only `arguments` count as `{}`: OpenAI-compatible clients parse `""` as no
  arguments (vLLM itself sends `"{}"`), so the agent experiences no failure; a schema with required
  fields still reports them missing.
- One violation per call, the most fundamental: a call that `tool_choice` forbids is reported as
  that alone; then unknown tool; then truncated or malformed; then schema.
- Truncated: the response stopped at the token limit (`finish_reason == "length"`) while the last
  call's arguments were unparsable or still blank, or inside a leaked call. Only the last call
  can be cut off; an unparsable earlier call is malformed.
- Message-level channels: calls leaked into content or into the reasoning (`reasoning_content`,
  `reasoning`; in a marked format only, see `proxy.guard.leaks`), not the text of a call the
  server did parse; `tool_choice` requiring a call when none was made and none leaked; an empty response,
  reported alone. Plain chat (no tools, no calls) can only be an empty response.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import jsonschema_rs
import orjson

from proxy.errors import BadRequestError, PayloadTooLargeError
from proxy.guard.channels import Channel, Violation
from proxy.guard.dialect import SchemaDialect, SchemaFallback, Uncompilable, read_leniently
from proxy.guard.leaks import LeakedCall, find_leaked_calls, find_leaked_calls_in_reasoning

# Compiled tool lists kept, by the size of their JSON: a compiled list holds about 18 times its
# JSON (its schemas as Python objects, their validators; measured on 55 KB lists of 20 tools), so
# 8 MB keeps about 150 lists of Claude Code's size in about 150 MB.
CACHE_BYTES: Final = 8 * 1024 * 1024
MAX_REPORTED_ERRORS: Final = 3
# fancy-regex's default is a million backtracking steps; ten thousand keeps a hostile pattern to
# well under a millisecond while every realistic pattern is compiled to the linear-time engine.
REGEX_BACKTRACK_LIMIT: Final = 10_000
REGEX_SIZE_LIMIT: Final = 1 << 20
_MESSAGE_LIMIT: Final = 300
_UNCHECKABLE_KINDS = (
    jsonschema_rs.ValidationErrorKind.BacktrackLimitExceeded,
    jsonschema_rs.ValidationErrorKind.RegexEngineFailure,
)


@dataclass(frozen=True, slots=True)
class GuardLimits:
    """What a request's `tools` may cost (DESIGN §9), and how their schemas are read;
    `compile_tools` rejects anything larger.

    `max_schema_bytes` and `max_schema_depth` apply to each tool's `parameters` (compact JSON size,
    nesting of objects and arrays); `max_tools_bytes` to the whole list (its compact JSON: a
    larger one is refused with 413, never compiled). `schema_dialect`: see `proxy.guard.dialect`.
    """

    max_tools: int = 512
    max_schema_bytes: int = 262_144
    max_schema_depth: int = 64
    max_tools_bytes: int = 1_048_576  # the whole list's compact JSON: compiling it holds the loop
    schema_dialect: SchemaDialect = SchemaDialect.LENIENT


DEFAULT_LIMITS: Final = GuardLimits()


@dataclass(frozen=True, slots=True)
class SchemaError:
    """One reason an arguments object fails its tool's schema; `pointer` is where (RFC 6901)."""

    pointer: str
    message: str


class ToolIndex:
    """The compiled view of one request's `tools`. Immutable and shared through the cache.

    `fallbacks`: the tools whose schema is checked only in part (the lenient dialect), in order.
    """

    __slots__ = ("_schemas", "_validators", "fallbacks", "names")

    def __init__(
        self,
        schemas: Mapping[str, dict[str, Any]],
        validators: Mapping[str, jsonschema_rs.Validator],
        fallbacks: tuple[SchemaFallback, ...] = (),
    ) -> None:
        self.names: tuple[str, ...] = tuple(schemas)
        self._schemas = dict(schemas)
        self._validators = dict(validators)
        self.fallbacks = fallbacks

    def __repr__(self) -> str:
        return f"ToolIndex(names={self.names!r})"

    def has(self, name: object) -> bool:
        """Whether `name` is a declared tool."""
        return isinstance(name, str) and name in self._schemas

    def schema(self, name: str) -> dict[str, Any] | None:
        """The `parameters` of `name` as the guard reads them (`{}` when it declared none: the
        declared schema, in the lenient dialect its standard form, or the part of it checked);
        None if undeclared.

        The dict is shared by every request with the same tools: read it, do not change it.
        """
        return self._schemas.get(name)

    def check(self, name: str, arguments: object) -> list[SchemaError]:
        """The first schema errors of `arguments` for tool `name` (empty when valid or unchecked).

        Returns at most `MAX_REPORTED_ERRORS` errors; an undeclared tool has none.
        """
        validator = self._validators.get(name)
        if validator is None or validator.is_valid(arguments):
            return []
        errors: list[SchemaError] = []
        for error in validator.iter_errors(arguments):
            if isinstance(error.kind, _UNCHECKABLE_KINDS):
                continue
            errors.append(SchemaError(_pointer_of(error), _clip(error.message)))
            if len(errors) == MAX_REPORTED_ERRORS:
                break
        return errors


EMPTY_INDEX: Final = ToolIndex({}, {})


class _IndexCache:
    """A LRU of compiled tool lists bounded by bytes (each entry weighs its tools' JSON), keyed
    by their JSON (or its digest) and the limits."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[bytes, GuardLimits], tuple[ToolIndex, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[bytes, GuardLimits]) -> ToolIndex | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: tuple[bytes, GuardLimits], index: ToolIndex, weight: int) -> None:
        """Keep `index` (its tools' JSON `weight` bytes), dropping the least recently used
        entries down to the budget; one that alone is over the budget is not kept."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            if weight > self.max_bytes:
                return
            self._entries[key] = (index, weight)
            self.bytes += weight
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


_CACHE = _IndexCache(CACHE_BYTES)
# Keyed by the tools' JSON as sent (not canonical), only for lists small enough to keep as a key;
# its entries weigh their key too.
_SEEN = _IndexCache(CACHE_BYTES)
_SEEN_KEY_BYTES: Final = 65_536


def configure_cache(max_bytes: int) -> None:
    """Bound the compiled tool lists kept to `max_bytes` of their JSON (the setting
    `tool_cache_bytes`); entries over the new bound are dropped as the next list comes."""
    _CACHE.max_bytes = _SEEN.max_bytes = max_bytes


def clear_cache() -> None:
    """Forget every compiled tool list (for benchmarks and tests)."""
    _CACHE.clear()
    _SEEN.clear()


def cached_tool_lists() -> int:
    """How many compiled tool lists the cache holds now."""
    return len(_CACHE)


def cached_tool_bytes() -> int:
    """The bytes of JSON the compiled tool lists in the cache weigh now (see `configure_cache`)."""
    return _CACHE.bytes


def compile_tools(tools: object, limits: GuardLimits = DEFAULT_LIMITS) -> ToolIndex:
    """Compile a request's `tools` (OpenAI format) into a `ToolIndex`, once per distinct list.

    Returns `EMPTY_INDEX` for None or an empty list. Tools of a type other than `function` are
    declared names without a schema. Raises `BadRequestError` (`param="tools"`) when `tools` is not
    a list of tool objects, a function has no name, two different tools share a name, `parameters`
    is not a valid JSON Schema (in the strict dialect; the lenient one checks what it can, see
    `ToolIndex.fallbacks`), or a limit of `limits` is exceeded (the message names the limit).
    """
    if tools is None:
        return EMPTY_INDEX
    if not isinstance(tools, list):
        raise _bad(f"'tools' must be a list of tool objects, not {_json_type(tools)}")
    if not tools:
        return EMPTY_INDEX
    if len(tools) > limits.max_tools:
        raise _bad(f"{len(tools)} tools declared; the limit is max_tools={limits.max_tools}")
    # The hit path: an agent resends its tools byte for byte, so their JSON as sent finds the
    # index without sorting keys and hashing a digest (about 6 µs instead of 13 for 17 tools).
    try:
        sent = orjson.dumps(tools)
    except orjson.JSONEncodeError:
        sent = b""
    seen_key = (sent, limits) if 0 < len(sent) <= _SEEN_KEY_BYTES else None
    if seen_key is not None:
        index = _SEEN.get(seen_key)
        if index is not None:
            return index
    canonical = _canonical_json(tools, limits)
    key = (hashlib.sha256(canonical).digest(), limits)
    index = _CACHE.get(key)
    if index is None:
        if len(canonical) > limits.max_tools_bytes:
            _checked(tools, limits)  # a tool's own fault is named first
            raise PayloadTooLargeError(
                f"the tools take {len(canonical)} bytes as JSON; the limit is "
                f"max_tools_bytes={limits.max_tools_bytes}",
                param="tools",
            )
        # Compile from a private copy: the cached index must not alias the caller's request.
        index = _build(copy.deepcopy(tools), limits)
        _CACHE.put(key, index, len(canonical))
    if seen_key is not None:
        _SEEN.put(seen_key, index, len(canonical) + len(sent))
    return index


def validate(
    message: Mapping[str, Any],
    tools: object,
    tool_choice: object = None,
    *,
    finish_reason: str | None = None,
    index: ToolIndex | None = None,
) -> list[Violation]:
    """Check an assistant message from a chat-completion choice against the request's tools.

    `index`, when given, is the compiled `tools` (and `tools` is not read). Returns the violations
    in call order, then the message-level ones; an empty list means nothing to report. Raises
    `BadRequestError` when `tools` itself is invalid (see `compile_tools`).
    """
    if index is None:
        index = compile_tools(tools)
    raw_calls = message.get("tool_calls")
    calls: list[object] = raw_calls if isinstance(raw_calls, list) else []
    leaks = written_calls(message, calls) if index.names else []
    # An answer left empty because the call went into the reasoning is that leak, not silence.
    if not calls and _is_blank(message) and not leaks:
        return [
            Violation(Channel.EMPTY_RESPONSE, "the response has neither content nor tool calls")
        ]
    rule = _ChoiceRule.parse(tool_choice) if index.names and tool_choice is not None else _ANY_CALL
    violations: list[Violation] = []
    for position, call in enumerate(calls):
        last = position == len(calls) - 1
        found = _check_call(position, call, index, rule, cut_off=last and finish_reason == "length")
        if found is not None:
            violations.append(found)
    leaked = 0
    for leak, in_reasoning in leaks:
        leaked += 1
        where = "the reasoning" if in_reasoning else "the content"
        call = f"a tool call to '{_clip(leak.name)}'" if leak.name else "an unreadable tool call"
        if not leak.complete and finish_reason == "length":
            channel = Channel.TRUNCATED
            text = f"{call} written as {leak.format} text in {where} was cut off at the token limit"
        else:
            channel = Channel.LEAKED_TOOL_CALL
            text = f"{call} was written into {where} as {leak.format} text instead of a tool call"
        found = Violation(
            channel, text, leak.name or None, format=leak.format, in_reasoning=in_reasoning
        )
        violations.append(found)
    if rule.mode == "required" and not calls and not leaked:
        violations.append(
            Violation(Channel.TOOL_CHOICE_VIOLATION, rule.describe_missing(), rule.only)
        )
    return violations


@dataclass(frozen=True, slots=True)
class _ChoiceRule:
    """What `tool_choice` allows: mode auto/none/required, and the allowed names (None = any)."""

    mode: str
    allowed: frozenset[str] | None

    @property
    def only(self) -> str | None:
        return next(iter(self.allowed)) if self.allowed and len(self.allowed) == 1 else None

    @classmethod
    def parse(cls, tool_choice: object) -> _ChoiceRule:
        if tool_choice is None or tool_choice == "auto":
            return _ANY_CALL
        if tool_choice in ("none", "required"):
            return cls(str(tool_choice), None)
        if isinstance(tool_choice, dict):
            if tool_choice.get("type") == "function":
                function = tool_choice.get("function")
                name = function.get("name") if isinstance(function, dict) else None
                if isinstance(name, str):
                    return cls("required", frozenset((name,)))
            if tool_choice.get("type") == "allowed_tools":
                spec = tool_choice.get("allowed_tools")
                if isinstance(spec, dict):
                    mode = "required" if spec.get("mode") == "required" else "auto"
                    return cls(mode, frozenset(_allowed_names(spec.get("tools"))))
        # A form this proxy does not know: nothing to enforce.
        return _ANY_CALL

    def forbids(self, name: object) -> str | None:
        """Why this call is not allowed, or None."""
        if self.mode == "none":
            return f"tool_choice is 'none' but the model called '{_clip(name)}'"
        if self.allowed is not None and name not in self.allowed:
            allowed = ", ".join(sorted(self.allowed)) or "no tool"
            return f"tool_choice allows only {allowed} but the model called '{_clip(name)}'"
        return None

    def describe_missing(self) -> str:
        if self.allowed is None:
            return "tool_choice is 'required' but the model made no tool call"
        return f"tool_choice requires a call to {', '.join(sorted(self.allowed))} but the model made no tool call"


_ANY_CALL: Final = _ChoiceRule("auto", None)
"""`tool_choice` `auto` or absent (every request without one): made once."""


def _allowed_names(tools: object) -> list[str]:
    names = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            names.append(name)
    return names


REASONING_FIELDS: Final = ("reasoning_content", "reasoning")
"""Where a chat message carries its reasoning: vLLM's older and newer field names."""


def written_calls(
    message: Mapping[str, Any], calls: Sequence[object] | None = None
) -> list[tuple[LeakedCall, bool]]:
    """The calls written as text in the message's content, then in its reasoning (True): the
    leaks `validate` reports. A text that echoes one of the parsed `calls` (default: the
    message's `tool_calls`) is left out: the server parsed that call and left its text behind."""
    if calls is None:
        raw = message.get("tool_calls")
        calls = raw if isinstance(raw, list) else []
    content = message.get("content")
    # Most answers leak nothing: no list is built for them (a comprehension is a call).
    leaks = find_leaked_calls(content) if isinstance(content, str) else None
    found = [(leak, False) for leak in leaks] if leaks else []
    for key in REASONING_FIELDS:
        reasoning = message.get(key)
        if isinstance(reasoning, str) and (leaks := find_leaked_calls_in_reasoning(reasoning)):
            found += [(leak, True) for leak in leaks]
    if not found:
        return found
    return [(leak, where) for leak, where in found if not _echoes_a_parsed_call(leak, calls)]


def _echoes_a_parsed_call(leak: LeakedCall, calls: Sequence[object]) -> bool:
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or function.get("name") != leak.name:
            continue
        if (
            leak.arguments is None
            or parse_arguments(function.get("arguments"))[0] == leak.arguments
        ):
            return True
    return False


def _check_call(
    position: int, call: object, index: ToolIndex, rule: _ChoiceRule, *, cut_off: bool
) -> Violation | None:
    # Most calls are valid: what only a failure needs (the call's id, its name clipped for the
    # text) is worked out in the failure's branch.
    if not isinstance(call, dict):
        return Violation(
            Channel.MALFORMED_ARGUMENTS, "the tool call is not an object", None, position
        )
    if (call.get("type") or "function") != "function":
        return None  # custom and other tool types carry no JSON arguments to check
    function = call.get("function")
    if not isinstance(function, dict):
        function = {}
    name = function.get("name")
    if rule is not _ANY_CALL and (forbidden := rule.forbids(name)) is not None:
        return _call_violation(call, position, name, Channel.TOOL_CHOICE_VIOLATION, forbidden)
    if not name or not isinstance(name, str):
        text = "the tool call names no function"
        return _call_violation(call, position, name, Channel.UNKNOWN_TOOL, text)
    if not index.has(name):
        text = f"tool '{_clip(name, 100)}' is not declared in the request's tools"
        return _call_violation(call, position, name, Channel.UNKNOWN_TOOL, text)
    arguments = function.get("arguments")
    parsed, problem = parse_arguments(arguments)
    if cut_off and (
        parsed is _UNPARSABLE or (isinstance(arguments, str) and not arguments.strip())
    ):
        # The response stopped at the token limit inside this call: whatever its arguments look
        # like, they are not what the model meant to send.
        text = f"the arguments of '{_clip(name, 100)}' were cut off at the token limit"
        return _call_violation(call, position, name, Channel.TRUNCATED, text)
    if problem is not None:
        text = f"the arguments of '{_clip(name, 100)}' {problem}"
        return _call_violation(call, position, name, Channel.MALFORMED_ARGUMENTS, text)
    errors = index.check(name, parsed)
    if not errors:
        return None
    detail = "; ".join(f"{e.pointer or '/'}: {e.message}" for e in errors)
    text = f"the arguments of '{_clip(name, 100)}' do not match its parameters: {detail}"
    pointers = tuple(e.pointer for e in errors)
    return _call_violation(call, position, name, Channel.SCHEMA_VIOLATION, text, pointers)


def _call_violation(
    call: dict[str, Any],
    position: int,
    name: object,
    channel: Channel,
    text: str,
    pointers: tuple[str, ...] = (),
) -> Violation:
    """A failure of the call at `position` named `name`, with the call's id when it has one."""
    call_id = call.get("id")
    return Violation(
        channel,
        text,
        name if isinstance(name, str) else None,
        position,
        call_id if isinstance(call_id, str) and call_id else None,
        pointers,
    )


_UNPARSABLE: Final = object()


def parse_arguments(arguments: object) -> tuple[object, str | None]:
    """Parse a tool call's `arguments` string the way an OpenAI-compatible client would.

    Returns `(object, None)` for a JSON object (`{}` for an empty or blank string), else
    `(value, reason)`: the parsed non-object value, or an unparsable marker, with a short reason
    that completes "the arguments of 'X' …".
    """
    if not isinstance(arguments, str):
        kind = "missing" if arguments is None else f"a JSON {_json_type(arguments)}"
        return _UNPARSABLE, f"must be a string holding a JSON object, got {kind}"
    if not arguments.strip():
        return {}, None
    try:
        # orjson is strict RFC 8259: no NaN, no Infinity, no lone surrogates (which the schema
        # validator could not take either).
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError as exc:
        return _UNPARSABLE, f"are not valid JSON ({_clip(str(exc), 120)})"
    if not isinstance(value, dict):
        return value, f"are a JSON {_json_type(value)}, not a JSON object"
    return value, None


def _is_blank(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    if isinstance(content, list):  # content parts
        content = "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    refusal = message.get("refusal")
    has_text = isinstance(content, str) and content.strip()
    return not has_text and not (isinstance(refusal, str) and refusal.strip())


def _build(tools: list[object], limits: GuardLimits) -> ToolIndex:
    schemas, pending = _checked(tools, limits)
    validators: dict[str, jsonschema_rs.Validator] = {}
    fallbacks: list[SchemaFallback] = []
    for position, name, parameters in pending:
        if limits.schema_dialect is SchemaDialect.LENIENT:
            schemas[name], validators[name], fallback = read_leniently(name, parameters, _validator)
            fallbacks.extend(() if fallback is None else (fallback,))
            continue
        try:
            validators[name] = _validator(parameters)
        except Uncompilable as exc:
            raise _bad(
                f"tools[{position}] ('{name}'): parameters is not a valid JSON Schema: {_clip(exc.message, 200)}"
            ) from None
    return ToolIndex(schemas, validators, tuple(fallbacks))


def _checked(
    tools: list[object], limits: GuardLimits
) -> tuple[dict[str, dict[str, Any]], list[tuple[int, str, dict[str, Any]]]]:
    """Each tool checked (BadRequestError for the first at fault): the declared schemas by name,
    and the position, name and schema of each one to compile."""
    schemas: dict[str, dict[str, Any]] = {}
    declared: dict[str, object] = {}
    pending: list[tuple[int, str, dict[str, Any]]] = []  # compiled once all are checked
    for position, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _bad(f"tools[{position}] must be a tool object, not {_json_type(tool)}")
        kind = tool.get("type", "function")
        if kind != "function":
            spec = tool.get(kind) if isinstance(kind, str) else None
            name = spec.get("name") if isinstance(spec, dict) else None
            if isinstance(name, str) and name and name not in schemas:
                schemas[name], declared[name] = {}, tool
            continue
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _bad(f"tools[{position}].function must be an object with a name")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _bad(f"tools[{position}].function.name must be a non-empty string")
        if name in declared:
            if declared[name] == tool:
                continue  # the same tool listed twice changes nothing
            raise _bad(f"tools[{position}]: two different tools are named '{name}'")
        declared[name] = tool
        parameters = function.get("parameters")
        if parameters is None:
            schemas[name] = {}
            continue
        if not isinstance(parameters, dict):
            raise _bad(f"tools[{position}] ('{name}'): parameters must be a JSON Schema object")
        _check_size(position, name, parameters, limits)
        schemas[name] = parameters
        pending.append((position, name, parameters))
    return schemas, pending


def _validator(schema: dict[str, Any]) -> jsonschema_rs.Validator:
    """`schema` compiled. Raises `Uncompilable` with the validator's first line of why not."""
    try:
        return jsonschema_rs.validator_for(
            schema,
            pattern_options=jsonschema_rs.FancyRegexOptions(
                backtrack_limit=REGEX_BACKTRACK_LIMIT, size_limit=REGEX_SIZE_LIMIT
            ),
            validate_formats=False,
            offline=True,
        )
    except (ValueError, jsonschema_rs.ReferencingError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        unresolved = isinstance(exc, jsonschema_rs.ReferencingError) or isinstance(
            getattr(exc, "kind", None), jsonschema_rs.ValidationErrorKind.Referencing
        )
        raise Uncompilable(reason, unresolved_ref=unresolved) from None


def _check_size(position: int, name: str, schema: dict[str, Any], limits: GuardLimits) -> None:
    depth = _depth(schema, limits.max_schema_depth)
    if depth > limits.max_schema_depth:
        raise _bad(
            f"tools[{position}] ('{name}'): parameters nest deeper than max_schema_depth={limits.max_schema_depth}"
        )
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limits.max_schema_bytes:
        raise _bad(
            f"tools[{position}] ('{name}'): parameters take {size} bytes; the limit is max_schema_bytes={limits.max_schema_bytes}"
        )


def _depth(value: object, stop_after: int) -> int:
    """Nesting depth of objects and arrays (a scalar is 0); stops counting past `stop_after`."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        )
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > stop_after:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def _canonical_json(tools: list[Any], limits: GuardLimits) -> bytes:
    try:
        return orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        pass
    # orjson stops at 255 levels and 64-bit integers; find out whether that is a limit breach.
    for position, tool in enumerate(tools):
        if _depth(tool, limits.max_schema_depth + 3) > limits.max_schema_depth + 3:
            raise _bad(
                f"tools[{position}] nests deeper than max_schema_depth={limits.max_schema_depth}"
            )
    try:
        text = json.dumps(
            tools, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise _bad(f"'tools' is not JSON: {_clip(str(exc), 120)}") from None
    return text.encode()


def _pointer_of(error: jsonschema_rs.ValidationError) -> str:
    path: list[str | int] = list(error.instance_path)
    kind = error.kind
    # Point at the missing or unexpected key itself: that is the field the model has to fix.
    if isinstance(kind, jsonschema_rs.ValidationErrorKind.Required):
        path.append(str(kind.property))
    elif (
        isinstance(kind, jsonschema_rs.ValidationErrorKind.AdditionalProperties) and kind.unexpected
    ):
        path.append(str(kind.unexpected[0]))
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _clip(text: object, limit: int = _MESSAGE_LIMIT) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bad(message: str) -> BadRequestError:
    return BadRequestError(message, param="tools")
