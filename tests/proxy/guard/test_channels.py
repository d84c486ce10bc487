from proxy.guard.channels import Channel, Violation


def test_only_channels_that_happened_elsewhere_are_not_repairable() -> None:
    not_repairable = {c for c in Channel if not c.repairable}
    assert not_repairable == {Channel.TOOL_ERROR, Channel.UPSTREAM_ERROR}


def test_violation_dict_leaves_out_what_it_does_not_know() -> None:
    v = Violation(Channel.EMPTY_RESPONSE, "no content and no tool calls")
    assert v.to_dict() == {"channel": "empty_response", "message": "no content and no tool calls"}
    w = Violation(Channel.SCHEMA_VIOLATION, "bad", "f", 1, "call_1", ("/order_id",))
    assert w.to_dict()["pointers"] == ["/order_id"]
