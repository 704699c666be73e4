"""Refunds an order: once per order across every thread (the ``"cross-run"`` window)."""

import os
from pathlib import Path

from pydantic import BaseModel

from runtime import ThreadState, define_tool


class Refund(BaseModel):
    order: int


def refund(state: ThreadState, args: Refund) -> str:
    with Path(os.environ["SHOP_WORLD"]).open("a") as f:
        f.write(f"refunded order {args.order}\n")
    return f"order {args.order} refunded"


tool = define_tool("Refunds an order.", Refund, refund,
                   idempotency_key=lambda args: str(args.order), idempotency_window="cross-run")
