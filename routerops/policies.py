"""Behaviour policies that collect the logged trajectories routers learn from.

MTRouter (§3.3, "Data collection") trains on two sources: single-model runs, which anchor each
worker's own behaviour, and a uniform random router, which covers the action space. Each policy
states the probability of every action it may take (`probabilities`), so the propensity logged
with each turn is exact and off-policy estimators can weight any logged action.

Determinism: a policy draws only from the `random.Random` the rollout engine hands it, and
`episode_rng` derives that from the policy's seed and the episode id; a resumed collection therefore
repeats the same choices for an episode it has to redo.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from typing import Sequence

from routerops.pricing import Pool
from routerops.types import STOP, Action, EpisodeState

ANSWER = "answer"  # the primitive an LLM worker uses to answer the task itself
UNIFORM_RANDOM, RANDOM_MULTI_TURN, SINGLE = "uniform_random", "random_multi_turn", "single"


def episode_rng(policy_seed: int, episode_id: str) -> random.Random:
    """Per-episode generator; independent of the order in which episodes are run."""
    digest = hashlib.sha256(json.dumps([int(policy_seed), episode_id]).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def is_stop(action: Action) -> bool:
    return action.primitive == STOP.primitive


def sample(distribution: Sequence[Action], rng: random.Random) -> Action:
    """Draw one action in proportion to its propensity (the propensities sum to one)."""
    draw = rng.random()
    cumulative = 0.0
    for action in distribution:
        cumulative += action.propensity
        if draw < cumulative:
            return action
    return distribution[-1]  # guards against a sum of 0.9999999 from rounding


def uniform(actions: Sequence[Action], mass: float = 1.0) -> list[Action]:
    return [Action(a.worker, a.primitive, mass / len(actions)) for a in actions]


def stop_with_certainty() -> list[Action]:
    return [Action(STOP.worker, STOP.primitive, 1.0)]


class DistributionPolicy:
    """A policy given by a distribution over the offered actions and STOP."""

    name: str
    version: str = "1"
    seed: int = 0

    def probabilities(self, state: EpisodeState, actions: Sequence[Action]) -> list[Action]:
        """Every action this policy may take now, with its probability (they sum to one)."""
        raise NotImplementedError

    def act(self, state: EpisodeState, actions: Sequence[Action], rng: random.Random) -> Action:
        return sample(self.probabilities(state, actions), rng)


@dataclass
class SinglePolicy(DistributionPolicy):
    """Always the same (worker, primitive); MTRouter's single-model runs.

    `turns` calls, then STOP: 1 for question answering; None keeps calling until the environment
    ends the episode (multi-turn environments, where the model is used for the whole episode).
    """

    worker: str
    primitive: str = ANSWER
    turns: int | None = 1

    def __post_init__(self) -> None:
        self.name = f"{SINGLE}/{self.worker}/{self.primitive}"
        self.version = f"1;turns={self.turns}"

    def probabilities(self, state: EpisodeState, actions: Sequence[Action]) -> list[Action]:
        finished = self.turns is not None and len(state.turns) >= self.turns
        offered = any((a.worker, a.primitive) == (self.worker, self.primitive) for a in actions)
        if finished or not offered:
            return stop_with_certainty()
        return [Action(self.worker, self.primitive, 1.0)]


@dataclass
class UniformRandomRouter(DistributionPolicy):
    """One call to a uniformly chosen affordable action, then STOP (single-turn random router).

    `primitives` limits the candidates to actions that answer the task (by default LLM workers'
    "answer"); None makes every offered action a candidate. Propensity = 1 / |candidates|.
    """

    seed: int = 0
    primitives: tuple[str, ...] | None = (ANSWER,)

    def __post_init__(self) -> None:
        self.name = UNIFORM_RANDOM
        self.version = f"1;seed={self.seed};primitives={','.join(self.primitives or ('*',))}"

    def candidates(self, actions: Sequence[Action]) -> list[Action]:
        if self.primitives is None:
            return list(actions)
        return [a for a in actions if a.primitive in self.primitives]

    def probabilities(self, state: EpisodeState, actions: Sequence[Action]) -> list[Action]:
        candidates = self.candidates(actions)
        if state.turns or not candidates:
            return stop_with_certainty()
        return uniform(candidates)


@dataclass
class RandomMultiTurnPolicy(DistributionPolicy):
    """MTRouter's random router: a uniformly random affordable action at every turn.

    Once a candidate answer exists it stops with probability `stop_prob`; the logged propensity of
    a call is then (1 - stop_prob) / |actions|, and 1 / |actions| before any answer exists.
    """

    stop_prob: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.stop_prob <= 1.0:
            raise ValueError(f"stop_prob must lie in [0, 1], got {self.stop_prob}")
        self.name = RANDOM_MULTI_TURN
        self.version = f"1;seed={self.seed};stop_prob={self.stop_prob:g}"

    def probabilities(self, state: EpisodeState, actions: Sequence[Action]) -> list[Action]:
        if not actions:
            return stop_with_certainty()
        if state.answer is None or self.stop_prob == 0.0:
            return uniform(actions)
        if self.stop_prob == 1.0:
            return stop_with_certainty()
        return uniform(actions, 1.0 - self.stop_prob) + [Action(STOP.worker, STOP.primitive, self.stop_prob)]


def behaviour_policies(pool: Pool, seed: int = 0, stop_prob: float = 0.5) -> list[DistributionPolicy]:
    """MTRouter's collection mix: every single (worker, primitive), the uniform router, the random
    multi-turn router."""
    return policies_by_name([SINGLE, UNIFORM_RANDOM, RANDOM_MULTI_TURN], pool, seed, stop_prob)


def policies_by_name(
    names: Sequence[str], pool: Pool, seed: int = 0, stop_prob: float = 0.5
) -> list[DistributionPolicy]:
    """Policies named in a config: "single" (one per (worker, primitive) of the pool),
    "single/<worker>/<primitive>", "uniform_random", "random_multi_turn"."""
    policies: list[DistributionPolicy] = []
    for name in names:
        if name == SINGLE:
            policies += [SinglePolicy(worker, primitive) for worker, primitive in pool.actions()]
        elif name.startswith(SINGLE + "/") and tuple(name.split("/")[1:]) in pool.actions():
            policies.append(SinglePolicy(*name.split("/")[1:]))
        elif name == UNIFORM_RANDOM:
            policies.append(UniformRandomRouter(seed=seed))
        elif name == RANDOM_MULTI_TURN:
            policies.append(RandomMultiTurnPolicy(stop_prob=stop_prob, seed=seed))
        else:
            known = [SINGLE, UNIFORM_RANDOM, RANDOM_MULTI_TURN] + [f"{SINGLE}/{w}/{p}" for w, p in pool.actions()]
            raise ValueError(f"unknown policy {name!r}; known: {known}")
    return policies
