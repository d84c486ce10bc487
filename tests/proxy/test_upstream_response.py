"""What an upstream answers, as the proxy reads it: an error status becomes the proxy's error."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import UpstreamStatusError
from proxy.upstream_response import UpstreamResponse, raise_for_status


def test_an_older_vllm_flat_error_body_is_put_into_the_openai_shape() -> None:
    flat = {
        "object": "error",
        "message": "bad n",
        "type": "BadRequestError",
        "param": "n",
        "code": 400,
    }
    response = UpstreamResponse(400, {}, orjson.dumps(flat), 0.0)
    with pytest.raises(UpstreamStatusError) as caught:
        raise_for_status(response, "s")
    assert caught.value.message == "bad n"
    assert caught.value.body() == {
        "error": {"message": "bad n", "type": "BadRequestError", "param": "n", "code": 400}
    }
