"""EmbedLLM: learned model embeddings trained on correctness prediction.

Source: Zhuang et al., "EmbedLLM: Learning Compact Representations of Large Language Models", 2024
(arXiv 2410.02223), §3: each model m has a learned
vector v_m; a question's sentence-transformer vector is projected by a linear layer to the same
space; a linear classifier reads their element-wise product and predicts (correct, incorrect) with
two logits under cross-entropy. The trained v_m are the "compact representations" the paper reuses
for routing (argmax predicted correctness) and benchmark prediction.

Here: the question vector is the shared MiniLM vector ⊕ surface statistics (as every learned
baseline reads); two-class softmax cross-entropy equals BCE on the logit difference, which is what
the module returns, so the bagged early-stopping trainer of models/baselines/neural.py fits it
unchanged. Unlike RouteLLM's MF (models/baselines/neural._MF), the model vectors are not
L2-normalised and the product goes through the two-class classifier, as in EmbedLLM; quality is
P̂(correct) per model, so the shared expected-utility rule q̂ − λ·c traces the cost curve.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from models.baselines.neural import TorchOutcomeRouter


class _EmbedLLM(nn.Module):
    def __init__(self, d_in: int, n_workers: int, dim: int, dropout: float):
        super().__init__()
        self.models = nn.Embedding(n_workers, dim)  # v_m: the learned model embeddings
        self.project = nn.Linear(d_in, dim)  # question vector → the models' space
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(dim, 2)  # logits of (incorrect, correct)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.dropout(self.project(x))  # (n, dim)
        logits = self.classifier(q[:, None, :] * self.models.weight[None, :, :])  # (n, w, 2)
        return logits[..., 1] - logits[..., 0]  # softmax over two classes = sigmoid of this difference


class EmbedLLMRouter(TorchOutcomeRouter):
    """EmbedLLM's correctness predictor as a router; `model_embeddings()` returns the learned v_m."""

    name = "embedllm"

    def __init__(self, dim: int = 64, dropout: float = 0.2, **kwargs):
        super().__init__(**kwargs)
        if dim < 1 or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dim must be ≥ 1 and dropout in [0, 1), got {dim}, {dropout}")
        self.dim, self.dropout = dim, dropout

    def _build(self, d_in: int, n_workers: int) -> nn.Module:
        return _EmbedLLM(d_in, n_workers, self.dim, self.dropout)

    def model_embeddings(self) -> np.ndarray:
        """(bags, workers, dim): each bag's learned model vectors (EmbedLLM's reusable output)."""
        if self.models_ is None:
            raise RuntimeError("EmbedLLMRouter.model_embeddings before fit")
        return np.stack([m.models.weight.detach().numpy() for m in self.models_])

    def _fuse(self):
        # Eval mode: logit_m = (W₁ − W₀)·(v_m ⊙ (P x + b)) + (b₁ − b₀) is linear in x, as MF's is:
        # x·Pᵀ(h ⊙ v_m) + (h ⊙ v_m)·b + c with h = W₁ − W₀. One (d × bags·w) product.
        coefs, offsets = [], []
        for m in self.models_:
            h = m.classifier.weight[1] - m.classifier.weight[0]  # (dim,)
            u = m.models.weight * h  # (w, dim)
            coefs.append((m.project.weight.T @ u.T).numpy())
            offsets.append((u @ m.project.bias + (m.classifier.bias[1] - m.classifier.bias[0])).numpy())
        coef, offset, w = np.concatenate(coefs, axis=1), np.concatenate(offsets), len(offsets[0])
        return lambda x: (x @ coef + offset).reshape(len(x), -1, w)
