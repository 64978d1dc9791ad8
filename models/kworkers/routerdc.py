"""RouterDC: a query encoder and learned LLM embeddings trained by dual contrastive learning.

Source: Chen, Jiang, Lin, Kwok & Zhang, "RouterDC: Query-based router by dual contrastive learning
for assembling large language models", NeurIPS 2024 (arXiv 2409.19886), §3:
- the router scores LLM t on query x by sim(E(x), k_t), the cosine similarity of the encoded query
  and a learned embedding k_t of the LLM; a softmax over the LLMs' similarities routes;
- sample-LLM contrastive loss: for each of the K⁺ best-scoring LLMs t⁺ of a training query,
  −log e^{sim(x,k_t⁺)} / (e^{sim(x,k_t⁺)} + Σ_{t⁻∈K⁻} e^{sim(x,k_t⁻)}) against its K⁻ worst-scoring LLMs;
- sample-sample contrastive loss: queries are clustered (k-means on the frozen encoder's
  vectors), and each query is pulled towards one query of its own cluster and pushed from in-batch
  queries of other clusters, which the paper finds stabilises training;
- the objective is L_sample-LLM + λ·L_sample-sample (λ = 1, K⁺ = K⁻ = 3 as in the authors' training
  script; 5 clusters, τ = 0.2, the step budget and learning rate are ours, untuned).

What differs here, and why: the paper fine-tunes the whole mDeBERTa encoder E. No hub weights can be
fetched on these machines and a transformer cannot be fine-tuned on 2 CPU cores in a benchmark's
time, so E is a small trainable projection (two layers) on top of the frozen, shared MiniLM query
vectors (⊕ the surface statistics of models/baselines/features.py); serving computes the same vectors.
Ties: with 0/1 correctness most queries have several equally good LLMs, so each step draws K⁺
positives among the best-scoring LLMs and K⁻ negatives among the worst at random (a query where all
LLMs score the same teaches nothing and is skipped). Training stops on the sample-LLM loss of a
validation fold carved out of the training queries (models/kworkers/validation.py).

Quality: `output="softmax"` returns RouterDC's routing distribution per query; "calibrated"
maps each LLM's similarity to P̂(correct) with isotonic regression fitted on the validation fold, so
the expected-utility rule q̂ − λ·c weighs a probability against a price (CalibratedRouter's reason).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from sklearn.cluster import KMeans
from sklearn.isotonic import IsotonicRegression
from torch import nn

from models.base import Router, RoutingData
from models.baselines.features import QueryFeaturizer, single_threaded
from models.kworkers.validation import split_data

OUTPUTS = ("softmax", "calibrated")


class _DualEncoder(nn.Module):
    """E(x): frozen-vector → trainable two-layer projection; k_t: one learned vector per LLM."""

    def __init__(self, d_in: int, n_workers: int, hidden: int, dim: int):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.llms = nn.Parameter(torch.randn(n_workers, dim) * 0.1)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(self.encoder(x), dim=-1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cosine similarities (n, w), normalised query embeddings (n, dim))."""
        e = self.embed(x)
        return e @ nn.functional.normalize(self.llms, dim=-1).T, e


def pick_contrast_sets(scores: torch.Tensor, k_pos: int, k_neg: int, generator: torch.Generator):
    """Boolean (n, w) masks of the K⁺ positives and K⁻ negatives of each query: the best- and
    worst-scoring LLMs, ties broken at random; an LLM is a positive only if it beats the query's
    worst score and a negative only if it trails its best (so no LLM is both)."""
    k_pos, k_neg = min(k_pos, scores.shape[1]), min(k_neg, scores.shape[1])  # e.g. two workers: 1 and 1
    jitter = torch.rand(scores.shape, generator=generator) * 1e-3
    ranked = scores + jitter
    lo, hi = scores.min(dim=1, keepdim=True).values, scores.max(dim=1, keepdim=True).values
    top = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, ranked.topk(k_pos, dim=1).indices, True)
    bottom = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, (-ranked).topk(k_neg, dim=1).indices, True)
    return top & (scores > lo), bottom & (scores < hi)


def sample_llm_loss(sim: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, tau: float) -> torch.Tensor:
    """RouterDC's sample-LLM loss, averaged over (query, positive LLM) pairs of queries with ≥ 1 negative."""
    s = sim / tau
    neg_lse = torch.logsumexp(s.masked_fill(~neg, float("-inf")), dim=1, keepdim=True)  # (n, 1)
    pair = torch.logaddexp(s, neg_lse) - s  # −log e^{s⁺} / (e^{s⁺} + Σ e^{s⁻})
    use = pos & neg.any(dim=1, keepdim=True)
    return (pair * use).sum() / use.sum().clamp(min=1)


def sample_sample_loss(e: torch.Tensor, e_pos: torch.Tensor, cluster: torch.Tensor, tau: float) -> torch.Tensor:
    """RouterDC's sample-sample loss: each query against one query of its cluster (e_pos) and the in-batch queries
    of other clusters; anchors without an other-cluster query in the batch are skipped."""
    s_pos = (e * e_pos).sum(dim=1) / tau  # (b,)
    s_all = e @ e.T / tau  # (b, b)
    other = cluster[:, None] != cluster[None, :]
    neg_lse = torch.logsumexp(s_all.masked_fill(~other, float("-inf")), dim=1)
    use = other.any(dim=1)
    loss = torch.logaddexp(s_pos, neg_lse) - s_pos
    return (loss * use).sum() / use.sum().clamp(min=1)


class RouterDCRouter(Router):
    """RouterDC on frozen query vectors (see the module docstring for what differs from the paper)."""

    name = "routerdc"

    def __init__(self, dim: int = 64, hidden: int = 256, k_pos: int = 3, k_neg: int = 3, n_clusters: int = 5,
                 cluster_weight: float = 1.0, tau: float = 0.2, steps: int = 1500, batch_size: int = 64,
                 lr: float = 1e-3, weight_decay: float = 1e-2, val_fraction: float = 0.15, eval_every: int = 50,
                 output: str = "softmax", seed: int = 0, encoder=None):
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if k_pos < 1 or k_neg < 1 or n_clusters < 1 or tau <= 0:
            raise ValueError("k_pos, k_neg and n_clusters must be ≥ 1 and tau > 0")
        self.dim, self.hidden, self.k_pos, self.k_neg = dim, hidden, k_pos, k_neg
        self.n_clusters, self.cluster_weight, self.tau = n_clusters, cluster_weight, tau
        self.steps, self.batch_size, self.lr, self.weight_decay = steps, batch_size, lr, weight_decay
        self.val_fraction, self.eval_every, self.output, self.seed = val_fraction, eval_every, output, seed
        self.featurizer = QueryFeaturizer(encoder=encoder)
        self.model_: _DualEncoder | None = None

    def fit(self, data: RoutingData) -> "RouterDCRouter":
        if len(data) < 10:
            raise ValueError(f"RouterDC needs at least 10 training queries, got {len(data)}")
        with single_threaded():
            return self._fit(data)

    def _fit(self, data: RoutingData) -> "RouterDCRouter":
        torch.manual_seed(self.seed)
        gen = torch.Generator().manual_seed(self.seed)
        fit_on, val = split_data(data, self.val_fraction, self.seed)
        self.featurizer.fit(fit_on)
        x = torch.as_tensor(self.featurizer.transform(fit_on))
        y = torch.as_tensor(np.nan_to_num(fit_on.scores, nan=0.0), dtype=torch.float32)
        xv = torch.as_tensor(self.featurizer.transform(val))
        yv = torch.as_tensor(np.nan_to_num(val.scores, nan=0.0), dtype=torch.float32)
        k = min(self.n_clusters, len(x))
        # Clusters of the frozen vectors, as the paper clusters its training queries before training.
        cluster = torch.as_tensor(KMeans(k, n_init=4, random_state=self.seed).fit_predict(x.numpy()))
        # Rows sorted by cluster: a random row of cluster c is by_cluster[start[c] + ⌊u·size[c]⌋].
        by_cluster = torch.argsort(cluster, stable=True)
        size = torch.bincount(cluster, minlength=k)
        start = torch.cumsum(size, 0) - size
        vpos, vneg = pick_contrast_sets(yv, self.k_pos, self.k_neg, torch.Generator().manual_seed(self.seed + 1))

        model = _DualEncoder(x.shape[1], y.shape[1], self.hidden, self.dim)
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        best, best_state, self.losses_ = float("inf"), copy.deepcopy(model.state_dict()), []
        for step in range(1, self.steps + 1):
            rows = torch.randint(len(x), (min(self.batch_size, len(x)),), generator=gen)
            c = cluster[rows]
            u = torch.rand(len(rows), generator=gen)
            mates = by_cluster[start[c] + (u * size[c]).long().clamp(max=size[c] - 1)]
            model.train()
            sim, e = model(x[rows])
            pos, neg = pick_contrast_sets(y[rows], self.k_pos, self.k_neg, gen)
            loss = sample_llm_loss(sim, pos, neg, self.tau)
            if self.cluster_weight > 0 and k > 1:
                loss = loss + self.cluster_weight * sample_sample_loss(e, model.embed(x[mates]), cluster[rows], self.tau)
            opt.zero_grad()
            loss.backward()
            opt.step()
            self.losses_.append(loss.item())
            if step % self.eval_every == 0 or step == self.steps:
                model.eval()
                with torch.no_grad():
                    vloss = float(sample_llm_loss(model(xv)[0], vpos, vneg, self.tau))
                if vloss < best:
                    best, best_state, self.best_step_ = vloss, copy.deepcopy(model.state_dict()), step
        model.load_state_dict(best_state)
        self.model_ = model.eval()
        if self.output == "calibrated":
            sim_v = self._similarity(xv.numpy())
            self.calibrators_ = [_isotonic(sim_v[:, j], val.scores[:, j]) for j in range(sim_v.shape[1])]
        return self

    def _similarity(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self.model_(torch.as_tensor(x, dtype=torch.float32))[0].numpy().astype(float)

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.model_ is None:
            raise RuntimeError("RouterDCRouter.predict_quality before fit")
        sim = self._similarity(self.featurizer.transform(data))
        if self.output == "calibrated":
            return np.stack([cal(sim[:, j]) for j, cal in enumerate(self.calibrators_)], axis=1)
        z = sim / self.tau
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)  # RouterDC's routing distribution


def _isotonic(p: np.ndarray, y: np.ndarray):
    keep = ~np.isnan(y)
    p, y = p[keep], (y[keep] > 0.5).astype(float)
    if len(np.unique(y)) < 2:
        rate = float(y.mean()) if len(y) else 0.5
        return lambda q: np.full(len(q), rate)
    return IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(p, y).predict
