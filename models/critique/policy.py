"""The controller policy π_θ(a | s): a small MLP over the frozen state features, with masked logits.

Paper 002 instantiates π_θ as an LLM that writes a verdict and a <model> tag (App. B); paper 003 as an
LLM with a value model beside it. Ours reads frozen MiniLM embeddings of the question and the draft
(models/critique/env.py) and outputs a distribution over {stop, route to agent k}: an RL-trained
SmolLM2 over 1,000 GSM8K queries does not fit a 2-core CPU, and on logged outcomes the controller's
only choices that change anything are the verdict and the route, which a head over the features
expresses exactly. The value network is CoRL's (003 §3.2, GAE's V_φ), unused by GRPO.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

NEG = -1e9  # logit of a masked action


class ControllerPolicy(nn.Module):
    def __init__(self, in_dim: int, n_actions: int, hidden: int = 64, value_head: bool = False, seed: int = 0):
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, n_actions)
        # Start from the uniform policy over the allowed actions: the first rollouts explore evenly.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        # CoRL's value model V_φ is a network of its own (003 §4.2 trains it at its own learning rate).
        self.value = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1)) if value_head else None
        torch.random.set_rng_state(generator_state)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(masked logits (m, A), value (m,) or None)."""
        h = self.body(x)
        logits = self.head(h).masked_fill(~mask, NEG)
        value = None if self.value is None else self.value(x).squeeze(-1)
        return logits, value

    def log_probs(self, x: np.ndarray, mask: np.ndarray) -> torch.Tensor:
        logits, _ = self(torch.as_tensor(x), torch.as_tensor(mask))
        return torch.log_softmax(logits, dim=-1)

    @torch.no_grad()
    def probabilities(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.log_probs(x, mask).exp().numpy()

    @torch.no_grad()
    def sample(self, x: np.ndarray, mask: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """(m, n) actions drawn i.i.d. from π_θ(· | s) at temperature 1 (002 Table 9, training)."""
        p = self.probabilities(x, mask).astype(float)
        p /= p.sum(axis=1, keepdims=True)
        cdf = np.cumsum(p, axis=1)
        u = rng.random((len(p), n, 1))
        return np.minimum((u >= cdf[:, None, :]).sum(axis=2), p.shape[1] - 1)
