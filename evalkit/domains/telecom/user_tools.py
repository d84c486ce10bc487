"""The customer's phone: the tools the user operates in telecom, over a `TelecomUserDB`.

Names, signatures, answers and effects are τ²-bench's: every answer the customer reads (the
status bar with its icons, "Speed Test Result: 275.00 Mbps (Excellent). …") is the same text,
and every setting changes the same fields. Changing a radio setting re-runs the network search
(`simulate_network_search`), which decides the connection from the SIM, the network mode
preference, airplane mode, the APN, the signal where the customer is, and whether the carrier
keeps the line active.
What the state means (the status bar, the search itself, whether data and MMS work, the speed
test) is worked out in `phone_state.py`.

Besides the tools, the class holds the set-up functions τ²-bench's tasks call to break the phone
(`turn_airplane_mode_on`, `unseat_sim_card`, `break_vpn`, …) and the assertions they check
(`assert_*`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evalkit.domains.base import Toolkit, tool
from evalkit.domains.telecom.phone_state import (
    SIM_TEXT,
    SPEED_ADVICE,
    can_send_mms,
    disconnect_vpn,
    drop_wifi,
    granted_permissions,
    mobile_data_working,
    network_search,
    on_off,
    sim_status,
    speed_test,
    status_bar,
)
from evalkit.domains.telecom.user_data_model import (
    APNNames,
    APNSettings,
    AppPermissions,
    MockPhoneAttributes,
    NetworkModePreference,
    NetworkStatus,
    PerformanceLevel,
    SimStatus,
    TelecomUserDB,
    UserSurroundings,
    VpnDetails,
)

DEFAULT_VPN = VpnDetails(
    server_address="192.168.1.1",
    protocol="OpenVPN",
    server_performance=PerformanceLevel.EXCELLENT,
)


class TelecomUserTools(Toolkit):
    """What the customer can do on their phone."""

    db: TelecomUserDB

    def __init__(self, db: TelecomUserDB) -> None:
        super().__init__(db)

    @property
    def device(self) -> MockPhoneAttributes:
        """The phone's current state."""
        return self.db.device

    @property
    def surroundings(self) -> UserSurroundings:
        """The customer's surroundings."""
        return self.db.surroundings

    # -- who and where (set-up) ------------------------------------------------------------

    def set_user_info(self, name: str, phone_number: str) -> None:
        """Say whose phone this is: the name and the number of the line it uses."""
        self.surroundings.name = name
        self.surroundings.phone_number = phone_number

    def set_user_location(self, abroad: bool) -> None:
        """Put the customer abroad, or at home."""
        self.surroundings.is_abroad = abroad

    # -- status bar and network ------------------------------------------------------------

    @tool()
    def check_status_bar(self) -> str:
        """Show the icons in the phone's status bar: signal strength and network type, whether
        mobile data is on (and Data Saver), Wi-Fi, VPN, and the battery level."""
        return f"Status Bar: {status_bar(self.device)}"

    def _with_status_bar(self, text: str) -> str:
        return f"{text}\nStatus Bar: {status_bar(self.device)}"

    @tool()
    def check_network_status(self) -> str:
        """Show the phone's connection to the cellular network and Wi-Fi: airplane mode, SIM,
        connection, signal strength, network type, mobile data, data roaming, Wi-Fi."""
        device = self.device
        lines = [
            f"Airplane Mode: {on_off(device.airplane_mode)}",
            f"SIM Card Status: {sim_status(device).value}",
            f"Cellular Connection: {device.network_connection_status.value}",
            f"Cellular Signal: {device.network_signal_strength.value}",
            f"Cellular Network Type: {device.network_technology_connected.value}",
            f"Mobile Data Enabled: {'Yes' if device.data_enabled else 'No'}",
            f"Data Roaming Enabled: {'Yes' if device.roaming_enabled else 'No'}",
            f"Wi-Fi Radio: {on_off(device.wifi_enabled)}",
            f"Wi-Fi Connected: {'Yes' if device.wifi_connected else 'No'}",
        ]
        if device.wifi_connected:
            lines.append(f"Connected Wi-Fi Network: {device.wifi_ssid}")
        return "\n".join(lines)

    @tool()
    def check_network_mode_preference(self) -> str:
        """Show which type of cellular network the phone prefers."""
        return f"Network Mode Preference: {self.device.network_mode_preference.value}"

    @tool(mutates=True)
    def set_network_mode_preference(self, mode: str) -> str:
        """Choose which type of cellular network the phone prefers; faster networks (4G/5G) give
        faster data and may use more battery.

        Args:
            mode: One of '4g_5g_preferred', '4g_only', '3g_only', '2g_only'.
        """
        try:
            preference = NetworkModePreference(mode)
        except ValueError:
            valid = ", ".join(m.value for m in NetworkModePreference)
            return self._with_status_bar(
                f"Failed to set network mode: '{mode}' is not a valid option. Please use one of: {valid}"
            )
        self.device.network_mode_preference = preference
        self.simulate_network_search()
        return self._with_status_bar(f"Preferred Network Mode set to: {preference.value}")

    @tool()
    def run_speed_test(self) -> str:
        """Measure the phone's mobile download speed and say what it is good enough for."""
        speed, description = speed_test(self.device, self.surroundings)
        if speed is None:
            return f"Speed test failed: {description or 'Could not determine speed'}."
        advice = SPEED_ADVICE.get(description, "")
        return f"Speed Test Result: {speed:.2f} Mbps ({description}). {advice}"

    # -- airplane mode ---------------------------------------------------------------------

    @tool(mutates=True)
    def toggle_airplane_mode(self) -> str:
        """Switch Airplane Mode on or off. On, it cuts every radio: cellular, Wi-Fi, Bluetooth."""
        state = self._toggle_airplane_mode()
        return self._with_status_bar(f"Airplane Mode is now {on_off(state)}.")

    def _toggle_airplane_mode(self) -> bool:
        device = self.device
        was_on = device.airplane_mode
        device.airplane_mode = not was_on
        if was_on:
            device.network_connection_status = NetworkStatus.SEARCHING
            if device.wifi_enabled:
                drop_wifi(device)
        else:
            drop_wifi(device)
            if device.vpn_connected:
                disconnect_vpn(device)
        self.simulate_network_search()
        return device.airplane_mode

    def turn_airplane_mode_on(self) -> str:
        """Put the phone in Airplane Mode (a task's set-up)."""
        _switch(self._toggle_airplane_mode, on=True)
        return "Airplane Mode is now ON."

    def turn_airplane_mode_off(self) -> str:
        """Take the phone out of Airplane Mode (a task's set-up)."""
        _switch(self._toggle_airplane_mode, on=False)
        return "Airplane Mode is now OFF."

    # -- SIM card --------------------------------------------------------------------------

    @tool()
    def check_sim_status(self) -> str:
        """Show whether the SIM card works: active, missing, or locked by a PIN or PUK code."""
        status = sim_status(self.device)
        return SIM_TEXT.get(status, f"Unknown SIM status: {status.value}")

    @tool(mutates=True)
    def reseat_sim_card(self) -> str:
        """Take the SIM card out and put it back in, which can fix a SIM the phone does not see."""
        self.device.sim_card_missing = False
        self.simulate_network_search()
        return self._with_status_bar("SIM card re-seated successfully.")

    def unseat_sim_card(self) -> str:
        """Take the SIM card out (a task's set-up; `reseat_sim_card` fixes it)."""
        self.device.sim_card_missing = True
        self.simulate_network_search()
        return "SIM card un-seated successfully."

    def lock_sim_card(self, mode: str) -> str:
        """Lock the SIM card with its PIN (`mode` 'pin') or PUK ('puk'); no tool fixes this."""
        if mode == "pin":
            self.device.sim_card_status = SimStatus.LOCKED_PIN
        elif mode == "puk":
            self.device.sim_card_status = SimStatus.LOCKED_PUK
        self.simulate_network_search()
        return f"SIM card locked successfully in {mode} mode."

    # -- mobile data and roaming -----------------------------------------------------------

    @tool(mutates=True)
    def toggle_data(self) -> str:
        """Switch mobile data on or off: whether the phone may use the cellular network for
        internet when there is no Wi-Fi."""
        state = self._toggle_data()
        return self._with_status_bar(f"Mobile Data is now {on_off(state)}.")

    def _toggle_data(self) -> bool:
        self.device.data_enabled = not self.device.data_enabled
        self.simulate_network_search()
        return self.device.data_enabled

    def turn_data_on(self) -> str:
        """Switch mobile data on (a task's set-up)."""
        self.device.data_enabled = True
        return "Data connection restored."

    def turn_data_off(self) -> str:
        """Switch mobile data off (a task's set-up)."""
        _switch(self._toggle_data, on=False)
        return "Data connection broken."

    @tool(mutates=True)
    def toggle_roaming(self) -> str:
        """Switch Data Roaming on or off: whether the phone may use data on other carriers'
        networks, outside the home coverage."""
        state = self._toggle_roaming()
        return self._with_status_bar(f"Data Roaming is now {on_off(state)}.")

    def _toggle_roaming(self) -> bool:
        self.device.roaming_enabled = not self.device.roaming_enabled
        self.simulate_network_search()
        return self.device.roaming_enabled

    def turn_roaming_on(self) -> str:
        """Switch Data Roaming on (a task's set-up)."""
        _switch(self._toggle_roaming, on=True)
        return "Data Roaming is now ON."

    def turn_roaming_off(self) -> str:
        """Switch Data Roaming off (a task's set-up)."""
        _switch(self._toggle_roaming, on=False)
        return "Data Roaming is now OFF."

    @tool()
    def check_data_restriction_status(self) -> str:
        """Show whether a data-limiting feature is on: Data Saver mode."""
        if self.device.data_saver_mode:
            return "Data Saver mode is ON (limits data usage)."
        return "Data Saver mode is OFF."

    @tool(mutates=True)
    def toggle_data_saver_mode(self) -> str:
        """Switch Data Saver mode on or off. On, it cuts data use and can slow data down."""
        state = self._toggle_data_saver_mode()
        return self._with_status_bar(f"Data Saver Mode is now {on_off(state)}.")

    def _toggle_data_saver_mode(self) -> bool:
        self.device.data_saver_mode = not self.device.data_saver_mode
        return self.device.data_saver_mode

    def turn_data_saver_mode_on(self) -> str:
        """Switch Data Saver mode on (a task's set-up)."""
        self.device.data_saver_mode = True
        return "Data Saver Mode is now ON."

    def turn_data_saver_mode_off(self) -> str:
        """Switch Data Saver mode off (a task's set-up)."""
        self.device.data_saver_mode = False
        return "Data Saver Mode is now OFF."

    # -- APN settings ----------------------------------------------------------------------

    @tool()
    def check_apn_settings(self) -> str:
        """Show the APN settings the phone uses for the carrier's data network: the APN name and
        the MMSC URL that picture messages need."""
        settings = self.device.active_apn_settings
        apn_name = settings.apn_name.value or "Not Set"
        mmsc_url = settings.mmsc_url or "Not Set"
        return (
            f"Current APN Name: {apn_name}\nMMSC URL (for picture messages): {mmsc_url}\n"
            "(These are technical settings, usually best left unchanged.)"
        )

    @tool(mutates=True)
    def set_apn_settings(self, apn_settings: dict[str, Any]) -> str:
        """Replace the phone's APN settings.

        Args:
            apn_settings: The new settings: apn_name ('internet' or 'broken'), reset_at_reboot,
                mms_apn, mmsc_url, mms_proxy, mms_port.
        """
        settings = APNSettings(**apn_settings)
        self.device.active_apn_settings = settings
        self.simulate_network_search()
        return self._with_status_bar(f"APN settings set to: {settings.apn_name.value}")

    @tool(mutates=True)
    def reset_apn_settings(self) -> str:
        """Put the APN settings back to the carrier's defaults (applied at the next reboot)."""
        self.device.active_apn_settings.reset_at_reboot = True
        self.simulate_network_search()
        return self._with_status_bar("APN settings will reset at reboot.")

    def break_apn_settings(self) -> str:
        """Break the APN so the phone loses service (a task's set-up; reset and reboot fix it)."""
        self.device.active_apn_settings.apn_name = APNNames.BROKEN
        self.simulate_network_search()
        return "APN settings broken. Please call reset_apn_settings() to fix."

    def break_apn_mms_setting(self) -> str:
        """Remove the MMSC URL so picture messages fail (a task's set-up; reset and reboot fix it)."""
        self.device.active_apn_settings.mmsc_url = None
        return "APN MMS setting broken. Please call reset_apn_settings() to fix."

    # -- Wi-Fi and Wi-Fi calling -----------------------------------------------------------

    @tool()
    def check_wifi_status(self) -> str:
        """Show whether Wi-Fi is on, which network it is connected to, and its signal."""
        device = self.device
        if not device.wifi_enabled:
            return "Wi-Fi is turned OFF."
        if device.wifi_connected:
            return (
                f"Wi-Fi is ON and connected to '{device.wifi_ssid}'. "
                f"Signal strength: {device.wifi_signal_strength.value}."
            )
        return "Wi-Fi is ON but not connected to any network."

    @tool(mutates=True)
    def toggle_wifi(self) -> str:
        """Switch the Wi-Fi radio on or off (not possible in Airplane Mode)."""
        if self.device.airplane_mode:
            return self._with_status_bar("Cannot change Wi-Fi settings while Airplane Mode is ON.")
        self.device.wifi_enabled = not self.device.wifi_enabled
        if not self.device.wifi_enabled:
            drop_wifi(self.device)
        return self._with_status_bar(f"Wi-Fi is now {on_off(self.device.wifi_enabled)}.")

    @tool()
    def check_wifi_calling_status(self) -> str:
        """Show whether Wi-Fi Calling is on: calls over Wi-Fi instead of the cellular network."""
        return f"Wi-Fi Calling is currently turned {on_off(self.device.wifi_calling_enabled)}."

    @tool(mutates=True)
    def toggle_wifi_calling(self) -> str:
        """Switch Wi-Fi Calling on or off; it can help where the cellular signal is weak."""
        self.device.wifi_calling_enabled = not self.device.wifi_calling_enabled
        return self._with_status_bar(
            f"Wi-Fi Calling is now {on_off(self.device.wifi_calling_enabled)}."
        )

    def set_wifi_calling(self, enabled: bool, mms_over_wifi: bool | None = None) -> str:
        """Set Wi-Fi Calling, and MMS over Wi-Fi when given (a task's set-up)."""
        self.device.wifi_calling_enabled = enabled
        text = f"Wi-Fi Calling is now {on_off(enabled)}."
        if mms_over_wifi is not None:
            self.device.wifi_calling_mms_over_wifi = mms_over_wifi
            text += f"\nMMS over Wi-Fi is now {on_off(mms_over_wifi)}."
        return text

    # -- VPN -------------------------------------------------------------------------------

    @tool()
    def check_vpn_status(self) -> str:
        """Show whether a VPN is on and connected, with the connection's details."""
        device = self.device
        if device.vpn_connected:
            if device.vpn_details is not None:
                return f"VPN is ON and connected. Details: {device.vpn_details.model_dump()}"
            return "VPN is ON and connected (no specific details available)."
        if device.vpn_enabled_setting:
            return "VPN is turned ON in settings, but currently not connected."
        return "VPN is turned OFF."

    @tool(mutates=True)
    def connect_vpn(self) -> str:
        """Connect the phone's VPN."""
        if self.device.vpn_connected:
            return "VPN already connected."
        self.device.vpn_connected = True
        self.device.vpn_details = DEFAULT_VPN.model_copy(deep=True)
        return self._with_status_bar("VPN connected successfully.")

    @tool(mutates=True)
    def disconnect_vpn(self) -> str:
        """Disconnect the VPN, so traffic no longer goes through a VPN server (this can change
        speed and what content is reachable)."""
        if disconnect_vpn(self.device):
            return self._with_status_bar("VPN disconnected successfully.")
        return self._with_status_bar("No active VPN connection to disconnect.")

    def break_vpn(self) -> str:
        """Connect a VPN whose server performs poorly, slowing data (a task's set-up)."""
        self.connect_vpn()
        if self.device.vpn_details is not None:
            self.device.vpn_details.server_performance = PerformanceLevel.POOR
        return "VPN connection broken."

    # -- apps ------------------------------------------------------------------------------

    @tool()
    def check_installed_apps(self) -> str:
        """List the apps installed on the phone."""
        names = ", ".join(self.device.app_statuses)
        return f"The following apps are installed on the phone: {names}"

    @tool()
    def check_app_status(self, app_name: str) -> str:
        """Show an app's details: the permissions it has.

        Args:
            app_name: The app's name, e.g. 'messaging'.
        """
        app = self.device.app_statuses.get(app_name)
        if app is None:
            return f"App '{app_name}' not found on this phone."
        granted = granted_permissions(app.permissions)
        lines = [f"Status for App: {app_name}"]
        if not granted:
            lines.append(" - Permissions: None granted.")
        else:
            lines.append(" - Permissions Granted:")
            lines.extend(f"   - {name}" for name in granted)
        return "\n".join(lines)

    @tool()
    def check_app_permissions(self, app_name: str) -> str:
        """Show which permissions an app has (SMS, storage, phone, network).

        Args:
            app_name: The app's name, e.g. 'messaging'.
        """
        app = self.device.app_statuses.get(app_name)
        if app is None:
            return f"App '{app_name}' not found on this phone."
        granted = granted_permissions(app.permissions)
        if not granted:
            return f"App '{app_name}' currently has no permissions granted."
        return f"App '{app_name}' has permission for: {', '.join(granted)}."

    @tool(mutates=True)
    def grant_app_permission(self, app_name: str, permission: str) -> str:
        """Give an app a permission some of its functions need.

        Args:
            app_name: The app's name, e.g. 'messaging'.
            permission: The permission to give, in lowercase: 'sms', 'storage', 'phone' or 'network'.
        """
        app = self.device.app_statuses.get(app_name)
        permission = permission.lower()
        if app is None:
            text = f"Error. App '{app_name}' not found. Cannot grant permission."
        elif permission not in AppPermissions.model_fields:
            available = list(AppPermissions.model_fields)
            text = f"Error. Permission '{permission}' not tracked for app '{app_name}', available permissions: {available}"
        else:
            setattr(app.permissions, permission, True)
            text = f"Success. Permission '{permission}' granted to app '{app_name}'."
        return self._with_status_bar(text)

    def remove_app_permission(self, app_name: str, permission: str) -> tuple[bool, str]:
        """Take a permission away from an app (a task's set-up)."""
        app = self.device.app_statuses.get(app_name)
        permission = permission.lower()
        if app is None:
            return False, f"App '{app_name}' not found. Cannot remove permission."
        if permission not in AppPermissions.model_fields:
            return False, f"Permission '{permission}' not tracked for app '{app_name}'."
        setattr(app.permissions, permission, False)
        return True, f"Permission '{permission}' removed from app '{app_name}'."

    # -- MMS -------------------------------------------------------------------------------

    @tool()
    def can_send_mms(self) -> str:
        """Check whether the messaging app can send MMS (picture) messages."""
        if can_send_mms(self.device, self.surroundings):
            return "Your messaging app can send MMS messages."
        return "Your messaging app cannot send MMS messages."

    # -- reboot and the network search -----------------------------------------------------

    @tool(mutates=True)
    def reboot_device(self) -> str:
        """Restart the phone, refreshing every service and connection; pending APN resets apply."""
        lines = []
        if self.device.active_apn_settings.reset_at_reboot:
            lines.append("Resetting APN settings...")
            self.device.active_apn_settings = APNSettings()
        lines.append("Restarting network services...")
        self.device.network_connection_status = NetworkStatus.SEARCHING
        self.simulate_network_search()
        return self._with_status_bar("\n".join(lines))

    def simulate_network_search(self) -> None:
        """Decide the cellular connection from the SIM, the mode preference and the signal where
        the customer is; airplane mode, a broken APN or an inactive line mean no service."""
        network_search(self.device, self.surroundings)

    # -- payment requests ------------------------------------------------------------------

    @tool()
    def check_payment_request(self) -> str:
        """Check whether the agent has sent you a request to pay a bill."""
        request = self.surroundings.payment_request
        if request is None:
            return "No payment request has been made."
        return f"You have a payment request for bill {request.bill_id} of {request.amount_due} USD."

    @tool(mutates=True)
    def make_payment(self) -> str:
        """Pay the bill the agent sent you a payment request for."""
        request = self.surroundings.payment_request
        if request is None:
            return "You do not have a payment request."
        request.paid = True
        return f"Payment of {request.amount_due} USD has been made for bill {request.bill_id}."

    # -- assertions of tasks ---------------------------------------------------------------

    def assert_airplane_mode_status(self, expected_status: bool) -> bool:
        """Whether airplane mode is `expected_status`."""
        return self.device.airplane_mode == expected_status

    def assert_service_status(self, expected_status: str) -> bool:
        """Whether the cellular connection is `expected_status` ('connected', 'no_service', …)."""
        return self.device.network_connection_status == NetworkStatus(expected_status)

    def assert_mobile_data_status(self, expected_status: bool) -> bool:
        """Whether mobile data works (`True`) or not (`False`) as expected."""
        return mobile_data_working(self.device, self.surroundings) == expected_status

    def assert_mobile_roaming_status(self, expected_status: bool) -> bool:
        """Whether the phone's Data Roaming setting is `expected_status`."""
        return self.device.roaming_enabled == expected_status

    def assert_mobile_data_saver_mode_status(self, expected_status: bool) -> bool:
        """Whether Data Saver mode is `expected_status`."""
        return self.device.data_saver_mode == expected_status

    def assert_internet_speed(
        self, expected_speed: float, expected_desc: str | None = None
    ) -> bool:
        """Whether the speed test gives at least `expected_speed` Mbps (and `expected_desc`)."""
        speed, description = speed_test(self.device, self.surroundings)
        reached = (speed or 0.0) >= expected_speed
        if expected_desc is None:
            return reached
        return reached and description.lower() == expected_desc.lower()

    def assert_internet_not_excellent(self) -> bool:
        """Whether the speed test gives anything but 'Excellent'."""
        return speed_test(self.device, self.surroundings)[1].lower() != "excellent"

    def assert_can_send_mms(self, expected_status: bool) -> bool:
        """Whether the messaging app can send MMS as expected."""
        return can_send_mms(self.device, self.surroundings) == expected_status

    def assert_mobile_data_usage_exceeded(self, expected_status: bool) -> bool:
        """Whether the line's data allowance is used up as expected."""
        return self.surroundings.mobile_data_usage_exceeded == expected_status


def _switch(toggle: Callable[[], bool], *, on: bool) -> None:
    """Bring a setting to `on` through its toggle (which returns the new state), so that a
    set-up has the side effects of the user's own toggling."""
    if toggle() != on:
        toggle()
