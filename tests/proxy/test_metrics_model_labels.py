"""Model label values in the metrics are bounded (issue 32): a client's model names never become
label values beyond the configured models; the real app on a loopback port."""

from __future__ import annotations

from collections.abc import Callable

from proxy.testing import completion
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import samples


def model_labels(text: str) -> set[str]:
    return {
        labels["model"]
        for name, labels, _ in samples(text)
        if name == "toolsentry_requests_total" and "model" in labels
    }


def test_model_labels_are_the_configured_models_then_other(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(
        upstreams=[
            {"name": "scripted", "base_url": upstream.base_url, "models": ["scripted-model"]}
        ],
        repair="off",
    )
    upstream.script.push(completion("ok"))
    with proxy.http() as http:
        for i in range(100):
            model = "scripted-model" if i % 10 == 0 else f"client-chosen-{i}"
            assert http.post("/v1/chat/completions", json=make_request(model=model)).is_success
    assert model_labels(proxy.metrics()) == {"scripted-model", "other"}
