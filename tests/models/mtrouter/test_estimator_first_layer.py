"""f_θ's first layer skips the gradient of the frozen history vector z_x; everything it does compute
must be autograd's own numbers, bit for bit, or training would drift from what it was."""

from __future__ import annotations

import torch
from torch import nn

from models.mtrouter.estimator import FirstLayerOnFrozenHistory


def _autograd_reference(zx, za, layer):
    za = za.detach().requires_grad_(True)
    out = layer(torch.cat([zx, za], dim=-1))
    return out, za


def test_forward_and_kept_gradients_equal_autograds_to_the_bit():
    torch.manual_seed(0)
    layer = nn.Linear(4486 + 64, 256)
    for batch in (1, 7, 64):
        zx = torch.randn(batch, 4486)
        za = torch.randn(batch, 64)
        upstream = torch.randn(batch, 256)

        layer.zero_grad()
        ref_out, ref_za = _autograd_reference(zx, za, layer)
        ref_out.backward(upstream)
        ref_grads = (ref_za.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())

        layer.zero_grad()
        za_mine = za.detach().requires_grad_(True)
        out = FirstLayerOnFrozenHistory.apply(zx, za_mine, layer.weight, layer.bias)
        out.backward(upstream)

        assert torch.equal(out, ref_out)
        assert torch.equal(za_mine.grad, ref_grads[0])
        assert torch.equal(layer.weight.grad, ref_grads[1])
        assert torch.equal(layer.bias.grad, ref_grads[2])


def test_a_history_that_asks_for_a_gradient_still_gets_it():
    torch.manual_seed(1)
    layer = nn.Linear(10 + 3, 5)
    zx = torch.randn(4, 10, requires_grad=True)
    za = torch.randn(4, 3, requires_grad=True)
    FirstLayerOnFrozenHistory.apply(zx, za, layer.weight, layer.bias).sum().backward()
    expected = torch.ones(4, 5) @ layer.weight[:, :10]
    assert torch.allclose(zx.grad, expected)
