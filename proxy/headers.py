"""The names of the proxy's own HTTP headers (DESIGN §5), defined once: the per-request controls
a client may send and the turn's report the proxy answers with. The turn, its report, evalkit
and the examples import these names; changing one changes the proxy's interface.

    client -> proxy   x-toolsentry-max-errors: 3      (lower the budget; `allow_overrides`)
                      x-toolsentry-repair: off        (off | reask | constrain; `allow_overrides`)
    proxy -> client   x-toolsentry-session, -errors, -max-errors, -repairs, -violations
"""

from __future__ import annotations

from typing import Final

HEADER_PREFIX: Final = "x-toolsentry-"
"""What every name below starts with (the upstream never gets these; evalkit keeps them)."""

# The controls a request may send (honoured under `allow_overrides`).
MAX_ERRORS_HEADER: Final = "x-toolsentry-max-errors"
"""A lower error budget for this request's session; also the budget the report answers with."""
REPAIR_HEADER: Final = "x-toolsentry-repair"
"""The repair mode of this request (a `RepairMode` value)."""

# The turn's report (`TurnReport.headers`).
SESSION_HEADER: Final = "x-toolsentry-session"
ERRORS_HEADER: Final = "x-toolsentry-errors"
REPAIRS_HEADER: Final = "x-toolsentry-repairs"
VIOLATIONS_HEADER: Final = "x-toolsentry-violations"
"""This response's channels, comma-separated, in the order first found."""
