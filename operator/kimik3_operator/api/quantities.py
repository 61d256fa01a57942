"""Kubernetes quantities in bytes, in the forms the CRD's patterns allow."""

from __future__ import annotations

from typing import Final

UNITS: Final = (
    ("Ki", 2**10),
    ("Mi", 2**20),
    ("Gi", 2**30),
    ("Ti", 2**40),
    ("Pi", 2**50),
    ("Ei", 2**60),
    ("k", 10**3),
    ("M", 10**6),
    ("G", 10**9),
    ("T", 10**12),
    ("P", 10**15),
    ("E", 10**18),
)


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory or storage quantity in bytes."""
    for suffix, factor in UNITS:
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(float(quantity))


def decimal_quantity(amount: int) -> str:
    """A byte count as Kubernetes writes it back: the largest decimal suffix that divides it."""
    for suffix, power in (("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3)):
        if amount and amount % 10**power == 0:
            return f"{amount // 10**power}{suffix}"
    return str(amount)
