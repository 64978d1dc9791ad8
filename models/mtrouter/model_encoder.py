"""Model encoder ψ (MTRouter §3.2 eq. 3, §4.1):

    z_a = W_proj · [MLP(attr_a); e_a] + b_proj

attr_a is a vector of structured attributes (context limit, knowledge cut-off, prices …),
standardised over the pool; MLP maps it to 32-d, e_a is a 16-d learned residual per model (L2
penalty 0.001), and the 48-d concatenation is projected to 64-d. The "hardcoded" ablation (Table 4)
uses the standardised attributes themselves as z_a.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from models.mtrouter.config import MTRouterConfig
from routerops.errors import InputError
from routerops.pricing import PriceBook

PRICE_FEATURES = ("input_per_1m", "output_per_1m", "cached_input_per_1m", "per_call")


@dataclass(frozen=True)
class AttributeTable:
    """Raw attribute matrix of a pool: one row per model, one column per attribute."""

    models: tuple[str, ...]
    features: tuple[str, ...]
    values: np.ndarray  # (m, k) float64

    def index(self, model: str) -> int:
        try:
            return self.models.index(model)
        except ValueError:
            raise KeyError(f"model {model!r} is not in the encoder's pool {list(self.models)}") from None

    def standardised(self) -> np.ndarray:
        """Signed log1p (prices and context limits span orders of magnitude), then z-scored per column;
        a constant column becomes 0 rather than NaN."""
        x = np.sign(self.values) * np.log1p(np.abs(self.values))
        std = x.std(axis=0)
        return ((x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)).astype(np.float32)


def attribute_table(models: Sequence[str], attributes: Mapping[str, Mapping[str, float]] | None = None,
                    prices: PriceBook | None = None, extra: Mapping[str, Mapping[str, float]] | None = None,
                    source: str = "pool") -> AttributeTable:
    """Attributes of `models` from pool attributes, a price book and any extra per-model numbers.

    Every model must carry the same attribute names: a missing one would silently read as 0.
    """
    rows: dict[str, dict[str, float]] = {m: {} for m in models}
    for m in models:
        rows[m].update({k: float(v) for k, v in ((attributes or {}).get(m) or {}).items()})
        if prices is not None:
            price = prices.price(m)
            rows[m].update({f: float(getattr(price, f)) for f in PRICE_FEATURES})
        rows[m].update({k: float(v) for k, v in ((extra or {}).get(m) or {}).items()})
    features = sorted({k for r in rows.values() for k in r})
    for m in models:
        absent = [f for f in features if f not in rows[m]]
        if absent:
            raise InputError(source, f"workers[{m}].attributes.{absent[0]}",
                             "missing; every model of the pool needs the same attributes")
    values = np.array([[rows[m][f] for f in features] for m in models], dtype=float).reshape(len(models), len(features))
    if not np.isfinite(values).all():
        raise InputError(source, "attributes", "non-finite attribute value")
    return AttributeTable(tuple(models), tuple(features), values)


class ModelEncoder(nn.Module):
    """ψ(a) for every model of a fixed pool; forward(model indices) → (b, out_dim)."""

    def __init__(self, table: AttributeTable, cfg: MTRouterConfig):
        super().__init__()
        self.table = table
        self.hardcoded = cfg.model_features == "hardcoded"
        self.residual_l2 = cfg.residual_l2
        self.register_buffer("attributes", torch.from_numpy(table.standardised()))
        k, m = len(table.features), len(table.models)
        if self.hardcoded:
            if k == 0:
                raise InputError("pool", "attributes", "the hard-coded model-feature ablation needs attributes")
            self.out_dim = k
            return
        self.attr_mlp = nn.Sequential(nn.Linear(k, cfg.attr_embed_dim), nn.ReLU(),
                                      nn.Linear(cfg.attr_embed_dim, cfg.attr_embed_dim))
        # Small initial residuals: the attribute path explains models first, e_a the remainder (§3.2).
        self.residual = nn.Parameter(0.01 * torch.randn(m, cfg.residual_dim))
        self.proj = nn.Linear(cfg.attr_embed_dim + cfg.residual_dim, cfg.model_embed_dim)
        self.out_dim = cfg.model_embed_dim

    def forward(self, model_idx: torch.Tensor) -> torch.Tensor:
        attrs = self.attributes[model_idx]
        if self.hardcoded:
            return attrs
        return self.proj(torch.cat([self.attr_mlp(attrs), self.residual[model_idx]], dim=-1))  # eq. 3

    def residual_penalty(self) -> torch.Tensor:
        """λ‖e‖² over every model's residual (§4.1: λ = 0.001); zero for the hard-coded ablation."""
        if self.hardcoded:
            return self.attributes.new_zeros(())
        return self.residual_l2 * self.residual.pow(2).sum()
