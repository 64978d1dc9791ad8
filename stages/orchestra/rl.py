"""Stage orchestra-rl: Agentic-GRPO (or another App. B estimator) from the SFT adapter on train tasks
(004 §4.2), resumable from its checkpoints, tracked in MLflow per step."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from pathlib import Path

from evaluation.orchestra_results import plot_rl_curves, success_by_pass
from evaluation.tracking import use_tracking
from models.orchestrator.config import OrchestraConfig
from models.orchestrator.lm import base_model_folder
from routerops import schema
from routerops.envs.suites import read_tasks
from routerops.errors import InputError, RouteropsError
from routerops.layout import Layout
from routerops.orchestra.executor import Executor, ExecutorConfig
from routerops.workers import check_pool_runnable
from stages.manifest import write_manifest
from stages.orchestra.config import CONTROLLER_NAME, OrchestraRun, lm_config
from models.orchestrator.rl_step import (  # noqa: F401  (the curriculum probe: re-exported by stages.orchestra)
    PROBE_SEED, limit_pool, prepare_rl_controller, probe_success_rates, rl_controller, rl_step, signal_pool,
)
from stages.orchestra.workers import close_workers, rollout_run_id, workers_with_servers, worker_cache, run_inputs

log = logging.getLogger(__name__)


RL_RUN_FILE = "rl_run.json"  # what the checkpoints under data/orchestra/rl were trained with


RL_RESULT_FILE = "rl_result.json"


RL_PROGRESS_FILE = "rl_progress.json"  # in each checkpoint: the step records and the √c cost buffer


RL_ROLLOUTS_FILE = "rollouts.jsonl"  # every step's episode rows and turn rows


RL_CHECKPOINTS = "checkpoints"


RL_KEEP_CHECKPOINTS = 2


def rl_task_order(layout: Layout, rl_tasks: Path) -> list:
    """The RL curriculum in the order it is visited: D_RL (the filter's rl_tasks.jsonl: tasks the teacher
    solved but π(0) did not, or that no SFT trajectory covers) first, then D_SFT's tasks. Train tasks only:
    a val, test or OOD task here would leak the gate's or the report's tasks into training; refused."""
    from models.orchestrator.sft_data import read_conversations

    chosen = list(read_tasks(rl_tasks)) if Path(rl_tasks).is_file() and Path(rl_tasks).stat().st_size else []
    if layout.orchestra_sft.is_file() and layout.orchestra_sft.stat().st_size:
        by_id = {t.task_id: t for t in read_tasks(layout.orchestra_tasks)}
        for task_id in dict.fromkeys(c.task_id for c in read_conversations(layout.orchestra_sft)):
            if task_id not in by_id:
                raise InputError(layout.orchestra_sft, "task_id", f"{task_id!r} is not a task of {layout.orchestra_tasks}")
            chosen.append(by_id[task_id])
    chosen = list({t.task_id: t for t in chosen}.values())  # first occurrence wins, order kept
    leaked = [t for t in chosen if t.split != "train"]
    if leaked:
        raise RouteropsError(f"the RL curriculum holds {leaked[0].split} task {leaked[0].task_id!r}: RL trains on "
                             "train tasks only (val gates promotion, test and OOD are reported)")
    if not chosen:
        raise InputError(rl_tasks, "tasks", f"no train task to roll out (D_RL is empty and {layout.orchestra_sft} "
                                            "names none)")
    return chosen


def train_tasks(layout: Layout) -> list:
    """Every train task of the tasks file: the signal probe's candidates."""
    return [t for t in read_tasks(layout.orchestra_tasks) if t.split == "train"]


def rl_run_record(run: OrchestraRun, lm: OrchestraConfig, cfg, tasks: list, adapter: Path) -> dict:
    """What the RL run's steps depend on; a rerun with another record is refused."""
    from models.orchestrator.advantages import AdvantageConfig
    from models.orchestrator.rl import RLSettings, adapter_fingerprint

    record = {"settings": dataclasses.asdict(cfg.settings), "advantages": dataclasses.asdict(cfg.advantages),
              "rollouts": {"budget_usd": run.budget_usd, "turn_limit": run.turn_limit, "prompt": run.prompt,
                           "end_on_malformed": run.evaluation.end_on_malformed, "model": dataclasses.asdict(lm.model),
                           "controller": dataclasses.asdict(lm.controller), "pool": run.pool,
                           "price_book": run.price_book},
              "tasks": [t.task_id for t in tasks], "sft_adapter_sha256": adapter_fingerprint(Path(adapter))}
    # Keys added after runs were recorded are left out at their defaults, so those runs still resume;
    # a setting that changes the steps is recorded when it is on.
    for key in ADVANTAGE_KEYS_ADDED:
        if record["advantages"][key] == getattr(AdvantageConfig(), key):
            del record["advantages"][key]
    for key in SETTING_KEYS_ADDED:
        if record["settings"][key] == getattr(RLSettings(), key):
            del record["settings"][key]
    if run.anonymize_workers:
        record["rollouts"]["anonymize_workers"] = True
    if cfg.advantages.estimator == "agentic_grpo":  # V_t now scores a plan turn's observations (rollout_group)
        record["advantages"]["progress"] = "verifier-confirmed observations"
    return json.loads(json.dumps(record))  # tuples → lists, as read back


# AdvantageConfig keys of issue 23 (eq. 5, eq. 6, GiGPO), absent from runs recorded before them.
ADVANTAGE_KEYS_ADDED = ("reward", "schema_bonus", "turn_return", "discount", "shaping_bound", "anchor_weight")
# RLSettings keys added since (pool_size; the sampler correction and the rollout weights), likewise.
SETTING_KEYS_ADDED = ("pool_size", "tis_cap", "rollout_weights")


def rl_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints (the trainer's state and the stage's progress), oldest first."""
    from models.orchestrator.rl import STATE_FILE

    found = [p for p in Path(folder).glob("step-*") if (p / STATE_FILE).is_file() and (p / RL_PROGRESS_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))


STEP_KEYS_NOT_LOGGED = ("step", "task_id", "episodes", "scores", "advantages")


def rl(run: OrchestraRun, layout: Layout, rl_tasks: Path, adapter: Path) -> Path:
    """Agentic-GRPO on the SFT'd controller (004 §4.2, App. B), tracked in MLflow per step.

    Step n: the next train task of the curriculum (`rl_task_order`, cycled), G rollouts of it sampled
    at orchestra.rl.temperature from the current policy through the real executor and workers, the
    RolloutGroup (V, C, per-turn costs), turn advantages of orchestra.rl.estimator, one update of the
    LoRA policy (clipped ratio + β·KL to the frozen SFT adapter). Checkpoints every save_steps (and at
    the end) under data/orchestra/rl/checkpoints; a rerun continues from the last one and refuses other
    settings, tasks or SFT adapter. Writes data/orchestra/rl/adapter and rl_result.json."""
    import time

    from models.orchestrator.advantages import CostNormaliser
    from models.orchestrator.rl import ADAPTER_DIR, RLTrainer

    lm, cfg = lm_config(run, layout.resolve("params.yaml")), run.rl
    settings = cfg.settings
    # "signal": every train task is a candidate and the probe picks the pool; "curriculum": the filter's.
    task_list = train_tasks(layout) if settings.pool == "signal" else rl_task_order(layout, rl_tasks)
    market = run.market(layout)
    pool, pool_file, book_file, book = market.pool, market.pool_file, market.evaluation_file, market.priced().book
    if CONTROLLER_NAME not in book.prices:
        raise InputError(book_file, f"prices.{CONTROLLER_NAME}", "the LM controller's turns need a price")
    check_pool_runnable(pool)
    if lm.controller.batch_size < cfg.group_size:
        log.warning("orchestra.controller.batch_size %d < G = %d: a round takes several generate() calls",
                    lm.controller.batch_size, cfg.group_size)

    out_dir, checkpoints = layout.orchestra_rl_run, layout.orchestra_rl_run / RL_CHECKPOINTS
    record = rl_run_record(run, lm, cfg, task_list, Path(adapter))
    run_file = out_dir / RL_RUN_FILE
    saved = rl_checkpoints(checkpoints)
    if saved:
        previous = json.loads(run_file.read_text()) if run_file.is_file() else None
        if previous != record:
            changed = sorted(k for k in record if not previous or previous.get(k) != record[k])
            raise RouteropsError(f"{checkpoints} holds an RL run with other {', '.join(changed)}; delete "
                                 f"{out_dir} to start a new run")
    else:
        shutil_rmtree(checkpoints)
        schema.write_json_atomic(record, run_file)

    normaliser, steps = CostNormaliser.for_config(cfg.advantages), []
    if saved:
        progress = json.loads((saved[-1] / RL_PROGRESS_FILE).read_text())
        steps, resumed_from = progress["steps"], int(progress["step"])
        normaliser.root_costs.extend(progress["root_costs"])
        trainer = RLTrainer.resume(saved[-1], settings)
        log.info("resuming RL from %s (step %d of %d)", saved[-1], resumed_from, settings.max_steps)
    else:
        resumed_from = None
        trainer = RLTrainer.create(settings, base_model_folder(lm.model, layout.model_cache), Path(adapter))

    # Every step's episodes and turn rows; a resumed run keeps those of the steps its checkpoint holds.
    rollouts_file = out_dir / RL_ROLLOUTS_FILE
    kept = [line for line in (rollouts_file.read_text().splitlines() if rollouts_file.is_file() else [])
            if line.strip() and json.loads(line)["step"] <= (resumed_from or 0)]
    schema.write_text_atomic("".join(line + "\n" for line in kept), rollouts_file)
    generation = dataclasses.replace(lm.controller, temperature=settings.temperature, top_p=1.0)
    executor_config = ExecutorConfig(budget_usd=run.budget_usd, turn_limit=run.turn_limit,
                                     controller_max_tokens=lm.controller.max_new_tokens,
                                     end_on_malformed=run.evaluation.end_on_malformed, prompt=run.prompt,
                                     anonymize_models=run.anonymize_workers)
    cache = worker_cache(run, layout)
    run_id = rollout_run_id(run, layout, "rl", run_inputs(run, layout, Path(rl_tasks), *sorted(Path(adapter).glob("*"))))

    def checkpoint() -> Path:
        path = trainer.save(checkpoints / f"step-{trainer.step_count:06d}")
        schema.write_json_atomic({"step": trainer.step_count, "steps": steps,
                                  "root_costs": list(normaliser.root_costs)}, path / RL_PROGRESS_FILE)
        for stale in rl_checkpoints(checkpoints)[:-RL_KEEP_CHECKPOINTS]:
            shutil_rmtree(stale)
        return path

    with rl_tracking(run, record, resumed_from, inputs={"train": [Path(rl_tasks)], "input": [Path(adapter)]}) as tracker:
        for past in steps:  # a resumed run's MLflow run holds the whole curve
            tracker(past)
        started = time.perf_counter()
        if not trainer.finished:
            with workers_with_servers(pool, run.evaluation.server_ctx, run.evaluation.server_threads) as workers:
                async def loop():
                    executor = Executor(pool, workers, book, executor_config, cache=cache)
                    controller = rl_controller(trainer, generation, lm.model, layout.model_cache, CONTROLLER_NAME)
                    try:
                        visit, probe_rates = task_list, {}
                        if settings.pool == "signal":
                            visit = await rl_pool(executor, controller, generation, task_list, out_dir, run_id,
                                                  settings.probe_samples, record["sft_adapter_sha256"])
                            probe_rates = json.loads((out_dir / RL_POOL_FILE).read_text())["success_rate"]
                            kept = limit_pool([t.task_id for t in visit], probe_rates, settings.pool_size)
                            if len(kept) < len(visit):
                                log.info("RL pool limited to the %d tasks nearest ½ (orchestra.rl.pool_size)", len(kept))
                            visit = [t for t in visit if t.task_id in set(kept)]
                        while not trainer.finished:
                            task = visit[trainer.step_count % len(visit)]
                            step = await rl_step(trainer, executor, cfg, controller, generation, task, run_id, normaliser,
                                                 rollouts_file)
                            steps.append(with_gain_over_probe(step, probe_rates.get(task.task_id)))
                            tracker(steps[-1])
                            log.info("RL step %d/%d on %s: loss %.4f, mean V %.2f, %.1f s", trainer.step_count,
                                     settings.max_steps, task.task_id, steps[-1]["loss"],
                                     steps[-1]["reward/verifier_mean"], steps[-1]["step_seconds"])
                            if trainer.checkpoint_due or trainer.finished:
                                checkpoint()
                    finally:
                        await close_workers(workers)

                asyncio.run(loop())
        last = rl_checkpoints(checkpoints)[-1]
        adapter_out = layout.orchestra_rl_adapter
        copy_tree_atomic(last / ADAPTER_DIR, adapter_out)
        pool_file = out_dir / RL_POOL_FILE
        probed = json.loads(pool_file.read_text()) if settings.pool == "signal" and pool_file.is_file() else None
        result = {"global_step": trainer.step_count, "resumed_from_step": resumed_from,
                  "success_gain_over_sft_probe": gain_by_half(steps), "success_by_pass": success_by_pass(steps),
                  "pool": settings.pool, "pool_size": settings.pool_size,
                  "pool_tasks": limit_pool(probed["pool"], probed["success_rate"], settings.pool_size) if probed
                  else record["tasks"],
                  "probe_success_rate": probed["success_rate"] if probed else None,
                  "train_seconds": round(time.perf_counter() - started, 3), "checkpoint": str(last),
                  "adapter_dir": str(adapter_out), "sft_adapter": str(adapter), "group_size": cfg.group_size,
                  "estimator": cfg.advantages.estimator, "tasks": record["tasks"], "steps": steps,
                  "worker_cache": cache.stats.snapshot() if cache is not None else None}
        result_file = schema.write_json_atomic(result, out_dir / RL_RESULT_FILE)
        curves = plot_rl_curves({cfg.advantages.estimator: [steps]}, layout.orchestra_rl_curves,
                                f"orchestra-rl from the SFT adapter, G = {cfg.group_size}")
        mlflow_run = tracker.finish(adapter_out, result_file, curves)
    metrics = {"global_step": trainer.step_count, "steps_run": trainer.step_count - (resumed_from or 0)}
    if steps:
        metrics.update(first_loss=steps[0]["loss"], last_loss=steps[-1]["loss"],
                       seconds_per_step=sum(s["step_seconds"] for s in steps) / len(steps),
                       verifier_mean=sum(s["reward/verifier_mean"] for s in steps) / len(steps))
    write_manifest(layout.orchestra_manifests, "orchestra-rl",
                   {"rl": {**dataclasses.asdict(run.rl.settings), **dataclasses.asdict(run.rl.advantages)},
                    "model": run.model, "controller": run.controller, "mlflow_run": mlflow_run or ""},
                   [Path(rl_tasks), *sorted(Path(adapter).glob("*"))],
                   [*sorted(adapter_out.glob("*")), result_file, rollouts_file, layout.orchestra_rl_curves], metrics)
    return adapter_out


RL_POOL_FILE = "rl_pool.json"  # the signal probe's success rates and the pool it kept

GAIN_KEY = "success_gain_over_sft_probe"


def with_gain_over_probe(step: dict, probe_rate: float | None) -> dict:
    """The step's G-sample success rate minus the SFT policy's probed rate on the same task (the same
    temperature; probe_samples rollouts, 4 by default as G): a per-step learning signal with the task's difficulty taken out. The raw train
    curve visits a different task each step (the pool is cycled), so it follows the pool's order of
    task families, not the policy; this one is 0 in expectation while the policy is still SFT's."""
    if probe_rate is not None:
        step[GAIN_KEY] = float(step["success_rate"]) - float(probe_rate)
    return step


def gain_by_half(steps: list[dict]) -> dict | None:
    """The mean gain over the probe in the first and the second half of the run's steps."""
    gains = [s[GAIN_KEY] for s in steps if GAIN_KEY in s]
    if len(gains) < 2:
        return None
    half = len(gains) // 2
    return {"first_half": sum(gains[:half]) / half, "second_half": sum(gains[half:]) / (len(gains) - half),
            "steps": len(gains)}


async def rl_pool(executor: Executor, controller, generation, candidates: list, out_dir: Path, run_id: str,
                  samples: int, policy: str = "") -> list:
    """The tasks RL visits under `pool: signal` (RLSettings.pool), in the candidates' order. Probed once:
    the rates are written to rl_pool.json with what they depend on (candidates, samples, temperature,
    the probed policy's fingerprint `policy`), and a file that matches is read back (a resumed run; a
    run of another seed or estimator from the same SFT adapter, given the file)."""
    path = out_dir / RL_POOL_FILE
    ids = [t.task_id for t in candidates]
    key = {"candidates": ids, "samples": samples, "temperature": generation.temperature, "policy": policy}
    probed = json.loads(path.read_text()) if path.is_file() else None
    if probed is None or any(probed.get(k) != v for k, v in key.items()):
        rates = await probe_success_rates(executor, controller, generation, candidates, samples, run_id)
        probed = {**key, "success_rate": rates, "pool": signal_pool(rates)}
        schema.write_json_atomic(probed, path)
    kept = set(probed["pool"])
    log.info("RL pool: %d of %d train tasks solved sometimes but not always (%d samples each at T = %.2f)",
             len(kept), len(ids), samples, generation.temperature)
    if not kept:
        raise RouteropsError(f"no train task has a learning signal: the SFT policy solved each of the {len(ids)} "
                             f"either in all or in none of {samples} samples ({path}); add train tasks, raise "
                             "orchestra.rl.temperature, or set orchestra.rl.pool: curriculum")
    return [t for t in candidates if t.task_id in kept]


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def copy_tree_atomic(source: Path, target: Path) -> Path:
    """`source` copied beside `target`, then renamed into place (a reader never sees half a folder)."""
    import os
    import shutil

    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


class _RLTracker:
    """Per-step metrics to the active MLflow run (or nowhere), the adapter and result at the end."""

    def __init__(self, active: bool):
        self.active = active
        self.run_id = None

    def __call__(self, step: dict) -> None:
        if self.active:
            import mlflow

            mlflow.log_metrics({k: float(v) for k, v in step.items() if k not in STEP_KEYS_NOT_LOGGED
                                and isinstance(v, (int, float))}, step=int(step["step"]))

    def finish(self, adapter: Path, result_file: Path, curves: Path | None = None) -> str | None:
        if not self.active:
            return None
        import mlflow

        mlflow.log_artifacts(str(adapter), artifact_path="adapter")
        mlflow.log_artifact(str(result_file))
        if curves is not None:
            mlflow.log_artifact(str(curves))
        return self.run_id


@contextlib.contextmanager
def rl_tracking(run: OrchestraRun, record: dict, resumed_from: int | None, inputs: dict[str, list[Path]] | None = None):
    """An MLflow run `orchestra-rl` when a tracking store is set (params.yaml's track, or
    MLFLOW_TRACKING_URI), holding the run's settings as params, every step's metrics and, as dataset
    inputs, `inputs` ({context: paths}: the RL task pool, the SFT adapter it starts from)."""
    from evaluation.sft_tracking import tracking_requested

    if not tracking_requested(run.track):
        yield _RLTracker(False)
        return
    import mlflow

    from evaluation.tracking import flatten, git_commit, log_dataset_inputs

    use_tracking(run.track)
    with mlflow.start_run(run_name="orchestra-rl", nested=mlflow.active_run() is not None) as active:
        params = {k: v for k, v in record.items() if k != "tasks"}
        mlflow.log_params({k: str(v)[:500] for k, v in flatten(params).items()})
        mlflow.set_tags({"git_commit": git_commit(), "stage": "orchestra-rl", "tasks": len(record["tasks"]),
                         "resumed_from_step": str(resumed_from)})
        for context, paths in (inputs or {}).items():
            log_dataset_inputs(paths, context=context)
        tracker = _RLTracker(True)
        tracker.run_id = active.info.run_id
        yield tracker
