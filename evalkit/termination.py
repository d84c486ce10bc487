"""How an episode ends: τ²-bench's termination reasons, the one spelling every module imports."""

from __future__ import annotations

import enum
from typing import Final


class TerminationReason(enum.StrEnum):
    """Why an episode ended (τ²-bench's values, as results files record them)."""

    USER_STOP = "user_stop"
    AGENT_STOP = "agent_stop"
    TOO_MANY_ERRORS = "too_many_errors"
    MAX_STEPS = "max_steps"
    AGENT_ERROR = "agent_error"
    USER_ERROR = "user_error"
    INFRASTRUCTURE_ERROR = "infrastructure_error"


NORMAL_ENDINGS: Final = frozenset({TerminationReason.USER_STOP, TerminationReason.AGENT_STOP})
"""The endings whose episodes are scored; every other one scores 0 without a check."""
