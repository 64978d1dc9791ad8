"""ScienceWorld environment: the paper's splits without a JVM; one real simulator in the slow tests."""

from __future__ import annotations

import pytest

from routerops.envs import scienceworld_env as sw
from routerops.errors import InputError
from routerops.types import EpisodeState, Task

pytest.importorskip("scienceworld")

BOIL = Task(task_id="boil/var0", suite="scienceworld/boil", split="test", prompt="", answer="",
            meta={"task_name": "boil", "variation": 0})
# Variation counts of the simulator shipped in scienceworld 1.2.3 for a few types (count_variations).
COUNTS = {"boil": 30, "identify-life-stages-1": 14, "power-component": 20, "freeze": 30, "identify-life-stages-2": 10}


# ---------------------------------------------------------------- splits (no simulator)


def test_paper_task_type_lists():
    assert len(sw.SCIENCEWORLD_ID_TYPES) == 13 and len(sw.SCIENCEWORLD_OOD_TYPES) == 12
    assert not set(sw.SCIENCEWORLD_ID_TYPES) & set(sw.SCIENCEWORLD_OOD_TYPES)
    known = set(sw.known_task_types())
    assert set(sw.SCIENCEWORLD_ID_TYPES) <= known and set(sw.SCIENCEWORLD_OOD_TYPES) <= known


def test_split_variations_is_60_20_20_of_the_capped_variations_and_seeded():
    splits = sw.split_variations(["boil", "identify-life-stages-1"], COUNTS, max_variations=10, seed=42)
    for name in ("boil", "identify-life-stages-1"):
        parts = splits[name]
        assert [len(parts[s]) for s in ("train", "val", "test")] == [6, 2, 2]
        assert sorted(parts["train"] + parts["val"] + parts["test"]) == list(range(10))
    assert splits == sw.split_variations(["boil", "identify-life-stages-1"], COUNTS, max_variations=10, seed=42)
    assert splits != sw.split_variations(["boil", "identify-life-stages-1"], COUNTS, max_variations=10, seed=7)


def test_split_keeps_fewer_variations_than_the_cap():
    splits = sw.split_variations(["identify-life-stages-1"], COUNTS, max_variations=30)
    parts = splits["identify-life-stages-1"]
    assert [len(parts[s]) for s in ("train", "val", "test")] == [8, 2, 4]  # int(14*.6), int(14*.2), rest


def test_scienceworld_tasks_without_simulator():
    tasks = sw.scienceworld_tasks(["boil", "power-component"], ["freeze", "identify-life-stages-2"], max_variations=5,
                                  variation_counts=COUNTS, with_descriptions=False)
    by_split = {s: [t for t in tasks if t.split == s] for s in ("train", "val", "test", "ood")}
    assert [len(by_split[s]) for s in ("train", "val", "test", "ood")] == [6, 2, 2, 10]
    assert {t.meta["task_name"] for t in by_split["ood"]} == {"freeze", "identify-life-stages-2"}
    assert {t.meta["task_name"] for t in by_split["train"]} == {"boil", "power-component"}
    assert len({t.task_id for t in tasks}) == len(tasks)
    first = by_split["ood"][0]
    assert first.task_id == "freeze/var0" and first.suite == "scienceworld/freeze" and first.meta["variation"] == 0


def test_unknown_or_overlapping_task_types_are_input_errors():
    with pytest.raises(InputError, match="id_types"):
        sw.scienceworld_tasks(["boil", "no-such-task"], [], variation_counts=COUNTS, with_descriptions=False)
    with pytest.raises(InputError, match="ood_types"):
        sw.scienceworld_tasks(["boil"], ["boil"], variation_counts=COUNTS, with_descriptions=False)


# ---------------------------------------------------------------- parsing (no simulator)


@pytest.mark.parametrize("reply, command", [
    ("Action: open door to kitchen", "open door to kitchen"),
    ("THOUGHT: explore.\n```text\nlook around\n```", "look around"),
    ("I will look.\nAction: `look around`.", "look around"),
    ("go to kitchen\nthen look", "go to kitchen"),
    ("Your next command is:\nlook around", "look around"),
    ("", ""),
])
def test_parse_command(reply, command):
    assert sw.parse_command(reply) == command


@pytest.mark.parametrize("reply, category", [
    ("Action: ?all", "query"), ("Action: go to kitchen", "navigation"), ("Action: pick up apple", "object"),
    ("Action: look around", "observation"), ("Action: activate stove", "device"), ("Action: open door to kitchen", "door"),
    ("Action: connect battery to wire", "electrical"), ("Action: focus on apple juice", "interaction"),
    ("Action: task completed", "finish"), ("Action: sing", "other"),
])
def test_action_category(reply, category):
    assert sw.action_category(reply) == category


def test_answer_query_filters_by_category_and_caps_the_list():
    valid = ["close door to kitchen", "go to kitchen", "look around", "open door to kitchen", "open oven"]
    assert sw.answer_query("?door", valid, limit=50) == (
        "valid door actions (3):\nclose door to kitchen\nopen door to kitchen\nopen oven")
    assert sw.answer_query("?all", valid, limit=2).endswith("go to kitchen\n... and 3 more")
    assert sw.answer_query("?weather", valid, limit=2).startswith("Unknown query")


def test_recent_pairs_keeps_the_newest_context_within_the_budget():
    pairs = [("a" * 10, "b" * 10), ("c" * 5, "d" * 5), ("e", "f")]
    assert sw.recent_pairs(pairs, 12) == [("c" * 5, "d" * 5), ("e", "f")]
    assert sw.recent_pairs(pairs, 100) == pairs
    assert sw.recent_pairs(pairs, 1) == []


def test_agent_submission_ends_the_episode_without_touching_the_simulator():
    env = sw.ScienceWorldEnvironment()
    state = EpisodeState(task=BOIL, env_state={"history": [], "valid_actions": [], "score": 0.0})
    seen = env.observe(state, "answer", "Action: task completed")
    assert seen.done and seen.errors == []


def test_tool_primitives_are_refused():
    from routerops.errors import RouteropsError

    with pytest.raises(RouteropsError, match="python"):
        sw.ScienceWorldEnvironment().request(EpisodeState(task=BOIL), "python")


# ---------------------------------------------------------------- one real simulator


@pytest.mark.slow
def test_episode_on_the_real_simulator():
    env = sw.ScienceWorldEnvironment()
    state = EpisodeState(task=BOIL, turn_limit=10)
    env.reset(state)
    process = state.env_state["simulator"]._gateway.java_process
    try:
        assert process.poll() is None
        assert "boil" in state.env_state["task_description"] and "This room is called" in state.observation
        messages = env.request(state, "answer")
        assert [m["role"] for m in messages] == ["system", "user"]
        assert state.env_state["task_description"] in messages[1]["content"]

        opened = env.observe(state, "answer", "Action: open door to kitchen")
        assert opened.errors == [] and opened.observation == "The door is now open." and not opened.done

        moves = state.env_state["moves"]
        listed = env.observe(state, "answer", "Action: ?door")
        assert "close door to kitchen" in listed.observation and listed.errors == []
        assert state.env_state["moves"] == moves  # a query consumes no simulator step

        nonsense = env.observe(state, "answer", "Action: frobnicate the quantum banana")
        assert nonsense.errors == [{"rule": "no_known_action", "severity": "high"}]
        prompt = env.request(state, "answer")[1]["content"]
        assert "Action: open door to kitchen\nObservation: The door is now open." in prompt  # earlier steps
        assert "Your last action: frobnicate the quantum banana" in prompt

        assert -100 <= env.score(state) <= 100
        failed = env.observe(state, "answer", "Action: focus on air")  # the wrong substance fails the task
        assert failed.done and env.score(state) == -100 and env.score(state) < env.success_threshold
    finally:
        env.close(state)
    assert process.poll() is not None  # the JVM has exited
    assert "simulator" not in state.env_state
    env.close(state)  # closing twice is harmless
    assert env.score(state) == -100  # the score outlives the simulator


@pytest.mark.slow
def test_task_descriptions_come_from_the_simulator():
    tasks = sw.scienceworld_tasks(["boil"], ["freeze"], max_variations=2, variation_counts=COUNTS)
    assert [t.split for t in tasks] == ["train", "test", "ood", "ood"]  # int(2*.6)=1, int(2*.2)=0, rest 1
    assert all(t.prompt.startswith("Your task is to") for t in tasks)
    assert "boil" in tasks[0].prompt and "freeze" in tasks[-1].prompt
