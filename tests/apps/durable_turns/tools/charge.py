"""Charges the card for an order: appends a line to the file ``SHOP_WORLD`` names."""

import os
from pathlib import Path

from pydantic import BaseModel

from runtime import ThreadState, define_tool


class Order(BaseModel):
    order: int


def charge(state: ThreadState, args: Order) -> str:
    with Path(os.environ["SHOP_WORLD"]).open("a") as f:
        f.write(f"charged order {args.order}\n")
    return f"order {args.order} charged"


tool = define_tool("Charges the card for an order.", Order, charge)
