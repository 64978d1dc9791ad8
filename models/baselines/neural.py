"""Small torch routers trained with BCE on (query, worker, correct): matrix factorisation and an MLP.

Both stop early on inner folds of the training queries (never on the evaluation fold) and average
the models of those folds (see TorchOutcomeRouter).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from scipy.special import erf
from sklearn.model_selection import KFold
from torch import nn

from models.base import Router, RoutingData
from models.baselines.features import QueryFeaturizer, single_threaded


def _masked_bce(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none")
    return (loss * mask).sum() / mask.sum().clamp(min=1.0)


# Up to this many training queries a step is one full-batch gradient (every table of the demo and of
# RouteLLM's GSM8K). Beyond it, steps take shuffled minibatches of MINIBATCH_ROWS: the same number of
# AdamW updates (max_epochs) at a fraction of the arithmetic. On a 14k-query table a full-batch step is
# a pass over ~9k queries and an MLP fit took ~45 s (benchmarks/replay_scale.py).
FULL_BATCH_ROWS = 2048
MINIBATCH_ROWS = 512


def _train_epochs(model: nn.Module, x, y, m, epochs: int, lr: float, weight_decay: float, val=None, patience=None,
                  seed: int = 0):
    """AdamW for `epochs` updates (full-batch while n ≤ FULL_BATCH_ROWS, else shuffled minibatches of
    MINIBATCH_ROWS); returns the validation losses and the best weights if `val`, stopping once the loss
    has not improved for `patience` updates. With minibatches the validation loss is read once per
    pass over the data."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)  # one kernel per step
    n = len(x)
    batches = _batches(n, np.random.default_rng(seed))
    history, best_state, best_loss, best_step = [], None, float("inf"), 0
    step = 0
    while step < epochs:
        for rows in next(batches):
            model.train()
            opt.zero_grad()
            loss = _masked_bce(model(x[rows]), y[rows], m[rows])
            loss.backward()
            opt.step()
            step += 1
            if step >= epochs:
                break
        if val is None:
            continue
        model.eval()
        with torch.no_grad():
            vloss = _masked_bce(model(val[0]), val[1], val[2]).item()
        history.append(vloss)
        if vloss < best_loss:
            best_loss, best_state, best_step = vloss, copy.deepcopy(model.state_dict()), step
        if patience is not None and step - best_step >= patience:
            break
    return history, best_state, best_step


def _batches(n: int, rng: np.random.Generator):
    """Passes over n rows: one full batch (a slice, no copy) while n ≤ FULL_BATCH_ROWS, else a fresh
    shuffle cut into minibatches of MINIBATCH_ROWS."""
    while True:
        if n <= FULL_BATCH_ROWS:
            yield [slice(None)]
        else:
            order = torch.as_tensor(rng.permutation(n))
            yield [order[i : i + MINIBATCH_ROWS] for i in range(0, n, MINIBATCH_ROWS)]


class TorchOutcomeRouter(Router):
    """Shared fit/predict for torch models mapping query features to per-worker correctness logits.

    Subclasses build the module in `_build(d_in, n_workers)`. Fitting is k-fold bagged early stopping:
    the training queries are split into `n_bags` inner folds; one model per fold trains on the others
    and keeps its weights from the epoch with the lowest loss on its own fold. Predictions average the
    bag. Every query is used for training (by n_bags − 1 models) and no hyper-parameter rests on one
    noisy validation split — a single 15% split made the MLP's APGR swing by ±0.03 between seeds.
    """

    def __init__(
        self,
        lr: float = 3e-3,
        weight_decay: float = 1e-2,
        max_epochs: int = 400,
        patience: int = 40,
        n_bags: int = 5,
        use_surface: bool = True,
        seed: int = 0,
        encoder=None,
    ):
        self.lr, self.weight_decay = lr, weight_decay
        self.max_epochs, self.patience, self.n_bags = max_epochs, patience, n_bags
        self.seed = seed
        self.featurizer = QueryFeaturizer(use_surface=use_surface, encoder=encoder)
        self.models_: list[nn.Module] | None = None

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
        self.models_, self.epochs_, self._fused = [], [], None
        if len(x) < 5 * max(self.n_bags, 2):  # too few queries to hold any out: one short, regularised fit
            model = self._build(x.shape[1], scores.shape[1])
            _train_epochs(model, *self._tensors(x, scores), self.max_epochs // 4, self.lr, self.weight_decay)
            self.models_, self.epochs_ = [model.eval()], [self.max_epochs // 4]
            return self
        folds = KFold(n_splits=max(self.n_bags, 2), shuffle=True, random_state=self.seed).split(x)
        for train, val in list(folds)[: self.n_bags]:
            model = self._build(x.shape[1], scores.shape[1])
            _, best_state, best_step = _train_epochs(
                model, *self._tensors(x[train], scores[train]), self.max_epochs, self.lr, self.weight_decay,
                val=self._tensors(x[val], scores[val]), patience=self.patience, seed=self.seed,
            )
            model.load_state_dict(best_state)
            self.models_.append(model.eval())
            self.epochs_.append(best_step)
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.models_ is None:
            raise RuntimeError(f"{type(self).__name__}.predict_quality before fit")
        x = self.featurizer.transform(data)
        if self._fused_logits is not None:
            return _sigmoid(self._fused_logits(x)).mean(axis=1).astype(float)
        return self.predict_with_torch(x)

    def predict_with_torch(self, x: np.ndarray) -> np.ndarray:
        """The reference path: every bag's torch module, sigmoid, averaged."""
        with torch.no_grad():
            xt = torch.as_tensor(x, dtype=torch.float32)
            return torch.stack([torch.sigmoid(m(xt)) for m in self.models_]).mean(0).numpy().astype(float)

    @property
    def _fused_logits(self):
        """x → (n, bags, w) logits of all bags in a couple of numpy products, or None. The online path:
        one torch module call costs ~60 µs of dispatch, a bag of five several hundred."""
        if getattr(self, "_fused", None) is None and self.models_:
            with torch.no_grad():
                self._fused = self._fuse()
        return self._fused

    def _fuse(self):
        return None


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # exp(-z) overflows float32 for z < -88; the overflow to inf gives 1 / inf = 0, the right limit, so
    # it is not worth a RuntimeWarning per large logit. (scipy's expit differs in the last bit on ~16%
    # of float32 inputs, which would change routers' reports that DVC expects to reproduce bit for bit.)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-z))


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

    def _fuse(self):
        # MF is bilinear: logit_m = h·(v̂_m ⊙ (P x + b₁)) + b_m
        #                         = x·Pᵀ(h ⊙ v̂_m) + (h ⊙ v̂_m)·b₁ + b_m,
        # i.e. linear in the query with a rank-`dim` coefficient matrix. One (d × bags·w) product.
        coefs, offsets = [], []
        for m in self.models_:
            u = nn.functional.normalize(m.workers.weight, dim=1) * m.head.weight  # (w, dim)
            coefs.append((m.proj.weight.T @ u.T).numpy())  # (d, w)
            offsets.append((u @ m.proj.bias + m.bias).numpy())  # (w,)
        coef, offset, w = np.concatenate(coefs, axis=1), np.concatenate(offsets), len(offsets[0])
        return lambda x: (x @ coef + offset).reshape(len(x), -1, w)


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

    def _fuse(self):
        # Eval mode: dropout is the identity. All bags' first layers side by side in one product,
        # then each bag's head on its own slice of the hidden units.
        first = [m[1] for m in self.models_]
        heads = [m[4] for m in self.models_]
        w1 = np.concatenate([layer.weight.T.numpy() for layer in first], axis=1)  # (d, bags·h)
        b1 = np.concatenate([layer.bias.numpy() for layer in first])
        w2 = np.stack([head.weight.T.numpy() for head in heads])  # (bags, h, w)
        b2 = np.stack([head.bias.numpy() for head in heads])  # (bags, w)
        bags, hidden = len(first), first[0].out_features

        def logits(x: np.ndarray) -> np.ndarray:
            z = x @ w1 + b1
            h = (0.5 * z * (1.0 + erf(z / np.sqrt(2.0)))).reshape(len(x), bags, hidden)  # exact GELU
            return np.einsum("nbh,bhw->nbw", h, w2) + b2

        return logits
