"""Generate the retail data shipped with evalkit: a seeded database, tasks with gold actions, the policy.

    python -m evalkit.domains.retail.generate [--seed 7] [--out evalkit/domains/retail/data]

The same seed writes the same files. Every task's gold actions are run against a fresh copy of
the database while generating, so a task whose gold path fails is never written; together the
tasks use every retail tool.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalkit.domains.retail.data_model import GiftCard, Order, RetailDB, User
from evalkit.domains.retail.tools import RetailTools
from evalkit.domains.retail.world import address_line, generate_db, random_address

DEFAULT_SEED = 7
DEFAULT_OUT = Path(__file__).parent / "data"

POLICY = """\
# Retail customer service policy

You work for an online shop. Within this policy you may help a customer to:

- cancel a pending order, or change its items, shipping address or payment method;
- return or exchange items of a delivered order;
- change the default address of their profile;
- learn about their own profile, their orders, and the products we sell.

## Before anything else: identify the customer

Every conversation starts by finding the customer's user id, either from their email address or
from their first name, last name and zip code. Do this even when the customer tells you their user
id. Until the customer is identified, do not share or change anything.

Once identified, you may give the customer information about their own profile, orders and our
products (for example, help them find an order id).

You serve one customer per conversation. Refuse any request about another customer's account,
even when several requests of the same customer are fine.

## How to act

- Before any action that changes the database (cancel, modify, return, exchange, change of
  address), state exactly what you are about to do and wait for the customer to say yes.
- Never make up information, procedures or prices that did not come from the customer or the
  tools, and do not give personal opinions or recommendations.
- Make at most one tool call at a time. A turn is either a tool call or a message to the
  customer, never both.
- Refuse requests that this policy does not allow.
- Hand the customer to a human agent only when the request is reasonable but outside what your
  tools and this policy let you do. To do so, call transfer_to_human_agents, then tell the
  customer: 'YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON.'

## What the shop knows

Times are Eastern time, 24-hour clock.

A customer's profile has a user id, an email address, a default address and payment methods. A
payment method is a gift card (with a balance), a PayPal account or a credit card.

The shop sells {num_products} types of products. Each product type (for example a backpack) comes
in variant items that differ in their options (for example colour and size). A product has a
product id, a name and its variants; a variant item has an item id, its option values, whether it
is available, and its price. A product id and an item id are different things; do not mix them
up.

An order has an order id, the customer's user id, a shipping address, the items bought, a status,
fulfillment records (tracking ids and item ids) and a payment history. Its status is one of
pending, processed, delivered or cancelled; after an action it can also be 'pending (item
modified)', 'return requested' or 'exchange requested', and it may then carry details of the
action (cancellation reason, items exchanged, price difference, ...).

## Rules for every action

Only pending and delivered orders can be acted on.

Changing the items of a pending order, and exchanging items of a delivered order, can each be
done only once per order: gather every item the customer wants changed into one call.

## Cancelling a pending order

Check that the order's status is 'pending'. The customer must confirm the order id and give the
reason: 'no longer needed' or 'ordered by mistake' — no other reason is accepted. The order then
becomes 'cancelled'; a gift card payment is refunded at once, any other within 5 to 7 business
days.

## Changing a pending order

Check that the order's status is 'pending'. Only the shipping address, the payment method or the
options of items can change — nothing else.

Payment method: the customer picks one payment method other than the current one. A gift card
must have a balance that covers the order total. The order stays 'pending'; the original payment
is refunded, at once to a gift card, otherwise within 5 to 7 business days.

Items: each item can become another available variant of the same product, never a different
product. The customer names a payment method for the price difference; a gift card must cover
it. This is possible once only: the order becomes 'pending (item modified)' and can then no
longer be cancelled or have its items changed, so make sure the customer has listed everything.

## Returning items of a delivered order

Check that the order's status is 'delivered'. The customer confirms the order id and the items to
return, and says where the refund goes: the original payment method or one of their gift cards.
The order becomes 'return requested' and the customer gets an email explaining how to send the
items back.

## Exchanging items of a delivered order

Check that the order's status is 'delivered', and remind the customer to list every item they
want exchanged. Each item can become another available variant of the same product, never a
different product. The customer names a payment method for the price difference; a gift card
must cover it. The order becomes 'exchange requested' and the customer gets an email on how to
send the items back; no new order is needed.
"""

# -- tasks -------------------------------------------------------------------------------------


@dataclass
class _Draft:
    reason: str
    known: str
    unknown: str
    instructions: str
    actions: list[tuple[str, dict[str, Any]]]
    communicate: list[str] = field(default_factory=list)
    nl_assertions: list[str] | None = None
    purpose: str = ""


class _TaskMaker:
    """Draws scenarios from the database; each returns None when nothing fits."""

    def __init__(self, db: RetailDB, rng: random.Random) -> None:
        self.db = db
        self.rng = rng
        self.used_orders: set[str] = set()
        self.used_users: set[str] = set()

    # helpers

    def _orders(self, status: str) -> list[Order]:
        found = [
            o
            for o in self.db.orders.values()
            if o.status == status
            and o.order_id not in self.used_orders
            and o.user_id not in self.used_users
        ]
        self.rng.shuffle(found)
        return found

    def _take(self, order: Order) -> User:
        self.used_orders.add(order.order_id)
        self.used_users.add(order.user_id)
        return self.db.users[order.user_id]

    def _auth(self, user: User) -> tuple[str, str, tuple[str, dict[str, Any]]]:
        """known_info, unknown_info, and the identification action (email or name + zip)."""
        if self.rng.random() < 0.5:
            return (
                f"Your email address is {user.email}.",
                "You do not know your user id.",
                ("find_user_id_by_email", {"email": user.email}),
            )
        return (
            f"You are {user.name.first_name} {user.name.last_name} and your zip code is {user.address.zip}.",
            "You do not remember your email address.",
            (
                "find_user_id_by_name_zip",
                {
                    "first_name": user.name.first_name,
                    "last_name": user.name.last_name,
                    "zip": user.address.zip,
                },
            ),
        )

    def _other_variant(self, product_id: str, item_id: str) -> str | None:
        variants = [
            v
            for v in self.db.products[product_id].variants.values()
            if v.available and v.item_id != item_id
        ]
        return self.rng.choice(variants).item_id if variants else None

    @staticmethod
    def _describe(options: dict[str, str]) -> str:
        return ", ".join(f"{k} {v}" for k, v in options.items())

    @staticmethod
    def _method_words(method: object) -> str:
        source = getattr(method, "source", "")
        return {"gift_card": "gift card", "credit_card": "credit card", "paypal": "paypal"}[source]

    # scenarios

    def cancel(self) -> _Draft | None:
        for order in self._orders("pending"):
            user = self._take(order)
            known, unknown, auth = self._auth(user)
            reason = self.rng.choice(["no longer needed", "ordered by mistake"])
            why = (
                "you no longer need it"
                if reason == "no longer needed"
                else "you ordered it by mistake"
            )
            return _Draft(
                reason=f"You want to cancel your order {order.order_id} because {why}.",
                known=known,
                unknown=unknown,
                instructions="Confirm the cancellation when the agent asks.",
                actions=[
                    auth,
                    ("get_user_details", {"user_id": user.user_id}),
                    ("get_order_details", {"order_id": order.order_id}),
                    ("cancel_pending_order", {"order_id": order.order_id, "reason": reason}),
                ],
                nl_assertions=[
                    "The agent asks the customer to confirm before cancelling the order."
                ],
                purpose="cancel a pending order",
            )
        return None

    def refuse_cancel_delivered(self) -> _Draft | None:
        for order in self._orders("delivered"):
            user = self._take(order)
            known, unknown, auth = self._auth(user)
            return _Draft(
                reason=f"You want to cancel your order {order.order_id} because you no longer need it. If the agent refuses, accept it and end the conversation.",
                known=known,
                unknown=unknown,
                instructions="Do not ask for anything else.",
                actions=[auth, ("get_order_details", {"order_id": order.order_id})],
                purpose="a delivered order cannot be cancelled: nothing changes",
            )
        return None

    def modify_address(self) -> _Draft | None:
        for order in self._orders("pending"):
            user = self._take(order)
            known, unknown, auth = self._auth(user)
            new = random_address(self.rng)
            line = address_line(new)
            return _Draft(
                reason=f"You moved and want your pending order {order.order_id} shipped to your new address. The new address is {line}.",
                known=known,
                unknown=unknown,
                instructions="Confirm the change when the agent asks.",
                actions=[
                    auth,
                    ("get_order_details", {"order_id": order.order_id}),
                    ("modify_pending_order_address", {"order_id": order.order_id, **new}),
                ],
                purpose="change the shipping address of a pending order",
            )
        return None

    def modify_user_address(self) -> _Draft | None:
        for order in self._orders("pending") + self._orders("delivered"):
            user = self._take(order)
            known, unknown, auth = self._auth(user)
            new = random_address(self.rng)
            line = address_line(new)
            return _Draft(
                reason=f"You want the default address of your profile changed. The new address is {line}.",
                known=known,
                unknown=unknown,
                instructions="Only your profile address should change, not any order.",
                actions=[
                    auth,
                    ("get_user_details", {"user_id": user.user_id}),
                    ("modify_user_address", {"user_id": user.user_id, **new}),
                ],
                purpose="change the default address of a profile",
            )
        return None

    def modify_payment(self) -> _Draft | None:
        for order in self._orders("pending"):
            user = self.db.users[order.user_id]
            current = order.payment_history[0].payment_method_id
            amount = order.payment_history[0].amount
            options = [
                m
                for m in user.payment_methods.values()
                if m.id != current and (not isinstance(m, GiftCard) or m.balance >= amount)
            ]
            if len(order.payment_history) != 1 or not options:
                continue
            self._take(order)
            method = self.rng.choice(options)
            known, unknown, auth = self._auth(user)
            return _Draft(
                reason=f"You want to pay for your pending order {order.order_id} with your {self._method_words(method)} instead.",
                known=known,
                unknown=unknown,
                instructions="Confirm the change when the agent asks.",
                actions=[
                    auth,
                    ("get_user_details", {"user_id": user.user_id}),
                    ("get_order_details", {"order_id": order.order_id}),
                    (
                        "modify_pending_order_payment",
                        {"order_id": order.order_id, "payment_method_id": method.id},
                    ),
                ],
                purpose="change the payment method of a pending order",
            )
        return None

    def _swap(self, status: str, tool_name: str, verb: str) -> _Draft | None:
        for order in self._orders(status):
            user = self.db.users[order.user_id]
            item = self.rng.choice(order.items)
            new_id = self._other_variant(item.product_id, item.item_id)
            original = order.payment_history[0].payment_method_id
            if new_id is None or original not in user.payment_methods:
                continue
            method = user.payment_methods[original]
            if isinstance(method, GiftCard):
                continue
            self._take(order)
            new = self.db.products[item.product_id].variants[new_id]
            known, unknown, auth = self._auth(user)
            return _Draft(
                reason=(
                    f"You want to {verb} the {item.name.lower()} ({self._describe(item.options)}) of your "
                    f"order {order.order_id} for the one with {self._describe(new.options)}. "
                    f"Any price difference goes to your {self._method_words(method)}."
                ),
                known=known,
                unknown=unknown,
                instructions="This is the only item you want changed. Confirm when the agent asks.",
                actions=[
                    auth,
                    ("get_order_details", {"order_id": order.order_id}),
                    ("get_product_details", {"product_id": item.product_id}),
                    (
                        tool_name,
                        {
                            "order_id": order.order_id,
                            "item_ids": [item.item_id],
                            "new_item_ids": [new_id],
                            "payment_method_id": original,
                        },
                    ),
                ],
                purpose=f"{verb} one item of a {status} order",
            )
        return None

    def modify_items(self) -> _Draft | None:
        return self._swap("pending", "modify_pending_order_items", "change")

    def exchange(self) -> _Draft | None:
        return self._swap("delivered", "exchange_delivered_order_items", "exchange")

    def return_items(self) -> _Draft | None:
        for order in self._orders("delivered"):
            user = self.db.users[order.user_id]
            original = order.payment_history[0].payment_method_id
            if original not in user.payment_methods:
                continue
            self._take(order)
            items = self.rng.sample(order.items, self.rng.randint(1, len(order.items)))
            names = " and the ".join(i.name.lower() for i in items)
            known, unknown, auth = self._auth(user)
            method = user.payment_methods[original]
            return _Draft(
                reason=f"You want to return the {names} from your order {order.order_id}, refunded to your {self._method_words(method)}.",
                known=known,
                unknown=unknown,
                instructions="Confirm the return when the agent asks.",
                actions=[
                    auth,
                    ("get_order_details", {"order_id": order.order_id}),
                    (
                        "return_delivered_order_items",
                        {
                            "order_id": order.order_id,
                            "item_ids": [i.item_id for i in items],
                            "payment_method_id": original,
                        },
                    ),
                ],
                purpose="return items of a delivered order",
            )
        return None

    def order_total(self) -> _Draft | None:
        for order in self._orders("delivered") + self._orders("processed"):
            if len(order.items) < 2:
                continue
            user = self._take(order)
            known, unknown, auth = self._auth(user)
            expression = " + ".join(f"{i.price}" for i in order.items)
            total = str(round(float(sum(i.price for i in order.items)), 2))
            return _Draft(
                reason=f"You want to know the total price of the items in your order {order.order_id}.",
                known=known,
                unknown=unknown,
                instructions="You only want the number; do not change anything.",
                actions=[
                    auth,
                    ("get_order_details", {"order_id": order.order_id}),
                    ("calculate", {"expression": expression}),
                ],
                communicate=[total],
                purpose="compute an order total with the calculator",
            )
        return None

    def product_price(self) -> _Draft | None:
        orders = self._orders("pending") + self._orders("delivered")
        if not orders:
            return None
        user = self._take(orders[0])
        product = self.rng.choice(list(self.db.products.values()))
        variant = self.rng.choice(list(product.variants.values()))
        known, unknown, auth = self._auth(user)
        return _Draft(
            reason=(
                f"You are thinking of buying a {product.name.lower()} and want the price of the one with "
                f"{self._describe(variant.options)}. You do not know the product id."
            ),
            known=known,
            unknown=unknown,
            instructions="You only want the price; do not place or change any order.",
            actions=[
                auth,
                ("list_all_product_types", {}),
                ("get_product_details", {"product_id": product.product_id}),
            ],
            communicate=[f"{variant.price}"],
            purpose="look up a product's price from the catalogue",
        )

    def item_lookup(self) -> _Draft | None:
        for order in self._orders("delivered") + self._orders("pending"):
            user = self._take(order)
            item = self.rng.choice(order.items)
            variant = self.db.products[item.product_id].variants[item.item_id]
            available = "yes" if variant.available else "no"
            known, unknown, auth = self._auth(user)
            return _Draft(
                reason=(
                    f"You want to know whether the {item.name.lower()} you bought in order {order.order_id} "
                    f"(item id {item.item_id}) is still available to buy, and its current price."
                ),
                known=known + f" The item id is {item.item_id}.",
                unknown=unknown,
                instructions="You only want the information.",
                actions=[auth, ("get_item_details", {"item_id": item.item_id})],
                communicate=[f"{variant.price}"],
                nl_assertions=[f"The agent tells the customer the item is available: {available}."],
                purpose="look up one item by id",
            )
        return None

    def transfer(self) -> _Draft | None:
        for order in self._orders("processed"):
            user = self._take(order)
            known, unknown, auth = self._auth(user)
            return _Draft(
                reason=(
                    f"Your order {order.order_id} has been processed but you need it delivered to a "
                    "different country, which the agent cannot arrange. Ask for a human agent."
                ),
                known=known,
                unknown=unknown,
                instructions="Insist on a human agent.",
                actions=[
                    auth,
                    ("get_order_details", {"order_id": order.order_id}),
                    (
                        "transfer_to_human_agents",
                        {
                            "summary": f"The customer wants processed order {order.order_id} shipped abroad."
                        },
                    ),
                ],
                purpose="transfer a request the tools cannot handle",
            )
        return None


SCENARIOS: list[tuple[str, int]] = [
    ("cancel", 6),
    ("modify_address", 4),
    ("modify_user_address", 4),
    ("modify_payment", 4),
    ("modify_items", 5),
    ("exchange", 5),
    ("return_items", 5),
    ("order_total", 3),
    ("product_price", 3),
    ("item_lookup", 3),
    ("transfer", 2),
    ("refuse_cancel_delivered", 2),
]


def generate_tasks(db_data: dict[str, Any], rng: random.Random) -> list[dict[str, Any]]:
    """Tasks in τ²-bench's format; each task's gold actions are checked to run cleanly."""
    maker = _TaskMaker(RetailDB.model_validate(db_data), rng)
    tasks: list[dict[str, Any]] = []
    for kind, count in SCENARIOS:
        draw: Callable[[], _Draft | None] = getattr(maker, kind)
        for _ in range(count):
            draft = draw()
            if draft is None:
                raise RuntimeError(f"no data left for a {kind!r} task; enlarge the database")
            task_id = str(len(tasks))
            _check_gold(db_data, draft, task_id)
            basis = ["DB", "COMMUNICATE"] + (["NL_ASSERTION"] if draft.nl_assertions else [])
            tasks.append(
                {
                    "id": task_id,
                    "description": {
                        "purpose": draft.purpose,
                        "relevant_policies": None,
                        "notes": None,
                    },
                    "user_scenario": {
                        "persona": None,
                        "instructions": {
                            "domain": "retail",
                            "reason_for_call": draft.reason,
                            "known_info": draft.known,
                            "unknown_info": draft.unknown,
                            "task_instructions": draft.instructions,
                        },
                    },
                    "initial_state": None,
                    "evaluation_criteria": {
                        "actions": [
                            {
                                "action_id": f"{task_id}_{i}",
                                "requestor": "assistant",
                                "name": name,
                                "arguments": arguments,
                                "info": None,
                            }
                            for i, (name, arguments) in enumerate(draft.actions)
                        ],
                        "communicate_info": draft.communicate,
                        "nl_assertions": draft.nl_assertions,
                        "reward_basis": basis,
                    },
                }
            )
    return tasks


def _check_gold(db_data: dict[str, Any], draft: _Draft, task_id: str) -> None:
    tools = RetailTools(RetailDB.model_validate(db_data))
    for name, arguments in draft.actions:
        try:
            tools.call(name, arguments)
        except Exception as exc:
            raise RuntimeError(f"task {task_id}: gold action {name} fails: {exc}") from exc


def generate(seed: int = DEFAULT_SEED) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """The database, the tasks and the policy for `seed`."""
    rng = random.Random(seed)
    db = generate_db(rng)
    tasks = generate_tasks(db, rng)
    policy = POLICY.replace("{num_products}", str(len(db["products"])))
    return db, tasks, policy


def write(out: Path, seed: int = DEFAULT_SEED) -> None:
    """Write `db.json`, `tasks.json` and `policy.md` into `out`."""
    db, tasks, policy = generate(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "db.json").write_text(json.dumps(db, indent=1) + "\n", encoding="utf-8")
    (out / "tasks.json").write_text(json.dumps(tasks, indent=1) + "\n", encoding="utf-8")
    (out / "policy.md").write_text(policy, encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    write(args.out, args.seed)


if __name__ == "__main__":
    main()
