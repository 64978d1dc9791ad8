"""The LM controller's environment over logged outcomes, its rewards, and Algorithm 1's rollout tree.

Every agent's full draft and its correctness are in the table, so calling an agent is a look-up: the
controller's text is the only thing generated. Agents are ordered weaker → stronger (by accuracy on
the training rows), as Template I/II list them; ξ and ρ, given strongest first, are mapped onto them.

Rewards (002 §3.2–3.3), per controller turn, with the readings the paper leaves open as switches
(lm_config.RewardSettings):
    eq. 1   r_t = w·R_r + (1 − w)·R_v                      (w = 0.5)
            R_r = 1(the routed agent's draft is correct);  R_v = 1(the verdict is correct)
            R_v(s_1, a_1) = 0 (no draft yet); R_r(s_T, a_T) = 0 (no routing at T);
            a stop's R_r: 0 ("zero", the paper's "not applicable") or 1(kept draft correct) ("kept_draft")
    eq. 3   R'_r = R_r − Σ_k 2ξ_k·1(f(a_t) = k)            (each call of k costs w·2ξ_k = ξ_k)
A malformed turn acts as its fallback (turn 1: the weakest agent; later turns: accept the draft) and
its reward is the fallback's minus `malformed_penalty` (ours). Routing goes upward only (Template II);
the strongest agent's draft ends the episode unless `verify_strongest`.

CoRL (003 §3.3 eq. 5–7): one decision, self (the weakest agent's logged answer, priced by its logged
tokens) or the expert (the strongest agent); r = r_p·1(cost ≤ B_mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.base import RoutingData
from models.critique.env import by_rank
from models.critique.lm_config import RewardSettings
from models.critique.lm_prompts import (ACCEPT, ROUTE, ParsedTurn, corl_messages, display_name,
                                        parse_corl, parse_routing, parse_verification, routing_messages,
                                        tail_tokens, verify_messages)
from routerops.errors import InputError
from routerops.orchestra.controller import Controller, ControllerTurn, Message

MODES = ("low", "medium", "high")


@dataclass
class OutcomeTable:
    """n queries × K agents, agents weaker → stronger."""

    workers: list[str]  # the table's worker names
    agents: list[str]  # as the prompts show them
    questions: list[str]
    drafts: list[list[str]]  # drafts[q][k]
    correct: np.ndarray  # (n, K) 0/1
    costs: np.ndarray  # (n, K) USD per call
    template: str = "full"  # which prompt wording the controller reads (lm_config.PromptSettings.template)

    def __post_init__(self) -> None:
        if self.correct.shape[1] < 2:
            raise InputError("logged outcomes", "worker", "a controller needs ≥ 2 agents")

    @property
    def strongest(self) -> int:
        return len(self.agents) - 1

    def by_strength(self, values: Sequence[float]) -> np.ndarray:
        """Per agent (weaker → stronger) from a by-rank list given strongest first (ξ, ρ)."""
        return by_rank(tuple(values), len(self.agents))[::-1].copy()


def outcome_table(data: RoutingData, fit_rows: np.ndarray | None = None, short_names: bool = True,
                  template: str = "full") -> OutcomeTable:
    """Agents ordered weaker → stronger by accuracy on `fit_rows` (ties: cheaper first)."""
    if data.responses is None:
        raise InputError("logged outcomes", "response", "the controller reads each agent's draft: the table "
                         "needs a `response` column (docs/replay_format.md)")
    rows = np.arange(len(data)) if fit_rows is None else np.asarray(fit_rows)
    order = np.lexsort((data.costs[rows].mean(axis=0), data.scores[rows].mean(axis=0)))
    return OutcomeTable(workers=[data.workers[j] for j in order],
                        agents=[display_name(data.workers[j], short_names) for j in order],
                        questions=list(data.queries),
                        drafts=[[row[j] or "" for j in order] for row in data.responses],
                        correct=np.asarray(data.scores[:, order], dtype=float),
                        costs=np.asarray(data.costs[:, order], dtype=float), template=template)


# ---- one turn ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """What one controller turn did and earned."""

    reward: float
    r_routing: float
    r_verify: float
    penalty: float  # 2ξ_k of the call (before the weight w)
    called: int  # agent called, −1 none
    next_author: int  # author of the next state's draft, −1 when the episode ended
    final: int  # agent whose draft is the answer when the episode ended here, −1 otherwise
    malformed: bool
    verdict: bool | None  # the verdict written (None at turn 1)


def turn_step(table: OutcomeTable, query: int, turn: int, author: int, parsed: ParsedTurn, horizon: int,
              xi: np.ndarray, rewards: RewardSettings) -> Step:
    """Eq. 3's reward of one parsed turn, and the transition (module docstring)."""
    kind, model = parsed.kind, parsed.model
    if parsed.malformed:  # fallback action: the cheapest route at turn 1, else keep the draft
        kind, model = (ROUTE, 0) if turn == 1 else (ACCEPT, None)
    correct = table.correct[query]
    r_routing = r_verify = penalty = 0.0
    called, next_author, final, verdict = -1, -1, -1, None
    if turn == 1:
        if kind != ROUTE:
            raise ValueError("turn 1 must route")
        called, r_routing = model, correct[model]  # R_v(s_1, a_1) = 0
    else:
        draft_right = correct[author]
        verdict = kind == ACCEPT
        r_verify = draft_right if verdict else 1.0 - draft_right
        if verdict:
            final = author
            r_routing = draft_right if rewards.stop_routing == "kept_draft" else 0.0
        elif model is not None and turn < horizon:
            called, r_routing = model, correct[model]
        else:  # False with nothing to call (turn T, or the strongest's draft): the draft stands
            final = author
    if called >= 0:
        penalty = 2.0 * float(xi[called])
        ends = called == table.strongest and not rewards.verify_strongest
        final, next_author = (called, -1) if ends else (-1, called)
    w = rewards.routing_weight
    reward = w * (r_routing - penalty) + (1 - w) * r_verify - (rewards.malformed_penalty if parsed.malformed else 0.0)
    return Step(float(reward), float(r_routing), float(r_verify), penalty, int(called), int(next_author),
                int(final), parsed.malformed, verdict)


def turn_messages(table: OutcomeTable, query: int, author: int, draft_tail: int, tokenizer: Any = None) -> list[Message]:
    if author < 0:
        return routing_messages(table.questions[query], table.agents, table.template)
    draft = tail_tokens(table.drafts[query][author], draft_tail, tokenizer)
    return verify_messages(table.questions[query], table.agents, author, draft, table.template)


def parse_turn(table: OutcomeTable, author: int, text: str) -> ParsedTurn:
    return parse_routing(text, table.agents) if author < 0 else parse_verification(text, table.agents, author)


# ---- Algorithm 1's tree --------------------------------------------------------------------------

@dataclass
class TreeNode:
    """One sampled action a_t^(b,i): the state it came from, what the controller wrote, what it earned."""

    tree: int  # which query of the mini-batch
    query: int
    state: int  # id of s_t^b (unique in the rollout)
    turn: int
    author: int
    messages: list[Message]
    output: ControllerTurn
    parsed: ParsedTurn
    step: Step
    child: int = -1  # id of s_{t+1}^(b,i), −1 terminal
    advantage: float = 0.0
    extra: dict = field(default_factory=dict)


def rollout_tree(controller: Controller, table: OutcomeTable, queries: Sequence[int], group: int, horizon: int,
                 xi: np.ndarray, rewards: RewardSettings, draft_tail: int, tokenizer: Any = None) -> list[TreeNode]:
    """Alg. 1 lines 4–20 for every query at once: each level's G×|B_t| conversations go to the
    controller in one respond() call (the sampler batches them)."""
    nodes: list[TreeNode] = []
    states = [(i, tree, int(q), -1) for i, (tree, q) in enumerate(enumerate(queries))]  # (id, tree, query, author)
    next_id = len(states)
    for turn in range(1, horizon + 1):
        if not states:
            break
        prompts = [(s, turn_messages(table, s[2], s[3], draft_tail, tokenizer)) for s in states]
        outputs = controller.respond([m for _, m in prompts for _ in range(group)])
        children = []
        for k, out in enumerate(outputs):
            (sid, tree, query, author), messages = prompts[k // group]
            parsed = parse_turn(table, author, out.text)
            step = turn_step(table, query, turn, author, parsed, horizon, xi, rewards)
            node = TreeNode(tree, query, sid, turn, author, messages, out, parsed, step)
            if step.next_author >= 0 and turn < horizon:
                node.child = next_id
                children.append((next_id, tree, query, step.next_author))
                next_id += 1
            nodes.append(node)
        states = children
    return nodes


def corl_rollout(controller: Controller, table: OutcomeTable, queries: Sequence[int], modes: Sequence[int],
                 group: int, budgets: Sequence[float], malformed_penalty: float) -> list[TreeNode]:
    """G sampled decisions per (query, mode): a one-level tree whose groups are the (query, mode) states.
    `budgets`: B per state (models/critique/corl_budgets.py: drawn per query, or the mode's fixed B)."""
    expert = table.agents[table.strongest]
    prompts = [corl_messages(table.questions[q], expert, MODES[m], table.template) for q, m in zip(queries, modes)]
    outputs = controller.respond([p for p in prompts for _ in range(group)])
    nodes = []
    for k, out in enumerate(outputs):
        i = k // group
        q, mode = int(queries[i]), int(modes[i])
        parsed = parse_corl(out.text, expert)
        nodes.append(TreeNode(i, q, i, 1, -1, prompts[i], out, parsed,
                              corl_step(table, q, parsed, budgets[i], malformed_penalty), extra={"mode": mode}))
    return nodes


def corl_step(table: OutcomeTable, query: int, parsed: ParsedTurn, budget: float, malformed_penalty: float) -> Step:
    """003 eq. 5–7: r = r_p·1(cost ≤ B); self is the weakest agent, the expert the strongest."""
    agent = table.strongest if (not parsed.malformed and parsed.model == 1) else 0
    r_p = float(table.correct[query, agent])
    r_c = float(table.costs[query, agent] <= budget)
    reward = r_p * r_c - (malformed_penalty if parsed.malformed else 0.0)
    return Step(reward, r_p, r_c, 0.0, agent, -1, agent, parsed.malformed, None)
