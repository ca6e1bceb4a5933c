"""The price table: whole machines per hour, on demand and spot, per provider, region
and machine type. Shipped as a dated data file (``spotbook/data/prices.json``); a user's
file in the same layout replaces it (``--prices FILE``). A price is looked up, never
guessed: what the table lacks is reported as unknown."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .._errors import UsageError

CAPACITIES = ("spot", "on-demand")


@dataclass(frozen=True)
class Price:
    """One machine's hourly prices, spot and on demand, in one region."""

    provider: str
    region: str
    machine_type: str
    on_demand: float
    spot: float
    gpu: str | None = None
    gpus: int = 0

    def per_hour(self, capacity: str) -> float:
        return self.spot if capacity == "spot" else self.on_demand


@dataclass(frozen=True)
class PriceTable:
    """The dated table of machine prices ``cost`` and ``simulate`` read."""

    date: str
    source: str  # "spotbook" (the shipped file) or the user's path
    prices: tuple[Price, ...]
    currency: str = "USD"

    def find(
        self, provider: str | None, region: str | None, machine_type: str | None
    ) -> Price | None:
        """The price of ``machine_type`` in ``region`` (a zone finds its region)."""
        if not (provider and region and machine_type):
            return None
        for p in self.prices:
            if (
                p.provider == provider
                and p.machine_type == machine_type
                and (p.region == region or region.startswith(p.region + "-"))
            ):
                return p
        return None


def _parse(doc: Any, where: str) -> PriceTable:
    if not isinstance(doc, dict) or not isinstance(doc.get("prices"), list):
        raise UsageError(f"{where} is not a price table: a JSON object with a 'prices' list")
    out = []
    for n, row in enumerate(doc["prices"]):
        try:
            out.append(
                Price(
                    provider=str(row["provider"]),
                    region=str(row["region"]),
                    machine_type=str(row["machine_type"]),
                    on_demand=float(row["on_demand"]),
                    spot=float(row["spot"]),
                    gpu=row.get("gpu"),
                    gpus=int(row.get("gpus") or 0),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(
                f"{where}: price {n} needs provider, region, machine_type, on_demand and "
                f"spot ({exc!r})"
            ) from exc
    return PriceTable(
        date=str(doc.get("date") or "undated"),
        source=where,
        prices=tuple(out),
        currency=str(doc.get("currency") or "USD"),
    )


def load_prices(path: str | None = None) -> PriceTable:
    """The shipped table, or the user's file at ``path``."""
    if path is None:
        text = resources.files("spotbook").joinpath("data/prices.json").read_text()
        return _parse(json.loads(text), "spotbook's price table")
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"--prices {path}: no such file") from None
    except (ValueError, RecursionError) as exc:  # nested past the parser's stack too
        raise UsageError(f"--prices {path} is not a price table's JSON: {exc}") from exc
    except OSError as exc:
        raise UsageError(f"--prices {path}: cannot read it ({exc.strerror or exc})") from exc
    return _parse(doc, path)
