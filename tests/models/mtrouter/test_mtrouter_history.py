"""History serialisation (eq. 2), token-budget truncation and the content-hash embedding cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.history import (
    HashingTextEncoder, HistoryEncoder, Interaction, interactions_from_turns, observation_from_message,
    serialise_history,
)
from routerops.types import TurnRecord

TASK = "Boil the water in the kitchen, then report its temperature."


def history(n: int) -> list[Interaction]:
    return [Interaction(f"action number {i} " + "word " * 20, f"observation number {i + 1}") for i in range(n)]


def test_full_history_keeps_every_pair_in_order(tiny_encoder, tiny_cfg):
    text = serialise_history(TASK, history(3), tiny_encoder.text_encoder, tiny_cfg)
    assert text.startswith("[Task]\n" + TASK)
    positions = [text.index(f"action number {i}") for i in range(3)]
    assert positions == sorted(positions)


@pytest.mark.parametrize("budget", [40, 60, 100])
def test_truncation_keeps_the_task_block_and_drops_oldest_first(budget):
    cfg = MTRouterConfig(encoder_kind="hashing", max_history_tokens=budget)
    enc = HashingTextEncoder(32, budget)
    text = serialise_history(TASK, history(6), enc, cfg)
    assert text.startswith("[Task]\n" + TASK)  # the task block is always whole
    assert enc.count_tokens(text) <= budget - 2  # room left for [CLS] / [SEP]
    assert "observation number 6" in text  # the newest context survives
    assert "action number 0 " not in text  # the oldest goes first
    kept = [i for i in range(6) if f"observation number {i + 1}" in text]
    assert kept == list(range(kept[0], 6))  # what is kept is a contiguous, most-recent suffix


def test_task_block_survives_even_when_it_alone_exceeds_the_budget():
    cfg = MTRouterConfig(encoder_kind="hashing", max_history_tokens=8)
    enc = HashingTextEncoder(32, 8)
    assert serialise_history(TASK, history(2), enc, cfg) == "[Task]\n" + TASK


def test_boundary_pair_keeps_its_newest_tokens():
    enc = HashingTextEncoder(32, 10_000)
    assert enc.tail("one two three four", 2) == "three four"
    assert enc.tail("one two", 5) == "one two"


def test_history_modes_select_what_the_router_sees(tiny_encoder, tiny_cfg):
    current = serialise_history(TASK, history(3), tiny_encoder.text_encoder, tiny_cfg.replace(history_mode="current_turn"))
    assert "observation number 3" in current and "observation number 2" not in current
    query = serialise_history(TASK, history(3), tiny_encoder.text_encoder, tiny_cfg.replace(history_mode="query_only"))
    assert query == "[Task]\n" + TASK


class CountingEncoder(HashingTextEncoder):
    """The real hashing encoder, counting how many texts it is asked to embed."""

    def __init__(self):
        super().__init__(16, 512)
        self.embedded = 0

    def encode(self, texts):
        self.embedded += len(texts)
        return super().encode(texts)


def test_cache_embeds_each_distinct_history_once(tiny_cfg):
    enc = HistoryEncoder(CountingEncoder(), tiny_cfg)
    a = enc.encode(TASK, history(2))
    b = enc.encode(TASK, history(2))
    enc.encode_texts(["x", "y", "x"])
    assert np.array_equal(a, b)
    assert enc.text_encoder.embedded == 3  # one history + "x" + "y": duplicates in a batch embed once
    assert enc.hits == 1  # the repeated history came from the cache


def test_cache_persists_on_disk_across_encoders(tiny_cfg, tmp_path):
    first = HistoryEncoder(CountingEncoder(), tiny_cfg, disk_cache_dir=tmp_path)
    first.encode(TASK)
    second = HistoryEncoder(CountingEncoder(), tiny_cfg, disk_cache_dir=tmp_path)
    second.encode(TASK)
    assert second.text_encoder.embedded == 0


def test_cache_is_bounded(tiny_cfg):
    enc = HistoryEncoder(CountingEncoder(), tiny_cfg.replace(cache_size=2))
    enc.encode_texts(["a", "b", "c"])
    assert len(enc._cache) == 2


def row(message: str, response: str) -> dict:
    """A turns-table row logged without the `observation` column (hand-built, or an external log)."""
    return {"message": message, "response": response}


def test_rows_without_an_observation_column_read_it_from_the_next_request():
    turns = [row(json.dumps([{"role": "user", "content": TASK}]), "go north"),
             row(json.dumps([{"role": "system", "content": "s"}, {"role": "user", "content": "You see a door."}]),
                 "open door")]
    pairs = interactions_from_turns(turns, current_observation="The door is open.")
    assert pairs == [Interaction("go north", "You see a door."), Interaction("open door", "The door is open.")]
    assert observation_from_message("print(1)") == "print(1)"  # tool payloads are plain text
    nan_rows = [{**r, "observation": float("nan")} for r in turns]  # a frame where only some rows have it
    assert interactions_from_turns(nan_rows, current_observation="The door is open.") == pairs


def test_an_empty_logged_observation_means_the_environment_said_nothing():
    """QA: turn 1's request repeats the task with a summary of turn 0 — not an observation."""
    qa_next = json.dumps([{"role": "user", "content": TASK + "\n\nPrevious attempts:\n- w (answer): 41"}])
    rows = [{"message": "q", "response": "41", "observation": ""},
            {"message": qa_next, "response": "42", "observation": ""}]
    assert interactions_from_turns(rows, current_observation="stale") == [Interaction("41", ""), Interaction("42", "")]
    records = [TurnRecord(i, "p", "w", "answer", m, r, 0, 0, 0, 0.0, 0.0, [], 1.0) for i, (m, r) in
               enumerate([("q", "41"), (qa_next, "42")])]
    assert [p.observation for p in interactions_from_turns(records, "stale")] == ["", ""]  # TurnRecord's default


def test_a_logged_observation_column_is_preferred():
    rows = [{"message": "ignored", "response": "go north", "observation": "You see a door."},
            {"message": "ignored", "response": "open door", "observation": "The door is open."}]
    assert interactions_from_turns(rows, current_observation="stale") == [
        Interaction("go north", "You see a door."), Interaction("open door", "The door is open.")]
