"""The generated retail world: product catalogue, people, addresses and the seeded database.

`generate.py` builds the shipped data from it; the same random generator state gives the same world.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

# name → {option: values}, base price range
PRODUCTS: dict[str, tuple[dict[str, list[str]], tuple[float, float]]] = {
    "T-Shirt": (
        {"color": ["black", "white", "blue", "red"], "size": ["S", "M", "L", "XL"]},
        (18, 35),
    ),
    "Running Shoes": (
        {"size": ["8", "9", "10", "11"], "color": ["black", "grey", "blue"]},
        (70, 140),
    ),
    "Water Bottle": (
        {"capacity": ["500ml", "750ml", "1000ml"], "material": ["steel", "plastic", "glass"]},
        (12, 40),
    ),
    "Desk Lamp": (
        {
            "color": ["black", "white", "silver"],
            "brightness": ["low", "medium", "high"],
            "power source": ["USB", "AC", "battery"],
        },
        (25, 80),
    ),
    "Backpack": (
        {"color": ["black", "green", "navy"], "size": ["small", "medium", "large"]},
        (40, 120),
    ),
    "Headphones": (
        {
            "type": ["on-ear", "over-ear", "in-ear"],
            "connectivity": ["wired", "wireless"],
            "color": ["black", "white"],
        },
        (30, 250),
    ),
    "Mechanical Keyboard": (
        {
            "switch type": ["linear", "tactile", "clicky"],
            "backlight": ["none", "white", "RGB"],
            "size": ["full size", "80%"],
        },
        (60, 180),
    ),
    "Smart Watch": (
        {"color": ["black", "silver", "gold"], "band material": ["silicone", "leather", "metal"]},
        (150, 400),
    ),
    "Coffee Maker": (
        {
            "color": ["black", "stainless steel"],
            "capacity": ["4 cups", "8 cups", "12 cups"],
            "type": ["drip", "espresso"],
        },
        (45, 300),
    ),
    "Office Chair": (
        {
            "material": ["mesh", "leather", "fabric"],
            "color": ["black", "grey"],
            "armrest": ["fixed", "adjustable"],
        },
        (120, 450),
    ),
    "Yoga Mat": (
        {
            "thickness": ["4mm", "6mm", "8mm"],
            "material": ["PVC", "rubber", "TPE"],
            "color": ["purple", "green", "pink"],
        },
        (20, 70),
    ),
    "Sunglasses": (
        {"frame color": ["black", "brown", "silver"], "lens type": ["polarized", "non-polarized"]},
        (60, 210),
    ),
    "Bluetooth Speaker": (
        {
            "color": ["black", "blue", "red"],
            "battery life": ["10 hours", "20 hours"],
            "water resistance": ["yes", "no"],
        },
        (35, 160),
    ),
    "Tablet": (
        {
            "screen size": ["8-inch", "10-inch", "12-inch"],
            "storage": ["64GB", "128GB", "256GB"],
            "color": ["black", "silver"],
        },
        (180, 800),
    ),
    "Laptop": (
        {
            "screen size": ["13-inch", "15-inch"],
            "processor": ["i5", "i7", "i9"],
            "ram": ["8GB", "16GB", "32GB"],
        },
        (700, 2200),
    ),
    "Jigsaw Puzzle": (
        {"pieces": ["500", "1000", "1500"], "theme": ["animals", "landscape", "art"]},
        (15, 45),
    ),
    "Electric Kettle": (
        {"capacity": ["1L", "1.5L", "2L"], "material": ["glass", "steel", "plastic"]},
        (25, 110),
    ),
    "Wall Clock": (
        {"diameter": ["10 inches", "12 inches", "14 inches"], "color": ["black", "white", "wood"]},
        (20, 80),
    ),
    "Hiking Boots": (
        {
            "size": ["8", "9", "10", "11"],
            "material": ["leather", "synthetic"],
            "waterproof": ["yes", "no"],
        },
        (90, 260),
    ),
    "Air Purifier": (
        {"room size": ["small", "medium", "large"], "filter type": ["HEPA", "carbon"]},
        (90, 450),
    ),
    "Vacuum Cleaner": (
        {"type": ["upright", "canister", "robotic"], "bagged/bagless": ["bagged", "bagless"]},
        (110, 650),
    ),
    "Digital Camera": (
        {
            "resolution": ["20MP", "24MP", "30MP"],
            "zoom": ["3x", "5x", "10x"],
            "storage": ["SD card", "CF card"],
        },
        (250, 1900),
    ),
    "Garden Hose": (
        {
            "length": ["25ft", "50ft", "100ft"],
            "material": ["rubber", "vinyl", "latex"],
            "color": ["green", "black"],
        },
        (20, 110),
    ),
    "Cycling Helmet": (
        {
            "size": ["S", "M", "L"],
            "color": ["black", "white", "red"],
            "ventilation": ["low", "medium", "high"],
        },
        (40, 230),
    ),
}

FIRST_NAMES = [
    "Ava",
    "Liam",
    "Maya",
    "Noah",
    "Iris",
    "Omar",
    "Lena",
    "Ethan",
    "Sofia",
    "Mateo",
    "Chloe",
    "Yusuf",
    "Priya",
    "Daniel",
    "Hana",
    "Lucas",
    "Amara",
    "Jonas",
    "Elena",
    "Ravi",
    "Grace",
    "Tomas",
    "Nadia",
    "Felix",
    "Zara",
    "Hugo",
    "Leila",
    "Aiden",
    "Mina",
    "Oscar",
]
LAST_NAMES = [
    "Garcia",
    "Kim",
    "Novak",
    "Okafor",
    "Silva",
    "Haddad",
    "Moreau",
    "Larsen",
    "Patel",
    "Rossi",
    "Nguyen",
    "Fischer",
    "Cohen",
    "Tanaka",
    "Ibrahim",
    "Walsh",
    "Costa",
    "Berg",
    "Khan",
    "Lopez",
]
STREETS = [
    "Maple Avenue",
    "Oak Street",
    "Cedar Lane",
    "Elm Street",
    "Pine Road",
    "Lakeview Drive",
    "Hillside Avenue",
    "River Road",
    "Sunset Boulevard",
    "Park Place",
    "Willow Way",
    "Main Street",
]
CITIES = [
    ("Austin", "TX", "787"),
    ("Denver", "CO", "802"),
    ("Seattle", "WA", "981"),
    ("Boston", "MA", "021"),
    ("Chicago", "IL", "606"),
    ("Phoenix", "AZ", "850"),
    ("Portland", "OR", "972"),
    ("Atlanta", "GA", "303"),
    ("Columbus", "OH", "432"),
    ("San Diego", "CA", "921"),
    ("Nashville", "TN", "372"),
    ("Madison", "WI", "537"),
]
BRANDS = ["visa", "mastercard", "amex", "discover"]


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


class _Ids:
    """Unique numeric ids of a given length."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def new(self, n: int, prefix: str = "") -> str:
        while True:
            value = prefix + _digits(self.rng, n)
            if value not in self.used and value[len(prefix)] != "0":
                self.used.add(value)
                return value


def random_address(rng: random.Random) -> dict[str, str]:
    city, state, zip_prefix = rng.choice(CITIES)
    return {
        "address1": f"{rng.randint(10, 999)} {rng.choice(STREETS)}",
        "address2": rng.choice(["", f"Apt {rng.randint(1, 40)}", f"Suite {rng.randint(100, 999)}"]),
        "city": city,
        "country": "USA",
        "state": state,
        "zip": zip_prefix + _digits(rng, 2),
    }


def address_line(address: dict[str, str]) -> str:
    parts = ["address1", "address2", "city", "state", "country", "zip"]
    return ", ".join(address[p] for p in parts if address[p])


def generate_db(rng: random.Random, *, num_users: int = 72) -> dict[str, Any]:
    """The database as plain JSON data."""
    ids = _Ids(rng)
    products = _products(rng, ids)
    users: dict[str, Any] = {}
    orders: dict[str, Any] = {}
    names = list(itertools.product(FIRST_NAMES, LAST_NAMES))
    rng.shuffle(names)
    for first, last in names[:num_users]:
        user = _user(rng, ids, first, last)
        for _ in range(rng.randint(1, 4)):
            order = _order(rng, ids, user, products)
            orders[order["order_id"]] = order
            user["orders"].append(order["order_id"])
        users[user["user_id"]] = user
    return {"products": products, "users": users, "orders": orders}


def _products(rng: random.Random, ids: _Ids) -> dict[str, Any]:
    """The catalogue: each product of PRODUCTS with 6 to 10 of its option combinations."""
    products: dict[str, Any] = {}
    for name, (options, (low, high)) in PRODUCTS.items():
        product_id = ids.new(10)
        keys = list(options)
        combos = list(itertools.product(*(options[k] for k in keys)))
        rng.shuffle(combos)
        variants = {}
        for combo in combos[: rng.randint(6, min(10, len(combos)))]:
            item_id = ids.new(10)
            variants[item_id] = {
                "item_id": item_id,
                "options": dict(zip(keys, combo, strict=True)),
                "available": rng.random() < 0.8,
                "price": round(rng.uniform(low, high), 2),
            }
        products[product_id] = {"name": name, "product_id": product_id, "variants": variants}
    return products


def _user(rng: random.Random, ids: _Ids, first: str, last: str) -> dict[str, Any]:
    """A user named `first last` with one to three payment methods and no orders yet."""
    suffix = _digits(rng, 4)
    methods: dict[str, Any] = {}
    for kind in rng.sample(["credit_card", "paypal", "gift_card"], rng.randint(1, 3)):
        method_id = ids.new(7, prefix=f"{kind}_")
        method: dict[str, Any] = {"source": kind, "id": method_id}
        if kind == "credit_card":
            method.update(brand=rng.choice(BRANDS), last_four=_digits(rng, 4))
        elif kind == "gift_card":
            method["balance"] = float(rng.randint(0, 300))
        methods[method_id] = method
    return {
        "user_id": f"{first}_{last}_{suffix}".lower(),
        "name": {"first_name": first, "last_name": last},
        "address": random_address(rng),
        "email": f"{first}.{last}{suffix}@example.com".lower(),
        "payment_methods": methods,
        "orders": [],
    }


def _order(
    rng: random.Random, ids: _Ids, user: dict[str, Any], products: dict[str, Any]
) -> dict[str, Any]:
    """An order of `user` for one to four products, paid with one of the user's methods; its
    status decides its refund and its fulfillment."""
    order_id = ids.new(7, prefix="#W")
    chosen = [
        rng.choice(list(p["variants"].values())) | {"product": p}
        for p in rng.sample(list(products.values()), rng.randint(1, 4))
    ]
    items = [
        {
            "name": v["product"]["name"],
            "product_id": v["product"]["product_id"],
            "item_id": v["item_id"],
            "price": v["price"],
            "options": v["options"],
        }
        for v in chosen
    ]
    status = rng.choices(
        ["pending", "processed", "delivered", "cancelled"], weights=[40, 12, 35, 13]
    )[0]
    method_id = rng.choice(list(user["payment_methods"]))
    total = round(sum(i["price"] for i in items), 2)
    history = [{"transaction_type": "payment", "amount": total, "payment_method_id": method_id}]
    if status == "cancelled":
        history.append(
            {"transaction_type": "refund", "amount": total, "payment_method_id": method_id}
        )
    fulfillments = []
    if status in ("processed", "delivered"):
        fulfillments.append(
            {"tracking_id": [_digits(rng, 12)], "item_ids": [i["item_id"] for i in items]}
        )
    return {
        "order_id": order_id,
        "user_id": user["user_id"],
        "address": dict(user["address"]) if rng.random() < 0.8 else random_address(rng),
        "items": items,
        "status": status,
        "fulfillments": fulfillments,
        "payment_history": history,
    }
