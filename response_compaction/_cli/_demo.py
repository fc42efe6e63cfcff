"""``response-compaction demo``: the main job end to end, on a large generated response.

Generates a deterministic list of typed orders (about 30 MB of canonical JSON by default),
compacts it on a local store with a model when the environment configures one, prints the
receipt and the timings, reads the exact value back and checks it equals what went in.

The schemas live at module level so the store's worker process can load them by reference.
"""

from __future__ import annotations

import contextlib
import random
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Literal

import msgspec

from .._compact import response_compact, response_compaction_read_exact
from .._harness import Harness, LocalWorkspace
from .._models import Found

__all__ = ("LineItem", "Order", "Orders", "OrdersSummary", "fallback_for", "make_orders", "run")

Status = Literal["open", "paid", "shipped", "returned", "cancelled"]
_STATUSES: tuple[Status, ...] = ("open", "paid", "shipped", "returned", "cancelled")
_WEIGHTS = (10, 30, 50, 6, 4)
_CUSTOMERS = tuple(f"customer-{i:05d}" for i in range(5000))
_SKUS = tuple(f"SKU-{i:06d}" for i in range(20000))
_TAGS = ("gift", "express", "fragile", "b2b", "promo", "international", "subscription")


class LineItem(msgspec.Struct, frozen=True, kw_only=True):
    """One product on an order."""

    sku: str
    quantity: int
    unit_price_cents: int


class Order(msgspec.Struct, frozen=True, kw_only=True):
    """One order, as a shop's API would return it."""

    id: int
    customer: str
    status: Status
    placed_at: str
    items: list[LineItem]
    tags: list[str]
    note: str | None = None


class Orders(msgspec.Struct, frozen=True, kw_only=True):
    """The exact schema: a page of orders, far too large to show a model whole."""

    source: str
    total_orders: int
    orders: list[Order]


class OrdersSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The summary schema the model must fill in (and the fallback has)."""

    overview: str
    order_count: int
    critical_facts: list[str]


def make_orders(count: int, seed: int = 20240601) -> Orders:
    """``count`` orders, the same ones for the same ``seed`` (about 330 bytes each)."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
    orders = []
    for i in range(count):
        items = [
            LineItem(
                sku=rng.choice(_SKUS),
                quantity=rng.randint(1, 9),
                unit_price_cents=rng.randint(99, 99_999),
            )
            for _ in range(rng.randint(1, 4))
        ]
        day = 1 + i * 365 // max(count, 1)
        orders.append(
            Order(
                id=1_000_000 + i,
                customer=rng.choice(_CUSTOMERS),
                status=rng.choices(_STATUSES, _WEIGHTS)[0],
                placed_at=f"2024-{1 + (day - 1) // 31 % 12:02d}-{1 + (day - 1) % 28:02d}"
                f"T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
                items=items,
                tags=rng.sample(_TAGS, rng.randint(0, 2)),
                note=None if rng.random() < 0.8 else f"call before delivery ({i})",
            )
        )
    return Orders(source="demo-shop/v2/orders", total_orders=count, orders=orders)


def fallback_for(orders: Orders) -> OrdersSummary:
    """A deterministic summary computed without a model: what the agent gets if none answers."""
    statuses = Counter(order.status for order in orders.orders)
    facts = [f"{n} orders are {status}" for status, n in statuses.most_common()]
    return OrdersSummary(
        overview=f"{orders.total_orders} orders from {orders.source}; no model summary.",
        order_count=orders.total_orders,
        critical_facts=facts,
    )


class Timer:
    """Seconds since construction, for the demo's report."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def seconds(self) -> float:
        """Elapsed seconds."""
        return time.perf_counter() - self.started


def describe_size(size: int) -> str:
    """``12.3 MB`` style."""
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"


def as_json(value: Any) -> str:
    """Indented JSON for the report."""
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


async def run(args: Any, llm: Any, model_description: str) -> int:
    """The demo: generate, compact, read back, compare. Returns the exit code."""
    with contextlib.ExitStack() as stack:
        root = args.root
        if root is None:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="response-compaction-"))
            where = f"{root} (temporary; --root DIR keeps it)"
        else:
            where = root
        say = _Reporter()
        say("store", where)
        say("model", model_description)

        timer = Timer()
        orders = make_orders(args.orders)
        fallback = fallback_for(orders)
        say("generated", f"{args.orders} orders in {timer.seconds():.2f} s")

        harness = Harness(fs=LocalWorkspace(root), llm=llm)
        options = {
            "fallback": fallback,
            "ladder": "demo",
            "instructions": "Say which statuses dominate and anything an operator must act on.",
        }
        timer = Timer()
        compacted = await response_compact(harness, orders, Orders, OrdersSummary, options)
        receipt = compacted.receipt
        why = f" ({receipt.fallback_reason})" if receipt.fallback_reason else ""
        say(
            "compacted",
            f"{describe_size(receipt.exact_bytes)} of canonical JSON in {timer.seconds():.2f} s"
            f" -> {compacted.output.kind}{why}",
        )
        say("output", as_json(compacted.output))
        say("receipt", as_json(receipt))

        timer = Timer()
        again = await response_compact(harness, orders, Orders, OrdersSummary, options)
        say(
            "again",
            f"same response compacted again in {timer.seconds():.2f} s: "
            f"exact_cache={again.receipt.exact_cache}, summary_cache={again.receipt.summary_cache}",
        )

        timer = Timer()
        read = await response_compaction_read_exact(harness, receipt.exact_ref, Orders)
        seconds = timer.seconds()
        if not isinstance(read, Found):
            say("read back", f"{read!r} in {seconds:.2f} s: FAILED")
            return 1
        equal = read.value == orders
        say("read back", f"Found in {seconds:.2f} s; equal to what went in: {equal}")
        return 0 if equal else 1


class _Reporter:
    """Aligned ``label  text`` lines on stdout, multi-line text indented under its label."""

    def __call__(self, label: str, text: str) -> None:
        pad = " " * 12
        lines = text.splitlines() or [""]
        print(f"{label:<11} {lines[0]}")
        for line in lines[1:]:
            print(pad + line)
        sys.stdout.flush()
