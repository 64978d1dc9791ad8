"""A verdict threshold fitted on validation rows (ours, issue 24): the usage constraint met at decoding.

Why. A warm-up on training outcomes teaches the LM controller p(False | question, draft) at Template
II's verdict token, and that probability ranks drafts usefully (on held-out training rows its ROC AUC
for "the draft is wrong" was 0.66, above the 0.57 of a logistic model of the question alone:
experiments/critique_verdict_probe.py, experiments/critique_draft_signal.py). But Mixtral is right on
63 % of queries, so p(False) stays below ½ on nearly every draft and greedy decoding accepts them all:
the ranking is there, the operating point is not. 002 reaches its operating point, "< 25 % of calls
to the strongest agent" (§4.2), through the multipliers ξ and RL; on two CPU cores a few RL steps do
not move the level reliably (docs/critique/lm.md). So the level is set where the paper states its
constraint: on validation rows, the threshold τ on p(False) that makes the strongest agent's share of
all calls ρ_strongest (rewards.rho), and at test time the verdict is False iff p(False) > τ.

How. `VerdictSteer` is a FastSampler `steer` hook: at the token after "<verdict>" it keeps only the
"True" and "False" tokens (a verdict is then always well formed), records p(False) of the pair, and
picks False iff p(False) > τ; after "<verdict>True</verdict>" it ends the turn (Template II, 002 Tab. 8,
writes `<model>` only after False: a controller inclined to reject, overruled by τ, would otherwise go
on to name a model and make its turn malformed). Everything else the controller writes is untouched.
τ = ½ is greedy decoding restricted to the two verdict words. `fit_verdict_threshold` fits τ through
any greedy episode runner (the evaluation's and the registration's share it); the served controller
(evaluation/serving/critique.py) keeps τ in its artifact, so the gateway decides as the evaluation did.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from routerops.errors import InputError

MARKER = "<verdict>"
ACCEPTED = "<verdict>True</verdict>"


class VerdictSteer:
    """The verdict token chosen between True and False by p(False) > threshold (module docstring)."""

    def __init__(self, tokenizer: Any, threshold: float = 0.5):
        if not 0.0 < threshold <= 1.0:
            raise InputError("critique_lm", "verdict threshold", f"must be in (0, 1], got {threshold}")
        self.tokenizer = tokenizer
        self.threshold = float(threshold)
        self.true_id, self.false_id = (tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in ("True", "False"))
        self.marker_tokens = len(tokenizer(MARKER, add_special_tokens=False)["input_ids"])
        self.accepted_tokens = len(tokenizer(ACCEPTED, add_special_tokens=False)["input_ids"])
        self.end_id = tokenizer.eos_token_id  # the chat template's end of turn (SmolLM2: <|im_end|>)
        self.p_false: list[float] = []  # p(False | True or False) at every verdict position met
        self.prefixes: list[tuple[int, ...]] = []  # the tokens generated before each of them

    def reset(self) -> None:
        self.p_false.clear()
        self.prefixes.clear()

    def p_false_of(self, token_ids: Sequence[int]) -> float | None:
        """p(False) recorded at the verdict of the turn whose tokens are `token_ids` (rows of a batch
        reach their verdicts at different steps, so the record is found by its prefix), else None."""
        ids = tuple(token_ids)
        for prefix, p in zip(self.prefixes, self.p_false):
            if ids[:len(prefix)] == prefix:
                return p
        return None

    def at_verdict(self, generated: Sequence[int]) -> bool:
        return len(generated) >= self.marker_tokens and self.tokenizer.decode(
            list(generated[-self.marker_tokens:]), skip_special_tokens=True).endswith(MARKER)

    def just_accepted(self, generated: Sequence[int]) -> bool:
        return self.end_id is not None and len(generated) >= self.accepted_tokens and self.tokenizer.decode(
            list(generated[-self.accepted_tokens - 1:]), skip_special_tokens=True).endswith(ACCEPTED)

    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        if self.just_accepted(generated):
            ended = torch.full_like(logits, float("-inf"))
            ended[self.end_id] = 0.0
            return ended
        if not self.at_verdict(generated):
            return logits
        pair = torch.softmax(logits[[self.true_id, self.false_id]].float(), -1)
        p_false = float(pair[1])
        self.p_false.append(p_false)
        self.prefixes.append(tuple(generated))
        steered = torch.full_like(logits, float("-inf"))
        chosen = self.false_id if p_false > self.threshold else self.true_id
        steered[chosen] = 0.0
        return steered


def fit_threshold(p_false: Sequence[float], strong_first_calls: int, queries: int, rho: float) -> float:
    """τ such that rejecting the drafts with p(False) > τ makes the strongest agent's share of all calls at
    most ρ on the fitting rows: with n₁ queries sent to it at turn 1 and r rejections over m queries,
    share = (n₁ + r) / (m + r) ≤ ρ ⇔ r ≤ (ρ·m − n₁) / (1 − ρ). Two agents: a rejection is one call to the
    strongest. Returns 1.0 (never reject) when no rejection fits."""
    if not 0.0 < rho < 1.0:
        raise InputError("critique_lm", "rewards.rho", f"the strongest agent's usage budget must be in (0, 1), got {rho}")
    allowed = int(math.floor((rho * queries - strong_first_calls) / (1.0 - rho) + 1e-9))
    p = np.sort(np.asarray(p_false, dtype=float))[::-1]
    if allowed <= 0 or not len(p):
        return 1.0
    if allowed >= len(p):
        return float(max(p[-1] - 1e-9, 1e-9))  # every draft may be rejected
    # Between the allowed-th and the next value: exactly `allowed` drafts lie above (ties: fewer).
    return float(max((p[allowed - 1] + p[allowed]) / 2.0, 1e-9))


def fit_verdict_threshold(run_greedy: Callable[[VerdictSteer], list[list[str]]], tokenizer: Any, rows: int,
                          strongest: int, rho: float) -> tuple[float, VerdictSteer]:
    """τ fitted on `rows` fitting queries: `run_greedy(steer)` runs the controller greedily on them with
    `steer` installed (τ = ½, recording p(False) at every verdict) and returns each episode's decisions
    ("route:k", ...); τ is then `fit_threshold` of what it recorded. Returns τ and the probe."""
    probe = VerdictSteer(tokenizer, 0.5)
    decisions = run_greedy(probe)
    first_to_strong = sum(1 for d in decisions if d and d[0] == f"route:{strongest}")
    return fit_threshold(probe.p_false, first_to_strong, rows, rho), probe
