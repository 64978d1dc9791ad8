"""Model encoder ψ (eq. 3): attributes → MLP → 32-d, ⊕ 16-d residual, → 64-d; and its ablation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.model_encoder import ModelEncoder, attribute_table
from routerops.errors import InputError


def test_attribute_table_joins_pool_attributes_and_prices(pool, book):
    table = attribute_table(pool.names, {w.name: w.attributes for w in pool.workers}, book)
    assert "context_limit" in table.features and "output_per_1m" in table.features
    z = table.standardised()
    assert z.shape == (3, len(table.features))
    assert np.allclose(z.mean(axis=0), 0.0, atol=1e-6)
    assert np.allclose(z[:, table.features.index("cached_input_per_1m")], 0.0)  # constant column → 0, not NaN


def test_missing_attribute_names_the_worker(pool):
    attrs = {w.name: dict(w.attributes) for w in pool.workers}
    del attrs["mid"]["knowledge_cutoff"]
    with pytest.raises(InputError, match=r"workers\[mid\].attributes.knowledge_cutoff"):
        attribute_table(pool.names, attrs)


def test_learned_encoder_shapes_and_residual_penalty(pool, book):
    table = attribute_table(pool.names, {w.name: w.attributes for w in pool.workers}, book)
    enc = ModelEncoder(table, MTRouterConfig())
    z = enc(torch.tensor([0, 2, 2]))
    assert z.shape == (3, 64)  # §4.1: 64-d model embedding
    assert enc.residual.shape == (3, 16) and enc.attr_mlp[-1].out_features == 32
    assert torch.allclose(z[1], z[2])
    assert enc.residual_penalty().item() == pytest.approx(0.001 * enc.residual.pow(2).sum().item())


def test_hardcoded_encoder_is_the_standardised_attributes(pool, book):
    table = attribute_table(pool.names, {w.name: w.attributes for w in pool.workers}, book)
    enc = ModelEncoder(table, MTRouterConfig(model_features="hardcoded"))
    assert list(enc.parameters()) == []  # no MLP, no residual, no projection
    assert np.allclose(enc(torch.tensor([0, 1, 2])).numpy(), table.standardised())
    assert enc.residual_penalty().item() == 0.0
