"""Reading the proxy's `/metrics` page: one sample of Prometheus exposition text by name and labels.

A sample that is not there raises, so `metric(...) == 0` cannot pass for a misspelt name or label;
a test that expects a series not to exist yet says so with `may_be_absent=True`, and even then the
metric must be one of the proxy's (declared on the page, or by `proxy.metrics.Metrics`: a
multi-process page lists only the families some worker has written to).
"""

from __future__ import annotations

import functools
import re

from proxy.metrics import Metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)(?: \S+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_DECLARED = re.compile(r"^# TYPE (\S+) \S+$", re.MULTILINE)
# Sample names a metric family exposes besides its own (counters, histograms, summaries).
_SUFFIXES = ("_total", "_count", "_sum", "_bucket", "_created")


class MetricAbsent(AssertionError):
    """The sample asked for is not on the page."""


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of the exposition text as (name, labels, value)."""
    found = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(match.group(2) or "")}
        found.append((match.group(1), labels, float(match.group(3))))
    return found


@functools.cache
def _proxy_families() -> frozenset[str]:
    return frozenset(_DECLARED.findall(Metrics().render().decode()))


def _declared(text: str, name: str) -> bool:
    families = set(_DECLARED.findall(text)) | _proxy_families()
    return name in families or any(
        name.endswith(suffix) and name.removesuffix(suffix) in families for suffix in _SUFFIXES
    )


def metric(text: str, name: str, *, may_be_absent: bool = False, **labels: str) -> float:
    """The value of the sample `name` with exactly `labels`.

    Returns 0.0 for a sample not (yet) exposed only when `may_be_absent` is true and the metric
    is the proxy's or declared on the page. Raises MetricAbsent otherwise, listing the label sets that are there.
    """
    present = []
    for sample, have, value in samples(text):
        if sample == name:
            if have == labels:
                return value
            present.append(have)
    if may_be_absent and _declared(text, name):
        return 0.0
    if not _declared(text, name):
        raise MetricAbsent(f"no metric {name} on the page")
    raise MetricAbsent(f"no sample {name}{labels}; the page has {name} with {present}")
