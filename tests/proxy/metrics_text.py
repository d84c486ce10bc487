"""Reading the proxy's `/metrics` page: one sample of Prometheus exposition text by name and labels."""

from __future__ import annotations

import re


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus exposition text (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if match and match.group(1) == name:
            have = ",".join(sorted(match.group(2).split(",")))
            if have == want:
                return float(match.group(3))
    return 0.0
