"""Small torch routers trained with BCE on (query, worker, correct): matrix factorisation and an MLP.

Both stop early on an inner validation split of the training queries (never on the evaluation fold),
then refit on all training queries for the epoch count that split chose.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from models.base import Router, RoutingData
from models.baselines.features import QueryFeaturizer, single_threaded


def _masked_bce(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none")
    return (loss * mask).sum() / mask.sum().clamp(min=1.0)


def _train_epochs(model: nn.Module, x, y, m, epochs: int, lr: float, weight_decay: float, val=None, patience=None):
    """Full-batch AdamW (n is a few thousand at most); returns per-epoch validation loss if `val`,
    stopping once it has not improved for `patience` epochs."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history, best_state, best_loss = [], None, float("inf")
    for _ in range(epochs):
        model.train()
        opt.zero_grad()
        loss = _masked_bce(model(x), y, m)
        loss.backward()
        opt.step()
        if val is not None:
            model.eval()
            with torch.no_grad():
                vloss = _masked_bce(model(val[0]), val[1], val[2]).item()
            history.append(vloss)
            if vloss < best_loss:
                best_loss, best_state = vloss, copy.deepcopy(model.state_dict())
            if patience is not None and len(history) - 1 - int(np.argmin(history)) >= patience:
                break
    return history, best_state


class TorchOutcomeRouter(Router):
    """Shared fit/predict for torch models mapping query features to per-worker correctness logits.

    Subclasses build the module in `_build(d_in, n_workers)`. Hyper-parameters are fixed by the
    constructor; the only data-driven choice, the epoch count, is made on an inner validation split.
    """

    def __init__(
        self,
        lr: float = 3e-3,
        weight_decay: float = 1e-2,
        max_epochs: int = 400,
        patience: int = 40,
        val_fraction: float = 0.15,
        use_surface: bool = True,
        seed: int = 0,
        encoder=None,
    ):
        self.lr, self.weight_decay = lr, weight_decay
        self.max_epochs, self.patience, self.val_fraction = max_epochs, patience, val_fraction
        self.seed = seed
        self.featurizer = QueryFeaturizer(use_surface=use_surface, encoder=encoder)
        self.model_: nn.Module | None = None

    def _build(self, d_in: int, n_workers: int) -> nn.Module:
        raise NotImplementedError

    def _tensors(self, x: np.ndarray, scores: np.ndarray):
        mask = ~np.isnan(scores)
        return (
            torch.as_tensor(x, dtype=torch.float32),
            torch.as_tensor(np.nan_to_num(scores), dtype=torch.float32),
            torch.as_tensor(mask, dtype=torch.float32),
        )

    def fit(self, data: RoutingData) -> "TorchOutcomeRouter":
        with single_threaded():
            return self._fit(data)

    def _fit(self, data: RoutingData) -> "TorchOutcomeRouter":
        torch.manual_seed(self.seed)
        x = self.featurizer.fit(data).transform(data)
        scores = np.asarray(data.scores, dtype=float)
        self.epochs_ = self._choose_epochs(x, scores)
        torch.manual_seed(self.seed)
        self.model_ = self._build(x.shape[1], scores.shape[1])
        _train_epochs(self.model_, *self._tensors(x, scores), self.epochs_, self.lr, self.weight_decay)
        self.model_.eval()
        return self

    def _choose_epochs(self, x: np.ndarray, scores: np.ndarray) -> int:
        n = len(x)
        n_val = int(round(n * self.val_fraction))
        if n_val < 5 or n - n_val < 5:
            return self.max_epochs // 4  # too few queries to hold any out: a short, regularised fit
        perm = np.random.default_rng(self.seed).permutation(n)
        val, train = perm[:n_val], perm[n_val:]
        model = self._build(x.shape[1], scores.shape[1])
        history, _ = _train_epochs(
            model, *self._tensors(x[train], scores[train]), self.max_epochs, self.lr, self.weight_decay,
            val=self._tensors(x[val], scores[val]), patience=self.patience,
        )
        # Refit on all training queries for the epoch count the held-out split liked best; with full-batch
        # steps (one per epoch) that count transfers to the slightly larger set.
        return int(np.argmin(history)) + 1

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.model_ is None:
            raise RuntimeError(f"{type(self).__name__}.predict_quality before fit")
        x = torch.as_tensor(self.featurizer.transform(data), dtype=torch.float32)
        with torch.no_grad():
            return torch.sigmoid(self.model_(x)).numpy().astype(float)


class _MF(nn.Module):
    """RouteLLM's matrix factorisation (Ong et al. 2024, §4.2 'Matrix factorization'):
    δ(m, q) = w₂ᵀ(v_m ⊙ (W₁ᵀ x_q + b₁)), here scored pointwise with a per-worker bias b_m so that
    BCE on (query, worker, correct) replaces their pairwise win-rate loss."""

    def __init__(self, d_in: int, n_workers: int, dim: int):
        super().__init__()
        self.proj = nn.Linear(d_in, dim)
        self.workers = nn.Embedding(n_workers, dim)
        self.head = nn.Linear(dim, 1, bias=False)
        self.bias = nn.Parameter(torch.zeros(n_workers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x)  # (n, dim)
        v = nn.functional.normalize(self.workers.weight, dim=1)  # (w, dim), as RouteLLM normalises
        inter = q[:, None, :] * v[None, :, :]  # (n, w, dim)
        return self.head(inter).squeeze(-1) + self.bias


class MatrixFactorizationRouter(TorchOutcomeRouter):
    name = "mf"

    def __init__(self, dim: int = 64, **kwargs):
        super().__init__(**kwargs)
        self.dim = dim

    def _build(self, d_in: int, n_workers: int) -> nn.Module:
        return _MF(d_in, n_workers, self.dim)


class MLPRouter(TorchOutcomeRouter):
    """Query features → hidden layer → one correctness logit per worker (shared trunk, one head)."""

    name = "mlp"

    def __init__(self, hidden: int = 128, dropout: float = 0.2, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.dropout = hidden, dropout

    def _build(self, d_in: int, n_workers: int) -> nn.Module:
        return nn.Sequential(
            nn.Dropout(self.dropout / 2),
            nn.Linear(d_in, self.hidden),
            nn.GELU(),
            nn.Dropout(self.dropout),
            nn.Linear(self.hidden, n_workers),
        )
