"""A scripted telecom customer turns the agent's requests into the right device actions, reports
what the phone shows, and can be walked through a troubleshooting path to a reward of 1.0."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from evalkit.domains.base import Domain
from evalkit.domains.telecom.device_requests import TelecomDeviceRequests
from evalkit.domains.telecom.user_tools import TelecomUserTools
from evalkit.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from evalkit.orchestrator import run_episode
from evalkit.scoring import evaluate
from evalkit.users import ScriptedUser, scripted_user

RULES = TelecomDeviceRequests()

# What an agent says, and the device calls it asks for — every device tool at least once.
REQUESTS: list[tuple[str, list[tuple[str, dict[str, Any]]]]] = [
    ("Could you look at your status bar and tell me what it shows?", [("check_status_bar", {})]),
    ("Please check your network status.", [("check_network_status", {})]),
    ("Which network mode is your phone set to?", [("check_network_mode_preference", {})]),
    (
        "Please change your network mode to 4G/5G preferred.",
        [("set_network_mode_preference", {"mode": "4g_5g_preferred"})],
    ),
    ("Please run a speed test.", [("run_speed_test", {})]),
    ("Please turn off airplane mode.", [("toggle_airplane_mode", {})]),
    ("Can you check your SIM card status?", [("check_sim_status", {})]),
    ("Please remove and reinsert your SIM card.", [("reseat_sim_card", {})]),
    ("Please turn on mobile data.", [("toggle_data", {})]),
    ("Please turn on data roaming on your phone.", [("toggle_roaming", {})]),
    ("Do you have any data restrictions active?", [("check_data_restriction_status", {})]),
    ("Please toggle Data Saver mode off.", [("toggle_data_saver_mode", {})]),
    ("What do your APN settings show?", [("check_apn_settings", {})]),
    (
        "Please set your APN settings to apn_name internet with MMSC URL http://mms.carrier.com/mms/wapenc.",
        [
            (
                "set_apn_settings",
                {
                    "apn_settings": {
                        "apn_name": "internet",
                        "mmsc_url": "http://mms.carrier.com/mms/wapenc",
                    }
                },
            )
        ],
    ),
    (
        "Please reset your APN settings, then reboot your phone.",
        [("reset_apn_settings", {}), ("reboot_device", {})],
    ),
    ("Is your Wi-Fi connected?", [("check_wifi_status", {})]),
    ("Please switch off Wi-Fi for now.", [("toggle_wifi", {})]),
    ("Could you check whether Wi-Fi calling is enabled?", [("check_wifi_calling_status", {})]),
    ("Please turn off Wi-Fi calling.", [("toggle_wifi_calling", {})]),
    ("Are you using a VPN?", [("check_vpn_status", {})]),
    ("You may connect your VPN again now.", [("connect_vpn", {})]),
    ("Please disconnect your VPN.", [("disconnect_vpn", {})]),
    ("Which apps are installed on your phone?", [("check_installed_apps", {})]),
    (
        "What is the app status of the messaging app?",
        [("check_app_status", {"app_name": "messaging"})],
    ),
    (
        "What permissions does the messaging app have?",
        [("check_app_permissions", {"app_name": "messaging"})],
    ),
    (
        "Please grant the messaging app the storage permission.",
        [("grant_app_permission", {"app_name": "messaging", "permission": "storage"})],
    ),
    ("Can you try sending a picture message?", [("can_send_mms", {})]),
    ("Please restart your phone.", [("reboot_device", {})]),
    (
        "I sent it: please check your payment request and make the payment.",
        [("check_payment_request", {}), ("make_payment", {})],
    ),
    (
        'Please do this on your device: grant_app_permission({"app_name": "messaging", "permission": "sms"})',
        [("grant_app_permission", {"app_name": "messaging", "permission": "sms"})],
    ),
    ("Thank you for your patience. Is there anything else?", []),
]


def test_the_requests_cover_every_device_tool() -> None:
    asked = {name for _, calls in REQUESTS for name, _ in calls}
    assert asked == set(TelecomUserTools.tool_names())


@pytest.mark.parametrize(("text", "calls"), REQUESTS, ids=[r[0][:40] for r in REQUESTS])
def test_an_agent_request_becomes_its_device_calls(
    text: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    assert RULES.calls_for(text, []) == calls


def test_a_switch_already_in_the_asked_position_is_left_alone() -> None:
    seen = ["Airplane Mode is now OFF.\nStatus Bar: 📶⁴ Excellent | 5G | 📱 Data Enabled | 🔋 80%"]
    assert RULES.calls_for("Please turn off airplane mode.", seen) == []
    assert RULES.calls_for("Please turn on airplane mode.", seen) == [("toggle_airplane_mode", {})]
    assert RULES.calls_for("Please toggle airplane mode.", seen) == [("toggle_airplane_mode", {})]
    later = [*seen, "Status Bar: ✈️ Airplane Mode | 🔋 80%"]
    assert RULES.calls_for("Please turn off airplane mode.", later) == [
        ("toggle_airplane_mode", {})
    ]


def test_a_mention_without_a_request_changes_nothing() -> None:
    calls = RULES.calls_for("I have enabled roaming on your line; roaming was off before.", [])
    assert all(not TelecomUserTools.mutates(name) for name, _ in calls)


def test_the_report_quotes_what_the_phone_showed() -> None:
    call = ToolCall(id="u1", name="run_speed_test", requestor="user")
    result = ToolMessage(id="u1", content="Speed test failed: No Connection.", requestor="user")
    assert RULES.report([(call, result)]) == (
        "I did 'run speed test'. My phone shows:\nSpeed test failed: No Connection."
    )


def test_scripted_user_for_telecom_operates_the_device_and_for_retail_does_not(
    telecom: Domain, retail: Domain
) -> None:
    assert isinstance(scripted_user(telecom, telecom.tasks[0]).device, TelecomDeviceRequests)
    assert scripted_user(retail, retail.tasks[0]).device is None


class _WorkflowAgent:
    """Says one line of a troubleshooting script per turn, in plain words, then says goodbye."""

    def __init__(self, lines: list[str | ToolCall]) -> None:
        self.lines = lines

    async def respond(self, history: Sequence[Any]) -> AssistantMessage:
        said = sum(1 for m in history if isinstance(m, AssistantMessage)) - 1
        if said >= len(self.lines):
            return AssistantMessage(content="Your phone works again. Is there anything else?")
        line = self.lines[said]
        if isinstance(line, ToolCall):
            return AssistantMessage(tool_calls=[line])
        return AssistantMessage(content=line)


async def test_scripted_user_follows_a_no_service_walkthrough_to_a_full_reward(
    telecom: Domain,
) -> None:
    task = next(t for t in telecom.tasks if "]airplane_mode_on|unseat_sim_card[" in t.id)
    user = scripted_user(telecom, task)
    phone = user.facts["phone"]
    agent = _WorkflowAgent(
        [
            "I can help. What is your phone number?",
            ToolCall(id="a1", name="get_customer_by_phone", arguments={"phone_number": phone}),
            "Thanks. Please look at your status bar and tell me what it shows.",
            "Please turn off airplane mode.",
            "Now please check your SIM card status.",
            "Please remove and reinsert your SIM card, then check your status bar again.",
        ]
    )
    sim = await run_episode(telecom, task, agent, user)
    assert sim.termination_reason == "user_stop"
    user_calls = [
        c.name for m in sim.messages if isinstance(m, UserMessage) for c in m.tool_calls or []
    ]
    assert user_calls == [
        "check_status_bar",
        "toggle_airplane_mode",
        "check_sim_status",
        "reseat_sim_card",
        "check_status_bar",
    ]
    reports = [m.content for m in sim.messages if isinstance(m, UserMessage) and m.content]
    assert any("📶" in (r or "") for r in reports)
    assert evaluate(telecom, task, sim.messages, sim.termination_reason).reward == 1.0


async def test_scripted_user_without_the_device_rules_cannot_fix_the_phone(
    telecom: Domain,
) -> None:
    task = next(t for t in telecom.tasks if "]airplane_mode_on|unseat_sim_card[" in t.id)
    agent = _WorkflowAgent(["Please turn off airplane mode.", "Please reinsert your SIM card."])
    sim = await run_episode(telecom, task, agent, ScriptedUser(task))
    assert not any(isinstance(m, UserMessage) and m.tool_calls for m in sim.messages)
    assert evaluate(telecom, task, sim.messages, sim.termination_reason).reward == 0.0
