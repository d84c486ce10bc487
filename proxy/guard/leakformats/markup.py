"""Formats that write a call as XML-like markup: `<function=name><parameter=k>` (Qwen3),
key/value tags (GLM, Hunyuan, K2 Horizon), `<invoke name=…><parameter name=…>` (MiniMax,
DeepSeek's DSML, Step3, Muse Glimmer), MiniMax M3's elements, MiniCPM's `<function name=…>`
and Kimi K3's XTML.
"""

from __future__ import annotations

import functools
import html
import re
from typing import Final

from proxy.guard.leakformats.reading import (
    LeakedCall,
    Parsed,
    blocks,
    identifier,
    json_calls,
    scalar,
)
from proxy.guard.leakformats.tagged import Finder, cut_off_marker, place

_FUNCTION: Final = re.compile(r"<function=([\w.\-]+)>(.*?)(</function>|\Z)", re.DOTALL)
_PARAMETER: Final = re.compile(
    r"<parameter=([^>\n]*)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|(?=</function>)|\Z)",
    re.DOTALL,
)


def find_qwen_xml(text: str) -> list[LeakedCall]:
    """`<function=name><parameter=k>v</parameter></function>`, bare or in `<tool_call>` or
    `<seed:tool_call>` (Qwen3-Coder, Qwen3.5, Seed-OSS, MiMo, Step 3.5)."""
    found: list[LeakedCall] = []
    for match in _FUNCTION.finditer(text):
        body = match.group(2).strip()
        if body and not body.startswith("<parameter="):
            continue  # `<function=f>` named in prose
        arguments = {k.strip(): scalar(v) for k, v in _PARAMETER.findall(match.group(2))}
        call = LeakedCall(
            match.group(1),
            arguments,
            match.group(0),
            "qwen_xml",
            bool(match.group(3)),
            match.start(),
        )
        found.append(call)
    return found


_MINICPM_FUNCTION: Final = re.compile(
    r"<function\s+name=['\"]([^'\"]+)['\"][^>]*>(.*?)(</function>|\Z)", re.DOTALL
)
_MINICPM_PARAM: Final = re.compile(r"<param\s+name=['\"]([^'\"]+)['\"]>(.*?)</param>", re.DOTALL)


def find_minicpm(text: str) -> list[LeakedCall]:
    """`<function name="f"><param name="k">v</param></function>` (MiniCPM 5)."""
    found: list[LeakedCall] = []
    for match in _MINICPM_FUNCTION.finditer(text):
        body = match.group(2).strip()
        if body and not body.startswith("<param"):
            continue
        arguments = {k: scalar(_cdata(v.strip())) for k, v in _MINICPM_PARAM.findall(body)}
        complete = bool(match.group(3))
        found.append(
            LeakedCall(
                match.group(1), arguments, match.group(0), "minicpm", complete, match.start()
            )
        )
    return found


def _cdata(value: str) -> str:
    if value.startswith("<![CDATA[") and value.endswith("]]>"):
        return value[len("<![CDATA[") : -len("]]>")]
    return value


def key_value_tags(
    fmt: str,
    call_open: str,
    call_close: str,
    *,
    key: tuple[str, str] = ("<arg_key>", "</arg_key>"),
    value: tuple[str, str] = ("<arg_value>", "</arg_value>"),
    kind: tuple[str, str] | None = None,
    separator: str | None = None,
    separator_required: bool = False,
    json_bodies: bool = False,
) -> Finder:
    """The finder of `call_open`name `key`k`/key` `value`v`/value` …`call_close` (GLM 4.5+,
    Poolside, Hunyuan, K2 Horizon). `kind`: an optional type tag between key and value;
    `separator`: a token between the name and the arguments (`separator_required`: the call
    counts only with it);
    `json_bodies`: the call may instead be a JSON object."""
    kind_part = rf"(?:\s*{re.escape(kind[0])}.*?{re.escape(kind[1])})?" if kind else ""
    pair = re.compile(
        rf"{re.escape(key[0])}(.*?){re.escape(key[1])}{kind_part}\s*"
        rf"{re.escape(value[0])}(.*?)(?:{re.escape(value[1])}|\Z)",
        re.DOTALL,
    )

    def find(text: str) -> list[LeakedCall]:
        found: list[LeakedCall] = []
        for block in blocks(text, call_open, call_close):
            body = block.body
            if json_bodies and body.lstrip().startswith("{"):
                found += place(fmt, text, block, json_calls(body, closed=block.closed) or [])
                continue
            head, has_key, _ = body.partition(key[0])
            has_separator = False
            if separator is not None:
                head, sep, _ = head.partition(separator)
                has_separator = bool(sep)
            if separator_required and not has_separator:
                found += cut_off_marker(fmt, text, block)
                continue
            name = identifier(head)
            # A call without arguments is its name on a line of its own (`<tool_call>f\n</tool_call>`),
            # which a tag pair around a word in prose is not.
            bare_name = block.closed and head.rstrip(" \t").endswith("\n")
            if name is None or not (has_key or has_separator or bare_name):
                found += cut_off_marker(fmt, text, block)
                continue
            pairs = pair.findall(body)
            arguments = {k.strip(): scalar(v.strip()) for k, v in pairs}
            balanced = body.count(value[1]) == len(pairs) == body.count(key[0])
            found += place(fmt, text, block, [Parsed(name, arguments, block.closed and balanced)])
        return found

    return find


_HY_OPEN: Final = re.compile(r"<tool_call(:[\w]+)?>")


def find_hunyuan(text: str) -> list[LeakedCall]:
    """Hunyuan (HY v3, v4): GLM's key/value tags with a checkpoint suffix on every token
    (`<tool_call:6124c78e>`), and on v3 a `<tool_sep>` between the name and the arguments."""
    found: list[LeakedCall] = []
    for suffix in sorted({m.group(1) or "" for m in _HY_OPEN.finditer(text)}):
        found += _hunyuan_finder(suffix)(text)
    return found


@functools.lru_cache(maxsize=16)
def _hunyuan_finder(s: str) -> Finder:
    """The key/value finder of one checkpoint suffix (a few per deployment, so cached)."""
    return key_value_tags(
        "hunyuan",
        f"<tool_call{s}>",
        f"</tool_call{s}>",
        key=(f"<arg_key{s}>", f"</arg_key{s}>"),
        value=(f"<arg_value{s}>", f"</arg_value{s}>"),
        separator=f"<tool_sep{s}>",
        separator_required=not s,
    )


def invoke_markup(fmt: str, tag_prefix: str) -> Finder:
    """The finder of `<{p}invoke name="f"><{p}parameter name="k">v</{p}parameter></{p}invoke>`
    where `p` is `tag_prefix` (a regex: "" for MiniMax M2 and dots, `｜DSML｜ ?` for DeepSeek
    V3.2/V4/V4.1, `steptml:` for Step3, `atem:` for Muse Glimmer). A `string="true"` parameter
    is text; any other value is read as JSON when it is JSON."""
    invoke = re.compile(
        rf"<(?P<p>{tag_prefix})invoke\s+name=(?:\"(?P<n1>[^\"<>]+)\"|'(?P<n2>[^'<>]+)'|(?P<n3>[^\s\"'<>]+))\s*>"
        rf"(?P<body>.*?)(?P<end></(?P=p)invoke>|\Z)",
        re.DOTALL,
    )

    def find(text: str) -> list[LeakedCall]:
        found: list[LeakedCall] = []
        for match in invoke.finditer(text):
            prefix = match.group("p")
            body = match.group("body").strip()
            if body and not body.startswith(f"<{prefix}parameter"):
                continue  # an invoke element named in prose
            parameter = _parameter_pattern(prefix)
            arguments: dict[str, object] = {}
            complete = bool(match.group("end"))
            for _, key, attributes, value, closed in parameter.findall(match.group("body")):
                text_value = 'string="true"' in attributes
                arguments[key] = value if text_value else scalar(html.unescape(value.strip()))
                complete = complete and bool(closed)
            name = match.group("n1") or match.group("n2") or match.group("n3")
            call = LeakedCall(name, arguments, match.group(0), fmt, complete, match.start())
            found.append(call)
        return found

    return find


@functools.lru_cache(maxsize=16)
def _parameter_pattern(prefix: str) -> re.Pattern[str]:
    p = re.escape(prefix)
    return re.compile(
        rf"<{p}parameter\s+name=([\"']?)([^\"'>]+)\1([^>]*)>(.*?)(</{p}parameter>|\Z)",
        re.DOTALL,
    )


MINIMAX_M3_NAMESPACE: Final = "]<]minimax[>["
_M3_INVOKE: Final = re.compile(
    re.escape(MINIMAX_M3_NAMESPACE)
    + r"<invoke\s+name=([\"']?)([^\"'>]+)\1\s*>(.*?)("
    + re.escape(MINIMAX_M3_NAMESPACE)
    + r"</invoke>|\Z)",
    re.DOTALL,
)
_ELEMENT: Final = re.compile(r"<([\w.\-]+)>(.*?)</\1>", re.DOTALL)


def find_minimax_m3(text: str) -> list[LeakedCall]:
    """MiniMax M3: every tag prefixed by `]<]minimax[>[`; an `<invoke name="f">` holds one
    element per argument (`<city>Paris</city>`), nested elements are objects, `<item>`s a list."""
    found: list[LeakedCall] = []
    for match in _M3_INVOKE.finditer(text):
        body = match.group(3).replace(MINIMAX_M3_NAMESPACE, "")
        arguments = _elements(body)
        complete = bool(match.group(4)) and isinstance(arguments, dict)
        found.append(
            LeakedCall(
                match.group(2), arguments, match.group(0), "minimax_m3", complete, match.start()
            )
        )
    return found


def _elements(body: str) -> object:
    children = _ELEMENT.findall(body)
    if not children:
        return scalar(body.strip())
    if all(tag == "item" for tag, _ in children):
        return [_elements(value) for _, value in children]
    return {tag: _elements(value) for tag, value in children}


_K3_CALL: Final = re.compile(
    r"<\|open\|>\s*call\s+(?P<attrs>[^<]*?)<\|sep\|>(?P<body>.*?)(?P<end><\|close\|>\s*call\s*<\|sep\|>|\Z)",
    re.DOTALL,
)
_K3_ARGUMENT: Final = re.compile(
    r"<\|open\|>\s*argument\s+(?P<attrs>[^<]*?)<\|sep\|>(?P<value>.*?)(?P<end><\|close\|>\s*argument\s*<\|sep\|>|\Z)",
    re.DOTALL,
)
_ATTRIBUTE: Final = re.compile(r'(\w+)="([^"]*)"')


def find_kimi_k3(text: str) -> list[LeakedCall]:
    """Kimi K3's XTML: `<|open|>call tool="f" index="1"<|sep|>` then
    `<|open|>argument key="k" type="string"<|sep|>v<|close|>argument<|sep|>` per argument, then
    `<|close|>call<|sep|>`."""
    found: list[LeakedCall] = []
    for match in _K3_CALL.finditer(text):
        attributes = {k: html.unescape(v) for k, v in _ATTRIBUTE.findall(match.group("attrs"))}
        name = attributes.get("tool") or attributes.get("name")
        if not name:
            continue
        arguments: dict[str, object] = {}
        complete = bool(match.group("end"))
        for argument in _K3_ARGUMENT.finditer(match.group("body")):
            a = {k: html.unescape(v) for k, v in _ATTRIBUTE.findall(argument.group("attrs"))}
            value = argument.group("value")
            key = a.get("key") or a.get("name") or ""
            arguments[key] = value if a.get("type") == "string" else scalar(value.strip())
            complete = complete and bool(argument.group("end"))
        found.append(
            LeakedCall(name, arguments, match.group(0), "kimi_k3", complete, match.start())
        )
    return found
