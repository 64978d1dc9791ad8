"""The orchestrator pipeline's config: params.yaml's `orchestra` section as dataclasses, loaded
with an unknown-key check and checked against the pool, prices and devices before any stage runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from models.orchestrator.config import OrchestraConfig, orchestra_config
from models.orchestrator.lm import resolve_device
from models.orchestrator.rl import rl_config
from routerops.config import Positive, Seeds, TrackConfig, Usd, load_pipeline_section
from routerops.errors import InputError
from routerops.layout import Layout
from routerops.pricing import check_pool_priced, load_pool, load_price_book
from routerops.workers import check_pool_runnable
from routerops.workers.llm import api_key_for

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
    router_seeds: Seeds = field(default_factory=lambda: [0, 1, 2])
    rollout_seed: int = 11  # episode ids and the random router's draws
    concurrency: Positive = 4  # episodes in flight
    server_ctx: int = 2048  # llama.cpp context of the embedded server
    server_threads: Positive = 2  # llama.cpp generation threads (1 on a busy machine)


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

    pool: str = "configs/pools/embedded-smollm2.yaml"
    price_book: str = "configs/prices/current.yaml"
    tasks: OrchestraTasks = field(default_factory=OrchestraTasks)
    budget_usd: Usd = 0.01  # per episode, checked before every worker call
    turn_limit: Positive = 8  # Tmax, controller turns per episode (004 App. B: Tmax = 8)
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
    run = load_pipeline_section(OrchestraRun, path, "orchestra")
    lm_config(run, path)  # the LM sections are checked at load too, before any stage runs
    rl_config(run.rl, str(path))
    return run


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


def lm_config(run: OrchestraRun, source: str | Path = "params.yaml") -> OrchestraConfig:
    """The controller model, decoding and SFT settings of the run."""
    return orchestra_config({"model": run.model, "controller": run.controller, "sft": run.sft}, source=str(source))
