"""What the phone's state means: the status bar, the SIM, the network search that decides the
cellular connection, whether mobile data and MMS work, and the speed test.

Plain functions over a `MockPhoneAttributes` and the customer's `UserSurroundings`; the tools of
`user_tools.py` change the settings and read their effects here. Texts and numbers are τ²-bench's.
"""

from __future__ import annotations

from evalkit.domains.telecom.user_data_model import (
    APNNames,
    AppPermissions,
    MockPhoneAttributes,
    NetworkModePreference,
    NetworkStatus,
    NetworkTechnology,
    PerformanceLevel,
    SignalStrength,
    SimStatus,
    UserSurroundings,
)

SIGNAL_ICONS = {
    SignalStrength.NONE: "📵 No Signal",
    SignalStrength.POOR: "📶¹ Poor",
    SignalStrength.FAIR: "📶² Fair",
    SignalStrength.GOOD: "📶³ Good",
    SignalStrength.EXCELLENT: "📶⁴ Excellent",
}

# Download speed range (Mbps) of each technology; the speed is its midpoint times the factors.
TECH_SPEED = {
    NetworkTechnology.TWO_G: (0.1, 0.4),
    NetworkTechnology.THREE_G: (1.0, 5.0),
    NetworkTechnology.FOUR_G: (10.0, 100.0),
    NetworkTechnology.FIVE_G: (50.0, 500.0),
    NetworkTechnology.NONE: (0.0, 0.0),
}
SIGNAL_FACTOR = {
    SignalStrength.POOR: 0.2,
    SignalStrength.FAIR: 0.5,
    SignalStrength.GOOD: 0.8,
    SignalStrength.EXCELLENT: 1.0,
    SignalStrength.NONE: 0.0,
}
SPEED_ADVICE = {
    "Very Poor": "Connection is very slow. Basic web browsing might be difficult.",
    "Poor": "Connection is slow. Web browsing may be sluggish, streaming difficult.",
    "Fair": "Connection is okay for web browsing and some standard definition streaming.",
    "Good": "Connection is good for most activities, including HD streaming.",
    "Excellent": "Connection is very fast.",
}
MODE_TECHNOLOGY = {
    NetworkModePreference.FOUR_G_ONLY: NetworkTechnology.FOUR_G,
    NetworkModePreference.THREE_G_ONLY: NetworkTechnology.THREE_G,
    NetworkModePreference.TWO_G_ONLY: NetworkTechnology.TWO_G,
}
SIM_TEXT = {
    SimStatus.ACTIVE: "Your SIM card is active and working.",
    SimStatus.MISSING: "No SIM card detected in the phone.",
    SimStatus.LOCKED_PIN: "The SIM card is locked with a PIN code.",
    SimStatus.LOCKED_PUK: "The SIM card is locked with a PUK code.",
}


def status_bar(device: MockPhoneAttributes) -> str:
    """The icons of the status bar, as the customer reads them."""
    icons: list[str] = []
    if device.airplane_mode:
        icons.append("✈️ Airplane Mode")
    else:
        icons.append(SIGNAL_ICONS.get(device.network_signal_strength, "📵 No Signal"))
        connected = device.network_technology_connected != NetworkTechnology.NONE
        if connected:
            icons.append(device.network_technology_connected.value)
        if device.data_enabled and connected:
            icons.append("📱 Data Enabled")
            if device.data_saver_mode:
                icons.append("🔽 Data Saver")
        else:
            icons.append("📵 Data Disabled")
    if device.wifi_enabled and device.wifi_connected:
        icons.append(f"📡 Connected to {device.wifi_ssid}" if device.wifi_ssid else "📡 Enabled")
    if device.vpn_connected:
        icons.append("🔒 VPN Connected")
    icons.append(f"🔋 {device.battery_level}%")
    return " | ".join(icons)


def sim_status(device: MockPhoneAttributes) -> SimStatus:
    """The SIM card's status; a SIM that is out of the phone is missing whatever its lock."""
    if device.sim_card_missing:
        return SimStatus.MISSING
    return device.sim_card_status


def mobile_data_working(device: MockPhoneAttributes, around: UserSurroundings) -> bool:
    """Whether mobile data works: service, roaming where the customer is, the setting, the allowance."""
    if device.airplane_mode or device.network_signal_strength == SignalStrength.NONE:
        return False
    if device.network_connection_status == NetworkStatus.NO_SERVICE:
        return False
    if around.is_abroad and not (device.roaming_enabled and around.roaming_allowed):
        return False
    if not device.data_enabled:
        return False
    return not around.mobile_data_usage_exceeded


def speed_test(device: MockPhoneAttributes, around: UserSurroundings) -> tuple[float | None, str]:
    """The download speed in Mbps and its description (`None` and 'No Connection' without data)."""
    if not mobile_data_working(device, around):
        return None, "No Connection"
    factor = 1.0
    if (
        device.vpn_connected
        and device.vpn_details is not None
        and device.vpn_details.server_performance == PerformanceLevel.POOR
    ):
        factor = 0.1
    if device.data_saver_mode:
        factor *= 0.2
    low, high = TECH_SPEED.get(device.network_technology_connected, (0.0, 0.0))
    signal = SIGNAL_FACTOR.get(device.network_signal_strength, 0.0)
    speed = round((low + high) / 2.0 * signal * factor, 2)
    if speed < 1:
        return speed, "Very Poor"
    if speed < 5:
        return speed, "Poor"
    if speed < 25:
        return speed, "Fair"
    if speed < 100:
        return speed, "Good"
    return speed, "Excellent"


def can_send_mms(device: MockPhoneAttributes, around: UserSurroundings) -> bool:
    """Whether the messaging app can send MMS."""
    # MMS travels over mobile data, even with Wi-Fi, and needs at least 3G.
    if not mobile_data_working(device, around):
        return False
    if device.network_technology_connected == NetworkTechnology.TWO_G:
        return False
    # The carrier does not carry MMS over Wi-Fi calling.
    if device.wifi_calling_enabled and device.wifi_calling_mms_over_wifi:
        return False
    if device.active_apn_settings.mmsc_url is None:
        return False
    messaging = device.app_statuses.get("messaging")
    return messaging is not None and messaging.permissions.storage and messaging.permissions.sms


def network_search(device: MockPhoneAttributes, around: UserSurroundings) -> None:
    """Decide the cellular connection from the SIM, the mode preference and the signal where
    the customer is; airplane mode, a broken APN or an inactive line mean no service."""
    if sim_status(device) == SimStatus.ACTIVE:
        device.network_connection_status = NetworkStatus.CONNECTED
        technology = MODE_TECHNOLOGY.get(device.network_mode_preference)
        if technology is None:  # 4G/5G preferred: 5G where there is 5G signal
            five_g = around.signal_strength.get(NetworkTechnology.FIVE_G, SignalStrength.NONE)
            technology = (
                NetworkTechnology.FOUR_G
                if five_g == SignalStrength.NONE
                else NetworkTechnology.FIVE_G
            )
        device.network_technology_connected = technology
        device.network_signal_strength = around.signal_strength.get(technology, SignalStrength.NONE)
    else:
        lose_service(device)
    if (
        device.airplane_mode
        or device.active_apn_settings.apn_name == APNNames.BROKEN
        or not around.line_active
    ):
        lose_service(device)


def lose_service(device: MockPhoneAttributes) -> None:
    """Drop the cellular connection."""
    device.network_connection_status = NetworkStatus.NO_SERVICE
    device.network_technology_connected = NetworkTechnology.NONE
    device.network_signal_strength = SignalStrength.NONE


def drop_wifi(device: MockPhoneAttributes) -> None:
    """Disconnect Wi-Fi, leaving the radio as it is."""
    device.wifi_connected = False
    device.wifi_ssid = None
    device.wifi_signal_strength = SignalStrength.NONE


def disconnect_vpn(device: MockPhoneAttributes) -> bool:
    """Disconnect the VPN; whether one was connected."""
    if not device.vpn_connected:
        return False
    device.vpn_connected = False
    device.vpn_details = None
    return True


def on_off(value: bool) -> str:
    """'ON' or 'OFF'."""
    return "ON" if value else "OFF"


def granted_permissions(permissions: AppPermissions) -> list[str]:
    """The names of the permissions an app has, as the customer reads them."""
    return [name.replace("_", " ").lower() for name, on in permissions.model_dump().items() if on]
