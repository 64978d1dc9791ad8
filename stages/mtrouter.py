"""MTRouter's stages (paper 000, §3–4): collect → ablations → evaluate → analyses → register → track.

Each is `stage(run, layout, *inputs) -> outputs` like every other stage (stages/pipeline.py): the
Prefect tasks of flows/mtrouter.py and `routerops stage mtrouter-…` (dvc.yaml) call them. Defaults
live in params.yaml, section `mtrouter` (small scale for this CPU; the README gives the paper-scale
run). Routers train on the train and val tasks only; ID test and OOD are only rolled out on.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from evaluation.serving.mtrouter import ServedMTRouter
from evaluation.registry import Judged, register_and_promote
from evaluation.tracking import use_tracking
from models.episode_router import episode_level_policies
from models.mtrouter.ablations import ABLATIONS, ablation_config
from models.mtrouter.config import MTRouterConfig
from models.mtrouter.router import MTRouter
from models.mtrouter.targets import turn_targets
from routerops import analyses, schema
from routerops.config import Positive, ScoreGate, Seeds, TrackConfig, Usd, load_pipeline_section
from routerops.envs.scienceworld_env import ScienceWorldEnvironment, action_category, scienceworld_tasks
from routerops.envs.suites import read_tasks, write_tasks
from routerops.errors import InputError
from routerops.layout import Layout, Trajectories
from routerops.metrics import count_switches
from routerops.policies import RandomMultiTurnPolicy, SinglePolicy
from routerops.market import Market, resolve_market
from routerops.pricing import Pool, check_pool_priced
from routerops.promotion import GateConfig, Outcomes
from routerops.report import to_markdown
from routerops.rollout import collect_sync
from routerops.types import EpisodeState
from routerops.workers import build_workers
from routerops.workers.endpoints import pool_endpoints
from stages.manifest import write_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MTRouterRun:
    """params.yaml → mtrouter: the environment, data collection and evaluation of the small run."""

    pool: str = "configs/pools/embedded-smollm2.yaml"
    price_book: str = "configs/prices/current.yaml"
    id_types: list[str] = field(default_factory=lambda: ["find-plant", "boil"])
    ood_types: list[str] = field(default_factory=lambda: ["find-non-living-thing"])
    max_variations: Positive = 5  # per task type (paper: at most N variations per type)
    split_seed: int = 42  # ID variations → train / val / test 60/20/20 (App. A: seed 42)
    budget_usd: Usd = 0.05  # B, per episode
    turn_limit: Positive = 6  # Tmax
    concurrency: Positive = 2
    seeds: Seeds = field(default_factory=lambda: [0, 1, 2])  # estimator seeds for mean ± std
    ablations: list[str] = field(default_factory=lambda: list(ABLATIONS))
    # Also roll every ablation out on ID test and OOD (seeds[0]) and add it to the evaluation table,
    # as Table 4 reports ablations by score; off by default at small scale, where scores are flat.
    ablation_rollouts: bool = False
    cost_weight: float = 0.0  # λ of the cost-aware variant: score − λ·predicted cost
    # Episode-level baselines (§4.1 "single-turn routers"): routers of models.baselines trained on the
    # single-model episodes' task × model grid; one decision at turn 0, kept for the episode.
    episode_routers: list[str] = field(default_factory=lambda: ["knn", "logistic", "mf", "mlp"])
    score_bounds: list[float] = field(default_factory=lambda: [-100.0, 100.0])  # ScienceWorld's score range
    # The estimator's hyper-parameters (MTRouterConfig, the paper's defaults), checked and typed once at load.
    estimator: MTRouterConfig = field(default_factory=MTRouterConfig)
    # Promotion gate of the register step: the seeds[0] router against the champion on the ID-test tasks.
    gate: ScoreGate = field(default_factory=ScoreGate)
    track: TrackConfig = field(default_factory=TrackConfig)  # params.yaml's `track` section, not `mtrouter`


def load_run(path: str | Path = "params.yaml") -> MTRouterRun:
    """params.yaml's `mtrouter` section, the estimator's subsection included, typed and checked once."""
    estimator = partial(MTRouterConfig.from_dict, source=f"{path} mtrouter.estimator")
    return load_pipeline_section(MTRouterRun, path, "mtrouter", parsers={"estimator": estimator})


def check_run(run: MTRouterRun) -> None:
    """Fail before any work on what would fail later: an LLM-less pool, or a pool worker without a
    price (an unpriced worker would make the budget B meaningless)."""
    pool = llm_pool(run)
    if not pool.workers:
        raise InputError(run.pool, "workers", "no LLM worker: ScienceWorld needs models that emit text actions")
    check_pool_priced(pool, market(run).evaluation.book, run.price_book)


def market(run: MTRouterRun) -> Market:
    """The run's pool and its book (params.yaml `prices.evaluation`, which also enforces the budget B),
    each read once per content (routerops/market.py); the paths are the layout's (`resolved`)."""
    return resolve_market(run.pool, run.price_book)


def llm_pool(run: MTRouterRun) -> Pool:
    """ScienceWorld takes one text action per turn: only LLM workers can act."""
    pool = market(run).pool
    return Pool(name=pool.name, workers=tuple(w for w in pool.workers if w.kind == "llm"))


def estimator_config(run: MTRouterRun, seed: int = 0) -> MTRouterConfig:
    return run.estimator.replace(seed=seed)


def resolved(run: MTRouterRun, layout: Layout) -> MTRouterRun:
    """The run with its pool and price-book paths under the layout's root."""
    return dataclasses.replace(run, pool=str(layout.resolve(run.pool)), price_book=str(layout.resolve(run.price_book)))


def rollouts(run: MTRouterRun, tasks: list, policies: list, out_dir: Path, seed: int = 0):
    """Episodes of `policies` on `tasks` against the pool (the local server when the pool uses it);
    `out_dir` holds the resumable journal and the two tables."""
    pool, book = llm_pool(run), market(run).evaluation.book
    with pool_endpoints(pool) as endpoints:
        workers = build_workers(pool, endpoints)
        return collect_sync(tasks, policies, env=ScienceWorldEnvironment(), workers=workers, book=book,
                            budget_usd=run.budget_usd, turn_limit=run.turn_limit, out_dir=out_dir,
                            run_id="mtrouter", seed=seed, concurrency=run.concurrency)


def behaviour_policies(pool: Pool, seed: int = 0) -> list:
    """The paper's data (§3.4): a random router (a uniformly random model at every turn, until the
    environment ends the episode or Tmax) and every single model over the pool."""
    return ([RandomMultiTurnPolicy(stop_prob=0.0, seed=seed)]
            + [SinglePolicy(w.name, "answer", turns=None) for w in pool.workers])


# ---------------------------------------------------------------- stage: collect


def collect(run: MTRouterRun, layout: Layout) -> tuple[Path, Trajectories]:
    """The ScienceWorld tasks (ID types split 60/20/20, OOD types held out) and the behaviour
    episodes on the train and val tasks (§3.4) → (tasks file, training trajectories)."""
    run = resolved(run, layout)
    check_run(run)
    tasks = scienceworld_tasks(run.id_types, run.ood_types, max_variations=run.max_variations, seed=run.split_seed)
    write_tasks(tasks, layout.mtrouter_tasks)
    train = [t for t in tasks if t.split in ("train", "val")]
    episodes, turns = rollouts(run, train, behaviour_policies(llm_pool(run)), layout.mtrouter_train.folder)
    write_manifest(layout.mtrouter_manifests, "mtrouter-collect", run, [Path(run.pool), Path(run.price_book)],
                   [layout.mtrouter_tasks, *layout.mtrouter_train.paths()],
                   {"episodes": len(episodes), "turns": len(turns), "tasks": len(tasks)})
    return layout.mtrouter_tasks, layout.mtrouter_train


def read_training(train: Trajectories) -> tuple[pd.DataFrame, pd.DataFrame]:
    return schema.read_table(train.episodes, "episodes"), schema.read_table(train.turns, "turns")


def fit_router(run: MTRouterRun, cfg: MTRouterConfig, episodes: pd.DataFrame, turns: pd.DataFrame, prompts):
    return MTRouter(llm_pool(run), market(run).evaluation.book, cfg).fit(episodes, turns, prompts)


def first_turn_prediction(router, task, worker: str) -> float:
    """ŝ(h_0, a): the estimator's outcome for starting the task with `worker`."""
    return float(router.score(router.history_features(EpisodeState(task=task)), [worker])[0])


def ablation_metrics(run: MTRouterRun, name: str, episodes: pd.DataFrame, turns: pd.DataFrame,
                     tasks_by_id: dict) -> dict:
    """Train one ablation on the train episodes and measure it offline on the validation episodes.

    val_mae: error of its first-turn prediction ŝ(h_0, a_0) against the target it was trained for,
    S̃_0 under its own settings (with or without the error penalty), so ablations that learn different
    targets are each judged on their own. val_spearman: how well those predictions rank the episodes'
    final scores — the quantity routing acts on, comparable across ablations.
    """
    prompts = {k: t.prompt for k, t in tasks_by_id.items()}
    router = fit_router(run, ablation_config(name, estimator_config(run)), episodes[episodes.split == "train"],
                        turns, prompts)
    return offline_metrics(router, episodes[episodes.split == "val"], turns, tasks_by_id)


def offline_metrics(router, val: pd.DataFrame, turns: pd.DataFrame, tasks_by_id: dict) -> dict:
    """val_mae against each row's own S̃_0 and val_spearman against S_final (see ablation_metrics)."""
    val_turns = turns[turns.episode_id.isin(set(val.episode_id))]
    own_target = turn_targets(val, val_turns, router.cfg, router.lengths)
    first = val_turns[val_turns.turn_index == 0]
    by_id = val.set_index("episode_id")
    rows = [(first_turn_prediction(router, tasks_by_id[by_id.loc[t.episode_id, "task_id"]], t.worker),
             own_target.loc[i], by_id.loc[t.episode_id, "score"]) for i, t in zip(first.index, first.itertuples())]
    metrics = {"val_episodes": float(len(rows))}
    reports = getattr(router.estimator, "reports", [])
    if reports and reports[0].val_loss:
        metrics["best_val_loss"] = float(min(reports[0].val_loss))
    if len(rows) >= 2:
        pred, target, final = np.array(rows, dtype=float).T
        metrics["val_mae"] = float(np.mean(np.abs(pred - target)))
        metrics["val_spearman"] = float(np.nan_to_num(spearmanr(pred, final).statistic))
    return metrics


def episode_level_baselines(run: MTRouterRun, episodes: pd.DataFrame, prompts: dict) -> list:
    """The evaluation issue's routers as episode-level policies, trained on the train and validation
    tasks MTRouter learns from (never on test or OOD)."""
    if not run.episode_routers:
        return []
    train = episodes[episodes.split.isin(["train", "val"])]
    return episode_level_policies(run.episode_routers, train, prompts, tuple(run.score_bounds), seed=run.seeds[0],
                                  cost_weight=run.cost_weight)


def ablated_policies(run: MTRouterRun, episodes: pd.DataFrame, turns: pd.DataFrame, prompts: dict) -> list:
    """`mtrouter:<ablation>` policies (seeds[0]), trained on the same train / val episodes as MTRouter."""
    base = estimator_config(run, run.seeds[0]).replace(cost_weight=run.cost_weight)
    return [fit_router(run, ablation_config(name, base), episodes, turns, prompts)
            .policy(name=f"mtrouter:{name}", version=f"seed{run.seeds[0]}")
            for name in run.ablations if name != "full"]


def evaluation_rollouts(run: MTRouterRun, layout: Layout, episodes: pd.DataFrame, turns: pd.DataFrame,
                       tasks: list) -> pd.DataFrame:
    """Roll MTRouter (one per estimator seed, each saved for the register stage), the single models,
    the random router, the episode-level routers and (with `ablation_rollouts`) each ablation out on
    ID test and OOD; the evaluation tables → episodes with their switch counts."""
    journals = layout.mtrouter_rollouts
    prompts = {t.task_id: t.prompt for t in tasks}
    held_out = [t for t in tasks if t.split in ("test", "ood")]
    # The baselines do not depend on the estimator's seed: roll them out once.
    baselines = behaviour_policies(llm_pool(run), seed=run.seeds[0]) + episode_level_baselines(run, episodes, prompts)
    frames = [rollouts(run, held_out, baselines, journals / "eval-baselines", seed=run.seeds[0])]
    if run.ablation_rollouts:
        frames.append(rollouts(run, held_out, ablated_policies(run, episodes, turns, prompts), journals / "eval-ablations",
                               seed=run.seeds[0]))
    for seed in run.seeds:
        router = fit_router(run, estimator_config(run, seed).replace(cost_weight=run.cost_weight), episodes, turns, prompts)
        router.save(layout.mtrouter_routers / f"seed{seed}")  # the register step logs exactly the router evaluated here
        frames.append(rollouts(run, held_out, [router.policy(version=f"seed{seed}")], journals / f"eval-seed{seed}", seed=seed))
    frames = [(ep.assign(switches=ep.episode_id.map(count_switches(tu)).fillna(0)), tu) for ep, tu in frames]
    episodes_all = pd.concat([f[0] for f in frames], ignore_index=True)
    turns_all = pd.concat([f[1] for f in frames], ignore_index=True)
    schema.write_table(episodes_all.drop(columns=["switches"]), layout.mtrouter_eval.episodes, "episodes")
    schema.write_table(turns_all, layout.mtrouter_eval.turns, "turns")
    return episodes_all


def summarise(episodes_all: pd.DataFrame) -> pd.DataFrame:
    """Mean ± std over seeds of score, success, USD per episode, turns and switches (§4.1)."""
    per_seed = (episodes_all.groupby(["policy", "split", "seed"])
                .agg(score=("score", "mean"), success=("success", "mean"), usd=("cost_usd", "mean"),
                     turns=("turns", "mean"), switches=("switches", "mean")).reset_index())
    table = per_seed.groupby(["policy", "split"]).agg(["mean", "std"])
    table.columns = [f"{a}_{b}" for a, b in table.columns]
    return table.drop(columns=[c for c in table.columns if c.startswith("seed_")]).reset_index()


# ---------------------------------------------------------------- stage: ablations


def ablations(run: MTRouterRun, layout: Layout, tasks: Path, train: Trajectories) -> Path:
    """Train every ablation on the train episodes and measure it on the val episodes (Table 4 offline);
    one manifest per ablation (one nested MLflow run each) and the comparison table."""
    run = resolved(run, layout)
    episodes, turns = read_training(train)
    by_id = {t.task_id: t for t in read_tasks(tasks)}
    rows = []
    for name in run.ablations:
        metrics = ablation_metrics(run, name, episodes, turns, by_id)
        write_manifest(layout.mtrouter_manifests, f"mtrouter-ablations:{name}",
                       {"ablation": name, **{k: str(v) for k, v in ABLATIONS[name].items()}},
                       [tasks, *train.paths()], [], metrics)
        rows.append({"ablation": name, **metrics})
    out = layout.mtrouter_reports / "ablations.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_markdown(pd.DataFrame(rows)) + "\n")
    return out


# ---------------------------------------------------------------- stage: evaluate


def evaluate(run: MTRouterRun, layout: Layout, tasks: Path, train: Trajectories) -> Path:
    """Every policy on ID test and OOD (§4.1) → reports/mtrouter/evaluation.{csv,md}; the rollouts are
    layout.mtrouter_eval and each seed's router is saved under layout.mtrouter_routers."""
    run = resolved(run, layout)
    episodes, turns = read_training(train)
    table = summarise(evaluation_rollouts(run, layout, episodes, turns, read_tasks(tasks)))
    out = layout.mtrouter_reports
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "evaluation.csv", index=False)
    (out / "evaluation.md").write_text(to_markdown(table) + "\n")
    metrics = {}
    for row in table.itertuples():
        key = f"{row.policy}/{row.split}".replace(":", "_")
        metrics.update({f"score_mean/{key}": row.score_mean, f"usd_mean/{key}": row.usd_mean})
    write_manifest(layout.mtrouter_manifests, "mtrouter-evaluate", run, [tasks, *train.paths()],
                   [out / "evaluation.csv", *layout.mtrouter_eval.paths()], metrics,
                   artifacts=[out / "evaluation.md"])
    return out / "evaluation.csv"


# ---------------------------------------------------------------- stage: analyses


ANALYSES = (
    ("cost_vs_switches", analyses.cost_vs_switches, analyses.plot_cost_vs_switches),
    ("error_switch_recovery", analyses.error_switch_recovery, analyses.plot_error_switch_recovery),
    ("usage_by_phase", analyses.usage_by_phase, analyses.plot_usage),
    ("action_lift", partial(analyses.action_lift, action_of=action_category), analyses.plot_action_lift),
)


def analyses_stage(run: MTRouterRun, layout: Layout, evaluation: Path) -> Path:
    """§4.3 analyses of every multi-turn policy on the evaluation rollouts, as tables and plots.
    `evaluation` is the evaluate stage's table; the rollouts beside it are what is analysed."""
    episodes = schema.read_table(layout.mtrouter_eval.episodes, "episodes")
    turns = schema.read_table(layout.mtrouter_eval.turns, "turns")
    out = layout.mtrouter_reports / "analyses"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, compute, plot in ANALYSES:
        frame = compute(episodes, turns)
        frame.to_csv(out / f"{name}.csv", index=False)
        plot(frame, out / f"{name}.png")
        written += [out / f"{name}.csv", out / f"{name}.png"]
    write_manifest(layout.mtrouter_manifests, "mtrouter-analyses", {}, [evaluation, *layout.mtrouter_eval.paths()],
                   written, {}, artifacts=written)
    return out


# ---------------------------------------------------------------- stage: register


def suite_name(tasks: list) -> str:
    """The environment the router serves: `scienceworld` for tasks of suites `scienceworld/<type>`."""
    names = sorted({t.suite.split("/")[0] for t in tasks})
    if len(names) != 1:
        raise InputError("tasks", "suite", f"one environment per MTRouter run, got {names}")
    return names[0]


def gate_config(run: MTRouterRun) -> GateConfig:
    """The paired gate on per-episode scores: "accuracy_at_budget" with no per-query budget is the mean
    score (the rollouts already enforced the per-episode budget B)."""
    return GateConfig(objective="accuracy_at_budget", budget_usd=None, n_boot=run.gate.n_boot,
                      confidence=run.gate.confidence, min_improvement=run.gate.min_improvement, seed=run.seeds[0])


def held_out_outcomes(episodes: pd.DataFrame) -> pd.DataFrame:
    """score and cost_usd of each ID-test episode, indexed by task id (one episode per task)."""
    test = episodes[episodes.split == "test"]
    return test.set_index("task_id")[["score", "cost_usd"]].sort_index()


def judged_episodes(outcomes: pd.DataFrame) -> Judged:
    """Per-task episode outcomes as the registry's Judged (one operating point)."""
    return Judged(list(outcomes.index), Outcomes(outcomes["score"].to_numpy()[None], outcomes["cost_usd"].to_numpy()[None]))


def champion_outcomes(run: MTRouterRun, layout: Layout, tasks: list, champion: ServedMTRouter, label: str) -> Judged:
    """Roll `champion` out on the ID-test tasks with the candidate's seed, budget and turn limit."""
    out_dir = layout.mtrouter_rollouts / "gate" / label
    shutil.rmtree(out_dir, ignore_errors=True)  # this champion's episodes, never an older journal's
    test = [t for t in tasks if t.split == "test"]
    episodes, _ = rollouts(run, test, [champion.router.policy(name="mtrouter-champion", version=label)], out_dir,
                           seed=run.seeds[0])
    return judged_episodes(held_out_outcomes(episodes))


def register(run: MTRouterRun, layout: Layout, tasks: Path, train: Trajectories, evaluation: Path) -> Path:
    """Register the evaluated seeds[0] router as `mtrouter-<suite>`; it takes the `champion` alias only
    if its ID-test episode scores beat the champion's, rolled out on the same tasks (paired gate)."""
    run = resolved(run, layout)
    task_list = read_tasks(tasks)
    episodes = schema.read_table(layout.mtrouter_eval.episodes, "episodes")
    mine = held_out_outcomes(episodes[(episodes.policy == "mtrouter")
                                      & (episodes.policy_version == f"seed{run.seeds[0]}")])
    served = ServedMTRouter(MTRouter.load(layout.mtrouter_routers / f"seed{run.seeds[0]}"), suite_name(task_list))
    hashes = {"train_episodes_sha256": schema.file_sha256(train.episodes),
              "train_turns_sha256": schema.file_sha256(train.turns), "tasks_sha256": schema.file_sha256(tasks)}
    metrics = {"id_test_score_mean": float(mine.score.mean()), "id_test_usd_mean": float(mine.cost_usd.mean())}
    use_tracking(run.track)
    registered, decision = register_and_promote(
        served, judged_episodes(mine), partial(champion_outcomes, run, layout, task_list), gate_config(run),
        data_hashes=hashes, metrics=metrics, training_inputs=[train.episodes, train.turns, tasks],
        gate_inputs=[layout.mtrouter_eval.episodes, tasks])
    summary = {"name": registered.name, "version": registered.version, "model_uri": registered.model_uri,
               "run_id": registered.run_id, "decision": decision.to_dict()}
    report = layout.mtrouter_reports / "registry.json"
    schema.write_json_atomic(summary, report)
    write_manifest(layout.mtrouter_manifests, "mtrouter-register", {"gate": dataclasses.asdict(gate_config(run))},
                   [evaluation, tasks], [report], {"promoted": float(decision.promote), **metrics})
    log.info("%s v%s: %s — %s", registered.name, registered.version,
             "promoted" if decision.promote else "refused", decision.reason)
    return report
