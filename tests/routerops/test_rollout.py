"""Rollout engine on real workers (sympy, an OpenAI-compatible HTTP endpoint) and the QA environment."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import gc
import json
import logging
import math

import pytest

from routerops import schema
from routerops.envs.qa import QAEnvironment
from routerops.envs.tooluse import ToolUseEnvironment
from routerops.errors import InputError, RouteropsError
from routerops.policies import RandomMultiTurnPolicy, SinglePolicy, UniformRandomRouter
from routerops.pricing import Price, PriceBook, WorkerSpec
from routerops.rollout import (
    JOURNAL_NAME,
    collect,
    collect_sync,
    prompt_token_bound,
    read_journal,
    run_episode,
    worst_case_cost,
)
from routerops.types import Action, EpisodeState, Task
from routerops.workers import LLMWorker, SympyWorker
from routerops.workers.chaos import DelayedEndpoint

SYMPY = WorkerSpec(name="sympy", kind="sympy", primitives=("sympy",), timeout_s=10)
ECHO = WorkerSpec(name="echo", kind="llm", primitives=("answer",), model="echo", concurrency=8,
                  generation={"max_tokens": 16, "system": "Reply with the answer."}, timeout_s=10, max_retries=0)
BOOK = PriceBook(
    version="unit-1", effective_date=dt.date(2026, 11, 1),
    prices={"sympy": Price(0.0, 0.0, per_call=1e-5), "echo": Price(100.0, 200.0, 50.0), "dead": Price(1.0, 1.0)},
)
TASKS = [Task(task_id=f"add/{i}", suite="unit/add", split="train", prompt=f"What is {i} + 30?", answer=str(i + 30))
         for i in range(5)]


@pytest.fixture(scope="module")
def endpoint():
    with DelayedEndpoint(delay_s=0.01) as url:
        yield url


def sympy_only() -> dict:
    return {"sympy": SympyWorker(SYMPY)}


def echo_and_sympy(url: str) -> dict:
    return {"echo": LLMWorker(ECHO, url), "sympy": SympyWorker(SYMPY)}


def _state(task: Task) -> EpisodeState:
    return EpisodeState(task=task)


async def play(policy, workers, budget=1.0, turn_limit=4, task=TASKS[0], seed=0, env=None):
    return await run_episode(task, policy, env or QAEnvironment(), workers, BOOK, budget, turn_limit, "run-1", seed)


# ---------------------------------------------------------------- budget, turn limit, single calls


async def test_single_policy_makes_exactly_one_call_and_scores_it():
    episode, turns = await play(SinglePolicy("sympy", "sympy"), sympy_only())
    assert len(turns) == episode["turns"] == 1
    assert (turns[0]["worker"], turns[0]["message"], turns[0]["response"]) == ("sympy", "0 + 30", "30")
    assert episode["ended_by"] == "done" and episode["final_answer"] == "30"
    assert episode["score"] == 1.0 and episode["success"]
    assert math.isclose(episode["cost_usd"], 1e-5) and turns[0]["propensity"] == 1.0
    assert episode["episode_id"] == schema.episode_id("run-1", "add/0", "single/sympy/sympy", 0)


async def test_tiny_budget_ends_the_episode_with_budget_before_any_call(endpoint):
    workers = echo_and_sympy(endpoint)
    for policy in (SinglePolicy("echo"), UniformRandomRouter(), RandomMultiTurnPolicy()):
        episode, turns = await play(policy, workers, budget=1e-9)
        assert (episode["ended_by"], episode["turns"], episode["cost_usd"]) == ("budget", 0, 0.0), policy.name
        assert turns == []
    assert workers["echo"].stats.calls == 0


async def test_cost_never_exceeds_budget_and_budget_ends_long_episodes(endpoint):
    workers = {"echo": LLMWorker(ECHO, endpoint)}
    llm_call = worst_case_cost(ECHO, QAEnvironment().request(_state(TASKS[0]), "answer"), BOOK)
    for budget in (llm_call * 0.9, llm_call * 1.5, llm_call * 3, llm_call * 6):
        for seed in range(4):
            episode, turns = await play(RandomMultiTurnPolicy(stop_prob=0.0, seed=seed), workers, budget=budget,
                                        turn_limit=40, seed=seed)
            assert episode["cost_usd"] <= budget, (budget, seed)
            assert math.isclose(episode["cost_usd"], sum(t["cost_usd"] for t in turns))
            assert episode["ended_by"] == "budget"  # it never stops on its own and the budget binds first
    assert workers["echo"].stats.calls > 0
    episode, _ = await play(RandomMultiTurnPolicy(stop_prob=0.0), sympy_only(), budget=2.5e-5, turn_limit=40)
    assert (episode["ended_by"], episode["turns"]) == ("budget", 2)  # 1e-5 a call: a third would exceed it


async def test_costs_are_derived_from_the_servers_token_counts(endpoint):
    episode, turns = await play(SinglePolicy("echo"), echo_and_sympy(endpoint))
    (turn,) = turns
    assert turn["prompt_tokens"] > 0 and turn["completion_tokens"] > 0
    expected = BOOK.cost("echo", turn["prompt_tokens"], turn["completion_tokens"], turn["cached_tokens"])
    assert turn["cost_usd"] == expected == episode["cost_usd"]
    assert json.loads(turn["message"])[0]["content"] == TASKS[0].prompt


async def test_turn_limit_ends_an_episode_that_would_go_on():
    episode, turns = await play(RandomMultiTurnPolicy(stop_prob=0.0), sympy_only(), turn_limit=3)
    assert (episode["ended_by"], episode["turns"]) == ("turn_limit", 3)
    assert [t["turn_index"] for t in turns] == [0, 1, 2]


async def test_policy_that_cannot_afford_its_worker_ends_by_budget_not_done(endpoint):
    cheap_budget = 5e-5  # sympy (1e-5) fits, an echo call does not
    episode, _ = await play(SinglePolicy("echo"), echo_and_sympy(endpoint), budget=cheap_budget)
    assert (episode["ended_by"], episode["turns"]) == ("budget", 0)
    episode, _ = await play(SinglePolicy("sympy", "sympy"), echo_and_sympy(endpoint), budget=cheap_budget)
    assert (episode["ended_by"], episode["turns"]) == ("done", 1)


# ---------------------------------------------------------------- propensities and determinism


async def test_logged_propensities_are_probabilities_of_the_chosen_actions(endpoint):
    workers = echo_and_sympy(endpoint)
    for seed in range(6):
        _, turns = await play(RandomMultiTurnPolicy(stop_prob=0.4, seed=seed), workers, turn_limit=5, seed=seed)
        for turn in turns:
            assert 0.0 < turn["propensity"] <= 1.0
            expected = 0.5 if turn["turn_index"] == 0 else 0.6 / 2  # 2 actions; stop factor once answered
            assert math.isclose(turn["propensity"], expected)


async def test_choices_are_deterministic_per_seed(endpoint):
    workers = echo_and_sympy(endpoint)

    async def routes(seed: int) -> list[list[tuple[str, float]]]:
        out = []
        for task in TASKS:
            _, turns = await play(RandomMultiTurnPolicy(stop_prob=0.3, seed=7), workers, turn_limit=6,
                                  task=task, seed=seed)
            out.append([(t["worker"], t["propensity"]) for t in turns])
        return out

    first = await routes(0)
    assert await routes(0) == first
    assert await routes(1) != first


# ---------------------------------------------------------------- errors and environment lifecycle


async def test_worker_failure_ends_the_episode_with_its_message():
    dead = dataclasses.replace(ECHO, name="dead", timeout_s=2)
    workers = {"dead": LLMWorker(dead, "http://127.0.0.1:9/v1")}  # port 9 (discard): connection refused
    episode, turns = await play(SinglePolicy("dead"), workers)
    assert episode["ended_by"] == "error" and "connection" in episode["error"]
    assert json.loads(turns[0]["errors"]) == [{"rule": "worker_error", "severity": "high"}]
    assert episode["score"] == 0.0 and not episode["success"]
    assert turns[0]["observation"] == ""  # the environment never saw a reply, so it showed nothing


class ClosingCountingQA(QAEnvironment):
    """The real QA environment, counting close() calls and optionally failing in observe()."""

    def __init__(self, fail: bool = False):
        super().__init__()
        self.closed, self.fail = 0, fail

    def observe(self, state, primitive, text):
        if self.fail:
            raise RuntimeError("parser bug")
        return super().observe(state, primitive, text)

    def close(self, state):
        self.closed += 1


async def test_environment_is_closed_after_success_and_after_an_exception():
    env = ClosingCountingQA()
    await play(SinglePolicy("sympy", "sympy"), sympy_only(), env=env)
    failing = ClosingCountingQA(fail=True)
    with pytest.raises(RuntimeError, match="parser bug"):
        await play(SinglePolicy("sympy", "sympy"), sympy_only(), env=failing)
    assert (env.closed, failing.closed) == (1, 1)


class RogueRouter:
    name, version, seed = "rogue", "1", 0

    def act(self, state, actions, rng):
        return Action("sympy", "sympy") if not state.turns else Action("echo", "answer")


async def test_a_policy_choosing_an_unoffered_action_is_an_error():
    with pytest.raises(RouteropsError, match="not offered"):
        await play(RogueRouter(), sympy_only())


def test_prompt_bound_counts_every_byte_and_the_workers_system_prompt():
    chat = [{"role": "user", "content": "héllo"}]
    assert prompt_token_bound(chat) == 6 + 16 + 16
    assert prompt_token_bound(chat, system="abc") == 6 + 3 + 2 * 16 + 16
    assert prompt_token_bound("1 + 2") == 5 + 16


# ---------------------------------------------------------------- collection and resumption


POLICIES = [SinglePolicy("sympy", "sympy"), SinglePolicy("echo"), RandomMultiTurnPolicy(stop_prob=0.5, seed=3)]


async def gather(out_dir, tasks, url, budget=1.0, concurrency=4):
    workers = echo_and_sympy(url)
    frames = await collect(tasks, POLICIES, QAEnvironment(), workers, BOOK, budget, 4, out_dir, "run-1", 0,
                           concurrency, progress=False)
    return frames, workers["echo"].stats.calls


def planned_ids(tasks) -> set[str]:
    return {schema.episode_id("run-1", t.task_id, p.name, 0) for t in tasks for p in POLICIES}


async def test_collect_writes_exactly_the_planned_episodes(tmp_path, endpoint):
    (episodes, turns), _ = await gather(tmp_path, TASKS, endpoint)
    assert set(episodes["episode_id"]) == planned_ids(TASKS) and episodes["episode_id"].is_unique
    on_disk = schema.read_table(tmp_path / "episodes.parquet", "episodes")
    assert list(on_disk["episode_id"]) == list(episodes["episode_id"])
    turns_on_disk = schema.read_table(tmp_path / "turns.parquet", "turns")
    assert len(turns_on_disk) == episodes["turns"].sum() and set(turns_on_disk["episode_id"]) <= planned_ids(TASKS)
    assert (episodes["cost_usd"] <= episodes["budget_usd"]).all()


async def test_rerun_skips_journaled_episodes_and_survives_a_torn_last_line(tmp_path, endpoint):
    (first, _), first_calls = await gather(tmp_path, TASKS[:2], endpoint)
    journal = tmp_path / JOURNAL_NAME
    with open(journal, "ab") as fh:
        fh.write(b'{"episode": {"episode_id": "torn')  # a SIGKILL in the middle of an append
    (episodes, turns), rerun_calls = await gather(tmp_path, TASKS, endpoint)
    assert set(episodes["episode_id"]) == planned_ids(TASKS) and episodes["episode_id"].is_unique
    assert len(read_journal(journal)) == len(planned_ids(TASKS))
    assert all(json.loads(line) for line in journal.read_text().splitlines())  # torn tail cut, lines intact
    redone = turns[~turns["episode_id"].isin(first["episode_id"]) & (turns["worker"] == "echo")]
    assert rerun_calls == len(redone) > 0  # only the episodes the journal lacked made calls
    kept = episodes.set_index("episode_id").loc[first["episode_id"]]
    assert list(kept["final_answer"]) == list(first["final_answer"])

    (again, _), third_calls = await gather(tmp_path, TASKS, endpoint)
    assert third_calls == 0 and list(again["episode_id"]) == list(episodes["episode_id"])


async def test_rerun_with_other_settings_refuses_to_mix_episodes(tmp_path, endpoint):
    await gather(tmp_path, TASKS[:1], endpoint, budget=1.0)
    with pytest.raises(InputError, match="budget_usd"):
        await gather(tmp_path, TASKS[:1], endpoint, budget=0.5)


async def test_corrupt_journal_line_before_the_end_is_an_input_error(tmp_path, endpoint):
    await gather(tmp_path, TASKS[:1], endpoint)
    journal = tmp_path / JOURNAL_NAME
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"not json\n" + b"".join(lines))
    with pytest.raises(InputError, match="line 1"):
        read_journal(journal)


async def test_a_plan_with_duplicate_tasks_is_refused(tmp_path, endpoint):
    with pytest.raises(InputError, match="planned twice"):
        await gather(tmp_path, [TASKS[0], TASKS[0]], endpoint)
    assert not (tmp_path / "episodes.parquet").exists()


@pytest.mark.parametrize("budget, turn_limit, concurrency, field", [
    (float("nan"), 3, 2, "budget_usd"), (-1.0, 3, 2, "budget_usd"), (1.0, 0, 2, "turn_limit"),
    (1.0, 3, 0, "concurrency"),
])
async def test_bad_collection_settings_name_the_field_and_write_nothing(tmp_path, budget, turn_limit, concurrency,
                                                                         field):
    with pytest.raises(InputError, match=field):
        await collect(TASKS, POLICIES, QAEnvironment(), sympy_only(), BOOK, budget, turn_limit, tmp_path / "out",
                      "run-1", 0, concurrency, progress=False)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- observations (turns schema v2)

# The echo endpoint repeats the last user message, so this prompt makes the first reply a real
# python tool call; the later replies echo tool results and break the tool-call format.
TOOL_TASK = Task(task_id="tool/0", suite="tooluse", split="train", answer="391",
                 prompt='Compute 17 * 23. <tool_call>{"name": "python", "arguments": {"code": "print(17 * 23)"}}</tool_call>')


class RecordingToolUse(ToolUseEnvironment):
    """The real tool-use environment (python sandbox included), keeping every observation it returned."""

    def __init__(self):
        super().__init__()
        self.shown: list[str] = []

    def observe(self, state, primitive, text):
        seen = super().observe(state, primitive, text)
        self.shown.append(seen.observation)
        return seen


async def test_every_turn_logs_the_observation_the_environment_returned(tmp_path, endpoint):
    env = RecordingToolUse()
    episodes, _ = await collect([TOOL_TASK], [RandomMultiTurnPolicy(stop_prob=0.0)], env, {"echo": LLMWorker(ECHO, endpoint)},
                                BOOK, 10.0, 3, tmp_path, "run-1", 0, 1, progress=False)
    turns = schema.read_table(tmp_path / "turns.parquet", "turns")
    assert episodes["turns"].tolist() == [3] and list(turns["observation"]) == env.shown
    assert env.shown[0] == "391"  # the sandbox ran the echoed tool call
    assert env.shown[1].startswith("No tool call found") and "Failed to parse" in env.shown[2]
    for turn, after in zip(turns.itertuples(), turns["message"].iloc[1:]):  # what the agent was shown next
        assert json.loads(after)[-1]["content"] == f"Tool result:\n{turn.observation}"


async def test_a_journal_written_before_observations_resumes(tmp_path, endpoint):
    """Journals of schema version 1 have turns without `observation`: they are reused, not redone."""
    (first, _), _ = await gather(tmp_path, TASKS[:2], endpoint)
    journal = tmp_path / JOURNAL_NAME
    entries = [json.loads(line) for line in journal.read_text().splitlines()]
    for entry in entries:
        for turn in entry["turns"]:
            del turn["observation"]
    journal.write_text("".join(json.dumps(e) + "\n" for e in entries))
    (episodes, turns), rerun_calls = await gather(tmp_path, TASKS, endpoint)
    redone = turns[~turns["episode_id"].isin(first["episode_id"]) & (turns["worker"] == "echo")]
    assert rerun_calls == len(redone)  # the old entries stood in for their episodes
    assert set(episodes["episode_id"]) == planned_ids(TASKS)
    on_disk = schema.read_table(tmp_path / "turns.parquet", "turns")
    old = on_disk[on_disk["episode_id"].isin(first["episode_id"])]
    assert len(old) > 0 and (old["observation"] == "").all() and on_disk["observation"].notna().all()



@pytest.mark.slow
def test_collect_sync_closes_its_http_clients_before_its_loop_ends(tmp_path, endpoint, caplog):
    """A client left open was closed by the garbage collector on the next loop (the flow's), where its
    connections, bound to the finished loop, raised "Event loop is closed": an ERROR and a traceback
    in every `make demo` (issue 26)."""
    gc.collect()  # other tests' open clients: collected here, outside any loop, they close nowhere
    workers = {"echo": LLMWorker(ECHO, endpoint)}
    collect_sync(TASKS[:2], [SinglePolicy("echo")], env=QAEnvironment(), workers=workers, book=BOOK,
                 budget_usd=1.0, turn_limit=2, out_dir=tmp_path, run_id="run-1", seed=0, concurrency=2,
                 progress=False)
    assert workers["echo"]._client is None  # closed, not left to the garbage collector

    async def next_loop() -> None:  # what runs after the collection: a Prefect task, another stage
        workers.clear()
        gc.collect()
        await asyncio.sleep(0.05)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(next_loop())
        gc.collect()
    assert not [r for r in caplog.records if r.name == "asyncio"], [r.getMessage() for r in caplog.records]
