"""Training examples from logged trajectories: each turn's example is trained on the very history
the router builds at routing time for the same state (MTRouter §3.2, eq. 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.mtrouter.dataset import turn_examples
from models.mtrouter.history import interactions_from_turns
from models.mtrouter.router import MTRouter
from routerops import schema
from routerops.envs.tooluse import ToolUseEnvironment
from routerops.policies import RandomMultiTurnPolicy
from routerops.rollout import collect
from routerops.types import Task
from routerops.workers import LLMWorker
from routerops.workers.chaos import DelayedEndpoint

# The echo endpoint repeats the last user message: the first reply is this python tool call, the
# later ones echo tool results (format and parse errors), so every turn has its own observation.
TASK = Task(task_id="tool/0", suite="tooluse", split="train", answer="391",
            prompt='Compute 17 * 23. <tool_call>{"name": "python", "arguments": {"code": "print(17 * 23)"}}</tool_call>')
TURNS = 3


class RoutingTimeRecorder:
    """A uniform behaviour policy that, before each choice, keeps what MTRouter would route on:
    the serialised history h_t and its features z_x for the current EpisodeState."""

    name, version, seed = "recorder", "1", 0

    def __init__(self, router: MTRouter):
        self.router = router
        self.inner = RandomMultiTurnPolicy(stop_prob=0.0)
        self.texts: list[str] = []
        self.features: list[np.ndarray] = []

    def act(self, state, actions, rng):
        interactions = interactions_from_turns(state.turns, state.observation)
        self.texts.append(self.router.encoder.serialise(state.task.prompt, interactions, self.router.cfg.history_mode))
        self.features.append(self.router.history_features(state))
        return self.inner.act(state, actions, rng)


@pytest.fixture(scope="module")
def endpoint():
    with DelayedEndpoint(delay_s=0.0) as url:
        yield url


async def test_training_history_equals_the_routing_time_history(tmp_path, endpoint, pool, book, tiny_cfg, tiny_encoder):
    router = MTRouter(pool, book, tiny_cfg, tiny_encoder)
    recorder = RoutingTimeRecorder(router)
    workers = {w.name: LLMWorker(w, endpoint) for w in pool.workers}
    await collect([TASK], [recorder], ToolUseEnvironment(), workers, book, 1.0, TURNS, tmp_path, "run", 0, 1,
                  progress=False)
    episodes = schema.read_table(tmp_path / "episodes.parquet", "episodes")
    turns = schema.read_table(tmp_path / "turns.parquet", "turns")
    assert len(turns) == len(recorder.texts) == TURNS

    examples = turn_examples(episodes, turns, router.encoder, tiny_cfg, prompts={TASK.task_id: TASK.prompt})
    assert examples.texts == recorder.texts
    np.testing.assert_array_equal(router.featurizer.transform(examples.texts, examples.tasks), np.stack(recorder.features))
    assert "Observation: 391" in examples.texts[1]  # o_1 is what the sandbox printed

    # Before the column existed o_1 was parsed from turn 1's request, which wraps it in the prompt's
    # template: a history the router never saw at routing time.
    unlogged = turns.drop(columns="observation").to_dict("records")
    parsed = interactions_from_turns(unlogged[:2])[0].observation
    assert parsed == json.loads(turns["message"].iloc[1])[-1]["content"] == "Tool result:\n391" != turns["observation"].iloc[0]
