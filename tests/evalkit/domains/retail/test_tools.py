"""The retail tools behave as τ²-bench's: error texts, state changes, rounding."""

from __future__ import annotations

import pytest

from evalkit.domains.base import Domain, ToolNotFoundError
from evalkit.domains.retail.data_model import GiftCard, RetailDB
from evalkit.domains.retail.tools import RetailTools


def make_tools(domain: Domain) -> RetailTools:
    tools, _ = domain.fresh_toolkits()
    assert isinstance(tools, RetailTools)
    return tools


def first_order(db: RetailDB, status: str) -> str:
    return next(o.order_id for o in db.orders.values() if o.status == status)


def test_tool_names_are_tau2_benchs(retail: Domain) -> None:
    assert RetailTools.tool_names() == sorted(
        [
            "calculate",
            "cancel_pending_order",
            "exchange_delivered_order_items",
            "find_user_id_by_email",
            "find_user_id_by_name_zip",
            "get_item_details",
            "get_order_details",
            "get_product_details",
            "get_user_details",
            "list_all_product_types",
            "modify_pending_order_address",
            "modify_pending_order_items",
            "modify_pending_order_payment",
            "modify_user_address",
            "return_delivered_order_items",
            "transfer_to_human_agents",
        ]
    )


def test_only_the_database_changing_tools_are_marked_as_mutating() -> None:
    mutating = {n for n in RetailTools.tool_names() if RetailTools.mutates(n)}
    assert mutating == {
        "cancel_pending_order",
        "exchange_delivered_order_items",
        "modify_pending_order_address",
        "modify_pending_order_items",
        "modify_pending_order_payment",
        "modify_user_address",
        "return_delivered_order_items",
    }


def test_openai_schemas_name_every_parameter_with_types_and_required() -> None:
    schemas = {s["function"]["name"]: s for s in RetailTools.openai_tools()}
    params = schemas["modify_pending_order_items"]["function"]["parameters"]
    assert params["required"] == ["order_id", "item_ids", "new_item_ids", "payment_method_id"]
    assert params["properties"]["item_ids"]["type"] == "array"
    assert params["properties"]["item_ids"]["items"] == {"type": "string"}
    assert params["properties"]["order_id"]["description"]
    assert schemas["list_all_product_types"]["function"]["parameters"]["required"] == []
    assert all(s["type"] == "function" and s["function"]["description"] for s in schemas.values())


def test_unknown_tool_raises_tau2_text(retail: Domain) -> None:
    with pytest.raises(ToolNotFoundError, match=r"^Tool 'nope' not found\.$"):
        make_tools(retail).call("nope", {})


def test_missing_argument_raises_python_text_naming_retailtools(retail: Domain) -> None:
    with pytest.raises(TypeError) as info:
        make_tools(retail).call("get_order_details", {})
    assert str(info.value) == (
        "RetailTools.get_order_details() missing 1 required positional argument: 'order_id'"
    )


def test_unknown_order_is_a_business_error(retail: Domain) -> None:
    with pytest.raises(ValueError, match=r"^Order not found$"):
        make_tools(retail).call("get_order_details", {"order_id": "#W0000000"})


def test_cancel_refunds_a_gift_card_at_once_rounded_to_cents(retail: Domain) -> None:
    tools = make_tools(retail)
    db = tools.db
    order = next(
        o
        for o in db.orders.values()
        if o.status == "pending"
        and isinstance(
            db.users[o.user_id].payment_methods[o.payment_history[0].payment_method_id], GiftCard
        )
    )
    card = db.users[order.user_id].payment_methods[order.payment_history[0].payment_method_id]
    assert isinstance(card, GiftCard)
    before = card.balance
    tools.call("cancel_pending_order", {"order_id": order.order_id, "reason": "ordered by mistake"})
    assert order.status == "cancelled"
    assert order.cancel_reason == "ordered by mistake"
    assert order.payment_history[-1].transaction_type == "refund"
    assert card.balance == round(before + order.payment_history[0].amount, 2)


def test_cancel_refuses_other_reasons_and_other_statuses(retail: Domain) -> None:
    tools = make_tools(retail)
    pending = first_order(tools.db, "pending")
    delivered = first_order(tools.db, "delivered")
    with pytest.raises(ValueError, match=r"^Invalid reason$"):
        tools.call("cancel_pending_order", {"order_id": pending, "reason": "too slow"})
    with pytest.raises(ValueError, match=r"^Non-pending order cannot be cancelled$"):
        tools.call("cancel_pending_order", {"order_id": delivered, "reason": "no longer needed"})


def test_modify_items_gives_every_changed_item_the_last_variants_price_like_tau2(
    tau2_retail: Domain,
) -> None:
    # τ²-bench's recorded results carry this quirk (simulation of task 100); DB hashes need it.
    tools = make_tools(tau2_retail)
    tools.call(
        "modify_pending_order_items",
        {
            "order_id": "#W3295833",
            "item_ids": ["8926329222", "5312063289"],
            "new_item_ids": ["7160999700", "6956751343"],
            "payment_method_id": "credit_card_3261838",
        },
    )
    items = {i.item_id: i for i in tools.db.orders["#W3295833"].items}
    assert items["7160999700"].price == items["6956751343"].price == 217.06
    assert items["7160999700"].options == {
        "deck material": "bamboo",
        "length": "34 inch",
        "design": "custom",
    }
    assert tools.db.orders["#W3295833"].status == "pending (item modified)"


def test_exchange_rounds_the_price_difference_and_sorts_item_lists(retail: Domain) -> None:
    tools = make_tools(retail)
    db = tools.db
    for order in db.orders.values():
        if order.status != "delivered":
            continue
        item = order.items[0]
        others = [
            v
            for v in db.products[item.product_id].variants.values()
            if v.available and v.item_id != item.item_id
        ]
        if others:
            break
    tools.call(
        "exchange_delivered_order_items",
        {
            "order_id": order.order_id,
            "item_ids": [item.item_id],
            "new_item_ids": [others[0].item_id],
            "payment_method_id": order.payment_history[0].payment_method_id,
        },
    )
    assert order.status == "exchange requested"
    assert order.exchange_price_difference == round(others[0].price - item.price, 2)
    assert order.exchange_new_items == [others[0].item_id]


def test_return_requires_original_method_or_gift_card(retail: Domain) -> None:
    tools = make_tools(retail)
    db = tools.db
    for order in db.orders.values():
        user = db.users[order.user_id]
        others = [
            m
            for m in user.payment_methods.values()
            if not isinstance(m, GiftCard) and m.id != order.payment_history[0].payment_method_id
        ]
        if order.status == "delivered" and others:
            break
    with pytest.raises(ValueError, match=r"^Payment method should be the original payment method$"):
        tools.call(
            "return_delivered_order_items",
            {
                "order_id": order.order_id,
                "item_ids": [order.items[0].item_id],
                "payment_method_id": others[0].id,
            },
        )


def test_calculate_rounds_and_rejects_other_characters(retail: Domain) -> None:
    tools = make_tools(retail)
    assert tools.call("calculate", {"expression": "(1 + 2) / 3 * 10.005"}) == "10.01"
    with pytest.raises(ValueError, match=r"^Invalid characters in expression$"):
        tools.call("calculate", {"expression": "__import__('os')"})


def test_name_and_email_lookup_ignore_case(retail: Domain) -> None:
    tools = make_tools(retail)
    user = next(iter(tools.db.users.values()))
    assert tools.call("find_user_id_by_email", {"email": user.email.upper()}) == user.user_id
    found = tools.call(
        "find_user_id_by_name_zip",
        {
            "first_name": user.name.first_name.lower(),
            "last_name": user.name.last_name.upper(),
            "zip": user.address.zip,
        },
    )
    assert found == user.user_id
