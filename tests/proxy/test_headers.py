"""The proxy's own header names (`proxy/headers.py`): one prefix, lower case, distinct, and the
turn's report writes exactly the report's names."""

from __future__ import annotations

from proxy import headers
from proxy.pipeline.report import TurnReport

REPORTED = (
    headers.SESSION_HEADER,
    headers.ERRORS_HEADER,
    headers.MAX_ERRORS_HEADER,
    headers.REPAIRS_HEADER,
    headers.VIOLATIONS_HEADER,
)
CONTROLS = (headers.MAX_ERRORS_HEADER, headers.REPAIR_HEADER)


def test_every_name_is_lower_case_distinct_and_starts_with_the_prefix() -> None:
    names = {*REPORTED, *CONTROLS}
    assert len(names) == 6
    for name in names:
        assert name == name.lower()
        assert name.startswith(headers.HEADER_PREFIX)


def test_the_turn_report_writes_the_reported_names_with_their_values() -> None:
    report = TurnReport("chat", "m", "s1", 1, 10, 2, ("unknown_tool", "truncated"))
    assert report.headers() == dict(
        zip(REPORTED, ("s1", "1", "10", "2", "unknown_tool,truncated"), strict=True)
    )
