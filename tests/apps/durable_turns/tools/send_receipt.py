"""Sends a receipt: one per arguments in a turn (``idempotency="args"``)."""

import os
from pathlib import Path

from pydantic import BaseModel

from runtime import ThreadState, define_tool


class Receipt(BaseModel):
    order: int
    email: str


def send_receipt(state: ThreadState, args: Receipt) -> str:
    with Path(os.environ["SHOP_WORLD"]).open("a") as f:
        f.write(f"receipt {args.order} to {args.email}\n")
    return f"receipt for order {args.order} sent"


tool = define_tool("Sends the receipt of an order.", Receipt, send_receipt, idempotency="args")
