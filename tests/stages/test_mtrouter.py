"""The MTRouter run settings: the paper-scale file and the checks made before any work starts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from stages.mtrouter import check_run, estimator_config, load_run
from routerops.envs.scienceworld_env import SCIENCEWORLD_ID_TYPES, SCIENCEWORLD_OOD_TYPES
from routerops.errors import InputError

REPO = Path(__file__).resolve().parents[2]
PAPER = REPO / "configs/paper/mtrouter.yaml"


def test_paper_scale_file_has_the_papers_setting():
    run = load_run(PAPER)
    assert tuple(run.id_types) == SCIENCEWORLD_ID_TYPES and tuple(run.ood_types) == SCIENCEWORLD_OOD_TYPES
    assert (run.max_variations, run.split_seed, run.turn_limit, len(run.seeds)) == (30, 42, 50, 3)
    cfg = estimator_config(run)
    assert cfg.max_history_tokens == 8192 and cfg.encoder_kind == "sentence" and not cfg.linear_head


def test_paper_scale_run_refuses_to_start_until_prices_are_filled(tmp_path):
    with pytest.raises(InputError, match=r"prices\.gpt-5\.input_per_1m"):
        check_run(load_run(PAPER))
    raw = yaml.safe_load((REPO / "configs/paper/prices.yaml").read_text())
    for price in raw["prices"].values():
        price.update(input_per_1m=1.0, output_per_1m=2.0)
    del raw["prices"]["kimi-k2"]
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump(raw))
    params = yaml.safe_load(PAPER.read_text())
    params["mtrouter"].update(pool=str(REPO / "configs/paper/pool.yaml"))
    params["prices"]["evaluation"] = str(tmp_path / "prices.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(InputError, match=r"prices\.kimi-k2"):
        check_run(load_run(tmp_path / "params.yaml"))


def test_embedded_run_passes_its_checks_and_unknown_keys_fail(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # params.yaml names its pool and price book relative to the repository
    check_run(load_run(REPO / "params.yaml"))
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["mtrouter"]["turn_limt"] = 3
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(InputError, match="mtrouter.turn_limt"):
        load_run(tmp_path / "params.yaml")


@pytest.mark.slow
def test_offline_ablation_metrics_judge_each_estimator_on_its_own_target(pool, book, tiny_cfg, tables):
    """The error-penalty ablation learns S_final, the full model S̃_0 = S_final − Σρ: each one's MAE
    is against its own target, so neither looks better just for predicting on another scale."""
    from stages.mtrouter import first_turn_prediction, offline_metrics
    from models.mtrouter.router import MTRouter
    from models.mtrouter.targets import turn_targets
    from routerops.types import Task

    episodes, turns, prompts = tables
    train, val = episodes[episodes.split == "train"], episodes[episodes.split == "val"]
    val_turns = turns[turns.episode_id.isin(set(val.episode_id))]
    first = val_turns[val_turns.turn_index == 0]
    task_of = val.set_index("episode_id").task_id
    tasks = {k: Task(k, "synthetic", "val", text, "") for k, text in prompts.items()}
    targets = {}
    for penalty in (True, False):
        cfg = tiny_cfg.replace(error_penalty=penalty, score_range=10.0)
        router = MTRouter(pool, book, cfg).fit(train, turns, prompts)
        metrics = offline_metrics(router, val, turns, tasks)
        targets[penalty] = turn_targets(val, val_turns, cfg, router.lengths).loc[first.index].to_numpy()
        pred = np.array([first_turn_prediction(router, tasks[task_of[e]], w)
                         for e, w in zip(first.episode_id, first.worker)])
        assert metrics["val_episodes"] == len(val)
        assert metrics["val_mae"] == pytest.approx(float(np.abs(targets[penalty] - pred).mean()))
        assert -1.0 <= metrics["val_spearman"] <= 1.0
    # The two targets really differ (the cheap worker's turns carry errors), so the metric must pick.
    assert (targets[True] < targets[False]).any()
