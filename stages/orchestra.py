"""The orchestrator's stages (paper 004, Uno-Orchestra §4): tasks → baselines, teacher, probe → verifier
filter → SFT → RL → evaluate → register.

orchestra-rl (`rl`) continues from the SFT adapter with the App. B estimator of orchestra.rl (Agentic-GRPO
by default; tree-GRPO rolls out trees) on train tasks (004 §4.2, App. B).

Each is `stage(run, layout, *inputs) -> outputs` like every other stage (stages/pipeline.py): the
Prefect tasks of flows/orchestra.py and `routerops stage orchestra-…` (dvc.yaml) call them. Defaults
live in params.yaml, section `orchestra` (small scale for this CPU); configs/paper/orchestra.yaml is
the paper-scale run. The controller trains on train tasks only; the promotion gate judges on val;
test and OOD are only rolled out on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from evaluation.baselines import (
    baseline_collection_plan, baseline_run_id, baseline_table, check_one_flat_primitive, check_router_names,
    check_splits, collect_baseline_episodes, write_baseline_report,
)
from models.embeddings import default_encoder
from evaluation.orchestra_results import controller_rows, plot_rl_curves, results_table, write_results_report
from evaluation.orchestra_serving import Episodes, ServedOrchestrator
from evaluation.registry import Judged, register_and_promote
from evaluation.sft_tracking import train_sft_tracked
from evaluation.tracking import use_tracking
from models.orchestrator.config import OrchestraConfig, orchestra_config
from models.orchestrator.lm import base_model_folder, resolve_device
from models.orchestrator.sampler import controller_for, load_controller_engine
from models.orchestrator.rl import rl_config
from models.orchestrator.sft import RESULT_FILE, holds_other_run
from routerops import schema
from routerops.config import TrackConfig, load_params
from routerops.envs.replay import load_logged_outcomes, write_logged_outcomes
from routerops.envs.suites import read_tasks, write_tasks
from routerops.envs.qa import extract_answer
from routerops.errors import InputError, RouteropsError
from routerops.files import read_yaml_mapping
from routerops.grid import logged_outcomes_from_trajectories
from routerops.layout import Layout, Trajectories
from routerops.orchestra.curriculum import (
    REASON_CODES, STRATEGY_SEPARATOR, collect_episodes, curriculum_expectations, filter_curriculum, sft_records,
)
from routerops.orchestra.endpoint import EndpointController
from routerops.orchestra.executor import WORKER_ACTOR, Executor, ExecutorConfig, TreeShape
from routerops.orchestra.teacher import teacher_controllers
from routerops.promotion import GateConfig, Outcomes
from routerops.pricing import check_pool_priced, load_pool, load_price_book
from routerops.validation import ephemeral_context, run_suite
from routerops.workers import build_workers, check_pool_runnable
from routerops.workers.cache import WorkerCache
from routerops.workers.llm import api_key_for
from routerops.workers.server import local_llm_server
from stages.manifest import write_manifest
from stages.pipeline import write_suites

log = logging.getLogger(__name__)

CONTROLLER_NAME = "orchestrator"  # the LM controller's price-book entry and its episodes' policy


@dataclass(frozen=True)
class OrchestraTasks:
    """The task pool D_0 (004 §4): verifiable reasoning-gym families, one held out as OOD. The split
    seeds are per (family, split), so with the main pipeline's families and seed the test and OOD
    tasks are the main pipeline's, whatever the train size."""

    families: list[str] = field(default_factory=lambda: ["basic_arithmetic", "chain_sum", "gcd", "lcm"])
    ood_families: list[str] = field(default_factory=lambda: ["decimal_chain_sum"])
    train: int = 6  # tasks per family: the teacher's pool, split by the filter into D_SFT and D_RL
    val: int = 2  # the promotion gate's tasks
    test: int = 4
    ood: int = 6
    seed: int = 7


@dataclass(frozen=True)
class OrchestraBaselines:
    """The baseline rows of the results table (004 §6 Tab. 1: single models, single-turn routers and
    multi-round routers beside the orchestrator), on the same tasks, pool, prices and budget."""

    # Single-turn routers of models/registry.py, fitted on the train grid; the one best on val is
    # reported as "the best single-turn router" (MTRouter is always fitted and reported too).
    routers: list[str] = field(default_factory=lambda: ["knn", "logistic", "mf", "mlp"])
    # One fit per seed of every learned router; a row is the mean over them (design.md: three seeds
    # where training is stochastic).
    router_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    rollout_seed: int = 11  # episode ids and the random router's draws
    concurrency: int = 4  # episodes in flight
    server_ctx: int = 2048  # llama.cpp context of the embedded server
    server_threads: int = 2  # llama.cpp generation threads (1 on a busy machine)


@dataclass(frozen=True)
class OrchestraTeacher:
    """Who proposes the trajectories (004 App. A.4). `search`: the search teacher of
    routerops/orchestra/teacher.py (the embedded pool has no strong model). `llm`: a strong LLM worker of
    the pool writes the turns itself through its endpoint (routerops/orchestra/endpoint.py), `samples`
    trajectories per task (sampled at the worker's own temperature); configs/paper/orchestra.yaml."""

    kind: str = "search"  # search | llm
    llm_worker: str = ""  # kind llm: the pool worker that teaches
    samples: int = 1  # kind llm: trajectories per task
    splits: list[str] = field(default_factory=lambda: ["train"])  # the filter splits these into D_SFT / D_RL
    # The worker running the controller's own model: its direct answer is the lazy candidate's answer.
    lazy_worker: str = "smol-direct"
    seed: int = 0
    server_ctx: int = 2048
    server_threads: int = 2


@dataclass(frozen=True)
class OrchestraEvaluation:
    """The language-model controller's rollouts: π(0) on the teacher's tasks (the probe) and the
    controller before and after SFT on val (the gate), test and OOD (the report)."""

    # True: a malformed turn ends the episode (counted, the episode fails). False: the executor answers
    # with an <error> block and the controller retries within Tmax — up to 8 full-length generations of
    # an untrained model per episode, which a 2-core CPU cannot afford for dozens of tasks.
    end_on_malformed: bool = True
    seed: int = 0
    server_ctx: int = 2048
    server_threads: int = 2


@dataclass(frozen=True)
class OrchestraGate:
    """The promotion gate of the register stage (routerops/promotion.py): the new controller takes the
    `champion` alias only if its mean val episode score beats the champion's, rolled out on the same
    val tasks, by more than `min_improvement` at the lower end of a paired bootstrap interval."""

    confidence: float = 0.95
    n_boot: int = 2000
    min_improvement: float = 0.0


@dataclass(frozen=True)
class OrchestraRun:
    """params.yaml → orchestra."""

    pool: str = "configs/pool.yaml"
    price_book: str = "configs/prices/current.yaml"
    tasks: OrchestraTasks = field(default_factory=OrchestraTasks)
    budget_usd: float = 0.01  # per episode, checked before every worker call
    turn_limit: int = 8  # Tmax, controller turns per episode (004 App. B: Tmax = 8)
    # The controller's system prompt (routerops/orchestra/prompt.py): "full" (F.2's sections, ~860 tokens
    # for the embedded pool) or "compact" (~350 tokens: what a 135M controller can be trained on, on a CPU).
    prompt: str = "full"
    baselines: OrchestraBaselines = field(default_factory=OrchestraBaselines)
    teacher: OrchestraTeacher = field(default_factory=OrchestraTeacher)
    evaluation: OrchestraEvaluation = field(default_factory=OrchestraEvaluation)
    gate: OrchestraGate = field(default_factory=OrchestraGate)
    # The language-model controller's sections, typed by models/orchestrator/config.py (lm_config).
    model: dict = field(default_factory=dict)
    controller: dict = field(default_factory=dict)
    sft: dict = field(default_factory=dict)
    rl: dict = field(default_factory=dict)  # orchestra.rl: models/orchestrator/rl.py rl_config (estimator + update)
    # 004 §5's blind-worker protocol: the LM controller sees the pool's LLM workers only as Worker1..K,
    # the mapping to the real workers drawn anew per episode (Executor's worker_labels), in RL and in
    # its own rollouts (probe, evaluation, gate) so that it is judged on what it was trained on. Tools
    # keep their names; the teacher routes by name. Off in the demo: its SFT data name the workers.
    anonymize_workers: bool = False
    # Replay deterministic workers' results (tools; LLMs at temperature 0) from Layout.worker_cache
    # (routerops/workers/cache.py) in the teacher, the controller's rollouts and RL; sampling workers
    # are always called.
    worker_cache: bool = True
    track: TrackConfig = field(default_factory=TrackConfig)  # params.yaml's `track` section, not `orchestra`


def load_run(path: str | Path = "params.yaml") -> OrchestraRun:
    raw = read_yaml_mapping(path).get("orchestra", {}) or {}
    if isinstance(raw, dict) and "track" in raw:
        raise InputError(path, "orchestra.track", "unknown key (tracking is the top-level `track` section)")
    run = _build(OrchestraRun, raw, path, "orchestra")
    for name in ("anonymize_workers", "worker_cache"):
        if not isinstance(getattr(run, name), bool):
            raise InputError(path, f"orchestra.{name}", f"expected true or false, got {getattr(run, name)!r}")
    lm_config(run, path)  # the LM sections are checked at load too, before any stage runs
    rl_config(run.rl, str(path))
    return dataclasses.replace(run, track=load_params(path, sections=("track",)).track)


def check_run(run: OrchestraRun, layout: Layout, params: Path) -> None:
    """Fail before any work on what would fail later: a pool or price book that does not load (the
    paper config's prices are left empty until filled in), an unpriced worker or controller, a teacher
    that is not in the pool, an endpoint key missing from the environment, a device this machine lacks."""
    pool_file, book_file = layout.resolve(run.pool), layout.resolve(run.price_book)
    pool, book = load_pool(pool_file), load_price_book(book_file)
    check_pool_priced(pool, book, book_file)
    if CONTROLLER_NAME not in book.prices:
        raise InputError(book_file, f"prices.{CONTROLLER_NAME}", "the LM controller's turns need a price "
                                                                 "(0 for a self-hosted one)")
    check_teacher(run.teacher, pool, pool_file, params)
    check_pool_runnable(pool)
    for spec in pool.workers:
        if spec.kind == "llm":
            api_key_for(spec)  # a RouteropsError naming the missing variable
    lm = lm_config(run, params)
    resolve_device(lm.controller.device, f"{params}: orchestra.controller")
    resolve_device(lm.sft.device, f"{params}: orchestra.sft")
    resolve_device(rl_config(run.rl, str(params)).settings.device, f"{params}: orchestra.rl")


def lm_config(run: OrchestraRun, source: str | Path = "params.yaml") -> OrchestraConfig:
    """The controller model, decoding and SFT settings of the run."""
    return orchestra_config({"model": run.model, "controller": run.controller, "sft": run.sft}, source=str(source))


def _build(cls, raw, path, where: str):
    if not isinstance(raw, dict):
        raise InputError(path, where, f"expected a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise InputError(path, f"{where}.{unknown[0]}", "unknown key")
    values = {}
    for name, value in raw.items():
        default = fields[name].default_factory() if fields[name].default_factory is not dataclasses.MISSING else None
        values[name] = _build(type(default), value, path, f"{where}.{name}") if dataclasses.is_dataclass(default) else value
    return cls(**values)


# ---------------------------------------------------------------- stage: tasks


def tasks(run: OrchestraRun, layout: Layout) -> Path:
    """D_0: the procedural QA tasks the teacher, the filter and the evaluation share."""
    return write_suites(run.tasks, layout.orchestra_tasks, layout.orchestra_manifests, "orchestra-tasks")


# ---------------------------------------------------------------- stage: baselines


def baselines(run: OrchestraRun, layout: Layout, tasks: Path) -> Path:
    """The baseline rows of the results table on the test and OOD tasks (evaluation/baselines.py):
    single workers and the random router rolled out through the real workers; the best single-turn
    router and MTRouter fitted on the train grid, their operating point chosen on val."""
    cfg = run.baselines
    pool_file, book_file = layout.resolve(run.pool), layout.resolve(run.price_book)
    pool, book, task_list = load_pool(pool_file), load_price_book(book_file), read_tasks(tasks)
    check_router_names(cfg.routers)
    check_one_flat_primitive(pool, pool_file)
    check_pool_priced(pool, book, book_file)
    check_pool_runnable(pool)  # before the LLM server starts
    check_splits(task_list, tasks)
    rollout = dict(budget_usd=run.budget_usd, turn_limit=run.turn_limit, seed=cfg.rollout_seed)
    run_id = baseline_run_id([tasks, pool_file, book_file], rollout)
    episodes, turns = collect_baseline_episodes(
        baseline_collection_plan(pool, task_list, cfg.rollout_seed), pool, book,
        layout.orchestra_journals / "baselines" / run_id, run_id, concurrency=cfg.concurrency,
        server_ctx=cfg.server_ctx, server_threads=cfg.server_threads, **rollout)
    out = layout.orchestra_baselines
    schema.write_table(episodes, out.episodes, "episodes")
    schema.write_table(turns, out.turns, "turns")
    grid = write_logged_outcomes(logged_outcomes_from_trajectories(episodes, task_list), layout.orchestra_grid)
    table, selection = baseline_table(episodes, load_logged_outcomes(grid), book, pool, list(cfg.routers),
                                      list(cfg.router_seeds), default_encoder(), source=grid)
    reports = write_baseline_report(table, selection, layout.orchestra_baselines_table,
                                    layout.orchestra_baselines_markdown, layout.orchestra_baselines_selection,
                                    book.version)
    metrics = {f"{col}/{row.split}/{row.policy}": float(getattr(row, col))
               for row in table.itertuples() for col in ("accuracy", "usd_per_episode")}
    write_manifest(layout.orchestra_manifests, "orchestra-baselines", run, [tasks, pool_file, book_file],
                   [*out.paths(), grid, *reports], {**metrics, "episodes": len(episodes)}, artifacts=reports[1:2])
    return layout.orchestra_baselines_table


# ---------------------------------------------------------------- stage: teacher


def teacher(run: OrchestraRun, layout: Layout, tasks: Path) -> Trajectories:
    """Teacher trajectories on the train tasks, every candidate run through the real executor and
    workers (004 App. A.4: observations are runtime outputs); resumable from its journal."""
    cfg = run.teacher
    pool_file, book_file = layout.resolve(run.pool), layout.resolve(run.price_book)
    pool, book = load_pool(pool_file), load_price_book(book_file)
    chosen = [t for t in read_tasks(tasks) if t.split in cfg.splits]
    if not chosen:
        raise InputError(tasks, "split", f"no task in the teacher's splits {cfg.splits}")
    check_pool_priced(pool, book, book_file)
    check_pool_runnable(pool)
    check_teacher(cfg, pool, pool_file, layout.resolve("params.yaml"))
    out = layout.orchestra_teacher
    run_id = baseline_run_id([tasks, pool_file, book_file], {"budget_usd": run.budget_usd,
                                                             "turn_limit": run.turn_limit, "teacher": cfg.seed,
                                                             "kind": cfg.kind, "llm_worker": cfg.llm_worker,
                                                             "prompt": run.prompt})
    with _workers(pool, cfg.server_ctx, cfg.server_threads) as workers:
        episodes, _ = asyncio.run(_teach(run, pool, book, workers, chosen, out.folder, run_id,
                                         worker_cache(run, layout)))  # writes out
    passed = episodes.groupby("task_id").success.any()
    write_manifest(layout.orchestra_manifests, "orchestra-teacher", run, [tasks, pool_file, book_file], out.paths(),
                   {"trajectories": len(episodes), "tasks": len(chosen), "tasks_with_a_passing_trajectory": int(passed.sum()),
                    "usd": float(episodes.cost_usd.sum())})
    return out


@contextlib.contextmanager
def _workers(pool, server_ctx: int, server_threads: int):
    """The pool's workers, with the local llama.cpp server up while they are used if the pool needs it."""
    uses_local = any(w.endpoint == "local" for w in pool.workers if w.kind == "llm")
    server = local_llm_server(n_ctx=server_ctx, n_threads=server_threads) if uses_local else None
    with server or contextlib.nullcontext() as base_url:
        yield build_workers(pool, base_url)


def check_teacher(cfg: OrchestraTeacher, pool, pool_file: Path, params: Path) -> None:
    names = {w.name: w for w in pool.workers}
    if cfg.kind not in ("search", "llm"):
        raise InputError(params, "orchestra.teacher.kind", f"{cfg.kind!r} is not one of search, llm")
    if cfg.kind == "search" and cfg.lazy_worker not in names:
        raise InputError(params, "orchestra.teacher.lazy_worker", f"{cfg.lazy_worker!r} is not a worker of {pool_file}")
    if cfg.kind == "llm" and (cfg.llm_worker not in names or names[cfg.llm_worker].kind != "llm"):
        raise InputError(params, "orchestra.teacher.llm_worker", f"{cfg.llm_worker!r} is not an LLM worker of {pool_file}")
    if cfg.kind == "llm" and not (isinstance(cfg.samples, int) and cfg.samples >= 1):
        raise InputError(params, "orchestra.teacher.samples", f"expected a positive integer, got {cfg.samples!r}")


async def teacher_batches(cfg: OrchestraTeacher, pool, workers, chosen: list, run_id: str) -> list:
    """(controller, tasks, run id) per teacher strategy: the search teacher's candidates, or `samples`
    rollouts of the LLM teacher. The strategy rides in the run id (curriculum.strategy_of)."""
    if cfg.kind == "llm":
        teacher = workers[cfg.llm_worker]
        controller = EndpointController(teacher.spec, teacher.base_url, version="llm-teacher")
        return [(controller, chosen, f"{run_id}{STRATEGY_SEPARATOR}llm:{cfg.llm_worker}:{i}") for i in range(cfg.samples)]
    lazy = await lazy_answers(chosen, workers[cfg.lazy_worker])
    return [(controller, batch, f"{run_id}{STRATEGY_SEPARATOR}{name}")
            for name, (controller, batch) in teacher_controllers(chosen, pool, lazy).items()]


async def _teach(run: OrchestraRun, pool, book, workers, chosen: list, out_dir: Path, run_id: str,
                 cache: WorkerCache | None = None):
    executor = Executor(pool, workers, book, ExecutorConfig(budget_usd=run.budget_usd, turn_limit=run.turn_limit,
                                                            prompt=run.prompt), cache=cache)
    try:
        batches = await teacher_batches(run.teacher, pool, workers, chosen, run_id)
        return await collect_episodes(executor, batches, out_dir, seed=run.teacher.seed)
    finally:
        await close_workers(workers)


async def lazy_answers(chosen: list, worker) -> dict[str, str]:
    """The controller model's own direct answer per task (the lazy candidate: no worker call)."""
    replies = await asyncio.gather(*(worker.call(task.prompt) for task in chosen))
    return {t.task_id: answer for t, r in zip(chosen, replies) if not r.error and (answer := extract_answer(r.text))}


async def close_workers(workers) -> None:
    for worker in workers.values():
        if hasattr(worker, "aclose"):
            await worker.aclose()


# ---------------------------------------------------------------- stage: verifier filter


def verifier_filter(run: OrchestraRun, layout: Layout, tasks: Path, teacher_out: Trajectories,
                    probe: Trajectories | None = None) -> dict[str, Path]:
    """D_SFT, D_RL and the reason for every trajectory (004 eq. 3, App. A.4), gated by a
    great-expectations suite on what it writes: a failed check writes nothing and raises."""
    task_list = read_tasks(tasks)
    episodes, turns = schema.read_table(teacher_out.episodes, "episodes"), schema.read_table(teacher_out.turns, "turns")
    probe_episodes = schema.read_table(probe.episodes, "episodes") if probe and probe.episodes.is_file() else None
    curriculum = filter_curriculum(task_list, episodes, turns, probe_episodes)
    check_curriculum(curriculum)
    paths = {"sft": layout.orchestra_sft, "rl": layout.orchestra_rl_tasks, "decisions": layout.orchestra_decisions}
    write_jsonl_atomic(sft_records(curriculum.sft), paths["sft"])
    write_tasks(curriculum.rl_tasks, paths["rl"])
    schema.write_csv_atomic(curriculum.decisions, paths["decisions"])
    counts = curriculum.decisions.reason.value_counts().to_dict()
    write_manifest(layout.orchestra_manifests, "orchestra-filter", run, [tasks, *teacher_out.paths()], paths.values(),
                   {"sft_trajectories": len(curriculum.sft), "rl_tasks": len(curriculum.rl_tasks),
                    "sft_tasks": int(curriculum.sft.task_id.nunique()),
                    **{f"modes/{k}": int(v) for k, v in curriculum.sft["mode"].value_counts().items()},
                    **{f"reasons/{REASON_CODES[k]}": int(v) for k, v in counts.items()}})
    return paths


def check_curriculum(curriculum) -> None:
    """The great-expectations gate on the filter's outputs (routerops/orchestra/curriculum.py)."""
    import great_expectations.expectations as gxe

    context = ephemeral_context()
    suites = curriculum_expectations(gxe)
    results = [*run_suite(context, "decisions", curriculum.decisions, suites["decisions"])]
    if len(curriculum.sft):
        results += run_suite(context, "sft", curriculum.sft, suites["sft"])
    failed = [r for r in results if not r.success]
    if failed:
        raise RouteropsError("curriculum data gate failed: " + "; ".join(f"{r.table}.{r.check}" for r in failed))


def write_jsonl_atomic(records: list[dict], path: Path) -> Path:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return schema.write_text_atomic(text, path)


# ---------------------------------------------------------------- the LM controller's rollouts


def load_controller(run: OrchestraRun, layout: Layout, adapter: Path | None = None,
                    version: str | None = None):
    """The LM controller, priced as `orchestrator` (configs/prices): π(0) without an adapter, the SFT'd
    or RL'd controller with one; `version` (base / sft / rl) tells their episodes apart."""
    config = lm_config(run, layout.resolve("params.yaml"))
    return load_controller_engine(config.model, config.controller, adapter, layout.model_cache, name=CONTROLLER_NAME,
                                  version=version or ("base" if adapter is None else "sft"))


def rollout_run_id(run: OrchestraRun, layout: Layout, stage: str, inputs: list[Path]) -> str:
    """A run id that changes with what the episodes depend on (tasks, pool, prices, weights, limits), so
    a rerun after any of them changed never reuses an old journal line."""
    lm = lm_config(run, layout.resolve("params.yaml"))
    settings = {"budget_usd": run.budget_usd, "turn_limit": run.turn_limit, "prompt": run.prompt, "evaluation": dataclasses.asdict(run.evaluation),
                "model": dataclasses.asdict(lm.model), "controller": dataclasses.asdict(lm.controller)}
    if run.anonymize_workers:  # other labels, other episodes (absent when off: earlier run ids stay valid)
        settings["anonymize_workers"] = True
    return f"{stage}-{baseline_run_id(inputs, settings)}"


def controller_rollouts(run: OrchestraRun, layout: Layout, batches: list, out_dir: Path):
    """Episodes of each (controller, tasks, run id) batch through the real executor and workers, one
    lockstep batch per controller (one generate call per round), resumable from out_dir's journal."""
    pool_file, book_file = layout.resolve(run.pool), layout.resolve(run.price_book)
    pool, book = load_pool(pool_file), load_price_book(book_file)
    check_pool_priced(pool, book, book_file)
    check_pool_runnable(pool)
    cfg = run.evaluation
    max_tokens = lm_config(run, layout.resolve("params.yaml")).controller.max_new_tokens
    config = ExecutorConfig(budget_usd=run.budget_usd, turn_limit=run.turn_limit, controller_max_tokens=max_tokens,
                            end_on_malformed=cfg.end_on_malformed, prompt=run.prompt,
                            anonymize_models=run.anonymize_workers)
    cache = worker_cache(run, layout)
    with _workers(pool, cfg.server_ctx, cfg.server_threads) as workers:
        async def collect():
            try:
                return await collect_episodes(Executor(pool, workers, book, config, cache=cache), batches, out_dir,
                                              seed=cfg.seed)
            finally:
                await close_workers(workers)

        collected = asyncio.run(collect())
    if cache is not None:
        log.info("worker cache %s: %s", cache.path, cache.stats.snapshot())
    return collected


def worker_cache(run: OrchestraRun, layout: Layout) -> WorkerCache | None:
    """The deterministic workers' cache of this layout, if orchestra.worker_cache is on."""
    return WorkerCache(layout.worker_cache) if run.worker_cache else None


def tasks_of(task_list: list, splits: list[str], source: Path) -> list:
    chosen = [t for t in task_list if t.split in splits]
    if not chosen:
        raise InputError(source, "split", f"no task in the splits {splits}")
    return chosen


def run_inputs(run: OrchestraRun, layout: Layout, *paths: Path) -> list[Path]:
    return [*paths, layout.resolve(run.pool), layout.resolve(run.price_book)]


# ---------------------------------------------------------------- stage: probe


def probe(run: OrchestraRun, layout: Layout, tasks: Path) -> Trajectories:
    """The cold-start controller π(0) (the base model, no adapter) on the teacher's tasks: the filter
    drops the tasks it already solves (004 eq. 3: no learning signal)."""
    chosen = tasks_of(read_tasks(tasks), run.teacher.splits, tasks)
    controller = load_controller(run, layout)
    run_id = rollout_run_id(run, layout, "probe", run_inputs(run, layout, tasks))
    out = layout.orchestra_probe
    episodes, turns = controller_rollouts(run, layout, [(controller, chosen, run_id)], out.folder)
    rows = controller_rows(episodes, turns, sorted(set(episodes.split)))
    write_manifest(layout.orchestra_manifests, "orchestra-probe", run, run_inputs(run, layout, tasks), out.paths(),
                   {"episodes": len(episodes), "solved": int(episodes.success.sum()),
                    **{f"valid_turn_rate/{r.split}": float(r.valid_turn_rate) for r in rows.itertuples()}})
    return out


# ---------------------------------------------------------------- stage: SFT


def sft(run: OrchestraRun, layout: Layout, sft_data: Path) -> Path:
    """LoRA SFT of the controller on D_SFT (models/orchestrator/sft.py: TRL's SFTTrainer, loss on the
    controller's tokens only, 004 App. E), tracked in MLflow (curve, settings, adapter). A rerun
    resumes from the last checkpoint of the same run; other data or settings start over."""
    config = lm_config(run, layout.resolve("params.yaml"))
    out_dir = layout.orchestra_sft_run
    resume = not holds_other_run(config, sft_data, out_dir)
    if not resume:
        log.info("%s holds another SFT run's checkpoints (other data or settings): starting over", out_dir)
    result, mlflow_run = train_sft_tracked(config, sft_data, out_dir, track=run.track, resume=resume,
                                           model_cache=layout.model_cache)
    losses = [p["loss"] for p in result.loss_curve if "loss" in p]
    metrics = {"global_step": result.global_step, "train_seconds": result.train_seconds,
               **{f"data/{k}": v for k, v in result.data.items()}}
    if losses:
        metrics.update(first_loss=losses[0], last_loss=losses[-1])
    write_manifest(layout.orchestra_manifests, "orchestra-sft", {"sft": run.sft, "model": run.model,
                                                                "mlflow_run": mlflow_run or ""},
                   [sft_data], [*sorted(result.adapter_dir.glob("*")), out_dir / RESULT_FILE], metrics)
    return result.adapter_dir


# ---------------------------------------------------------------- stage: evaluate


EVAL_SPLITS = ["val", "test", "ood"]  # val: the promotion gate's tasks; test and OOD: the report


def evaluate(run: OrchestraRun, layout: Layout, tasks: Path, adapter: Path, rl_adapter: Path,
             baselines_table: Path) -> Path:
    """The controller before (π(0)), after SFT and after RL, rolled out on val, test and OOD through the
    real executor; its rows (accuracy, USD per episode, valid-turn rate, modes) beside the baselines' in
    one table (reports/orchestra/results.*)."""
    task_list = tasks_of(read_tasks(tasks), EVAL_SPLITS, tasks)
    versions = {"base": None, "sft": Path(adapter), "rl": Path(rl_adapter)}
    adapter_files = [f for weights in versions.values() if weights for f in sorted(weights.glob("*"))]
    batches = []
    for version, weights in versions.items():
        controller = load_controller(run, layout, weights, version)
        inputs = run_inputs(run, layout, tasks, *(sorted(weights.glob("*")) if weights else []))
        batches.append((controller, task_list, rollout_run_id(run, layout, f"eval-{version}", inputs)))
    out = layout.orchestra_eval
    episodes, turns = controller_rollouts(run, layout, batches, out.folder)
    reported = ["test", "ood"]
    table = results_table(controller_rows(episodes, turns, EVAL_SPLITS), pd.read_csv(baselines_table), reported)
    book = load_price_book(layout.resolve(run.price_book))
    notes = [f"orchestrator-base is π(0), the untrained {lm_config(run).model.name}; orchestrator-sft adds the LoRA "
             "adapter of the SFT stage (trained on D_SFT, train tasks only); orchestrator-rl continues it with "
             f"{rl_config(run.rl).advantages.estimator} on train-task rollouts (orchestra-rl).",
             "valid_turn_rate: controller turns the strict grammar parser accepted; "
             + ("a malformed turn ends its episode." if run.evaluation.end_on_malformed
                else "a malformed turn is answered with an <error> block and retried within Tmax."),
             "mode_*: share of episodes in each behaviour mode (004 App. E, Tab. 14).",
             "Baseline rows: reports/orchestra/baselines.md says how each was fitted and chosen.",
             "val rows: the controller only, the promotion gate's evidence (the baselines chose their λ there)."]
    reports = write_results_report(table, layout.orchestra_results, layout.orchestra_results_markdown, book.version,
                                   notes)
    metrics = {f"{col}/{row.split}/{row.policy}": float(getattr(row, col))
               for row in table[table.kind == "orchestrator"].itertuples()
               for col in ("accuracy", "usd_per_episode", "valid_turn_rate")}
    write_manifest(layout.orchestra_manifests, "orchestra-evaluate", run,
                   [tasks, *adapter_files, baselines_table], [*out.paths(), *reports], metrics, artifacts=reports[1:])
    return layout.orchestra_results


# ---------------------------------------------------------------- stage: register


def gate_config(run: OrchestraRun) -> GateConfig:
    """The paired gate on per-episode scores (the rollouts already enforced the per-episode budget)."""
    return GateConfig(objective="accuracy_at_budget", budget_usd=None, n_boot=run.gate.n_boot,
                      confidence=run.gate.confidence, min_improvement=run.gate.min_improvement,
                      seed=run.evaluation.seed)


def judged_on_val(episodes: pd.DataFrame) -> Judged:
    """Per val task: the episode's score and USD, as the registry's Judged (one operating point)."""
    val = episodes[episodes.split == "val"].set_index("task_id").sort_index()
    return Judged(list(val.index), Outcomes(val.score.to_numpy()[None], val.cost_usd.to_numpy()[None]))


def champion_on_val(run: OrchestraRun, layout: Layout, task_list: list, champion: ServedOrchestrator,
                    label: str) -> Judged:
    """Roll the registered champion out on the val tasks, as the candidate was."""
    val = [t for t in task_list if t.split == "val"]
    controller = champion.controller
    controller.version = label
    run_id = rollout_run_id(run, layout, f"gate-{label}", run_inputs(run, layout, *sorted(champion.adapter.glob("*"))))
    episodes, _ = controller_rollouts(run, layout, [(controller, val, run_id)], layout.orchestra_journals / "gate" / label)
    return judged_on_val(episodes)


REGISTERED_VERSION = "rl"  # the flow's last trained controller is the one registered


def register(run: OrchestraRun, layout: Layout, tasks: Path, adapter: Path, evaluation: Path) -> Path:
    """Register the RL'd controller (`adapter`, the flow's last) as `orchestrator`; it takes the
    `champion` alias only if it beats the champion on the val tasks (paired bootstrap gate,
    routerops/promotion.py). The SFT'd controller's val numbers stand beside it in results.csv."""
    task_list = read_tasks(tasks)
    episodes = schema.read_table(layout.orchestra_eval.episodes, "episodes")
    mine = episodes[(episodes.policy == CONTROLLER_NAME) & (episodes.policy_version == REGISTERED_VERSION)]
    if mine.empty:
        raise InputError(layout.orchestra_eval.episodes, "policy_version",
                         f"no {REGISTERED_VERSION!r} episodes: run orchestra-evaluate after orchestra-rl")
    candidate = judged_on_val(mine)
    config = lm_config(run, layout.resolve("params.yaml"))
    served = ServedOrchestrator.from_files(config.model, config.controller, Path(adapter), layout.resolve(run.pool),
                                           layout.resolve(run.price_book), Episodes(run.budget_usd, run.turn_limit, run.prompt),
                                           layout.model_cache)
    results = pd.read_csv(evaluation)
    own_rows = results[results.policy == f"{CONTROLLER_NAME}-{REGISTERED_VERSION}"]
    metrics = {f"{s}_{col}": float(v) for s, row in own_rows.set_index("split").iterrows()
               for col, v in row[["accuracy", "usd_per_episode", "valid_turn_rate"]].items()}
    metrics["val_score_mean"] = float(candidate.outcomes.correct.mean())
    hashes = {"sft_sha256": schema.file_sha256(layout.orchestra_sft), "tasks_sha256": schema.file_sha256(tasks),
              "adapter_sha256": schema.file_sha256(Path(adapter) / "adapter_model.safetensors")}
    use_tracking(run.track)
    registered, decision = register_and_promote(
        served, candidate, lambda champion, label: champion_on_val(run, layout, task_list, champion, label),
        gate_config(run), data_hashes=hashes, metrics=metrics,
        training_inputs=[layout.orchestra_sft, tasks, layout.resolve(run.pool), layout.resolve(run.price_book)],
        gate_inputs=[evaluation, tasks, layout.resolve(run.price_book)])
    summary = {"name": registered.name, "version": registered.version, "model_uri": registered.model_uri,
               "run_id": registered.run_id, "decision": decision.to_dict()}
    schema.write_json_atomic(summary, layout.orchestra_registry)
    write_manifest(layout.orchestra_manifests, "orchestra-register", {"gate": dataclasses.asdict(gate_config(run))},
                   [evaluation, tasks], [layout.orchestra_registry], {"promoted": float(decision.promote), **metrics})
    log.info("%s v%s: %s — %s", registered.name, registered.version,
             "promoted" if decision.promote else "refused", decision.reason)
    return layout.orchestra_registry


# ---------------------------------------------------------------- stage: RL (Agentic-GRPO)


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


def signal_pool(rates: dict[str, float]) -> list[str]:
    """Tasks solved sometimes but not always (004's residual hard pool with a learning signal)."""
    return [task_id for task_id, rate in rates.items() if 0.0 < rate < 1.0]


async def probe_success_rates(executor: Executor, controller, generation, tasks: list, samples: int,
                              run_id: str) -> dict[str, float]:
    """Each task's success rate over `samples` rollouts of the policy as it stands (the SFT adapter),
    sampled at the RL temperature under a seed of the probe's own (not the run's sampling seed: the
    probe describes the SFT policy, so runs of other seeds share it), all tasks in one lockstep batch."""
    prepare_rl_controller(controller, dataclasses.replace(generation, seed=PROBE_SEED), 0)
    controller.version = "rl-probe"
    items = [(task, PROBE_SEED + i) for task in tasks for i in range(samples)]
    results = await executor.run_batch(items, controller, f"{run_id}-probe")
    successes: dict[str, list[bool]] = {t.task_id: [] for t in tasks}
    for r in results:
        successes[r.episode["task_id"]].append(bool(r.episode["success"]))
    return {task_id: sum(s) / len(s) for task_id, s in successes.items()}


PROBE_SEED = 900_000  # the probe's sampling seeds, apart from the steps' (n·G + i)


def rl_run_record(run: OrchestraRun, lm: OrchestraConfig, cfg, tasks: list, adapter: Path) -> dict:
    """What the RL run's steps depend on; a rerun with another record is refused."""
    from models.orchestrator.advantages import AdvantageConfig
    from models.orchestrator.rl import adapter_fingerprint

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
    if run.anonymize_workers:
        record["rollouts"]["anonymize_workers"] = True
    if cfg.advantages.estimator == "agentic_grpo":  # V_t now scores a plan turn's observations (rollout_group)
        record["advantages"]["progress"] = "verifier-confirmed observations"
    return json.loads(json.dumps(record))  # tuples → lists, as read back


# AdvantageConfig keys of issue 23 (eq. 5, eq. 6, GiGPO), absent from runs recorded before them.
ADVANTAGE_KEYS_ADDED = ("reward", "schema_bonus", "turn_return", "discount", "shaping_bound", "anchor_weight")


def rl_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints (the trainer's state and the stage's progress), oldest first."""
    from models.orchestrator.rl import STATE_FILE

    found = [p for p in Path(folder).glob("step-*") if (p / STATE_FILE).is_file() and (p / RL_PROGRESS_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step-")))


def controller_turn_groups(turn_rows: list[dict]) -> list[list[dict]]:
    """The episode's rows cut at each controller turn: the turn's own row, then its plan's worker calls."""
    groups: list[list[dict]] = []
    for row in turn_rows:
        if row["actor"] == "controller":
            groups.append([row])
        elif groups:
            groups[-1].append(row)
    return groups


def rollout_group(results: list, normaliser, task_id: str, tree: bool = False, config=None,
                  score_text: Callable[[str], float] | None = None):
    """The G episodes as advantages.RolloutGroup (004 App. B), every per-turn field filled, so that any
    estimator and either reward runs on it.

    V_g: the episode's verifier score. C_g: its USD, √-normalised by the rolling percentile (the
    normaliser is updated with this group's costs first, §4.1 / App. A.2). Per controller turn:
    - C_t: the USD of the controller turn and the worker calls its plan made, normalised alike.
    - V_t (B.10's "verifier-confirmed progress", which the paper leaves undefined per turn) and U_t
      (B.6's turn score "from the downstream outcome of the decision at turn t"): what the verifier
      confirms of the turn's own outcome. A final answer: the verifier's score of it. A plan or repair:
      the best score the verifier gives to what its subtasks returned (each <obs>'s value: a tool's
      printed value, else the answer in an LLM's reply; `score_text`, None: 0), i.e. whether the
      routes it chose brought the answer into the conversation. A malformed turn: 0.
    - r_t (eq. 6's shaping, |r_t| ≤ η = config.shaping_bound): −η on a malformed turn (schema
      validity), 0 otherwise. A repair is not rewarded in itself: one after a correct result is waste.
    - action: its kind (plan / repair / final_answer / malformed), B.11's and eq. 6's cohorts.
    - state (GiGPO's anchor, B.8): a hash of the conversation the controller saw before the turn
      (system prompt with the pool table, task, earlier turns, <obs>). Two turns share a state only if
      the controller faced exactly the same context: the first turns of a group (unless the blind
      protocol draws different labels per episode), siblings at a tree's branch point, and episodes
      whose earlier turns and (deterministic, cached) observations coincided.
    - node (with `tree`): its node of the rollout tree (Executor.run_tree) for tree-GRPO (B.5).
    Per rollout, schema_share (eq. 5's S(τ) = schema_bonus × it): the share of its controller turns
    that were schema-valid plan-and-route emissions (plan or repair)."""
    from models.orchestrator.advantages import AdvantageConfig, Rollout, RolloutGroup, Turn
    from routerops.orchestra import modes

    eta = (config or AdvantageConfig()).shaping_bound
    normaliser.update([float(r.episode["cost_usd"]) for r in results])
    rollouts = []
    for r in results:
        score = min(1.0, max(0.0, float(r.episode["score"])))
        states = anchor_states(getattr(r, "messages", None) or [])
        turns, kinds = [], []
        for k, rows in enumerate(controller_turn_groups(r.turns)):
            kind = rows[0]["primitive"] or "turn"
            kinds.append(kind)
            if kind == modes.KIND_FINAL_ANSWER:
                progress = score
            elif kind in (modes.KIND_PLAN, modes.KIND_REPAIR) and score_text is not None:
                progress = observed_progress(rows[0].get("observation") or "", score_text)
            else:
                progress = 0.0
            turns.append(Turn(cost=normaliser.normalise(sum(float(x["cost_usd"]) for x in rows)),
                              progress=progress, score=progress, action=kind,
                              shaping=-eta if kind == modes.KIND_MALFORMED else 0.0,
                              state=states[k] if k < len(states) else None,
                              node=r.nodes[k] if tree else None))
        share = sum(kind in (modes.KIND_PLAN, modes.KIND_REPAIR) for kind in kinds) / max(len(kinds), 1)
        rollouts.append(Rollout(verifier=score, cost=normaliser.normalise(float(r.episode["cost_usd"])), turns=turns,
                                schema_share=share))
    return RolloutGroup(tuple(rollouts), task=task_id)


def observed_progress(observation: str, score_text: Callable[[str], float]) -> float:
    """The best verifier score among a plan turn's <obs> results (0 when it has none)."""
    from routerops.orchestra.render import parse_observations

    try:
        results = parse_observations(observation)
    except ValueError:  # an <error> block (a malformed turn answered), not observations
        return 0.0
    return max((min(1.0, max(0.0, float(score_text(text)))) for _, text in results), default=0.0)


def answer_scorer(task, verifier) -> Callable[[str], float]:
    """`score_text` for rollout_group: a worker's result scored as an answer to `task` by the task's
    verifier — a tool's printed value if it printed one, else the answer an LLM's reply gives."""
    from routerops.envs.qa import extract_answer, tool_value

    def score(text: str) -> float:
        candidate = tool_value(text) or extract_answer(text)
        return float(verifier(task, candidate)) if candidate else 0.0

    return score


def anchor_states(messages: list) -> list[str]:
    """Per assistant message, a hash of every message before it: the state its turn was taken from."""
    import hashlib

    states = []
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            prefix = json.dumps(messages[:i], ensure_ascii=False, sort_keys=True)
            states.append(hashlib.sha256(prefix.encode()).hexdigest()[:16])
    return states


def rollout_metrics(results: list, group, alpha: float, workers: list[str] = (), config=None) -> dict[str, float]:
    """The group's reward components and behaviour: mean V, mean C (normalised), mean R (config's reward:
    B.1's V − αC, or eq. 5; without a config V − αC), USD,
    success rate, controller turns, malformed turns, and each worker's share of the worker calls (the
    usage ratios; every pool worker in `workers` is logged, 0 when not called)."""
    import numpy as np

    from models.orchestrator.advantages import rewards

    calls = [row["worker"] for r in results for row in r.turns if row["actor"] == WORKER_ACTOR]
    verifier = np.array([g.verifier for g in group.rollouts])
    cost = np.array([g.cost for g in group.rollouts])
    metrics = {"reward/verifier_mean": float(verifier.mean()), "reward/cost_mean": float(cost.mean()),
               "reward/return_mean": float(np.mean(rewards(group, config)) if config is not None
                                           else (verifier - alpha * cost).mean()),
               "reward/usd_mean": float(np.mean([r.episode["cost_usd"] for r in results])),
               "success_rate": float(np.mean([bool(r.episode["success"]) for r in results])),
               "controller_turns_mean": float(np.mean([len(r.controller_turns) for r in results])),
               "malformed_turns_mean": float(np.mean([r.malformed_turns for r in results])),
               "worker_calls_mean": len(calls) / len(results)}
    for worker in sorted(set(calls) | set(workers)):
        metrics[f"usage/{worker}"] = calls.count(worker) / len(calls) if calls else 0.0
    return metrics


async def rl_step(trainer, executor: Executor, cfg, controller, generation, task, run_id: str, normaliser,
                  rollouts: Path) -> dict:
    """One Agentic-GRPO step: G rollouts of `task` sampled from the current policy through the real
    executor and workers, their turn advantages, one clipped-ratio update (models/orchestrator/rl.py).
    `controller` samples the trainer's policy (`rl_controller`): synced to the weights before the step."""
    import time

    import torch

    from models.orchestrator.advantages import turn_advantages
    from models.orchestrator.rl import RolloutBatch

    n, g = trainer.step_count + 1, cfg.group_size
    started = time.perf_counter()
    cache_before = executor.cache.stats.snapshot() if executor.cache is not None else None
    # Each step samples the policy as the previous update left it, under its own seed.
    prepare_rl_controller(controller, generation, n)
    seeds = [n * g + i for i in range(g)]
    tree = cfg.advantages.estimator == "tree_grpo"
    if tree:  # Uno-tree-GRPO: prefix-sharing rollouts, at most G leaves (004 App. B)
        shape = TreeShape(g // cfg.settings.tree_branches, cfg.settings.tree_branches, cfg.settings.tree_branch_turn)
        results = await executor.run_tree(task, controller, run_id, seeds, shape)
    else:
        results = await executor.run_group(task, controller, run_id, seeds)
    rollout_seconds = time.perf_counter() - started
    group = rollout_group(results, normaliser, task.task_id, tree, cfg.advantages,
                          answer_scorer(task, executor.verifier))
    advantages = turn_advantages(cfg.advantages, group)
    batch = RolloutBatch.from_conversations(trainer.tokenizer, [r.messages for r in results],
                                            [a.tolist() for a in advantages],
                                            turns=[r.controller_turns for r in results],
                                            max_length=cfg.settings.max_seq_len)
    # The turns let the batch drop a template end token the policy never chose (a turn cut at
    # max_new_tokens); old log-probs are still recomputed by the trainer (RolloutBatch: exact ρ = 1
    # at the update of a synchronous loop).
    batch = dataclasses.replace(batch, old_known=torch.zeros_like(batch.old_known))
    stats = trainer.step(batch)  # one update per group: old log-probs from its own forward pass
    with open(rollouts, "a") as fh:  # what the step trained on, for inspection (not a resume journal)
        for r in results:
            fh.write(json.dumps({"step": n, "episode": r.episode, "turns": r.turns}, default=str) + "\n")
    return {"step": n, "task_id": task.task_id, "episodes": [r.episode["episode_id"] for r in results],
            "leaves": len(results),
            "scores": [float(r.episode["score"]) for r in results],
            "advantages": [[round(float(x), 6) for x in a] for a in advantages],
            "truncated": batch.truncated, **{k: v for k, v in stats.items() if k not in ("step", "seconds")},
            "controller_tokens": sum(t.completion_tokens for r in results for t in r.controller_turns),
            **rollout_metrics(results, group, cfg.advantages.alpha, sorted(executor.workers), cfg.advantages),
            **cache_metrics(cache_before, executor.cache), "rollout_seconds": rollout_seconds,
            "update_seconds": stats["seconds"], "step_seconds": time.perf_counter() - started}


def rl_controller(trainer, generation):
    """The RL stage's sampler of the trainer's policy (orchestra.controller.engine; FastSampler by
    default: a merged, KV-cached copy re-synced to the adapter before every step)."""
    return controller_for(trainer.model, trainer.tokenizer, generation, name=CONTROLLER_NAME, version="rl")


def prepare_rl_controller(controller, generation, step: int) -> None:
    """Step `step`'s sampling: the current weights (FastSampler re-merges them) and a seed of the step's
    own, so a resumed run samples what an uninterrupted one would have."""
    if hasattr(controller, "sync"):
        controller.sync()
    controller.settings = dataclasses.replace(generation, seed=generation.seed + 10_000 * step)
    controller.calls = 0
    controller.version = f"rl-step{step}"


def cache_metrics(before: dict | None, cache: WorkerCache | None) -> dict[str, float]:
    """This step's worker-cache hits, misses (deterministic calls made) and uncacheable (sampling
    workers') calls, and the hit rate among cacheable calls; nothing when the cache is off."""
    if before is None or cache is None:
        return {}
    now = cache.stats.snapshot()
    hits, misses = now["hits"] - before["hits"], now["misses"] - before["misses"]
    return {"cache/hits": hits, "cache/misses": misses, "cache/uncacheable": now["uncacheable"] - before["uncacheable"],
            "cache/hit_rate": hits / (hits + misses) if hits + misses else 0.0}


STEP_KEYS_NOT_LOGGED = ("step", "task_id", "episodes", "scores", "advantages")


def rl(run: OrchestraRun, layout: Layout, rl_tasks: Path, adapter: Path) -> Path:
    """Agentic-GRPO on the SFT'd controller (004 §4.2, App. B), tracked in MLflow per step.

    Step n: the next train task of the curriculum (`rl_task_order`, cycled), G rollouts of it sampled
    at orchestra.rl.temperature from the current policy through the real executor and workers, the
    RolloutGroup (V, C, per-turn costs), turn advantages of orchestra.rl.estimator, one update of the
    LoRA policy (clipped ratio + β·KL to the frozen SFT adapter). Checkpoints every save_steps (and at
    the end) under data/orchestra/rl/checkpoints; a rerun continues from the last one and refuses other
    settings, tasks or SFT adapter. Writes data/orchestra/rl/adapter and rl_result.json."""
    import asyncio
    import time

    from models.orchestrator.advantages import CostNormaliser
    from models.orchestrator.rl import ADAPTER_DIR, RLTrainer

    params = layout.resolve("params.yaml")
    lm, cfg = lm_config(run, params), rl_config(run.rl, str(params))
    settings = cfg.settings
    # "signal": every train task is a candidate and the probe picks the pool; "curriculum": the filter's.
    task_list = train_tasks(layout) if settings.pool == "signal" else rl_task_order(layout, rl_tasks)
    pool_file, book_file = layout.resolve(run.pool), layout.resolve(run.price_book)
    pool, book = load_pool(pool_file), load_price_book(book_file)
    check_pool_priced(pool, book, book_file)
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
            with _workers(pool, run.evaluation.server_ctx, run.evaluation.server_threads) as workers:
                async def loop():
                    executor = Executor(pool, workers, book, executor_config, cache=cache)
                    controller = rl_controller(trainer, generation)
                    try:
                        visit = task_list
                        if settings.pool == "signal":
                            visit = await rl_pool(executor, controller, generation, task_list, out_dir, run_id,
                                                  settings.probe_samples, record["sft_adapter_sha256"])
                        while not trainer.finished:
                            task = visit[trainer.step_count % len(visit)]
                            steps.append(await rl_step(trainer, executor, cfg, controller, generation, task, run_id, normaliser,
                                                       rollouts_file))
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
                  "pool": settings.pool, "pool_tasks": probed["pool"] if probed else record["tasks"],
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
                   {"rl": run.rl, "model": run.model, "controller": run.controller, "mlflow_run": mlflow_run or ""},
                   [Path(rl_tasks), *sorted(Path(adapter).glob("*"))],
                   [*sorted(adapter_out.glob("*")), result_file, rollouts_file, layout.orchestra_rl_curves], metrics)
    return adapter_out


RL_POOL_FILE = "rl_pool.json"  # the signal probe's success rates and the pool it kept


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
