"""The orchestrator pipeline's config: params.yaml's `orchestra` section as dataclasses, loaded
with an unknown-key check and checked against the pool, prices and devices before any stage runs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from models.orchestrator.config import GenerationSettings, ModelSpec, OrchestraConfig, SFTSettings, orchestra_config
from models.orchestrator.lm import resolve_device
from models.orchestrator.rl import RLConfig, rl_config
from routerops.config import Positive, ScoreGate, Seeds, TrackConfig, Usd, load_pipeline_section
from routerops.errors import InputError
from routerops.layout import Layout
from routerops.market import Market, resolve_market
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
    gate: ScoreGate = field(default_factory=ScoreGate)  # orchestra-register's gate, on the val tasks
    # The language-model controller's sections (models/orchestrator/config.py), checked and typed once
    # when the run is loaded (load_run): every stage reads these objects, none parses the section again.
    model: ModelSpec = field(default_factory=ModelSpec)
    controller: GenerationSettings = field(default_factory=GenerationSettings)
    sft: SFTSettings = field(default_factory=SFTSettings)
    # orchestra.rl: the update's settings and the advantage estimator's (models/orchestrator/rl.py RLConfig).
    rl: RLConfig = field(default_factory=RLConfig)
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

    def market(self, layout: Layout) -> Market:
        """The run's pool and its book (params.yaml `prices.evaluation`, which also enforces the budgets)
        under the layout's root, each read once per content (routerops/market.py)."""
        return resolve_market(layout.resolve(self.pool), layout.resolve(self.price_book))


def lm_sections(path: str | Path) -> dict:
    """The controller's sections, each parsed by its own checker (ranges and choices included)."""
    return {"model": lambda raw: orchestra_config({"model": raw}, str(path)).model,
            "controller": lambda raw: orchestra_config({"controller": raw}, str(path)).controller,
            "sft": lambda raw: orchestra_config({"sft": raw}, str(path)).sft,
            "rl": lambda raw: rl_config(raw, str(path), "orchestra.rl")}


def load_run(path: str | Path = "params.yaml") -> OrchestraRun:
    """params.yaml's `orchestra` section, every part of it typed and checked once, before any stage runs."""
    return load_pipeline_section(OrchestraRun, path, "orchestra", parsers=lm_sections(path))


def check_run(run: OrchestraRun, layout: Layout, params: Path) -> None:
    """Fail before any work on what would fail later: a pool or price book that does not load (the
    paper config's prices are left empty until filled in), an unpriced worker or controller, a teacher
    that is not in the pool, an endpoint key missing from the environment, a device this machine lacks."""
    market = run.market(layout)
    pool, pool_file, book_file, book = market.pool, market.pool_file, market.evaluation_file, market.priced().book
    if CONTROLLER_NAME not in book.prices:
        raise InputError(book_file, f"prices.{CONTROLLER_NAME}", "the LM controller's turns need a price "
                                                                 "(0 for a self-hosted one)")
    check_teacher(run.teacher, pool, pool_file, params)
    check_pool_runnable(pool)
    for spec in pool.workers:
        if spec.kind == "llm":
            api_key_for(spec)  # a RouteropsError naming the missing variable
    resolve_device(run.controller.device, f"{params}: orchestra.controller")
    resolve_device(run.sft.device, f"{params}: orchestra.sft")
    resolve_device(run.rl.settings.device, f"{params}: orchestra.rl")


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
    """The controller model, decoding and SFT settings of the run, as the SFT trainer takes them
    (`source`: the params file, named in its errors)."""
    return OrchestraConfig(run.model, run.controller, run.sft, source=str(source))
