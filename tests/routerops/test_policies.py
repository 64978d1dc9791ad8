"""Behaviour policies: propensities are probabilities, choices are reproducible per episode."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from routerops.policies import (
    RandomMultiTurnPolicy,
    SinglePolicy,
    UniformRandomRouter,
    behaviour_policies,
    episode_rng,
    is_stop,
    policies_by_name,
)
from routerops.pricing import Pool, WorkerSpec
from routerops.types import Action, EpisodeState, Task, TurnRecord

POOL = Pool(
    name="test",
    workers=(
        WorkerSpec(name="small", kind="llm", primitives=("answer",), generation={"max_tokens": 8}),
        WorkerSpec(name="large", kind="llm", primitives=("answer",), generation={"max_tokens": 64}),
        WorkerSpec(name="sympy", kind="sympy", primitives=("sympy",)),
    ),
)
ACTIONS = [Action(w, p) for w, p in POOL.actions()]
TASK = Task(task_id="t1", suite="unit", split="train", prompt="2 + 3", answer="5")


def a_turn(worker: str = "small", primitive: str = "answer") -> TurnRecord:
    return TurnRecord(
        turn_index=0, actor="p", worker=worker, primitive=primitive, message="2 + 3", response="5",
        prompt_tokens=3, completion_tokens=1, cached_tokens=0, latency_s=0.1, cost_usd=0.0, errors=[],
        propensity=1.0,
    )


def fresh() -> EpisodeState:
    return EpisodeState(task=TASK, turn_limit=4)


def answered() -> EpisodeState:
    return EpisodeState(task=TASK, turns=[a_turn()], answer="5", turn_limit=4)


def test_single_policy_calls_its_worker_once_with_propensity_one_then_stops():
    policy = SinglePolicy("large")
    first = policy.act(fresh(), ACTIONS, episode_rng(0, "e"))
    assert (first.worker, first.primitive, first.propensity) == ("large", "answer", 1.0)
    assert is_stop(policy.act(answered(), ACTIONS, episode_rng(0, "e")))


def test_single_policy_stops_when_its_action_is_not_affordable():
    offered = [a for a in ACTIONS if a.worker != "large"]
    assert is_stop(SinglePolicy("large").act(fresh(), offered, episode_rng(0, "e")))


def test_single_policy_without_turn_cap_keeps_calling():
    policy = SinglePolicy("small", turns=None)
    assert policy.act(answered(), ACTIONS, episode_rng(0, "e")).worker == "small"


@pytest.mark.parametrize("offered", [ACTIONS, ACTIONS[:2], ACTIONS[1:]])
def test_uniform_router_is_uniform_over_answering_actions_and_sums_to_one(offered):
    dist = UniformRandomRouter(seed=3).probabilities(fresh(), offered)
    answering = [a for a in offered if a.primitive == "answer"]
    assert [(a.worker, a.primitive) for a in dist] == [(a.worker, a.primitive) for a in answering]
    assert all(math.isclose(a.propensity, 1 / len(answering)) for a in dist)
    assert math.isclose(sum(a.propensity for a in dist), 1.0)


def test_uniform_router_over_all_actions_when_asked():
    dist = UniformRandomRouter(primitives=None).probabilities(fresh(), ACTIONS)
    assert len(dist) == 3 and all(math.isclose(a.propensity, 1 / 3) for a in dist)


def test_uniform_router_makes_one_call_then_stops_and_stops_when_nothing_is_offered():
    router = UniformRandomRouter()
    assert is_stop(router.act(answered(), ACTIONS, episode_rng(0, "e")))
    assert is_stop(router.act(fresh(), [Action("sympy", "sympy")], episode_rng(0, "e")))


def test_uniform_router_choices_are_roughly_uniform():
    router = UniformRandomRouter(seed=1)
    counts = Counter(router.act(fresh(), ACTIONS, episode_rng(1, f"ep{i}")).worker for i in range(2000))
    assert set(counts) == {"small", "large"}
    assert abs(counts["small"] - 1000) < 120  # > 5 standard deviations


def test_multi_turn_policy_never_stops_before_an_answer_exists():
    dist = RandomMultiTurnPolicy(stop_prob=0.3).probabilities(fresh(), ACTIONS)
    assert not any(is_stop(a) for a in dist)
    assert all(math.isclose(a.propensity, 1 / 3) for a in dist)


def test_multi_turn_policy_propensities_include_the_stop_factor_and_sum_to_one():
    dist = RandomMultiTurnPolicy(stop_prob=0.3).probabilities(answered(), ACTIONS)
    stops = [a for a in dist if is_stop(a)]
    calls = [a for a in dist if not is_stop(a)]
    assert len(stops) == 1 and math.isclose(stops[0].propensity, 0.3)
    assert all(math.isclose(a.propensity, 0.7 / 3) for a in calls)
    assert math.isclose(sum(a.propensity for a in dist), 1.0)
    assert all(0.0 < a.propensity <= 1.0 for a in dist)


def test_multi_turn_policy_returned_action_carries_its_propensity():
    policy = RandomMultiTurnPolicy(stop_prob=0.5, seed=2)
    for i in range(50):
        action = policy.act(answered(), ACTIONS, episode_rng(2, f"ep{i}"))
        assert math.isclose(action.propensity, 0.5 if is_stop(action) else 0.5 / 3)


def test_multi_turn_policy_rejects_a_probability_outside_unit_interval():
    with pytest.raises(ValueError, match="stop_prob"):
        RandomMultiTurnPolicy(stop_prob=1.5)


def test_choices_are_deterministic_per_seed_and_episode():
    policy = RandomMultiTurnPolicy(stop_prob=0.2)

    def choices(seed: int, eid: str) -> list[tuple[str, str]]:
        rng = episode_rng(seed, eid)
        return [(a.worker, a.primitive) for a in (policy.act(fresh(), ACTIONS, rng) for _ in range(20))]

    assert choices(0, "ep-1") == choices(0, "ep-1")
    assert choices(0, "ep-1") != choices(0, "ep-2")
    assert choices(0, "ep-1") != choices(1, "ep-1")


def test_behaviour_policies_cover_every_single_action_and_both_random_routers():
    names = [p.name for p in behaviour_policies(POOL)]
    assert names == ["single/small/answer", "single/large/answer", "single/sympy/sympy",
                     "uniform_random", "random_multi_turn"]
    assert len(set(names)) == len(names)


def test_policies_by_name_resolves_config_names_and_rejects_unknown():
    assert [p.name for p in policies_by_name(["single/large/answer", "uniform_random"], POOL)] == [
        "single/large/answer", "uniform_random"]
    with pytest.raises(ValueError, match="unknown policy 'oracle'"):
        policies_by_name(["oracle"], POOL)
    with pytest.raises(ValueError, match="unknown policy"):
        policies_by_name(["single/nobody/answer"], POOL)


def test_policy_version_records_its_parameters():
    assert "stop_prob=0.3" in RandomMultiTurnPolicy(stop_prob=0.3, seed=4).version
    assert "seed=4" in UniformRandomRouter(seed=4).version
