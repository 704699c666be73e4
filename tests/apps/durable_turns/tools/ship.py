"""Ships an order: once per order in a thread (a key with the ``"thread"`` window)."""

import os
from pathlib import Path

from pydantic import BaseModel

from runtime import ThreadState, define_tool


class Shipment(BaseModel):
    order: int
    note: str = ""


def ship(state: ThreadState, args: Shipment) -> str:
    with Path(os.environ["SHOP_WORLD"]).open("a") as f:
        f.write(f"shipped order {args.order}\n")
    return f"order {args.order} shipped"


tool = define_tool("Ships an order.", Shipment, ship,
                   idempotency_key=lambda args: f"order-{args.order}",
                   idempotency_window="thread")
