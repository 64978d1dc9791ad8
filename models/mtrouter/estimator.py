"""Outcome estimator ŝ_θ(h_t, a) = f_θ([z_x; z_a]) (MTRouter §3.3 eq. 4, 7) and its training loop.

f_θ is an MLP with ReLU and dropout over the joint history–model representation; ψ (the model
encoder) is trained jointly. Training minimises the squared error to the error-penalised targets
(eq. 7) plus the residual L2 penalty, with AdamW (lr 1e-3, weight decay 0.01), cosine annealing,
batch 64, up to 100 epochs and early stopping (patience 3) on validation loss (§4.1).
`RidgeOutcomeEstimator` is Table 4's linear ablation on the same features.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.linear_head import LinearHead, cross_fitted_predictions
from models.mtrouter.model_encoder import AttributeTable, ModelEncoder


@dataclass
class TrainingSet:
    """Examples (history, model, target); distinct histories are stored once and indexed."""

    histories: np.ndarray  # (h, d) float32: z_x of each distinct history
    history_idx: np.ndarray  # (n,) int: which history each example uses
    model_idx: np.ndarray  # (n,) int: index of the model into the AttributeTable
    targets: np.ndarray  # (n,) float: S̃_t
    groups: np.ndarray | None = None  # (n,) task ids, so validation splits never share a task

    def __len__(self) -> int:
        return len(self.targets)

    def subset(self, rows: np.ndarray) -> "TrainingSet":
        return TrainingSet(self.histories, self.history_idx[rows], self.model_idx[rows], self.targets[rows],
                           None if self.groups is None else self.groups[rows])

    def features(self) -> np.ndarray:
        return self.histories[self.history_idx]


def shared_histories(parts: list[TrainingSet]) -> tuple[np.ndarray, np.ndarray]:
    """One history matrix and the rows' indices into it for several TrainingSets: the sets' own
    matrix when they share one (the single-turn adapter indexes one z_x table), else stacked."""
    if all(p.histories is parts[0].histories for p in parts):
        return parts[0].histories, np.concatenate([p.history_idx for p in parts])
    offsets = np.cumsum([0] + [len(p.histories) for p in parts[:-1]])
    return (np.concatenate([p.histories for p in parts]),
            np.concatenate([p.history_idx + o for p, o in zip(parts, offsets)]))


@dataclass
class FitReport:
    train_loss: list[float] = field(default_factory=list)  # mean MSE (standardised targets) per epoch
    val_loss: list[float] = field(default_factory=list)
    best_epoch: int = -1
    stopped_early: bool = False


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class FirstLayerOnFrozenHistory(torch.autograd.Function):
    """f_θ's first layer W·[z_x; z_a] + b, whose backward skips the gradient with respect to z_x.

    φ is frozen (§3.3), so z_x needs no gradient; but z_a does (ψ trains jointly), and autograd,
    seeing a concatenation that requires grad, computed the whole (batch × 4.5k) input gradient to
    keep its last 64 columns: a third of the first layer's arithmetic, which is most of a step on a
    single-turn table's 4,486-wide z_x. Forward and the kept gradients are computed with the very
    operations autograd's linear (addmm) backward uses (grad_W = gᵀ·x, grad_b = Σ g, grad_za =
    g·W[:, d:], a column slice of its g·W), so training is unchanged to the bit on this CPU
    (tests/models/mtrouter/test_estimator_first_layer.py compares both against autograd's).
    """

    @staticmethod
    def forward(ctx, zx: torch.Tensor, za: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = torch.cat([zx, za], dim=-1)
        ctx.save_for_backward(x, weight)
        ctx.history_width = zx.shape[-1]
        return nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_za = grad.mm(weight[:, ctx.history_width:]) if ctx.needs_input_grad[1] else None
        grad_zx = grad.mm(weight[:, : ctx.history_width]) if ctx.needs_input_grad[0] else None
        return grad_zx, grad_za, grad.t().mm(x), grad.sum(0)


class OutcomeNet(nn.Module):
    """f_θ([z_x; ψ(a)]) → scalar (eq. 4)."""

    def __init__(self, x_dim: int, table: AttributeTable, cfg: MTRouterConfig):
        super().__init__()
        self.model_encoder = ModelEncoder(table, cfg)
        layers: list[nn.Module] = []
        width = x_dim + self.model_encoder.out_dim
        for hidden in cfg.hidden_dims:
            layers += [nn.Linear(width, int(hidden)), nn.ReLU(), nn.Dropout(cfg.dropout)]
            width = int(hidden)
        layers.append(nn.Linear(width, 1))
        self.backbone = nn.Sequential(*layers)

    def forward(self, zx: torch.Tensor, model_idx: torch.Tensor) -> torch.Tensor:
        first, *rest = self.backbone
        h = FirstLayerOnFrozenHistory.apply(zx, self.model_encoder(model_idx), first.weight, first.bias)
        for layer in rest:
            h = layer(h)
        return h.squeeze(-1)

    def score_candidates(self, zx: torch.Tensor, model_idx: torch.Tensor) -> torch.Tensor:
        """One history (d,) against c candidates in one batch: z_x is computed once and broadcast."""
        za = self.model_encoder(model_idx)
        return self.backbone(torch.cat([zx.expand(len(model_idx), -1), za], dim=-1)).squeeze(-1)


class OutcomeEstimator:
    """Trains `cfg.ensemble` OutcomeNets (seeds seed, seed+1 …) and averages their predictions;
    with cfg.linear_head, beside a closed-form per-model linear head (models.mtrouter.linear_head).

    Targets are standardised on the training set (so one learning rate suits any score scale) and
    predictions come back in target units. Inputs are used as the featurizer gives them: the
    sentence embedding is already L2-normalised, and z-scoring its 384 near-noise dimensions made
    the MLP overfit within one epoch on small tables.
    """

    def __init__(self, table: AttributeTable, cfg: MTRouterConfig):
        self.table = table
        self.cfg = cfg
        self.device = pick_device(cfg.device)
        self.nets: list[OutcomeNet] = []
        self.reports: list[FitReport] = []
        self.head: LinearHead | None = None
        self.y_mean, self.y_std = 0.0, 1.0  # the nets are trained on (y − mean) / std

    # ---- training
    def fit(self, train: TrainingSet, val: TrainingSet | None = None) -> "OutcomeEstimator":
        val = val if val is not None and len(val) else None
        if self.cfg.linear_head:
            train, val = self._fit_linear_head(train, val)
        self.y_mean, self.y_std = float(train.targets.mean()), float(train.targets.std()) or 1.0
        self.nets, self.reports = [], []
        for k in range(self.cfg.ensemble):
            net, report = self._fit_one(train, val, self.cfg.seed + k)
            self.nets.append(net.eval())
            self.reports.append(report)
        return self

    def _fit_linear_head(self, train: TrainingSet, val: TrainingSet | None) -> tuple[TrainingSet, TrainingSet | None]:
        """Fit the head on train ∪ val (RidgeCV validates itself); return both sets with targets
        replaced by their cross-fitted residuals, which the MLP then learns."""
        parts = [train] + ([val] if val is not None else [])
        histories, hidx = shared_histories(parts)
        m = np.concatenate([p.model_idx for p in parts])
        y = np.concatenate([p.targets for p in parts])
        groups = None if any(p.groups is None for p in parts) else np.concatenate([p.groups for p in parts])
        self.head = LinearHead(self.table, self.cfg).fit(histories, hidx, m, y)
        residual = y - cross_fitted_predictions(self.head, histories, hidx, m, y, groups)
        train = dataclasses.replace(train, targets=residual[: len(train)])
        return train, None if val is None else dataclasses.replace(val, targets=residual[len(train):])

    def _tensors(self, data: TrainingSet) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        hist = torch.as_tensor(data.histories, dtype=torch.float32, device=self.device)
        return (hist, torch.as_tensor(data.history_idx, dtype=torch.long, device=self.device),
                torch.as_tensor(data.model_idx, dtype=torch.long, device=self.device),
                torch.as_tensor((data.targets - self.y_mean) / self.y_std, dtype=torch.float32, device=self.device))

    def _new_net(self, x_dim: int) -> OutcomeNet:
        net = OutcomeNet(x_dim, self.table, self.cfg).to(self.device)
        if self.cfg.linear_head:  # start the residual model at zero: ŝ = the linear head
            nn.init.zeros_(net.backbone[-1].weight)
            nn.init.zeros_(net.backbone[-1].bias)
        return net

    def _fit_one(self, train: TrainingSet, val: TrainingSet | None, seed: int) -> tuple[OutcomeNet, FitReport]:
        torch.manual_seed(seed)
        net = self._new_net(train.histories.shape[1])
        # fused: one kernel over every parameter instead of a loop of small ops per tensor; a step of
        # the 4.6k-input net went from 19.8 to 8.4 ms on this CPU (same update rule, AdamW §4.1).
        opt = torch.optim.AdamW(net.parameters(), lr=self.cfg.learning_rate, weight_decay=self.cfg.weight_decay,
                                fused=True)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.cfg.max_epochs)
        hist, hidx, midx, y = self._tensors(train)
        val_t = self._tensors(val) if val is not None else None
        gen = torch.Generator(device="cpu").manual_seed(seed)
        report, waited = FitReport(), 0
        # Early stopping (§4.1) may keep the untrained net (best_epoch −1) if no epoch beats it.
        best_val = self._val_loss(net, val_t) if val_t is not None else float("inf")
        best_state = copy.deepcopy(net.state_dict())
        for epoch in range(self.cfg.max_epochs):
            net.train()
            total = 0.0
            for rows in torch.randperm(len(y), generator=gen).to(self.device).split(self.cfg.batch_size):
                pred = net(hist[hidx[rows]], midx[rows])
                loss = nn.functional.mse_loss(pred, y[rows]) + net.model_encoder.residual_penalty()  # eq. 7
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(rows)
            sched.step()
            report.train_loss.append(total / len(y))
            if val_t is None:
                best_state, report.best_epoch = None, epoch
                continue
            report.val_loss.append(self._val_loss(net, val_t))
            if report.val_loss[-1] < best_val - 1e-6:
                best_val, best_state, waited, report.best_epoch = report.val_loss[-1], copy.deepcopy(net.state_dict()), 0, epoch
            else:
                waited += 1
                if waited >= self.cfg.patience:  # early stopping, patience 3 (§4.1)
                    report.stopped_early = True
                    break
        if best_state is not None:
            net.load_state_dict(best_state)
        return net, report

    @staticmethod
    def _val_loss(net: OutcomeNet, val_t) -> float:
        hist, hidx, midx, y = val_t
        net.eval()
        with torch.no_grad():
            return float(nn.functional.mse_loss(net(hist[hidx], midx), y))

    # ---- prediction
    def _input(self, zx: np.ndarray) -> torch.Tensor:
        if not self.nets:
            raise RuntimeError("OutcomeEstimator used before fit()")
        return torch.as_tensor(np.asarray(zx, dtype=np.float32), dtype=torch.float32, device=self.device)

    def _with_head(self, deep: torch.Tensor, zx: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        out = deep.cpu().numpy() * self.y_std + self.y_mean
        return out if self.head is None else out + self.head.predict(zx, model_idx)

    def predict(self, zx: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        """ŝ for n (history, model) pairs: zx (n, d), model_idx (n,)."""
        x, m = self._input(zx), torch.as_tensor(model_idx, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            deep = torch.stack([net(x, m) for net in self.nets]).mean(0)
        return self._with_head(deep, zx, model_idx)

    def predict_matrix(self, zx: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        """(n, c) ŝ of n histories against the same c candidate models."""
        n, c = len(zx), len(model_idx)
        rows = np.repeat(np.asarray(zx, dtype=np.float32), c, axis=0)
        return self.predict(rows, np.tile(np.asarray(model_idx), n)).reshape(n, c)

    def score_candidates(self, zx: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        """(c,) ŝ of one history (d,) against c candidates, all in one batch (§3.2)."""
        x, m = self._input(zx[None, :]), torch.as_tensor(model_idx, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            deep = torch.stack([net.score_candidates(x, m) for net in self.nets]).mean(0)
        return self._with_head(deep, np.repeat(np.asarray(zx)[None, :], len(model_idx), axis=0), np.asarray(model_idx))


class RidgeOutcomeEstimator:
    """Table 4's "Ridge" ablation: a regularised linear model on [z_x; attributes; one-hot model]
    (the linear analogue of [z_x; ψ(a)]); the penalty is chosen by RidgeCV's inner validation."""

    def __init__(self, table: AttributeTable, cfg: MTRouterConfig):
        self.table = table
        self.cfg = cfg
        self.model = None
        self.reports: list[FitReport] = []

    def _model_features(self, model_idx: np.ndarray) -> np.ndarray:
        attrs = self.table.standardised()[model_idx]
        onehot = np.eye(len(self.table.models), dtype=np.float32)[model_idx]
        return np.concatenate([attrs, onehot], axis=1)

    def _design(self, zx: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        return np.concatenate([np.asarray(zx, dtype=np.float32), self._model_features(np.asarray(model_idx))], axis=1)

    def fit(self, train: TrainingSet, val: TrainingSet | None = None) -> "RidgeOutcomeEstimator":
        from sklearn.linear_model import RidgeCV

        self.model = RidgeCV(alphas=list(self.cfg.ridge_alphas)).fit(self._design(train.features(), train.model_idx),
                                                                     train.targets)
        return self

    def predict(self, zx: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        if self.model is None:
            raise RuntimeError("RidgeOutcomeEstimator used before fit()")
        return self.model.predict(self._design(zx, model_idx))

    def predict_matrix(self, zx: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        n, c = len(zx), len(model_idx)
        return self.predict(np.repeat(np.asarray(zx), c, axis=0), np.tile(np.asarray(model_idx), n)).reshape(n, c)

    def score_candidates(self, zx: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        return self.predict(np.repeat(np.asarray(zx)[None, :], len(model_idx), axis=0), np.asarray(model_idx))


def build_estimator(table: AttributeTable, cfg: MTRouterConfig) -> OutcomeEstimator | RidgeOutcomeEstimator:
    return RidgeOutcomeEstimator(table, cfg) if cfg.regressor == "ridge" else OutcomeEstimator(table, cfg)
