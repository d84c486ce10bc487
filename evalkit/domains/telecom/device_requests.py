"""How a scripted customer turns a telecom agent's request into actions on their phone.

Deterministic keyword rules, one or more per user tool. An agent message that names tools
literally (`toggle_data`, `grant_app_permission({"app_name": "messaging", ...})`) gets exactly
those calls. Otherwise each rule looks for its request in the message: a change needs an
imperative verb ("turn off airplane mode", "please reboot", "reset your APN settings"), a
check only a mention ("what does your status bar show?"). The calls come in the order the
message asks for them.

A switch the agent asks to set ("turn data roaming ON") is toggled only when the customer does
not already know it to be in that position from what the phone showed them before; "toggle"
without a direction always toggles.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evalkit.domains.telecom.user_tools import TelecomUserTools
from evalkit.messages import ToolCall, ToolMessage

_VERB = r"\b(?:turn|switch|toggle|disable|enable|deactivate|activate|put)\b"
# Another request between a switch verb and the switch: the verb is not about the switch.
_OTHER_VERB = r"\b(?:check|look|see|tell|run|verify|confirm|make sure|let me know|reboot|restart)\b"
_PRONOUN = r"\b(?:turn|switch|toggle)\s+(?:it|this|that)(?:\s+(?:on|off)\b)?"
_MODE_VERB = r"\b(?:set|change|switch|select|choose|turn)\b"
_GAP = r"[^.?!\n]{0,40}?"
_MODES = {
    "2g_only": r"\b2g[ _-]?only\b",
    "3g_only": r"\b3g[ _-]?only\b",
    "4g_only": r"\b4g[ _-]?only\b|\blte[ _-]?only\b",
}
_PERMISSIONS = ("sms", "storage", "phone", "network")
_APPS = ("messaging", "browser")
_URL = re.compile(r"https?://[^\s'\"]+")


@dataclass(frozen=True)
class _Switch:
    """A setting the customer can flip, and how the phone's answers show its position."""

    tool: str
    subject: str  # regex for what the agent names
    shown: tuple[tuple[str, str], ...]  # (regex whose group(1) is ON/OFF/Yes/No…, group meaning)


_SWITCHES = (
    _Switch(
        "toggle_airplane_mode",
        r"airplane[ -]mode|flight mode",
        (
            (r"Airplane Mode(?: is now|:) (ON|OFF)", ""),
            (r"Status Bar: (✈️) Airplane Mode", "ON"),
            (r"Status Bar: (📵|📶)", "OFF"),
        ),
    ),
    _Switch(
        "toggle_data",
        r"(?:mobile|cellular) data(?! roaming| saver)|\bdata connection",
        (
            (r"Mobile Data is now (ON|OFF)", ""),
            (r"Mobile Data Enabled: (Yes|No)", ""),
        ),
    ),
    _Switch(
        "toggle_roaming",
        r"(?:data )?roaming",
        (
            (r"Data Roaming is now (ON|OFF)", ""),
            (r"Data Roaming Enabled: (Yes|No)", ""),
        ),
    ),
    _Switch(
        "toggle_data_saver_mode",
        r"data[ -]saver",
        (
            (r"Data Saver Mode is now (ON|OFF)", ""),
            (r"Data Saver mode is (ON|OFF)", ""),
        ),
    ),
    _Switch(
        "toggle_wifi_calling",
        r"wi-?fi calling",
        (
            (r"Wi-Fi Calling is now (ON|OFF)", ""),
            (r"Wi-Fi Calling is currently turned (ON|OFF)", ""),
        ),
    ),
    _Switch(
        "toggle_wifi",
        r"wi-?fi(?! calling)",
        (
            (r"Wi-Fi is now (ON|OFF)", ""),
            (r"Wi-Fi is turned (OFF)", ""),
            (r"Wi-Fi (?:is )?(ON)\b", ""),
            (r"Wi-Fi Radio: (ON|OFF)", ""),
        ),
    ),
)

# Checks: (tool, regex of a mention). A mention of a switch without a verb checks the network.
_CHECKS: tuple[tuple[str, str], ...] = (
    ("check_status_bar", r"status bar"),
    (
        "check_network_status",
        r"network status|connection status|cellular connection|signal strength",
    ),
    (
        "check_network_mode_preference",
        r"network mode|network preference|preferred network|network type",
    ),
    ("run_speed_test", r"speed ?test|test (?:your |the )?(?:internet |data )?speed"),
    ("check_sim_status", r"sim (?:card )?status|check (?:your |the )?sim"),
    ("check_data_restriction_status", r"data restrictions?|data[ -]saver"),
    ("check_apn_settings", r"\bapn\b|mmsc"),
    ("check_wifi_status", r"wi-?fi(?! calling)"),
    ("check_wifi_calling_status", r"wi-?fi calling"),
    ("check_vpn_status", r"\bvpn\b"),
    (
        "check_installed_apps",
        r"installed apps|apps (?:are )?installed|which apps|list (?:of )?(?:your )?apps",
    ),
    ("check_app_status", r"app status|status of (?:the |your )?\w+ app"),
    ("check_app_permissions", r"permissions?"),
    ("can_send_mms", r"\bmms\b|picture messages?|multimedia messag"),
    ("check_payment_request", r"payment request"),
    ("check_network_status", r"airplane[ -]mode|mobile data|roaming"),
)

# Changes that are not switches: (tool, regex of the request).
_CHANGES: tuple[tuple[str, str], ...] = (
    (
        "reset_apn_settings",
        r"\breset\b" + _GAP + r"\bapn|\bapn\b" + _GAP + r"\b(?:reset|defaults?)\b",
    ),
    ("set_apn_settings", r"\bset\b" + _GAP + r"\bapn\b" + _GAP + r"\bto\b"),
    ("reseat_sim_card", r"re-?seat|re-?insert|remove and re-?insert|take out" + _GAP + r"sim"),
    (
        "set_network_mode_preference",
        _MODE_VERB
        + _GAP
        + r"(?:network mode|network preference|preferred network|network type|\b[2345]g\b)",
    ),
    (
        "disconnect_vpn",
        r"\bdisconnect\b"
        + _GAP
        + r"\bvpn\b|\b(?:turn|switch) off\b"
        + _GAP
        + r"\bvpn\b|\b(?:disable|deactivate)\b"
        + _GAP
        + r"\bvpn\b|\bvpn\b"
        + _GAP
        + r"\boff\b",
    ),
    (
        "connect_vpn",
        r"(?<!dis)\bconnect\b" + _GAP + r"\bvpn\b|\b(?:turn|switch) on\b" + _GAP + r"\bvpn\b",
    ),
    (
        "grant_app_permission",
        r"\b(?:grant|give|allow|enable)\b" + _GAP + r"permission|permission" + _GAP + r"\bgrant",
    ),
    (
        "make_payment",
        r"\bmake (?:the |a )?payment|\bpay (?:the|your|this|that|it)\b|\baccept (?:the )?payment|\bcomplete (?:the )?payment",
    ),
    ("reboot_device", r"\breboot|\brestart"),
)


def _state(switch: _Switch, seen: Sequence[str]) -> bool | None:
    # The switch's last position the customer saw, or None when never shown.
    for text in reversed(seen):
        found: list[tuple[int, bool]] = []
        for pattern, meaning in switch.shown:
            for m in re.finditer(pattern, text):
                word = (meaning or m.group(1)).upper()
                found.append((m.start(), word in ("ON", "YES")))
        if found:
            return max(found)[1]
    return None


def _target(words: str) -> bool | None:
    # What position the request asks for: on, off, or just "toggle".
    if re.search(r"\b(?:off|disable|deactivate)\b", words):
        return False
    if re.search(r"\b(?:on|enable|activate)\b", words):
        return True
    return None


def _switch_request(text: str, start: int, end: int) -> str | None:
    """The words of a request to flip the switch named at text[start:end], or None."""
    sentence_start = max(text.rfind(c, 0, start) for c in ".?!\n") + 1
    before = text[max(sentence_start, start - 45) : start]
    verbs = list(re.finditer(_VERB, before))
    if verbs:
        between = before[verbs[-1].start() :]
        if re.search(_OTHER_VERB, between):
            return None
        after = re.match(r"\s+(?:on|off)\b", text[end:])
        return between + (after.group(0) if after else "")
    ends = [i for i in (text.find(c, end) for c in ".?!\n") if i >= 0]
    rest = text[end : min(ends, default=len(text))]
    pronoun = re.search(_PRONOUN, rest)
    return None if pronoun is None else pronoun.group(0)


class TelecomDeviceRequests:
    """The rules a scripted telecom customer follows (see the module docstring)."""

    def calls_for(self, agent_text: str, seen: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
        """The calls `agent_text` asks for, in order; `seen` is what the phone showed before."""
        named = _named_calls(agent_text)
        if named:
            return named
        original = agent_text.lower()
        text = _URL.sub("<url>", original)  # "mms.carrier.com" is not a request about MMS
        found: dict[str, tuple[int, list[dict[str, Any]]]] = {}
        taken: list[tuple[int, int]] = []

        def free(position: int) -> bool:
            return not any(s <= position < e for s, e in taken)

        for switch in _SWITCHES:
            for m in re.finditer(switch.subject, text):
                words = _switch_request(text, m.start(), m.end())
                if words is None or switch.tool in found:
                    continue
                taken.append((m.start(), m.end()))
                wanted = _target(words)
                if wanted is None or wanted != _state(switch, seen):
                    found[switch.tool] = (m.start(), [{}])
        for tool, pattern in _CHANGES:
            change = re.search(pattern, text)
            if change is None or not free(change.start()) or tool in found:
                continue
            taken.append((change.start(), change.end()))
            found[tool] = (change.start(), _change_arguments(tool, original))
        changed = bool(found)
        for tool, pattern in _CHECKS:
            check = re.search(pattern, text)
            if check is None or not free(check.start()) or tool in found:
                continue
            if tool == "check_network_status" and changed:
                continue  # the change's answer already shows the network
            found[tool] = (check.start(), [_check_arguments(tool, text)])
        ordered = sorted(found.items(), key=lambda item: item[1][0])
        return [(tool, arguments) for tool, (_, calls) in ordered for arguments in calls]

    def report(self, results: Sequence[tuple[ToolCall, ToolMessage]]) -> str:
        """Tell the agent what the phone showed after each call."""
        parts = []
        for call, result in results:
            what = call.name.replace("_", " ")
            parts.append(f"I did '{what}'. My phone shows:\n{result.content or ''}")
        return "\n\n".join(parts) if parts else "I tried, but nothing happened."


def _named_calls(agent_text: str) -> list[tuple[str, dict[str, Any]]]:
    # Tool names written out, optionally with JSON arguments in parentheses.
    names = "|".join(sorted(TelecomUserTools.tool_names(), key=len, reverse=True))
    calls = []
    for m in re.finditer(rf"\b({names})\b(?:\((\{{.*?\}})?\))?", agent_text):
        arguments: dict[str, Any] = {}
        if m.group(2):
            try:
                parsed = json.loads(m.group(2))
            except json.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                arguments = parsed
        calls.append((m.group(1), arguments))
    return calls


def _app(text: str) -> str:
    return next((app for app in _APPS if app in text), "messaging")


def _check_arguments(tool: str, text: str) -> dict[str, Any]:
    if tool in ("check_app_status", "check_app_permissions"):
        return {"app_name": _app(text)}
    return {}


def _change_arguments(tool: str, text: str) -> list[dict[str, Any]]:
    if tool == "set_network_mode_preference":
        mode = next((m for m, p in _MODES.items() if re.search(p, text)), "4g_5g_preferred")
        return [{"mode": mode}]
    if tool == "grant_app_permission":
        wanted = [p for p in _PERMISSIONS if re.search(rf"\b{p}\b", text)] or ["storage", "sms"]
        return [{"app_name": _app(text), "permission": p} for p in wanted]
    if tool == "set_apn_settings":
        settings: dict[str, Any] = {"apn_name": "internet"}
        if url := _URL.search(text):
            settings["mmsc_url"] = url.group(0).rstrip(".,)")
        return [{"apn_settings": settings}]
    return [{}]
