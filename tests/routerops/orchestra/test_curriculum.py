"""The search teacher and the verifier filter (teacher.py, curriculum.py) on the real tool workers:
sympy in-process and python in the OS sandbox; no LLM, so the candidates are the exact routes."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pandas as pd
import pytest

from routerops.envs.suites import materialise_suites
from routerops.orchestra.curriculum import (
    DROP_SOLVED, KEPT_CHEAPEST, REASONS, collect_episodes, filter_curriculum, sft_records, strategy_of,
)
from routerops.orchestra.executor import Executor, ExecutorConfig
from routerops.orchestra.grammar import FinalAnswer, GrammarError, RouteTable, TurnContext, parse_turn
from routerops.orchestra.teacher import exact_form, strategies_for, teacher_controllers
from routerops.pricing import load_pool, load_price_book
from routerops.workers import build_workers
from routerops.workers.sandbox import sandbox_problem

needs_sandbox = pytest.mark.skipif(sandbox_problem() is not None, reason=f"no OS sandbox here: {sandbox_problem()}")


def test_exact_forms_read_only_the_question():
    gcd = exact_form("Find the Greatest Common Divisor (GCD) of these numbers: 46, 90. Give only the GCD.")
    assert gcd.sympy == "gcd(46, 90)" and "math.gcd(46, 90)" in gcd.python
    assert exact_form("Find the Least Common Multiple (LCM) of these numbers: 14, 20").sympy == "lcm(14, 20)"
    assert exact_form("State the final answer to the following arithmetic problem: 6 - 2 + 3 =").sympy == "6 - 2 + 3"
    assert exact_form("Calculate -( -( -6 * 1 ) ).").python == "print(-( -( -6 * 1 ) ))"
    assert exact_form("Who wrote Hamlet?") is None


def tool_pool():
    pool = load_pool("configs/pools/embedded-smollm2.yaml")
    return dataclasses.replace(pool, workers=tuple(w for w in pool.workers if w.kind in ("python", "sympy")))


def test_strategies_cover_each_exact_route_and_a_oneshot_of_two():
    task = materialise_suites(["gcd"], [], {"train": 1}, seed=1)[0]
    names = [s.name for s in strategies_for(task, tool_pool(), lazy_answer="7")]
    assert names == ["lazy", "route:python/python", "route:sympy/sympy", "oneshot:python/python+sympy/sympy"]


@pytest.mark.slow
@needs_sandbox
def test_teacher_trajectories_run_on_real_tools_and_the_filter_keeps_the_cheapest(tmp_path):
    tasks = materialise_suites(["gcd", "chain_sum"], [], {"train": 2}, seed=3)
    pool, book = tool_pool(), load_price_book("configs/prices/current.yaml")
    executor = Executor(pool, build_workers(pool, None), book, ExecutorConfig(budget_usd=0.01))
    wrong = {t.task_id: "-1" for t in tasks}  # lazy answers the verifier rejects
    batches = [(c, ts, f"run#{name}") for name, (c, ts) in teacher_controllers(tasks, pool, wrong).items()]
    episodes, turns = asyncio.run(collect_episodes(executor, batches, tmp_path))
    assert len(episodes) == len(tasks) * 4 and set(episodes.task_id) == {t.task_id for t in tasks}
    assert episodes.groupby("task_id").success.any().all()  # the exact routes solve every task
    assert not episodes[episodes.run_id.map(strategy_of) == "lazy"].success.any()

    curriculum = filter_curriculum(tasks, episodes, turns)
    assert set(curriculum.decisions.reason) <= set(REASONS) and curriculum.rl_tasks == []
    cheapest = curriculum.decisions[curriculum.decisions.reason == KEPT_CHEAPEST]
    assert len(cheapest) == len(tasks) and set(cheapest.strategy) == {"route:sympy/sympy"}  # $1e-5 < python's $2e-5
    for record in sft_records(curriculum.sft):
        table = RouteTable({w: tuple(p for x, p in pool.admissible_pairs() if x == w) for w in pool.names},
                           frozenset(pool.primitives))
        replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        parsed = [parse_turn(r, TurnContext(table, k, frozenset({1}) if k else frozenset()))
                  for k, r in enumerate(replies)]
        assert not any(isinstance(p, GrammarError) for p in parsed) and isinstance(parsed[-1].action, FinalAnswer)
        assert record["messages"][1]["content"] in {t.prompt for t in tasks}

    again = asyncio.run(collect_episodes(executor, batches, tmp_path))[0]  # resumed: nothing runs twice
    assert again.episode_id.tolist() == episodes.episode_id.tolist()
    assert len((tmp_path / "journal.jsonl").read_text().splitlines()) == len(episodes)

    solved = pd.DataFrame({"task_id": [tasks[0].task_id], "success": [True]})
    dropped = filter_curriculum(tasks, episodes, turns, probe=solved)
    assert set(dropped.decisions[dropped.decisions.task_id == tasks[0].task_id].reason) == {DROP_SOLVED}
    assert tasks[0].task_id not in set(dropped.sft.task_id)


def test_tasks_no_trajectory_solves_go_to_the_rl_pool():
    task = materialise_suites(["gcd"], [], {"train": 1}, seed=1)[0]
    conversation = json.dumps([{"role": "assistant", "content": "<final_answer>1</final_answer>"}])
    episodes = pd.DataFrame([{"task_id": task.task_id, "episode_id": "e1", "run_id": "r#lazy", "mode": "lazy",
                              "success": False, "cost_usd": 0.0, "turns": 1, "policy": "t",
                              "conversation": conversation}])
    turns = pd.DataFrame({"episode_id": ["e1"], "errors": [[]]})
    curriculum = filter_curriculum([task], episodes, turns)
    assert [t.task_id for t in curriculum.rl_tasks] == [task.task_id] and curriculum.sft.empty


@needs_sandbox
def test_filter_stage_writes_dsft_drl_and_decisions_under_the_layout(tmp_path):
    from routerops.envs.suites import write_tasks
    from routerops.layout import Layout
    from stages.orchestra import OrchestraRun, verifier_filter

    layout = Layout(tmp_path)
    tasks = materialise_suites(["lcm"], [], {"train": 2}, seed=5)
    write_tasks(tasks, layout.orchestra_tasks)
    pool, book = tool_pool(), load_price_book("configs/prices/current.yaml")
    executor = Executor(pool, build_workers(pool, None), book, ExecutorConfig(budget_usd=0.01))
    batches = [(c, ts, f"run#{n}") for n, (c, ts) in teacher_controllers(tasks, pool, {}).items()]
    asyncio.run(collect_episodes(executor, batches, layout.orchestra_teacher.folder))
    paths = verifier_filter(OrchestraRun(), layout, layout.orchestra_tasks, layout.orchestra_teacher,
                            layout.orchestra_probe)  # no probe yet: nothing is dropped as solved
    kept = [json.loads(line) for line in paths["sft"].read_text().splitlines()]
    assert {r["task_id"] for r in kept} == {t.task_id for t in tasks} and paths["rl"].read_text() == ""
    assert pd.read_csv(paths["decisions"]).reason.isin(REASONS).all()
    assert (tmp_path / "reports/orchestra/stages/orchestra-filter.json").is_file()


def test_the_teacher_answers_validly_after_an_empty_observation_or_an_error_block():
    from routerops.orchestra.teacher import NO_ANSWER, TeacherController

    task = materialise_suites(["gcd"], [], {"train": 1}, seed=1)[0]
    pool = tool_pool()
    strategy = next(s for s in strategies_for(task, pool, lazy_answer=None) if s.name == "route:sympy/sympy")
    teacher = TeacherController({task.prompt: strategy})
    opening = [{"role": "system", "content": "grammar"}, {"role": "user", "content": task.prompt}]
    first = teacher.respond([opening])[0].text
    table = RouteTable({w: tuple(p for x, p in pool.admissible_pairs() if x == w) for w in pool.names},
                       frozenset(pool.primitives))
    for reply in ('<obs subtask="1">\n\n</obs>', '<error kind="empty">\nthe final answer is empty\n</error>'):
        conversation = [*opening, {"role": "assistant", "content": first}, {"role": "user", "content": reply}]
        turn = parse_turn(teacher.respond([conversation])[0].text, TurnContext(table, 1, frozenset({1})))
        assert not isinstance(turn, GrammarError) and turn.action == FinalAnswer(NO_ANSWER)
