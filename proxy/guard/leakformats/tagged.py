"""Formats whose calls sit between marker tokens with a JSON body, or a name, a separator and
JSON arguments (hermes, granite, jamba, kimi_k2, deepseek, harmony, mistral, …).

Each `find_*` takes the scanned text and returns its calls in order; `tagged_json` builds the
finder of a format that is one pair of tags around a JSON call object or list.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from proxy.guard.leakformats.reading import (
    ARGUMENT_KEYS,
    Block,
    LeakedCall,
    Parsed,
    blocks,
    decode_exact,
    decode_prefix,
    identifier,
    json_calls,
    scalar,
)

Finder = Callable[[str], list[LeakedCall]]


def either(*finders: Finder) -> Finder:
    """One finder for a format written in several ways: the calls of each, in turn."""

    def find(text: str) -> list[LeakedCall]:
        return [call for finder in finders for call in finder(text)]

    return find


def place(fmt: str, text: str, block: Block, calls: list[Parsed]) -> list[LeakedCall]:
    """The calls read from `block`, as LeakedCalls of format `fmt` located in `text`."""
    raw = text[block.start : block.end]
    if not block.closed and block.end != len(text):
        # Truncation cuts a call at the end of the text; a nameless fragment followed by more of
        # the text is a marker named in prose.
        calls = [c for c in calls if c.name or c.arguments is not None]
    return [LeakedCall(c.name, c.arguments, raw, fmt, c.complete, block.start) for c in calls]


def cut_off_marker(fmt: str, text: str, block: Block) -> list[LeakedCall]:
    """A marker with nothing after it that ends the text: the model began a call and stopped,
    so the agent got neither a call nor an answer."""
    if block.closed or block.body.strip() or block.end != len(text):
        return []
    return place(fmt, text, block, [Parsed("", None, complete=False)])


def tagged_json(
    fmt: str,
    open_tag: str,
    close_tag: str | None,
    *,
    name_keys: tuple[str, ...] = ("name",),
    argument_keys: tuple[str, ...] = ARGUMENT_KEYS,
    body_starts: tuple[str, ...] = ("{", "["),
) -> Finder:
    """The finder of a format that writes `open_tag` JSON-call(s) `close_tag` (no close: the
    JSON's end ends the call)."""

    def find(text: str) -> list[LeakedCall]:
        found: list[LeakedCall] = []
        for block in blocks(text, open_tag, close_tag):
            if not block.body.lstrip().startswith(body_starts):
                found += cut_off_marker(fmt, text, block)
                continue
            closed = block.closed if close_tag else None
            calls = json_calls(
                block.body, closed=closed, name_keys=name_keys, argument_keys=argument_keys
            )
            found += place(fmt, text, block, calls or [])
        return found

    return find


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


def find_hermes(text: str) -> list[LeakedCall]:
    """`<tool_call>{"name": …, "arguments": {…}}</tool_call>`; a bare `[…]` left open is
    granite's, a non-JSON body another format's (or prose)."""
    found: list[LeakedCall] = []
    for block in blocks(text, HERMES_OPEN, HERMES_CLOSE):
        body = block.body.lstrip()
        if body.startswith("{") or (body.startswith("[") and block.closed):
            found += place("hermes", text, block, json_calls(body, closed=block.closed) or [])
        elif not body.startswith("["):
            found += cut_off_marker("hermes", text, block)
    return found


def find_granite(text: str) -> list[LeakedCall]:
    """`<|tool_call|>[{…}, …]` (Granite 3.0) and `<tool_call>[{…}, …]` with no closing tag
    (Granite 3.1): the array's end ends the calls."""
    found: list[LeakedCall] = []
    for block in blocks(text, "<|tool_call|>", None):
        body = block.body.lstrip()
        if body.startswith(("[", "{")):
            found += place("granite", text, block, json_calls(body, closed=None) or [])
        else:
            found += cut_off_marker("granite", text, block)
    for block in blocks(text, HERMES_OPEN, HERMES_CLOSE):
        if not block.closed and block.body.lstrip().startswith("["):
            found += place("granite", text, block, json_calls(block.body, closed=None) or [])
    return found


_APERTUS_START: Final = re.compile(r"\[\s*(?:\{|\Z)")


def find_apertus(text: str) -> list[LeakedCall]:
    """`<|tools_prefix|>[{"get_weather": {"city": "Paris"}}, …]<|tools_suffix|>`: each object's
    one key is the name, its value the arguments."""
    found: list[LeakedCall] = []
    for block in blocks(text, "<|tools_prefix|>", "<|tools_suffix|>"):
        body = block.body.strip()
        if not body.startswith("["):
            found += cut_off_marker("apertus", text, block)
            continue
        value, ok = decode_exact(body)
        if not ok and not _APERTUS_START.match(body):
            continue  # `[` then words: the marker named in prose, not a list of calls
        if not ok or not isinstance(value, list):
            name = re.match(r'\[\s*\{\s*"((?:[^"\\]|\\.)*)"', body)
            calls = [Parsed(name.group(1) if name else "", None, complete=False)]
        else:
            calls = [
                Parsed(key, arguments, complete=block.closed)
                for item in value
                if isinstance(item, dict) and len(item) == 1
                for key, arguments in item.items()
            ]
        found += place("apertus", text, block, calls)
    return found


_LLAMA_BUILTIN: Final = re.compile(r"\A([A-Za-z_][\w.]*)\.call\((.*)\)\s*\Z", re.DOTALL)
PYTHON_TAG: Final = "<|python_tag|>"


def find_llama3(text: str) -> list[LeakedCall]:
    """`<|python_tag|>{"name": …, "parameters": {…}}` (several joined by `;`), or a built-in
    `<|python_tag|>brave_search.call(query="…")`."""
    found: list[LeakedCall] = []
    for block in blocks(text, PYTHON_TAG, None):
        body = block.body.strip()
        builtin = _LLAMA_BUILTIN.match(body)
        if builtin:
            found += place("llama3", text, block, [Parsed(builtin.group(1), None, True)])
        elif body.startswith("{"):
            found += place("llama3", text, block, json_calls(body, closed=None) or [])
        else:
            found += cut_off_marker("llama3", text, block)
    return found


MISTRAL_TAG: Final = "[TOOL_CALLS]"
_MISTRAL_NAMED: Final = re.compile(r"\A\s*([\w.\-]+)(?:\[CALL_ID\][^\[{]*)?(\[ARGS\]|(?=\s*\{))?")


def find_mistral(text: str) -> list[LeakedCall]:
    """`[TOOL_CALLS][{…}, …]` (before v11), `[TOOL_CALLS]name[ARGS]{…}` and
    `[TOOL_CALLS]name{…}` (v11 on), one tag per call."""
    found: list[LeakedCall] = []
    all_blocks = list(blocks(text, MISTRAL_TAG, None))
    for number, block in enumerate(all_blocks, start=1):
        body = block.body.strip()
        if not body:
            found += cut_off_marker("mistral", text, block)
            continue
        if body.startswith(("[", "{")):
            found += place("mistral", text, block, json_calls(body, closed=None) or [])
            continue
        named = _MISTRAL_NAMED.match(body)
        if named is None:
            continue
        if named.group(2) is None:
            # Only a bare name that ends the text is a call cut off before its arguments;
            # anything else after the tag is prose about it.
            glued = re.match(r"[A-Za-z_]", block.body) is not None
            if glued and named.end() == len(body) and number == len(all_blocks):
                found += place("mistral", text, block, [Parsed(named.group(1), None, False)])
            continue
        arguments, complete = decode_prefix(body[named.end() :])
        found += place("mistral", text, block, [Parsed(named.group(1), arguments, complete)])
    return found


_DS_CALL_OPEN, _DS_CALL_CLOSE, _DS_SEP = (
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)
_DS_V3_ARGS: Final = re.compile(r"\A\s*([\w.\-]+)\s*\n```(?:json)?\n(.*?)(?:\n```|\Z)", re.DOTALL)


def find_deepseek_v3(text: str) -> list[LeakedCall]:
    """`<｜tool▁call▁begin｜>function<｜tool▁sep｜>name` + a ```json fence of arguments +
    `<｜tool▁call▁end｜>` (DeepSeek V3, R1)."""
    found: list[LeakedCall] = []
    for block in blocks(text, _DS_CALL_OPEN, _DS_CALL_CLOSE):
        kind, sep, rest = block.body.partition(_DS_SEP)
        if not sep or kind.strip() != "function":
            found += cut_off_marker("deepseek_v3", text, block)
            continue
        match = _DS_V3_ARGS.match(rest)
        if match is None:
            name = identifier(rest.split("\n", 1)[0]) or ""
            found += place("deepseek_v3", text, block, [Parsed(name, None, False)])
            continue
        arguments, ok = decode_exact(match.group(2))
        complete = ok and block.closed
        parsed = Parsed(match.group(1), arguments if ok else None, complete)
        found += place("deepseek_v3", text, block, [parsed])
    return found


def find_deepseek_v31(text: str) -> list[LeakedCall]:
    """`<｜tool▁call▁begin｜>name<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>` (DeepSeek V3.1)."""
    found: list[LeakedCall] = []
    for block in blocks(text, _DS_CALL_OPEN, _DS_CALL_CLOSE):
        name, sep, rest = block.body.partition(_DS_SEP)
        name_read = identifier(name)
        if not sep or name_read is None or (name_read == "function" and "```" in rest):
            if not sep:
                found += cut_off_marker("deepseek_v31", text, block)
            continue
        arguments, ok = decode_exact(rest) if block.closed else decode_prefix(rest)
        parsed = Parsed(name_read, arguments if ok else None, ok and block.closed)
        found += place("deepseek_v31", text, block, [parsed])
    return found


_KIMI_ARGS = "<|tool_call_argument_begin|>"
_KIMI_NAME: Final = re.compile(r"\A\s*(?:functions\.)?([\w.\-]+?)(?::\d+)?\s*\Z")


def find_kimi_k2(text: str) -> list[LeakedCall]:
    """`<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>{…}<|tool_call_end|>`."""
    found: list[LeakedCall] = []
    for block in blocks(text, "<|tool_call_begin|>", "<|tool_call_end|>"):
        head, sep, rest = block.body.partition(_KIMI_ARGS)
        name = _KIMI_NAME.match(head)
        if name is None or not (sep or head.strip().startswith("functions.")):
            found += cut_off_marker("kimi_k2", text, block)
            continue
        arguments, ok = decode_prefix(rest) if sep else (None, False)
        parsed = Parsed(name.group(1), arguments, ok and block.closed)
        found += place("kimi_k2", text, block, [parsed])
    return found


_PLAMO = "<|plamo:{}:plamo|>"
_PLAMO_NAME: Final = re.compile(
    re.escape(_PLAMO.format("begin_tool_name"))
    + r"(.*?)"
    + re.escape(_PLAMO.format("end_tool_name")),
    re.DOTALL,
)
_PLAMO_ARGS: Final = re.compile(
    re.escape(_PLAMO.format("begin_tool_arguments"))
    + r"(?:<\|plamo:constrain\|>json)?(?:<\|plamo:msg\|>)?(.*?)(?:"
    + re.escape(_PLAMO.format("end_tool_arguments"))
    + r"|\Z)",
    re.DOTALL,
)


def find_plamo3(text: str) -> list[LeakedCall]:
    """`<|plamo:begin_tool_request:plamo|>` name and JSON arguments, each in its own tags."""
    found: list[LeakedCall] = []
    open_tag, close_tag = _PLAMO.format("begin_tool_request"), _PLAMO.format("end_tool_request")
    for block in blocks(text, open_tag, close_tag):
        name = _PLAMO_NAME.search(block.body)
        if name is None:
            if block.closed or block.body.strip().startswith("<|plamo:"):
                found += place("plamo3", text, block, [Parsed("", None, False)])
            else:
                found += cut_off_marker("plamo3", text, block)
            continue
        args = _PLAMO_ARGS.search(block.body)
        arguments, ok = decode_exact(args.group(1)) if args else (None, False)
        parsed = Parsed(name.group(1).strip(), arguments, ok and block.closed)
        found += place("plamo3", text, block, [parsed])
    return found


_HARMONY: Final = re.compile(
    r"to=functions\.(?P<name>[\w.\-]+)[^\S\n]*(?:<\|constrain\|>[^\S\n]*json|json)?[^\S\n]*(?:<\|message\|>)?"
)


def find_harmony(text: str) -> list[LeakedCall]:
    """gpt-oss (harmony): `<|channel|>commentary to=functions.name <|constrain|>json<|message|>
    {…}<|call|>`, or the same with its special tokens dropped (`… to=functions.name json{…}`)."""
    found: list[LeakedCall] = []
    for match in _HARMONY.finditer(text):
        rest = text[match.end() :]
        if rest.lstrip() and not rest.lstrip().startswith("{"):
            continue  # `to=functions.x` named in prose
        arguments, ok = decode_prefix(rest)
        end = text.find("<|call|>", match.end())
        stop = end + len("<|call|>") if ok and end != -1 else len(text)
        start = text.rfind("<|channel|>", 0, match.start())
        start = start if start != -1 and "\n" not in text[start : match.start()] else match.start()
        raw = text[start:stop]
        # With its special tokens kept, a call ends with `<|call|>`; without, with its JSON.
        ended = ok and (end != -1 or "<|message|>" not in match.group(0))
        found.append(LeakedCall(match.group("name"), arguments, raw, "harmony", ended, start))
    return found


_MUSE_HEADER: Final = re.compile(r"to=(?P<name>[A-Za-z0-9_.\-]+)<\|message\|>")
_MUSE_START: Final = re.compile(r"<\|start\|>\s*assistant[^\S\n]*\Z")
_MUSE_END: Final = re.compile(r"<\|eom\|>|<\|eot\|>")
_MUSE_NOT_TOOLS: Final = frozenset({"self", "user"})


def find_muse_recipient(text: str) -> list[LeakedCall]:
    """Muse Glimmer's message to a tool: `<|start|>assistant to=name<|message|>{…}<|eom|>`."""
    found: list[LeakedCall] = []
    for match in _MUSE_HEADER.finditer(text):
        name = match.group("name")
        if name in _MUSE_NOT_TOOLS or name.startswith("functions."):
            continue  # reasoning, an answer, or a harmony recipient
        end = _MUSE_END.search(text, match.end())
        body = text[match.end() : end.start() if end else len(text)]
        if body.strip() and not body.lstrip().startswith("{"):
            continue
        arguments, ok = decode_exact(body) if end else decode_prefix(body)
        stop = end.end() if end else len(text)
        # The header's `<|start|>assistant`, when the message has one, is part of the call.
        head = _MUSE_START.search(text, max(0, match.start() - 40), match.start())
        start = head.start() if head else match.start()
        raw = text[start:stop]
        complete = ok and end is not None
        found.append(LeakedCall(name, arguments, raw, "muse_glimmer", complete, start))
    return found


_CALL_HEAD: Final = re.compile(r"\A\s*call:([\w.\-]+)\{")


def braced_call(fmt: str, open_tag: str, close_tag: str, delimiter: str) -> Finder:
    """The finder of `open_tag`call:name{key:value,…}`close_tag`, strings between `delimiter`s
    (Gemma 4: `<|"|>`, FunctionGemma: `<escape>`)."""

    def find(text: str) -> list[LeakedCall]:
        found: list[LeakedCall] = []
        for block in blocks(text, open_tag, close_tag):
            head = _CALL_HEAD.match(block.body)
            if head is None:
                found += cut_off_marker(fmt, text, block)
                continue
            reader = _BracedReader(block.body, head.end() - 1, delimiter)
            arguments = reader.value()
            if not reader.ok and block.closed:
                continue  # a closed tag around something that is not a call: prose about one
            complete = reader.ok and block.closed and not block.body[reader.position :].strip()
            parsed = Parsed(head.group(1), arguments if reader.ok else None, complete)
            found += place(fmt, text, block, [parsed])
        return found

    return find


class _BracedReader:
    """Reads Gemma's argument syntax: `{key:<|"|>text<|"|>,n:42,o:{…},l:[…]}` → Python values.

    `ok` turns False when the text ends or breaks before the value does.
    """

    def __init__(self, text: str, position: int, delimiter: str) -> None:
        self.text, self.position, self.delimiter, self.ok = text, position, delimiter, True

    def value(self) -> object:
        text = self.text
        if self.position >= len(text):
            self.ok = False
            return None
        if text.startswith(self.delimiter, self.position):
            start = self.position + len(self.delimiter)
            end = text.find(self.delimiter, start)
            if end == -1:
                self.ok, self.position = False, len(text)
                return text[start:]
            self.position = end + len(self.delimiter)
            return text[start:end]
        if text[self.position] == "{":
            return self._container("}", keyed=True)
        if text[self.position] == "[":
            return self._container("]", keyed=False)
        end = self.position
        while end < len(text) and text[end] not in ",}]":
            end += 1
        bare, self.position = text[self.position : end].strip(), end
        return scalar(bare)

    def _container(self, close: str, *, keyed: bool) -> object:
        self.position += 1
        items: dict[str, object] = {}
        values: list[object] = []
        while self.ok:
            if self.position >= len(self.text):
                self.ok = False
                break
            if self.text[self.position] == close:
                self.position += 1
                break
            if keyed:
                colon = self.text.find(":", self.position)
                if colon == -1:
                    self.ok = False
                    break
                key = self.text[self.position : colon].strip().strip('"')
                key = key.removeprefix(self.delimiter).removesuffix(self.delimiter)
                self.position = colon + 1
                items[key] = self.value()
            else:
                values.append(self.value())
            if self.position < len(self.text) and self.text[self.position] == ",":
                self.position += 1
        return items if keyed else values
