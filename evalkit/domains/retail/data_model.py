"""The retail database: products with variants, users with payment methods, orders.

Field names and their order follow τ²-bench's retail `db.json`, so its database loads unchanged
and tool results serialise to the same JSON text.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from evalkit.domains.base import DomainDB


class Variant(BaseModel):
    """One purchasable item of a product: its options, whether it is in stock, its price."""

    item_id: str
    options: dict[str, str]
    available: bool
    price: float


class Product(BaseModel):
    name: str
    product_id: str
    variants: dict[str, Variant]


class UserName(BaseModel):
    first_name: str
    last_name: str


class UserAddress(BaseModel):
    address1: str
    address2: str
    city: str
    country: str
    state: str
    zip: str


class CreditCard(BaseModel):
    source: Literal["credit_card"]
    id: str
    brand: str
    last_four: str


class Paypal(BaseModel):
    source: Literal["paypal"]
    id: str


class GiftCard(BaseModel):
    source: Literal["gift_card"]
    id: str
    balance: float


PaymentMethod = Annotated[CreditCard | Paypal | GiftCard, Field(discriminator="source")]


class User(BaseModel):
    user_id: str
    name: UserName
    address: UserAddress
    email: str
    payment_methods: dict[str, PaymentMethod]
    orders: list[str]


class OrderFulfillment(BaseModel):
    tracking_id: list[str]
    item_ids: list[str]


class OrderItem(BaseModel):
    name: str
    product_id: str
    item_id: str
    price: float
    options: dict[str, str]


class OrderPayment(BaseModel):
    transaction_type: Literal["payment", "refund"]
    amount: float
    payment_method_id: str


class Order(BaseModel):
    """An order. Statuses: pending, processed, delivered, cancelled, and after the agent's actions
    'pending (item modified)', 'exchange requested', 'return requested'."""

    order_id: str
    user_id: str
    address: UserAddress
    items: list[OrderItem]
    status: str
    fulfillments: list[OrderFulfillment]
    payment_history: list[OrderPayment]
    cancel_reason: str | None = None
    exchange_items: list[str] | None = None
    exchange_new_items: list[str] | None = None
    exchange_payment_method_id: str | None = None
    exchange_price_difference: float | None = None
    return_items: list[str] | None = None
    return_payment_method_id: str | None = None


class RetailDB(DomainDB):
    products: dict[str, Product]
    users: dict[str, User]
    orders: dict[str, Order]
