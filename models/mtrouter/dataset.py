"""Logged trajectories → estimator training examples (MTRouter §3.3 "Training Objective").

Every turn t of every logged episode k gives one example (h_t^(k), a_t^(k), S̃_t^(k)). Distinct
serialised histories are embedded once. `HistoryFeaturizer` turns serialised histories into z_x:
the frozen embedding, optionally followed by standardised surface statistics of the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from models.baselines.features import surface_features
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.estimator import TrainingSet
from models.mtrouter.history import HistoryEncoder, Interaction, interactions_from_turns, observation_from_message
from models.mtrouter.model_encoder import AttributeTable
from models.mtrouter.targets import turn_targets
from routerops.errors import InputError


class HistoryFeaturizer:
    """z_x for serialised histories: φ(h_t), plus (cfg.surface_features) the task's surface statistics
    standardised on the training tasks — length and quantity counts are difficulty cues."""

    def __init__(self, encoder: HistoryEncoder | None, cfg: MTRouterConfig):
        self.encoder = encoder
        self.cfg = cfg
        self.mean: np.ndarray | None = None
        self.std: np.ndarray | None = None

    @staticmethod
    def _surface(tasks: Sequence[str]) -> np.ndarray:
        return surface_features(list(tasks))

    def fit(self, tasks: Sequence[str]) -> "HistoryFeaturizer":
        if self.cfg.surface_features:
            s = self._surface(tasks)
            self.mean, self.std = s.mean(axis=0), s.std(axis=0) + 1e-6
        return self

    def transform(self, texts: Sequence[str], tasks: Sequence[str]) -> np.ndarray:
        return self.with_surface(self.encoder.encode_texts(list(texts)), tasks)

    def with_surface(self, z: np.ndarray, tasks: Sequence[str]) -> np.ndarray:
        """[z; standardised surface statistics of the tasks] (z alone when they are off)."""
        if not self.cfg.surface_features:
            return z
        if self.mean is None:
            raise RuntimeError("HistoryFeaturizer used before fit")
        return np.concatenate([z, (self._surface(tasks) - self.mean) / self.std], axis=1).astype(np.float32)


@dataclass
class TurnExamples:
    """One row per logged turn: its serialised history, task, chosen model, target and labels."""

    texts: list[str]
    tasks: list[str]
    workers: list[str]
    targets: np.ndarray
    task_ids: np.ndarray
    splits: np.ndarray
    episode_ids: np.ndarray
    turn_index: np.ndarray

    def training_set(self, featurizer: HistoryFeaturizer, table: AttributeTable,
                     rows: np.ndarray | None = None) -> TrainingSet:
        rows = np.arange(len(self.texts)) if rows is None else np.asarray(rows)
        texts = [self.texts[i] for i in rows]
        unique = list(dict.fromkeys(texts))
        position = {t: i for i, t in enumerate(unique)}
        task_of = {self.texts[i]: self.tasks[i] for i in rows}
        histories = featurizer.transform(unique, [task_of[t] for t in unique])
        model_idx = np.array([table.index(self.workers[i]) for i in rows], dtype=np.int64)
        return TrainingSet(histories, np.array([position[t] for t in texts], dtype=np.int64), model_idx,
                           self.targets[rows].astype(np.float64), self.task_ids[rows])


def drop_random_router_episodes(episodes: pd.DataFrame, cfg: MTRouterConfig) -> pd.DataFrame:
    """Table 4's "w/o random-router data": keep only episodes whose policy is not a random router."""
    if cfg.use_random_router_data:
        return episodes
    return episodes[~episodes["policy"].isin(cfg.random_policies)]


def task_prompt_of(task_id: str, rows: pd.DataFrame, prompts: Mapping[str, str] | None) -> str:
    """The task block q: from `prompts` (task_id → prompt, the Task.prompt the router sees at routing
    time), else the first request's last user message — the prompt itself in QA and tool-use, but
    ScienceWorld's whole templated first prompt, so pass `prompts` there."""
    if prompts is not None:
        if task_id not in prompts:
            raise InputError("<task prompts>", task_id, "no prompt for a task of the episodes table")
        return prompts[task_id]
    return observation_from_message(rows["message"].iloc[0])


def episode_histories(task: str, rows: pd.DataFrame) -> list[list[Interaction]]:
    """[⟨u_0,o_1⟩ … ⟨u_{t−1},o_t⟩] for every turn t of one episode (eq. 2), the history the router
    builds at routing time before turn t: o_{i+1} is turn i's logged `observation`. Turn t's row is
    passed along only for rows without that column, whose o_t is read from turn t's request."""
    records = rows.to_dict("records")
    return [interactions_from_turns(records[: t + 1])[:t] for t in range(len(records))]


def turn_examples(episodes: pd.DataFrame, turns: pd.DataFrame, encoder: HistoryEncoder, cfg: MTRouterConfig,
                  prompts: Mapping[str, str] | None = None, lengths: Mapping[str, float] | None = None) -> TurnExamples:
    """Every turn of the (ablation-filtered) episodes as an example with its eq. 5 target."""
    episodes = drop_random_router_episodes(episodes, cfg)
    turns = turns[turns["episode_id"].isin(set(episodes["episode_id"]))]
    turns = turns.sort_values(["episode_id", "turn_index"], kind="mergesort")
    targets = turn_targets(episodes, turns, cfg, lengths)
    info = episodes.set_index("episode_id")
    texts, tasks, workers, ys, task_ids, splits, eids, positions = [], [], [], [], [], [], [], []
    for eid, rows in turns.groupby("episode_id", sort=False):
        task_id = str(info.at[eid, "task_id"])
        task = task_prompt_of(task_id, rows, prompts)
        for t, history in enumerate(episode_histories(task, rows)):
            texts.append(encoder.serialise(task, history, cfg.history_mode))
            tasks.append(task)
            workers.append(str(rows["worker"].iloc[t]))
            ys.append(float(targets.loc[rows.index[t]]))
            task_ids.append(task_id)
            splits.append(str(info.at[eid, "split"]))
            eids.append(eid)
            positions.append(t)
    obj = lambda v: np.asarray(v, dtype=object)  # noqa: E731
    return TurnExamples(texts, tasks, workers, np.asarray(ys, dtype=float), obj(task_ids), obj(splits), obj(eids),
                        np.asarray(positions, dtype=np.int64))


def validation_rows(task_ids: np.ndarray, splits: np.ndarray | None, cfg: MTRouterConfig) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, validation rows). Logged "val" split when present (App. A's 60/20/20), else a
    seeded `val_fraction` of the tasks; a task never straddles the two."""
    rows = np.arange(len(task_ids))
    if splits is not None and (splits == "val").any() and (splits == "train").any():
        return rows[splits == "train"], rows[splits == "val"]
    unique = np.array(sorted(set(task_ids.tolist())), dtype=object)
    if len(unique) < 2:
        return rows, rows[:0]
    rng = np.random.default_rng(cfg.seed)
    held = set(rng.choice(unique, size=max(1, int(round(cfg.val_fraction * len(unique)))), replace=False).tolist())
    is_val = np.array([t in held for t in task_ids])
    return rows[~is_val], rows[is_val]
