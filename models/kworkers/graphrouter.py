"""GraphRouter: routing as edge prediction on a heterogeneous task–query–LLM graph.

Source: Feng et al., "GraphRouter: A Graph-based Router for LLM Selections", ICLR 2025
(arXiv 2410.03834), §3: task, query and LLM nodes; task–query edges, and query–LLM edges whose
features are the logged performance and cost of that LLM on that query; a heterogeneous GNN passes
messages along both edge kinds (with the edge features) and an edge predictor scores the query–LLM
edges of a new query, which enters the graph with its edges' outcomes unknown (inductive).

Built here in plain torch with dense tensors (two CPU cores suffice: the graph is the training
queries × the workers, 3,365 × 9 on the nine-model table). What differs, and why:
- node features: a query is its shared MiniLM vector ⊕ surface statistics; an LLM is a learned
  vector plus a projection of its standardised mean log cost on the training queries (the paper
  embeds LLM and task *descriptions* with a hub encoder; the router interface carries none). A
  query–LLM edge carries the logged outcome only: a per-query cost would, on tables whose costs
  count the logged response's tokens (RouteLLM's), leak the answer's length into the router;
- task nodes: RoutingData names no task, so tasks are k-means clusters of the training queries'
  vectors and a new query joins its nearest one;
- the predicted edge label is correctness (the paper's "effect" mixes performance and cost with a
  preference weight); cost enters through the shared rule q̂ − λ·c, so one fit serves every λ;
- training masks a random share of the training queries each step (their query–LLM edges lose their
  outcome) and predicts those edges from the rest of the graph, which is how a new query sits in the
  graph at test time; early stopping on a validation fold carved out of the training queries.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from sklearn.cluster import KMeans
from torch import nn

from models.base import Router, RoutingData
from models.baselines.features import QueryFeaturizer, single_threaded
from models.kworkers.validation import validation_split

EDGE_FEATURES = 2  # (logged score, outcome observed)


class _Layer(nn.Module):
    """One round of heterogeneous message passing (GraphSAGE-style mean aggregation per edge kind,
    edge features concatenated to the sender's state)."""

    def __init__(self, dim: int):
        super().__init__()
        self.q_to_llm = nn.Linear(dim + EDGE_FEATURES, dim)
        self.llm_to_q = nn.Linear(dim + EDGE_FEATURES, dim)
        self.q_to_task = nn.Linear(dim, dim)
        self.task_to_q = nn.Linear(dim, dim)
        self.self_q, self.self_llm, self.self_task = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, hq, hm, ht, edges, observed, task):
        """hq (n, d) queries, hm (w, d) LLMs, ht (t, d) tasks; edges (n, w, E); observed (n,) bool:
        queries whose outcomes LLM and task nodes may read; task (n,) long."""
        n, w = edges.shape[:2]
        ctx = observed.float()[:, None]
        # query → LLM: mean over the queries whose outcome on that LLM is observed.
        msg = self.q_to_llm(torch.cat([hq[:, None, :].expand(n, w, -1), edges], dim=-1))  # (n, w, d)
        hm_new = self.self_llm(hm) + (msg * ctx[:, :, None]).sum(0) / ctx.sum().clamp(min=1)
        # query → task: mean over the task's observed queries.
        onehot = nn.functional.one_hot(task, len(ht)).float() * ctx  # (n, t)
        ht_new = self.self_task(ht) + onehot.T @ self.q_to_task(hq) / onehot.sum(0).clamp(min=1)[:, None]
        # LLM → query (with the edge's features) and task → query.
        back = self.llm_to_q(torch.cat([hm[None, :, :].expand(n, w, -1), edges], dim=-1)).mean(1)
        hq_new = self.self_q(hq) + back + self.task_to_q(ht)[task]
        act = nn.functional.gelu  # residual updates: the query's own vector reaches the edge predictor intact
        return hq + act(hq_new), hm + act(hm_new), ht + act(ht_new)


class _GraphModel(nn.Module):
    def __init__(self, d_in: int, n_workers: int, n_tasks: int, dim: int, layers: int, dropout: float):
        super().__init__()
        self.q_in = nn.Sequential(nn.Dropout(dropout), nn.Linear(d_in, dim))
        self.llm = nn.Parameter(torch.randn(n_workers, dim) * 0.1)
        self.llm_cost = nn.Linear(1, dim)
        self.tasks = nn.Parameter(torch.randn(n_tasks, dim) * 0.1)
        self.layers = nn.ModuleList(_Layer(dim) for _ in range(layers))
        self.head = nn.Sequential(nn.Linear(dim + EDGE_FEATURES, dim), nn.GELU(), nn.Linear(dim, 1))
        self.bias = nn.Parameter(torch.zeros(n_workers))

    def forward(self, x, edges, observed, task, llm_cost) -> torch.Tensor:
        """(n, w) correctness logits of every query–LLM edge (those of observed queries included);
        llm_cost (w, 1): each LLM's standardised mean log cost."""
        hq, hm, ht = self.q_in(x), self.llm + self.llm_cost(llm_cost), self.tasks
        for layer in self.layers:
            hq, hm, ht = layer(hq, hm, ht, edges, observed, task)
        pair = torch.cat([hq[:, None, :] * hm[None, :, :], edges], dim=-1)  # edge predictor input
        return self.head(pair).squeeze(-1) + self.bias


class GraphRouter(Router):
    """GraphRouter's inductive edge prediction; the fitted router keeps its training graph."""

    name = "graphrouter"

    def __init__(self, dim: int = 64, layers: int = 2, n_tasks: int = 5, mask_fraction: float = 0.25,
                 steps: int = 600, lr: float = 1e-3, weight_decay: float = 1e-2, dropout: float = 0.1,
                 val_fraction: float = 0.15, patience: int = 100, seed: int = 0, encoder=None):
        if not 0.0 < mask_fraction < 1.0:
            raise ValueError(f"mask_fraction must be in (0, 1), got {mask_fraction}")
        if layers < 1 or dim < 1 or n_tasks < 1:
            raise ValueError("layers, dim and n_tasks must be ≥ 1")
        self.dim, self.layers, self.n_tasks, self.mask_fraction = dim, layers, n_tasks, mask_fraction
        self.steps, self.lr, self.weight_decay, self.dropout = steps, lr, weight_decay, dropout
        self.val_fraction, self.patience, self.seed = val_fraction, patience, seed
        self.featurizer = QueryFeaturizer(encoder=encoder)
        self.model_: _GraphModel | None = None

    # ------------------------------------------------------------------ graph pieces

    @staticmethod
    def _edges(scores: np.ndarray | None, shape: tuple[int, int]) -> torch.Tensor:
        """(n, w, E) edge features; scores None = outcomes unknown (a new query)."""
        if scores is None:
            return torch.zeros((*shape, EDGE_FEATURES))
        known = ~np.isnan(scores)
        return torch.as_tensor(np.stack([np.nan_to_num(scores, nan=0.0), known], axis=-1), dtype=torch.float32)

    def fit(self, data: RoutingData) -> "GraphRouter":
        if len(data) < 10:
            raise ValueError(f"GraphRouter needs at least 10 training queries, got {len(data)}")
        with single_threaded():
            return self._fit(data)

    def _fit(self, data: RoutingData) -> "GraphRouter":
        torch.manual_seed(self.seed)
        rng = np.random.default_rng(self.seed)
        x = self.featurizer.fit(data).transform(data)
        logc = np.log(np.asarray(data.costs, dtype=float).mean(axis=0) + 1e-12)
        self.llm_cost_ = torch.as_tensor((logc - logc.mean()) / (logc.std() + 1e-6), dtype=torch.float32)[:, None]
        k = min(self.n_tasks, len(x))
        self.tasks_ = KMeans(k, n_init=4, random_state=self.seed).fit(x)
        task = torch.as_tensor(self.tasks_.labels_, dtype=torch.long)
        xt = torch.as_tensor(x)
        full = self._edges(data.scores, data.scores.shape)
        hidden = self._edges(None, data.scores.shape)
        target = torch.as_tensor(np.nan_to_num(data.scores, nan=0.0) > 0.5, dtype=torch.float32)
        weight = torch.as_tensor(~np.isnan(data.scores), dtype=torch.float32)
        fit_rows, val_rows = validation_split(len(x), self.val_fraction, self.seed)
        val = torch.zeros(len(x), dtype=torch.bool)
        val[val_rows] = True

        model = _GraphModel(x.shape[1], full.shape[1], k, self.dim, self.layers, self.dropout)
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        best, best_state, best_step, self.losses_ = float("inf"), copy.deepcopy(model.state_dict()), 0, []
        for step in range(1, self.steps + 1):
            # Mask a random share of the fit-on queries; validation queries are never observed.
            masked = torch.as_tensor(rng.random(len(x)) < self.mask_fraction) & ~val
            observed = ~masked & ~val
            edges = torch.where(observed[:, None, None], full, hidden)
            model.train()
            logits = model(xt, edges, observed, task, self.llm_cost_)
            w = weight * masked.float()[:, None]
            loss = (nn.functional.binary_cross_entropy_with_logits(logits, target, reduction="none") * w).sum() / w.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            self.losses_.append(loss.item())
            model.eval()
            with torch.no_grad():  # validation edges predicted from every fit-on query, as at test time
                edges = torch.where(~val[:, None, None], full, hidden)
                vl = model(xt, edges, ~val, task, self.llm_cost_)
                wv = weight * val.float()[:, None]
                vloss = float((nn.functional.binary_cross_entropy_with_logits(vl, target, reduction="none") * wv).sum()
                              / wv.sum())
            if vloss < best:
                best, best_state, best_step = vloss, copy.deepcopy(model.state_dict()), step
            elif step - best_step >= self.patience:
                break
        model.load_state_dict(best_state)
        self.model_, self.best_step_ = model.eval(), best_step
        self.graph_ = (xt, full, task)  # the training graph every new query joins
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.model_ is None:
            raise RuntimeError("GraphRouter.predict_quality before fit")
        x_new = self.featurizer.transform(data)
        x_tr, e_tr, t_tr = self.graph_
        task_new = torch.as_tensor(self.tasks_.predict(x_new), dtype=torch.long)
        x = torch.cat([x_tr, torch.as_tensor(x_new)])
        edges = torch.cat([e_tr, self._edges(None, (len(x_new), e_tr.shape[1]))])
        observed = torch.cat([torch.ones(len(x_tr), dtype=torch.bool), torch.zeros(len(x_new), dtype=torch.bool)])
        with torch.no_grad(), single_threaded():
            # New queries read only the training graph (LLM and task nodes aggregate observed
            # queries alone), so each new query's score does not depend on the others scored with it.
            logits = self.model_(x, edges, observed, torch.cat([t_tr, task_new]), self.llm_cost_)[len(x_tr):]
        return torch.sigmoid(logits).numpy().astype(float)
