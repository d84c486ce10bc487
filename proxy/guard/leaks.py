"""Find tool calls a model wrote into `content` that the server did not parse into `tool_calls`.

Recognised formats (the `format` of a `LeakedCall`):

- `hermes`: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes, Qwen 2.5)
- `qwen_xml`: `<function=name><parameter=k>v</parameter></function>`, bare or inside
  `<tool_call>` (Qwen3-Coder)
- `llama3`: `<|python_tag|>{"name": …, "parameters": {…}}` (several joined by `;`), or a built-in
  `<|python_tag|>tool.call(…)`
- `mistral`: `[TOOL_CALLS][{…}, …]` and `[TOOL_CALLS]name[ARGS]{…}`
- `json`: the whole content is a call object `{"name": …, "arguments"|"parameters": …}` or a list
  of them, possibly in a ```json fence (Llama 3 JSON, many fine-tunes)

Prose that mentions JSON or a tag is not a call: a tag must be followed by a call body, and a bare
object must be the whole content and hold nothing but call keys. Each finder runs only when a cheap
substring test says its marker is present.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final

_DECODER: Final = json.JSONDecoder()
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_FENCE_OPEN = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n?")
_PARTIAL_CALL = re.compile(r'\A\[?\s*\{\s*"name"\s*:\s*"')
_ARGUMENTS_KEY = re.compile(r'"(?:arguments|parameters)"\s*:')
_FUNCTION = re.compile(r"<function=([\w.\-]+)>(.*?)(</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(
    r"<parameter=([^>\n]*)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|(?=</function>)|\Z)",
    re.DOTALL,
)
_PYTHON_CALL = re.compile(r"\A([A-Za-z_][\w.]*)\.call\((.*)\)\s*\Z", re.DOTALL)
_MISTRAL_NAMED = re.compile(r"\A\s*([\w.\-]+)(?:\[CALL_ID\][^\[]*)?(\[ARGS\])?", re.DOTALL)
_JSON_STARTS: Final = frozenset('{["-0123456789tfn')
_CALL_KEYS: Final = frozenset({"name", "arguments", "parameters", "type", "id"})

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"


@dataclass(frozen=True, slots=True)
class LeakedCall:
    """A tool call found in content: its name ("" if unreadable), parsed arguments (None if
    unreadable), the text it was found in, its format, and whether it ended (False: cut off)."""

    name: str
    arguments: object | None
    raw: str
    format: str
    complete: bool


def find_leaked_calls(content: str | None) -> list[LeakedCall]:
    """Every tool call written into `content`, in order of appearance within each format.

    Returns an empty list for None, prose, or content without a recognisable call.
    """
    if not content:
        return []
    found: list[LeakedCall] = []
    rest = content
    if HERMES_OPEN in content:
        hermes, rest = _hermes(content)
        found += hermes
    if "<function=" in rest:
        found += _qwen_xml(rest)
    if PYTHON_TAG in content:
        found += _llama3(content)
    if MISTRAL_TAG in content:
        found += _mistral(content)
    if not found:
        stripped = content.strip()
        if stripped[:1] in ("{", "[", "`"):
            found += _bare_json(stripped)
    return found


def _hermes(content: str) -> tuple[list[LeakedCall], str]:
    """Calls inside `<tool_call>` tags, and the content with those blocks cut out."""
    calls: list[LeakedCall] = []
    outside: list[str] = []
    position = 0
    while (start := content.find(HERMES_OPEN, position)) != -1:
        outside.append(content[position:start])
        body_start = start + len(HERMES_OPEN)
        end = content.find(HERMES_CLOSE, body_start)
        closed = end != -1
        body_end = end if closed else len(content)
        position = body_end + len(HERMES_CLOSE) if closed else len(content)
        raw = content[start:position]
        body = content[body_start:body_end].strip()
        if body.startswith("<function="):
            calls += _qwen_xml(body, raw=raw, enclosed=closed)
        elif body.startswith("{"):
            calls += _json_calls(body, "hermes", raw, closed=closed)
        elif not closed and not body:
            calls.append(LeakedCall("", None, raw, "hermes", complete=False))
        else:
            outside.append(raw)  # a tag named in prose, not a call
    outside.append(content[position:])
    return calls, "".join(outside)


def _qwen_xml(text: str, *, raw: str | None = None, enclosed: bool = True) -> list[LeakedCall]:
    calls = []
    for match in _FUNCTION.finditer(text):
        body = match.group(2).strip()
        if body and not body.startswith("<parameter="):
            continue  # `<function=f>` named in prose
        name = match.group(1)
        arguments = {
            key.strip(): _scalar(value) for key, value in _PARAMETER.findall(match.group(2))
        }
        complete = bool(match.group(3)) and enclosed
        calls.append(LeakedCall(name, arguments, raw or match.group(0), "qwen_xml", complete))
    return calls


def _scalar(value: str) -> object:
    """A parameter's value: JSON when it reads as JSON (numbers, objects, …), else the text."""
    if not value or value[0] not in _JSON_STARTS:
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


def _llama3(content: str) -> list[LeakedCall]:
    raw = content[content.find(PYTHON_TAG) :]
    body = raw[len(PYTHON_TAG) :].strip()
    python_call = _PYTHON_CALL.match(body)
    if python_call:
        return [LeakedCall(python_call.group(1), None, raw, "llama3", complete=True)]
    if body.startswith("{"):
        return _json_calls(body, "llama3", raw, closed=None)
    return [LeakedCall("", None, raw, "llama3", complete=False)] if not body else []


def _mistral(content: str) -> list[LeakedCall]:
    calls: list[LeakedCall] = []
    segments = content.split(MISTRAL_TAG)[1:]
    for number, segment in enumerate(segments, start=1):
        raw = MISTRAL_TAG + segment
        body = segment.strip()
        if not body:
            calls.append(LeakedCall("", None, raw, "mistral", complete=False))
            continue
        if body.startswith(("[", "{")):
            calls += _json_calls(body, "mistral", raw, closed=None)
            continue
        named = _MISTRAL_NAMED.match(body)
        if named is None:
            continue
        if named.group(2) is None:
            # Only a bare name that ends the content is a call cut off before its arguments;
            # anything else after the tag is prose about it.
            if named.end() == len(body) and number == len(segments):
                calls.append(LeakedCall(named.group(1), None, raw, "mistral", complete=False))
            continue
        arguments, complete = _decode_prefix(body[named.end() :].lstrip())
        calls.append(LeakedCall(named.group(1), arguments, raw, "mistral", complete))
    return calls


def _bare_json(stripped: str) -> list[LeakedCall]:
    body = stripped
    complete = True
    if body.startswith("`"):
        fence = _FENCE_OPEN.match(body)
        if fence is None:
            return []
        body = body[fence.end() :]
        close = body.find("```")
        if close == -1:
            complete = False  # the fence never closed: cut off
        elif body[close + 3 :].strip():
            return []  # prose after the fence: the JSON is an example, not the answer
        else:
            body = body[:close]
        body = body.strip()
    if not body.startswith(("{", "[")):
        return []
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        if _PARTIAL_CALL.match(body) and _ARGUMENTS_KEY.search(body):
            return [LeakedCall(_name_in(body), None, stripped, "json", complete=False)]
        return []
    items = value if isinstance(value, list) else [value]
    if not items or not all(_is_call_object(item, strict=True) for item in items):
        return []
    return [_from_object(item, stripped, "json", complete) for item in items]


def _json_calls(body: str, fmt: str, raw: str, *, closed: bool | None) -> list[LeakedCall]:
    """Calls from one JSON value, or several joined by `;` or whitespace, at the start of `body`.

    `closed` says whether the format's end marker was seen (None: the format has none, so a call
    is complete when its JSON is).
    """
    calls: list[LeakedCall] = []
    rest = body
    while rest.startswith(("{", "[")):
        try:
            value, end = _DECODER.raw_decode(rest)
        except (ValueError, RecursionError):
            calls.append(LeakedCall(_name_in(rest), None, raw, fmt, complete=bool(closed)))
            break
        items = value if isinstance(value, list) else [value]
        complete = closed is not False
        calls += [
            _from_object(i, raw, fmt, complete) for i in items if _is_call_object(i, strict=False)
        ]
        rest = rest[end:].lstrip().lstrip(";").lstrip()
    return calls


def _decode_prefix(text: str) -> tuple[object | None, bool]:
    """The JSON value at the start of `text` and True, or (None, False) when it does not parse."""
    try:
        value, _ = _DECODER.raw_decode(text)
    except (ValueError, RecursionError):
        return None, False
    return value, True


def _is_call_object(value: object, *, strict: bool) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return False
    if strict:
        # A whole-content object must hold nothing but call keys, or a JSON answer that happens
        # to have a "name" and "parameters" would count as a call.
        arguments = value.get("arguments", value.get("parameters"))
        return isinstance(arguments, dict | str) and value.keys() <= _CALL_KEYS
    return True


def _from_object(value: object, raw: str, fmt: str, complete: bool) -> LeakedCall:
    assert isinstance(value, dict)
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):
        parsed, ok = _decode_prefix(arguments)
        arguments = parsed if ok else arguments
    return LeakedCall(value["name"], arguments, raw, fmt, complete)


def _name_in(text: str) -> str:
    match = _NAME.search(text)
    return _unescape(match.group(1)) if match else ""


def _unescape(text: str) -> str:
    try:
        value = json.loads(f'"{text}"')
    except ValueError:
        return text
    return value if isinstance(value, str) else text
