"""The phone's tools: each changes exactly the state it should, answers τ²-bench's texts, and the
network search, speed test and MMS check follow τ²-bench's rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from evalkit.domains.telecom.user_data_model import (
    NetworkStatus,
    NetworkTechnology,
    PaymentRequest,
    SignalStrength,
    TelecomUserDB,
)
from evalkit.domains.telecom.user_tools import TelecomUserTools

Setup = Callable[[TelecomUserTools], Any]


def make_phone(*setups: Setup) -> TelecomUserTools:
    """A phone in the default state, connected after a network search, then `setups` applied."""
    phone = TelecomUserTools(TelecomUserDB())
    phone.simulate_network_search()
    for setup in setups:
        setup(phone)
    return phone


def changed_paths(before: Any, after: Any, path: str = "") -> set[str]:
    """The dotted paths of the leaves that differ between two JSON-like values."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: set[str] = set()
        for key in before.keys() | after.keys():
            out |= changed_paths(before.get(key), after.get(key), f"{path}.{key}".lstrip("."))
        return out
    return set() if before == after else {path}


def pay_request(phone: TelecomUserTools) -> None:
    phone.surroundings.payment_request = PaymentRequest(bill_id="B1", amount_due=40.0)


def pending_apn_reset(phone: TelecomUserTools) -> None:
    phone.break_apn_mms_setting()
    phone.reset_apn_settings()


RADIO = {
    "device.network_connection_status",
    "device.network_technology_connected",
    "device.network_signal_strength",
}

# tool, arguments, set-up before the call, the state the call must change (nothing for checks)
DEVICE_TOOLS: list[tuple[str, dict[str, Any], list[Setup], set[str]]] = [
    ("check_status_bar", {}, [], set()),
    ("check_network_status", {}, [], set()),
    ("check_network_mode_preference", {}, [], set()),
    (
        "set_network_mode_preference",
        {"mode": "3g_only"},
        [],
        {"device.network_mode_preference"} | RADIO - {"device.network_connection_status"},
    ),
    ("run_speed_test", {}, [], set()),
    ("toggle_airplane_mode", {}, [], {"device.airplane_mode"} | RADIO),
    ("check_sim_status", {}, [], set()),
    (
        "reseat_sim_card",
        {},
        [lambda p: p.unseat_sim_card()],
        {"device.sim_card_missing"} | RADIO,
    ),
    ("toggle_data", {}, [], {"device.data_enabled"}),
    ("toggle_roaming", {}, [], {"device.roaming_enabled"}),
    ("check_data_restriction_status", {}, [], set()),
    ("toggle_data_saver_mode", {}, [], {"device.data_saver_mode"}),
    ("check_apn_settings", {}, [], set()),
    (
        "set_apn_settings",
        {"apn_settings": {"apn_name": "internet", "mmsc_url": None}},
        [],
        {"device.active_apn_settings.mmsc_url"},
    ),
    ("reset_apn_settings", {}, [], {"device.active_apn_settings.reset_at_reboot"}),
    ("check_wifi_status", {}, [], set()),
    ("toggle_wifi", {}, [], {"device.wifi_enabled"}),
    ("check_wifi_calling_status", {}, [], set()),
    ("toggle_wifi_calling", {}, [], {"device.wifi_calling_enabled"}),
    ("check_vpn_status", {}, [], set()),
    ("connect_vpn", {}, [], {"device.vpn_connected", "device.vpn_details"}),
    (
        "disconnect_vpn",
        {},
        [lambda p: p.break_vpn()],
        {"device.vpn_connected", "device.vpn_details"},
    ),
    ("check_installed_apps", {}, [], set()),
    ("check_app_status", {"app_name": "messaging"}, [], set()),
    ("check_app_permissions", {"app_name": "messaging"}, [], set()),
    (
        "grant_app_permission",
        {"app_name": "messaging", "permission": "network"},
        [],
        {"device.app_statuses.messaging.permissions.network"},
    ),
    ("can_send_mms", {}, [], set()),
    (
        "reboot_device",
        {},
        [pending_apn_reset],
        {"device.active_apn_settings.mmsc_url", "device.active_apn_settings.reset_at_reboot"},
    ),
    ("check_payment_request", {}, [pay_request], set()),
    ("make_payment", {}, [pay_request], {"surroundings.payment_request.paid"}),
]


def test_the_table_covers_every_device_tool_once() -> None:
    assert sorted(row[0] for row in DEVICE_TOOLS) == TelecomUserTools.tool_names()
    assert len(TelecomUserTools.tool_names()) == 30


@pytest.mark.parametrize(
    ("tool", "arguments", "setups", "expected"), DEVICE_TOOLS, ids=[r[0] for r in DEVICE_TOOLS]
)
def test_each_device_tool_changes_exactly_its_state(
    tool: str, arguments: dict[str, Any], setups: list[Setup], expected: set[str]
) -> None:
    phone = make_phone(*setups)
    before = phone.db.model_dump(mode="json")
    answer = phone.call(tool, arguments)
    assert isinstance(answer, str)
    assert answer
    assert changed_paths(before, phone.db.model_dump(mode="json")) == expected
    assert TelecomUserTools.mutates(tool) == bool(expected)


def test_status_bar_and_speed_test_answer_tau2_benchs_texts() -> None:
    phone = make_phone()
    assert phone.check_status_bar() == "Status Bar: 📶⁴ Excellent | 5G | 📱 Data Enabled | 🔋 80%"
    assert phone.run_speed_test() == (
        "Speed Test Result: 275.00 Mbps (Excellent). Connection is very fast."
    )
    assert (
        phone.toggle_airplane_mode()
        == "Airplane Mode is now ON.\nStatus Bar: ✈️ Airplane Mode | 🔋 80%"
    )
    assert phone.run_speed_test() == "Speed test failed: No Connection."


def test_data_saver_and_a_poor_vpn_slow_the_speed_test_down() -> None:
    phone = make_phone(lambda p: p.turn_data_saver_mode_on())
    assert phone.run_speed_test().startswith("Speed Test Result: 55.00 Mbps (Good).")
    phone = make_phone(lambda p: p.break_vpn())
    assert phone.run_speed_test().startswith("Speed Test Result: 27.50 Mbps (Good).")
    assert "<PerformanceLevel.POOR: 'poor'>" in phone.check_vpn_status()


@pytest.mark.parametrize(
    ("mode", "technology", "signal"),
    [
        ("4g_5g_preferred", NetworkTechnology.FIVE_G, SignalStrength.EXCELLENT),
        ("4g_only", NetworkTechnology.FOUR_G, SignalStrength.GOOD),
        ("3g_only", NetworkTechnology.THREE_G, SignalStrength.FAIR),
        ("2g_only", NetworkTechnology.TWO_G, SignalStrength.POOR),
    ],
)
def test_the_network_search_follows_the_mode_and_the_local_signal(
    mode: str, technology: NetworkTechnology, signal: SignalStrength
) -> None:
    phone = make_phone()
    phone.set_network_mode_preference(mode)
    assert phone.device.network_technology_connected == technology
    assert phone.device.network_signal_strength == signal
    assert phone.device.network_connection_status == NetworkStatus.CONNECTED


def test_an_unknown_network_mode_is_refused_without_a_change() -> None:
    phone = make_phone()
    answer = phone.set_network_mode_preference("6g")
    assert answer.startswith("Failed to set network mode: '6g' is not a valid option.")
    assert "4g_5g_preferred, 4g_only, 3g_only, 2g_only" in answer
    assert phone.device.network_mode_preference == "4g_5g_preferred"


@pytest.mark.parametrize(
    "breakage",
    [
        lambda p: p.turn_airplane_mode_on(),
        lambda p: p.unseat_sim_card(),
        lambda p: p.lock_sim_card("pin"),
        lambda p: p.break_apn_settings(),
        lambda p: setattr(p.surroundings, "line_active", False) or p.simulate_network_search(),
    ],
    ids=["airplane", "no-sim", "locked-sim", "broken-apn", "inactive-line"],
)
def test_each_cause_of_no_service_cuts_the_connection(breakage: Setup) -> None:
    phone = make_phone(breakage)
    assert phone.assert_service_status("no_service")
    assert not phone.assert_mobile_data_status(True)
    assert phone.check_status_bar().startswith(("Status Bar: ✈️", "Status Bar: 📵 No Signal"))


@pytest.mark.parametrize(
    "breakage",
    [
        lambda p: p.set_network_mode_preference("2g_only"),
        lambda p: p.set_wifi_calling(True, mms_over_wifi=True),
        lambda p: p.remove_app_permission("messaging", "sms"),
        lambda p: p.remove_app_permission("messaging", "storage"),
        lambda p: p.break_apn_mms_setting(),
        lambda p: p.turn_data_off(),
    ],
    ids=[
        "2g",
        "wifi-calling-mms",
        "no-sms-permission",
        "no-storage-permission",
        "no-mmsc",
        "data-off",
    ],
)
def test_each_cause_of_failing_mms_is_detected(breakage: Setup) -> None:
    assert make_phone().assert_can_send_mms(True)
    phone = make_phone(breakage)
    assert phone.can_send_mms() == "Your messaging app cannot send MMS messages."


def test_abroad_data_needs_roaming_on_the_phone_and_on_the_line() -> None:
    phone = make_phone(lambda p: p.set_user_location(True))
    assert not phone.assert_mobile_data_status(True)
    phone.turn_roaming_on()
    assert not phone.assert_mobile_data_status(True)
    phone.surroundings.roaming_allowed = True
    assert phone.assert_mobile_data_status(True)


def test_a_reset_apn_applies_only_at_the_next_reboot() -> None:
    phone = make_phone(lambda p: p.break_apn_settings())
    phone.reset_apn_settings()
    assert phone.assert_service_status("no_service")
    assert phone.reboot_device().startswith(
        "Resetting APN settings...\nRestarting network services..."
    )
    assert phone.assert_service_status("connected")


def test_grant_of_an_untracked_permission_or_app_answers_an_error_text() -> None:
    phone = make_phone()
    assert phone.grant_app_permission("messaging", "camera").startswith(
        "Error. Permission 'camera' not tracked for app 'messaging', available permissions: "
        "['sms', 'storage', 'phone', 'network']"
    )
    assert phone.grant_app_permission("maps", "sms").startswith(
        "Error. App 'maps' not found. Cannot grant permission."
    )


def test_wifi_cannot_change_in_airplane_mode() -> None:
    phone = make_phone(lambda p: p.turn_airplane_mode_on())
    assert phone.toggle_wifi().startswith("Cannot change Wi-Fi settings while Airplane Mode is ON.")
    assert not phone.device.wifi_enabled


def test_make_payment_without_a_request_changes_nothing() -> None:
    phone = make_phone()
    assert phone.check_payment_request() == "No payment request has been made."
    assert phone.make_payment() == "You do not have a payment request."
