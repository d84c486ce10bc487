"""The telecom troubleshooting tasks: a phone or an account broken in one or more ways
(no service, slow or no mobile data, no MMS), with the diagnosis and the fixes that repair it."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from evalkit.domains.telecom.task_drafts import (
    GROUNDING,
    Call,
    Case,
    Draft,
    identify_by_phone,
    known_info,
)
from evalkit.domains.telecom.world import COUNTRIES

DEFAULT_MMSC = "http://mms.carrier.com/mms/wapenc"


class _Issue:
    """One way the phone or the account can be broken: set-up, diagnosis, fix, task text."""

    def __init__(self, rng: random.Random, case: Case) -> None:
        self.rng = rng
        self.case = case

    def setup(self, name: str) -> list[Call]:
        """The calls that break the phone or the account as issue `name` does."""
        return {
            **self._service_setups(),
            **self._mobile_data_setups(),
            **self._mms_setups(),
        }[name]

    def _service_setups(self) -> dict[str, list[Call]]:
        """What takes the service away: airplane mode, the SIM card, the APN, a suspended line."""
        c = self.case
        u = "user"
        return {
            "airplane_mode_on": [(u, "turn_airplane_mode_on", {})],
            "unseat_sim_card": [(u, "unseat_sim_card", {})],
            "break_apn_settings": [(u, "break_apn_settings", {})],
            "lock_sim_card_pin": [(u, "lock_sim_card", {"mode": "pin"})],
            "lock_sim_card_puk": [(u, "lock_sim_card", {"mode": "puk"})],
            "overdue_bill_suspension": [
                (
                    "assistant",
                    "suspend_line_for_overdue_bill",
                    {
                        "customer_id": c.cid,
                        "line_id": c.lid,
                        "new_bill_id": self.overdue_bill,
                        "contract_ended": False,
                    },
                ),
                (u, "simulate_network_search", {}),
            ],
            "contract_end_suspension": [
                (
                    "assistant",
                    "suspend_line_for_overdue_bill",
                    {
                        "customer_id": c.cid,
                        "line_id": c.lid,
                        "new_bill_id": self.overdue_bill,
                        "contract_ended": True,
                    },
                ),
                (u, "simulate_network_search", {}),
            ],
        }

    def _mobile_data_setups(self) -> dict[str, list[Call]]:
        """What slows or stops mobile data: its settings, the data used, a VPN, roaming abroad."""
        c = self.case
        u = "user"
        return {
            "data_mode_off": [(u, "turn_data_off", {})],
            "data_usage_exceeded": [
                (
                    "assistant",
                    "set_data_usage",
                    {"customer_id": c.cid, "line_id": c.lid, "data_used_gb": self.exceeded_usage},
                )
            ],
            "data_saver_mode_on": [(u, "turn_data_saver_mode_on", {})],
            "bad_network_preference": [
                (u, "set_network_mode_preference", {"mode": self.slow_mode})
            ],
            "bad_vpn": [(u, "break_vpn", {})],
            "bad_vpn_reconnect": [(u, "break_vpn", {})],
            "user_abroad_roaming_enabled_off": [
                (u, "set_user_location", {"abroad": True}),
                (u, "turn_roaming_off", {}),
                ("assistant", "enable_roaming", {"customer_id": c.cid, "line_id": c.lid}),
            ],
            "user_abroad_roaming_disabled_off": [
                (u, "set_user_location", {"abroad": True}),
                (u, "turn_roaming_off", {}),
                ("assistant", "disable_roaming", {"customer_id": c.cid, "line_id": c.lid}),
                (u, "simulate_network_search", {}),
            ],
            "user_abroad_roaming_disabled_on": [
                (u, "set_user_location", {"abroad": True}),
                (u, "turn_roaming_on", {}),
                ("assistant", "disable_roaming", {"customer_id": c.cid, "line_id": c.lid}),
                (u, "simulate_network_search", {}),
            ],
            "wifi_connected_home": [],
        }

    def _mms_setups(self) -> dict[str, list[Call]]:
        """What stops picture messages: Wi-Fi calling, the app's permissions, the MMS APN, 2G."""
        u = "user"
        return {
            "mms_2g_preference": [(u, "set_network_mode_preference", {"mode": "2g_only"})],
            "bad_wifi_calling": [(u, "set_wifi_calling", {"enabled": True, "mms_over_wifi": True})],
            "break_app_sms_permission": [
                (u, "remove_app_permission", {"app_name": "messaging", "permission": "sms"})
            ],
            "break_app_storage_permission": [
                (u, "remove_app_permission", {"app_name": "messaging", "permission": "storage"})
            ],
            "break_app_both_permissions": [
                (u, "remove_app_permission", {"app_name": "messaging", "permission": "sms"}),
                (u, "remove_app_permission", {"app_name": "messaging", "permission": "storage"}),
            ],
            "break_apn_mms_setting": [(u, "break_apn_mms_setting", {})],
            "break_apn_mms_setting_no_reboot": [(u, "break_apn_mms_setting", {})],
        }

    def fix(self, name: str) -> list[Call]:
        """The calls that diagnose issue `name` and, where the agent can, repair it (gold actions)."""
        return {
            **self._service_fixes(),
            **self._mobile_data_fixes(),
            **self._mms_fixes(),
        }[name]

    def _service_fixes(self) -> dict[str, list[Call]]:
        """The diagnosis and repair of each issue that takes the service away."""
        c = self.case
        a = "assistant"
        u = "user"
        line = {"customer_id": c.cid, "line_id": c.lid}
        return {
            "airplane_mode_on": [(u, "check_network_status", {}), (u, "toggle_airplane_mode", {})],
            "unseat_sim_card": [(u, "check_sim_status", {}), (u, "reseat_sim_card", {})],
            "break_apn_settings": [
                (u, "check_apn_settings", {}),
                (u, "reset_apn_settings", {}),
                (u, "reboot_device", {}),
            ],
            "lock_sim_card_pin": [(u, "check_sim_status", {})],
            "lock_sim_card_puk": [(u, "check_sim_status", {})],
            "overdue_bill_suspension": [
                (a, "get_details_by_id", {"id": c.lid}),
                (a, "get_bills_for_customer", {"customer_id": c.cid}),
                (a, "send_payment_request", {"customer_id": c.cid, "bill_id": self.overdue_bill}),
                (u, "check_payment_request", {}),
                (u, "make_payment", {}),
                (a, "get_details_by_id", {"id": self.overdue_bill}),
                (a, "resume_line", line),
                (u, "reboot_device", {}),
            ],
            "contract_end_suspension": [(a, "get_details_by_id", {"id": c.lid})],
        }

    def _mobile_data_fixes(self) -> dict[str, list[Call]]:
        """The diagnosis and repair of each issue that slows or stops mobile data."""
        c = self.case
        a = "assistant"
        u = "user"
        line = {"customer_id": c.cid, "line_id": c.lid}
        return {
            "data_mode_off": [(u, "check_network_status", {}), (u, "toggle_data", {})],
            "data_usage_exceeded": [
                (a, "get_data_usage", line),
                (a, "refuel_data", {**line, "gb_amount": self.refuel_gb}),
            ],
            "data_saver_mode_on": [
                (u, "check_data_restriction_status", {}),
                (u, "toggle_data_saver_mode", {}),
            ],
            "bad_network_preference": [
                (u, "check_network_mode_preference", {}),
                (u, "set_network_mode_preference", {"mode": "4g_5g_preferred"}),
            ],
            "bad_vpn": [(u, "check_vpn_status", {}), (u, "disconnect_vpn", {})],
            "bad_vpn_reconnect": [
                (u, "check_vpn_status", {}),
                (u, "disconnect_vpn", {}),
                (u, "run_speed_test", {}),
                (u, "connect_vpn", {}),
            ],
            "user_abroad_roaming_enabled_off": [
                (u, "check_network_status", {}),
                (u, "toggle_roaming", {}),
            ],
            "user_abroad_roaming_disabled_off": [
                (a, "get_details_by_id", {"id": c.lid}),
                (a, "enable_roaming", line),
                (u, "toggle_roaming", {}),
            ],
            "user_abroad_roaming_disabled_on": [
                (u, "check_network_status", {}),
                (a, "get_details_by_id", {"id": c.lid}),
                (a, "enable_roaming", line),
            ],
            "wifi_connected_home": [(u, "check_wifi_status", {}), (u, "toggle_wifi", {})],
        }

    def _mms_fixes(self) -> dict[str, list[Call]]:
        """The diagnosis and repair of each issue that stops picture messages."""
        u = "user"
        return {
            "mms_2g_preference": [
                (u, "check_network_mode_preference", {}),
                (u, "set_network_mode_preference", {"mode": "4g_5g_preferred"}),
            ],
            "bad_wifi_calling": [
                (u, "check_wifi_calling_status", {}),
                (u, "toggle_wifi_calling", {}),
            ],
            "break_app_sms_permission": [
                (u, "check_app_permissions", {"app_name": "messaging"}),
                (u, "grant_app_permission", {"app_name": "messaging", "permission": "sms"}),
            ],
            "break_app_storage_permission": [
                (u, "check_installed_apps", {}),
                (u, "check_app_status", {"app_name": "messaging"}),
                (u, "grant_app_permission", {"app_name": "messaging", "permission": "storage"}),
            ],
            "break_app_both_permissions": [
                (u, "check_app_permissions", {"app_name": "messaging"}),
                (u, "grant_app_permission", {"app_name": "messaging", "permission": "sms"}),
                (u, "grant_app_permission", {"app_name": "messaging", "permission": "storage"}),
            ],
            "break_apn_mms_setting": [
                (u, "check_apn_settings", {}),
                (u, "reset_apn_settings", {}),
                (u, "reboot_device", {}),
            ],
            "break_apn_mms_setting_no_reboot": [
                (u, "check_apn_settings", {}),
                (
                    u,
                    "set_apn_settings",
                    {
                        "apn_settings": {
                            "apn_name": "internet",
                            "mms_apn": "mms",
                            "mmsc_url": DEFAULT_MMSC,
                        }
                    },
                ),
            ],
        }

    @property
    def overdue_bill(self) -> str:
        return f"B{9000 + int(self.case.lid[1:])}"

    @property
    def exceeded_usage(self) -> float:
        return round(float(self.case.plan["data_limit_gb"]) + self._overage, 1)

    @property
    def refuel_gb(self) -> float:
        return self._refuel

    @property
    def slow_mode(self) -> str:
        return self._slow_mode

    def draw(self) -> None:
        """Draw the task's numbers (same order every time: the output depends on the seed only)."""
        self._overage = self.rng.choice([0.2, 0.4, 0.6, 0.8])
        self._refuel = self.rng.choice([1.0, 1.5, 2.0])
        self._slow_mode = self.rng.choice(["2g_only", "3g_only"])
        self.country = self.rng.choice(COUNTRIES)


ABROAD = {
    "user_abroad_roaming_enabled_off",
    "user_abroad_roaming_disabled_off",
    "user_abroad_roaming_disabled_on",
}
UNSOLVABLE = {"lock_sim_card_pin", "lock_sim_card_puk", "contract_end_suspension"}
SUSPENSIONS = {"overdue_bill_suspension", "contract_end_suspension"}

SERVICE = [
    ["airplane_mode_on"],
    ["unseat_sim_card"],
    ["break_apn_settings"],
    ["overdue_bill_suspension"],
    ["airplane_mode_on", "unseat_sim_card"],
    ["break_apn_settings", "unseat_sim_card"],
    ["airplane_mode_on", "overdue_bill_suspension"],
    ["airplane_mode_on", "break_apn_settings", "overdue_bill_suspension"],
    ["lock_sim_card_pin"],
    ["airplane_mode_on", "lock_sim_card_puk"],
    ["contract_end_suspension"],
    ["contract_end_suspension", "unseat_sim_card"],
]
MOBILE_DATA = [
    ["data_mode_off"],
    ["data_usage_exceeded"],
    ["data_saver_mode_on"],
    ["bad_network_preference"],
    ["bad_vpn"],
    ["user_abroad_roaming_enabled_off"],
    ["user_abroad_roaming_disabled_off"],
    ["user_abroad_roaming_disabled_on"],
    ["airplane_mode_on", "data_saver_mode_on"],
    ["data_mode_off", "data_usage_exceeded"],
    ["bad_network_preference", "bad_vpn"],
    ["unseat_sim_card", "user_abroad_roaming_disabled_on"],
    ["wifi_connected_home", "data_mode_off"],
    ["bad_vpn_reconnect"],
]
MMS = [
    ["bad_wifi_calling"],
    ["break_app_sms_permission"],
    ["break_app_storage_permission"],
    ["break_app_both_permissions"],
    ["break_apn_mms_setting"],
    ["break_apn_mms_setting_no_reboot"],
    ["mms_2g_preference"],
    ["data_mode_off", "break_app_sms_permission"],
    ["airplane_mode_on", "bad_wifi_calling"],
    ["data_usage_exceeded", "break_apn_mms_setting"],
    ["user_abroad_roaming_disabled_off", "mms_2g_preference"],
    ["unseat_sim_card", "break_app_storage_permission"],
]


def troubleshooting_task(category: str, issues: list[str], case: Case, rng: random.Random) -> Draft:
    """The task where `issues` break the phone or the account of `case` (`category` says what
    the customer notices)."""
    issue = _Issue(rng, case)
    issue.draw()
    abroad = any(i in ABROAD for i in issues)
    unsolvable = any(i in UNSOLVABLE for i in issues)
    where = (
        f"You are currently abroad in {issue.country}."
        if abroad
        else "You are at home in the United States."
    )
    setup: list[Call] = [("user", "set_user_info", {"name": case.name, "phone_number": case.phone})]
    for name in issues:
        setup += issue.setup(name)
    gold, compare = _gold(category, issues, issue, unsolvable)
    reason, steps = _user_story(category, issues, issue, unsolvable)
    if "wifi_connected_home" in issues:
        known_wifi = {
            "device": {
                "wifi_enabled": True,
                "wifi_connected": True,
                "wifi_ssid": f"HomeNet-{rng.randint(10, 99)}",
                "wifi_signal_strength": "good",
            }
        }
    else:
        known_wifi = None
    return Draft(
        category=category,
        issues=issues,
        case=case,
        reason=reason,
        known=known_info(case, where),
        instructions="\n".join(steps),
        purpose=f"Troubleshooting path: {category.replace('_', ' ')} ({', '.join(issues)}).",
        setup=setup,
        gold=gold,
        compare=compare,
        assertions=_assertions(category, issues, issue, unsolvable),
        basis=["ENV_ASSERTION", "ACTION"] if unsolvable else ["ENV_ASSERTION"],
        user_data=known_wifi,
        broken_before=not unsolvable,
    )


def _gold(
    category: str, issues: list[str], issue: _Issue, unsolvable: bool
) -> tuple[list[Call], dict[str, list[str]]]:
    """The gold actions (identify, the symptom's check, each issue's fix, the check again or the
    transfer to a human) and the arguments compared of those that are compared loosely."""
    first_check, last_check = {
        "service_issue": ("check_status_bar", "check_status_bar"),
        "mobile_data_issue": ("run_speed_test", "run_speed_test"),
        "mms_issue": ("can_send_mms", "can_send_mms"),
    }[category]
    gold: list[Call] = [identify_by_phone(issue.case), ("user", first_check, {})]
    for name in issues:
        gold += issue.fix(name)
    compare: dict[str, list[str]] = {}
    if unsolvable:
        gold.append(
            ("assistant", "transfer_to_human_agents", {"summary": "The customer has no service."})
        )
        compare["transfer_to_human_agents"] = []
    else:
        gold.append(("user", last_check, {}))
    return gold, compare


def _assertions(category: str, issues: list[str], issue: _Issue, unsolvable: bool) -> list[Call]:
    """What must hold at the end: the symptom gone (or still there, when unsolvable), the overdue
    bill paid, the data refueled."""
    case = issue.case
    assertions: list[Call]
    if unsolvable:
        assertions = [("user", "assert_service_status", {"expected_status": "no_service"})]
    elif category == "service_issue":
        assertions = [("user", "assert_service_status", {"expected_status": "connected"})]
    elif category == "mobile_data_issue":
        assertions = [
            ("user", "assert_mobile_data_status", {"expected_status": True}),
            (
                "user",
                "assert_internet_speed",
                {"expected_speed": 200, "expected_desc": "excellent"},
            ),
        ]
    else:
        assertions = [("user", "assert_can_send_mms", {"expected_status": True})]
    if any(i in SUSPENSIONS for i in issues) and not unsolvable:
        assertions.append(
            ("assistant", "assert_no_overdue_bill", {"overdue_bill_id": issue.overdue_bill})
        )
    if "data_usage_exceeded" in issues:
        assertions.append(
            (
                "assistant",
                "assert_data_refueling_amount",
                {"customer_id": case.cid, "line_id": case.lid, "expected_amount": issue.refuel_gb},
            )
        )
    return assertions


def _user_story(
    category: str, issues: list[str], issue: _Issue, unsolvable: bool
) -> tuple[str, list[str]]:
    """Why the customer calls, and the steps of the user's instructions."""
    reason = {
        "service_issue": "Your phone shows 'No Service': you cannot make or receive calls.",
        "mobile_data_issue": (
            "Mobile data on your phone does not work properly: it is very slow or does not "
            "work at all. You want it fixed, and you will only accept an excellent internet "
            "speed on your phone, nothing less."
        ),
        "mms_issue": "You cannot send picture messages (MMS) from your phone, and you want that fixed.",
    }[category]
    done = {
        "service_issue": "You consider the issue solved when the status bar shows that you have signal.",
        "mobile_data_issue": "You consider the issue solved only when a speed test gives an excellent speed.",
        "mms_issue": "You consider the issue solved when your phone says it can send MMS messages.",
    }[category]
    steps = [
        "Follow the agent's guidance on your phone; if a step does not fix the issue at once, say "
        "you are a little frustrated, but carry on.",
        done,
    ]
    if "wifi_connected_home" in issues:
        reason += " It is only a problem when you are away from your home Wi-Fi."
    if "data_usage_exceeded" in issues:
        steps.append(
            f"If necessary you are willing to refuel {issue.refuel_gb} GB of data, but you do not "
            "want to change your plan."
        )
    if any(i in SUSPENSIONS for i in issues):
        steps.append("If the agent asks you to pay a bill, you accept and pay it.")
    if "bad_vpn_reconnect" in issues:
        steps.append(
            "You need your VPN for work: if the agent asks you to disconnect it, you do, but then "
            "you ask whether you may connect it again, and you connect it again."
        )
    if "break_apn_mms_setting_no_reboot" in issues:
        steps.append(
            "You are waiting for an important call and cannot restart your phone today; refuse "
            "any restart and ask for another way."
        )
    if unsolvable:
        steps.append("If the agent transfers you to a human agent, you accept.")
    steps.append(GROUNDING)
    return reason, steps


def troubleshooting_tasks(
    db: dict[str, Any], cases: Iterator[Case], rng: random.Random
) -> list[Draft]:
    """One task for each combination of issues in `SERVICE`, `MOBILE_DATA` and `MMS`, each on a
    line from `cases` the issues can break."""
    overdue = {b["customer_id"] for b in db["bills"] if b["status"] == "Overdue"}
    drafts: list[Draft] = []
    for category, combos in (
        ("service_issue", SERVICE),
        ("mobile_data_issue", MOBILE_DATA),
        ("mms_issue", MMS),
    ):
        for issues in combos:
            suspended = any(i in SUSPENSIONS for i in issues)
            for case in cases:
                if suspended and case.cid in overdue:
                    continue
                if "data_usage_exceeded" in issues and case.plan["data_limit_gb"] >= 100:
                    continue
                break
            drafts.append(troubleshooting_task(category, issues, case, rng))
    return drafts
