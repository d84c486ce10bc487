"""The retail agent's tools, with τ²-bench's names, signatures, error texts and database effects.

Business errors raise `ValueError` with τ²-bench's message (the environment shows it as
`Error: <message>`); wrong or missing arguments raise Python's own `TypeError`, whose text names
`RetailTools.<tool>()` exactly as τ²-bench's does. Amounts are rounded where τ²-bench rounds
them and nowhere else, so database hashes agree with its own.
"""

from __future__ import annotations

import json

from evalkit.domains.base import Toolkit, tool
from evalkit.domains.retail.data_model import (
    GiftCard,
    Order,
    OrderPayment,
    Product,
    RetailDB,
    User,
    UserAddress,
    Variant,
)

CANCEL_REASONS = ("no longer needed", "ordered by mistake")


class RetailTools(Toolkit):
    """Tools over a retail database."""

    db: RetailDB

    def __init__(self, db: RetailDB) -> None:
        super().__init__(db)

    # -- lookups shared by the tools ---------------------------------------------------------

    def _order(self, order_id: str) -> Order:
        if order_id not in self.db.orders:
            raise ValueError("Order not found")
        return self.db.orders[order_id]

    def _user(self, user_id: str) -> User:
        if user_id not in self.db.users:
            raise ValueError("User not found")
        return self.db.users[user_id]

    def _product(self, product_id: str) -> Product:
        if product_id not in self.db.products:
            raise ValueError("Product not found")
        return self.db.products[product_id]

    def _variant(self, product_id: str, item_id: str) -> Variant:
        product = self._product(product_id)
        if item_id not in product.variants:
            raise ValueError("Variant not found")
        return product.variants[item_id]

    def _check_items_held(self, order: Order, item_ids: list[str], missing: str) -> None:
        """Raise ValueError(`missing`, with `{item_id}` filled in) when `item_ids` names an item
        more often than the order holds it."""
        in_order = [item.item_id for item in order.items]
        for item_id in item_ids:
            if item_ids.count(item_id) > in_order.count(item_id):
                raise ValueError(missing.format(item_id=item_id))

    def _swap_price_difference(
        self,
        order: Order,
        item_ids: list[str],
        new_item_ids: list[str],
        *,
        new_must_differ: bool,
    ) -> tuple[float, Variant | None]:
        """The unrounded price difference of swapping each of `item_ids` of `order` for the
        variant at the same place in `new_item_ids`, and the last new variant checked; raises
        ValueError where an item or new variant is missing or unavailable, or (with
        `new_must_differ`) where an item would be swapped for itself."""
        diff_price = 0.0
        variant: Variant | None = None
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            if new_must_differ and item_id == new_item_id:
                raise ValueError("The new item id should be different from the old item id")
            item = next((it for it in order.items if it.item_id == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._variant(item.product_id, new_item_id)
            if not variant.available:
                raise ValueError(f"New item {new_item_id} not found or available")
            diff_price += variant.price - item.price
        return diff_price, variant

    def _payment_method(self, user_id: str, payment_method_id: str) -> object:
        user = self._user(user_id)
        if payment_method_id not in user.payment_methods:
            raise ValueError("Payment method not found")
        return user.payment_methods[payment_method_id]

    # -- read tools ------------------------------------------------------------------------

    @tool()
    def find_user_id_by_email(self, email: str) -> str:
        """Look up a customer's user id from their email address (case does not matter).

        Args:
            email: The customer's email address, for example 'jane.doe1234@example.com'.
        """
        for user_id, user in self.db.users.items():
            if user.email.lower() == email.lower():
                return user_id
        raise ValueError("User not found")

    @tool()
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Look up a customer's user id from their first name, last name and zip code.
        Use this when the customer cannot give an email address, or the email finds nobody.

        Args:
            first_name: The customer's first name, for example 'Jane'.
            last_name: The customer's last name, for example 'Doe'.
            zip: The zip code of the customer's default address, for example '90210'.
        """
        for user_id, user in self.db.users.items():
            if (
                user.name.first_name.lower() == first_name.lower()
                and user.name.last_name.lower() == last_name.lower()
                and user.address.zip == zip
            ):
                return user_id
        raise ValueError("User not found")

    @tool()
    def get_user_details(self, user_id: str) -> User:
        """Get a customer's profile: name, default address, email, payment methods and order ids.

        Args:
            user_id: The user id, for example 'jane_doe_1234'.
        """
        return self._user(user_id)

    @tool()
    def get_order_details(self, order_id: str) -> Order:
        """Get an order: its status, items, shipping address, fulfillments and payments.

        Args:
            order_id: The order id, which starts with '#', for example '#W1234567'.
        """
        return self._order(order_id)

    @tool()
    def get_product_details(self, product_id: str) -> Product:
        """Get a product and all its variant items with their options, stock and prices.

        Args:
            product_id: The product id, for example '1234567890'. A product id is not an item id.
        """
        return self._product(product_id)

    @tool()
    def get_item_details(self, item_id: str) -> Variant:
        """Get one variant item: its options, whether it is available, and its price.

        Args:
            item_id: The item id, for example '1234567890'. An item id is not a product id.
        """
        for product in self.db.products.values():
            if item_id in product.variants:
                return product.variants[item_id]
        raise ValueError("Item not found")

    @tool()
    def list_all_product_types(self) -> str:
        """List every product type of the store as a JSON object from product name to product id,
        sorted by name. Each product type has several variant items with their own item ids."""
        names = {product.name: product.product_id for product in self.db.products.values()}
        return json.dumps(names, sort_keys=True)

    @tool()
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return the result rounded to 2 decimals.

        Args:
            expression: The expression, made of numbers, + - * /, parentheses and spaces, for example '(12.5 + 7) * 2'.
        """
        if not all(char in "0123456789+-*/(). " for char in expression):
            raise ValueError("Invalid characters in expression")
        # Only digits, operators, parentheses and spaces reach eval, and without builtins.
        return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))

    @tool()
    def transfer_to_human_agents(self, summary: str) -> str:
        """Hand the customer over to a human agent with a summary of their issue. Only do this when
        the customer asks for a human, or when the request cannot be handled with the policy and
        the tools available.

        Args:
            summary: A short summary of the customer's issue.
        """
        return "Transfer successful"

    # -- write tools -----------------------------------------------------------------------

    @tool(mutates=True)
    def cancel_pending_order(self, order_id: str, reason: str) -> Order:
        """Cancel a pending order and refund its payments (a gift card is credited at once, other
        methods within 5 to 7 business days). Explain the details and get the customer's explicit
        confirmation first. Returns the order after the cancellation.

        Args:
            order_id: The order id, which starts with '#', for example '#W1234567'.
            reason: Either 'no longer needed' or 'ordered by mistake'.
        """
        order = self._order(order_id)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in CANCEL_REASONS:
            raise ValueError("Invalid reason")
        refunds = []
        for payment in order.payment_history:
            refunds.append(
                OrderPayment(
                    transaction_type="refund",
                    amount=payment.amount,
                    payment_method_id=payment.payment_method_id,
                )
            )
            method = self._payment_method(order.user_id, payment.payment_method_id)
            if isinstance(method, GiftCard):
                method.balance = round(method.balance + payment.amount, 2)
        order.status = "cancelled"
        order.cancel_reason = reason
        order.payment_history.extend(refunds)
        return order

    @tool(mutates=True)
    def modify_pending_order_address(
        self,
        order_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> Order:
        """Change the shipping address of a pending order. Explain the change and get the
        customer's explicit confirmation first. Returns the order after the change.

        Args:
            order_id: The order id, which starts with '#', for example '#W1234567'.
            address1: First address line, for example '12 Elm Street'.
            address2: Second address line, for example 'Apt 4', or ''.
            city: City, for example 'Austin'.
            state: State, for example 'TX'.
            country: Country, for example 'USA'.
            zip: Zip code, for example '73301'.
        """
        order = self._order(order_id)
        if "pending" not in order.status:
            raise ValueError("Non-pending order cannot be modified")
        order.address = UserAddress(
            address1=address1,
            address2=address2,
            city=city,
            country=country,
            state=state,
            zip=zip,
        )
        return order

    @tool(mutates=True)
    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> Order:
        """Pay a pending order with another of the customer's payment methods; the original payment
        is refunded. Explain the change and get the customer's explicit confirmation first.
        Returns the order after the change.

        Args:
            order_id: The order id, which starts with '#', for example '#W1234567'.
            payment_method_id: The new payment method's id, for example 'gift_card_1234567' or 'credit_card_1234567', as listed in the customer's profile.
        """
        order = self._order(order_id)
        if "pending" not in order.status:
            raise ValueError("Non-pending order cannot be modified")
        method = self._payment_method(order.user_id, payment_method_id)
        history = order.payment_history
        if len(history) != 1 or history[0].transaction_type != "payment":
            raise ValueError("There should be exactly one payment for a pending order")
        if history[0].payment_method_id == payment_method_id:
            raise ValueError("The new payment method should be different from the current one")
        amount = history[0].amount
        if isinstance(method, GiftCard) and method.balance < amount:
            raise ValueError("Insufficient gift card balance to pay for the order")
        old_method_id = history[0].payment_method_id
        history.extend(
            [
                OrderPayment(
                    transaction_type="payment", amount=amount, payment_method_id=payment_method_id
                ),
                OrderPayment(
                    transaction_type="refund", amount=amount, payment_method_id=old_method_id
                ),
            ]
        )
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - amount, 2)
        old_method = self._payment_method(order.user_id, old_method_id)
        if isinstance(old_method, GiftCard):
            old_method.balance = round(old_method.balance + amount, 2)
        return order

    @tool(mutates=True)
    def modify_pending_order_items(
        self,
        order_id: str,
        item_ids: list[str],
        new_item_ids: list[str],
        payment_method_id: str,
    ) -> Order:
        """Swap items of a pending order for other available variants of the same products. This can
        be done only once per order, and the order can no longer be cancelled or modified
        afterwards, so collect every item first. The price difference is paid with, or refunded to,
        the given payment method. Explain the change and get the customer's explicit confirmation
        first. Returns the order after the change.

        Args:
            order_id: The order id, which starts with '#', for example '#W1234567'.
            item_ids: The item ids to change, for example ['1234567890']; an id may repeat.
            new_item_ids: The new item ids, one per entry of item_ids, in the same order and of the same product.
            payment_method_id: The payment method that pays or receives the price difference, for example 'gift_card_1234567'.
        """
        order = self._order(order_id)
        if order.status != "pending":
            raise ValueError("Non-pending order cannot be modified")
        self._check_items_held(order, item_ids, "{item_id} not found")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match")
        diff_price, variant = self._swap_price_difference(
            order, item_ids, new_item_ids, new_must_differ=True
        )
        method = self._payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < diff_price:
            raise ValueError("Insufficient gift card balance to pay for the new item")
        # The difference is recorded unrounded, as τ²-bench records it.
        order.payment_history.append(
            OrderPayment(
                transaction_type="payment" if diff_price > 0 else "refund",
                amount=abs(diff_price),
                payment_method_id=payment_method_id,
            )
        )
        if isinstance(method, GiftCard):
            method.balance = round(method.balance - diff_price, 2)
        # τ²-bench gives every changed item the price and options of the *last* new variant
        # checked above (its recorded results show it); we keep that, or DB hashes would differ.
        for item_id, new_item_id in zip(item_ids, new_item_ids, strict=False):
            item = next((it for it in order.items if it.item_id == item_id), None)
            if item is None or variant is None:
                raise ValueError(f"Item {item_id} not found")
            item.item_id = new_item_id
            item.price = variant.price
            item.options = variant.options
        order.status = "pending (item modified)"
        return order

    @tool(mutates=True)
    def modify_user_address(
        self,
        user_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,
    ) -> User:
        """Change a customer's default address. Explain the change and get the customer's explicit
        confirmation first. Returns the profile after the change.

        Args:
            user_id: The user id, for example 'jane_doe_1234'.
            address1: First address line, for example '12 Elm Street'.
            address2: Second address line, for example 'Apt 4', or ''.
            city: City, for example 'Austin'.
            state: State, for example 'TX'.
            country: Country, for example 'USA'.
            zip: Zip code, for example '73301'.
        """
        user = self._user(user_id)
        user.address = UserAddress(
            address1=address1,
            address2=address2,
            city=city,
            country=country,
            state=state,
            zip=zip,
        )
        return user

    @tool(mutates=True)
    def return_delivered_order_items(
        self, order_id: str, item_ids: list[str], payment_method_id: str
    ) -> Order:
        """Request the return of items of a delivered order; the order becomes 'return requested'
        and the customer gets an email on how to send the items back. The refund goes to the
        original payment method or to one of the customer's gift cards. Explain the details and get
        the customer's explicit confirmation first. Returns the order after the request.

        Args:
            order_id: The order id, which starts with '#', for example '#W1234567'.
            item_ids: The item ids to return, for example ['1234567890']; an id may repeat.
            payment_method_id: The payment method that receives the refund: the original one, or a gift card, for example 'gift_card_1234567'.
        """
        order = self._order(order_id)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be returned")
        user = self._user(order.user_id)
        method = self._payment_method(user.user_id, payment_method_id)
        if (
            not isinstance(method, GiftCard)
            and payment_method_id != order.payment_history[0].payment_method_id
        ):
            raise ValueError("Payment method should be the original payment method")
        self._check_items_held(order, item_ids, "Some item not found")
        order.status = "return requested"
        order.return_items = sorted(item_ids)
        order.return_payment_method_id = payment_method_id
        return order

    @tool(mutates=True)
    def exchange_delivered_order_items(
        self,
        order_id: str,
        item_ids: list[str],
        new_item_ids: list[str],
        payment_method_id: str,
    ) -> Order:
        """Request the exchange of items of a delivered order for other available variants of the
        same products; the order becomes 'exchange requested'. This can be done only once per
        order, so collect every item first. The price difference is paid with, or refunded to, the
        given payment method. Explain the details and get the customer's explicit confirmation
        first. Returns the order after the request.

        Args:
            order_id: The order id, which starts with '#', for example '#W1234567'.
            item_ids: The item ids to exchange, for example ['1234567890']; an id may repeat.
            new_item_ids: The new item ids, one per entry of item_ids, in the same order and of the same product.
            payment_method_id: The payment method that pays or receives the price difference, for example 'gift_card_1234567'.
        """
        order = self._order(order_id)
        if order.status != "delivered":
            raise ValueError("Non-delivered order cannot be exchanged")
        self._check_items_held(order, item_ids, "Number of {item_id} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match.")
        diff_price, _ = self._swap_price_difference(
            order, item_ids, new_item_ids, new_must_differ=False
        )
        diff_price = round(diff_price, 2)
        method = self._payment_method(order.user_id, payment_method_id)
        if isinstance(method, GiftCard) and method.balance < diff_price:
            raise ValueError("Insufficient gift card balance to pay for the price difference")
        order.status = "exchange requested"
        order.exchange_items = sorted(item_ids)
        order.exchange_new_items = sorted(new_item_ids)
        order.exchange_payment_method_id = payment_method_id
        order.exchange_price_difference = diff_price
        return order
