"""The pipelines, declared once (issue 26 item 1): every stage by name — the function it runs, its
config loader, its inputs as the Layout places them, its Prefect retry policy and its DVC entry — and
every pipeline as its config loader, its ordered stage names and, where it has one, its dvc.yaml (its
Prefect flow, a floor above, is named by the CLI: cli/run.py FLOWS). What is built from here:

- `routerops stage NAME` (stages/__init__.py: run_stage) and `routerops run PIPELINE` (cli/run.py);
- the Prefect tasks (tasks/stages.py: TASKS, one per stage, named and retried as declared here); each
  flow calls them in the order its pipeline lists (tests/flows/test_declarations.py reads the flow);
- every dvc.yaml (`routerops dvc-yaml` writes them, stages/dvc_yaml.py; a test fails when one is stale).

This module imports only the Layout and stages/loaders.py (functions that import a stage's module
when called): `routerops stage NAME` (every dvc.yaml command) reads it first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from routerops.layout import Layout
from stages.order import MAIN_ORDER, MTROUTER_ORDER
from stages.loaders import (stages_arena_orchestra, load_main_params, load_mtrouter_run, load_orchestra_run, load_critique_config,
                            load_critique_lm_config, load_arena_run, stages_arena, stages_critique, stages_mtrouter,
                            stages_orchestra_data, stages_orchestra_evaluate, stages_orchestra_register,
                            stages_orchestra_rl, stages_orchestra_sft, stages_orchestra_teacher, stages_pipeline,
                            stages_replay, stages_retrain, stages_routers, stages_track)


@dataclass(frozen=True)
class Dvc:
    """A stage's dvc.yaml entry (its `cmd` is always `routerops stage NAME`). Paths are relative to
    the repository root; `params` are params.yaml keys. Comments here stay in Python, not the YAML."""

    deps: tuple[str, ...]
    params: tuple[str, ...] = ()
    outs: tuple[str | dict, ...] = ()
    metrics: tuple[str | dict, ...] = ()
    note: str = ""  # one line, written beside the stage's name in dvc.yaml


def uncached(path: str) -> dict:
    """A report DVC tracks but does not cache (small, rewritten each run, read in place)."""
    return {path: {"cache": False}}


@dataclass(frozen=True)
class Stage:
    """A stage whose module is imported when it runs (`run()` returns the stage function, importing its
    module; stages/loaders.py): `routerops stage evaluate` (every dvc.yaml command) must not pay for
    importing the orchestrator's torch / transformers / peft stack, which the pipeline's own stages never touch."""

    run: Callable[[], Callable[..., Any]]
    config: Callable[[Any], Any]  # params.yaml → the stage's config
    # The upstream outputs, as the Layout places them. None: the stage runs only inside its flow, whose
    # run-time values it takes (the retrain's price book and pool in force, its workspace Layout).
    inputs: Callable[[Layout], tuple] | None
    retries: int = 0  # Prefect retries: only where a rerun resumes safely (see each stage's comment)
    retry_delay_seconds: float = 0
    log_prints: bool | None = None  # None: as the flow says
    dvc: Dvc | None = None

    def task_options(self, name: str) -> dict[str, Any]:
        """Keyword arguments of `prefect.task` for this stage (only those that differ from its defaults)."""
        options: dict[str, Any] = {"name": name}
        if self.retries:
            options |= {"retries": self.retries, "retry_delay_seconds": self.retry_delay_seconds}
        if self.log_prints is not None:
            options["log_prints"] = self.log_prints
        return options


MAIN = load_main_params
MT = load_mtrouter_run
ORCH = load_orchestra_run
CRITIQUE_LM = load_critique_lm_config
ARENA = load_arena_run
# A dependency written `${key}` is the file params.yaml's `key` names (the pool, a price book): stages/dvc_yaml.py
# writes the path the settings give, so an edited params.yaml cannot leave dvc.yaml tracking the old file
# (`routerops dvc-yaml --check`, run by the tests, names the stale stage). Such a key is a param of its stage too.
POOL = "${pool.file}"
COLLECTION_BOOK, EVALUATION_BOOK, REPLAY_BOOK = "${prices.collection}", "${prices.evaluation}", "${prices.replay}"
ARENA_DATA = ("datasets/routellm", "datasets/gsm8k/train_first8.jsonl", REPLAY_BOOK, "routerops/splits.py")
# The orchestrator run's shared sections (pool, prices, budget, prompt) and the controller's.
ORCH_RUN = ("orchestra.pool", "prices.evaluation", "orchestra.budget_usd", "orchestra.turn_limit", "orchestra.prompt")
ORCH_LM = ("orchestra.anonymize_workers", "orchestra.evaluation", "orchestra.model", "orchestra.controller")
POOL_AND_PRICES = (POOL, EVALUATION_BOOK)
# The MTRouter and orchestrator pipelines run on the embedded pool (params.yaml mtrouter.pool, orchestra.pool).
MTROUTER_POOL_AND_PRICES = ("${mtrouter.pool}", EVALUATION_BOOK)
ORCH_POOL_AND_PRICES = ("${orchestra.pool}", EVALUATION_BOOK)

STAGES: dict[str, Stage] = {
    # --- the main pipeline (dvc.yaml, flows/pipeline.py) ---
    # RouteLLM's logged GSM8K answers, imported once: the default pool's replay endpoints serve them,
    # materialise draws the tasks from their questions, replay ranks the routers on them.
    "outcomes": Stage(lambda: stages_replay().import_outcomes, MAIN, lambda L: (), dvc=Dvc(
        deps=("datasets/routellm", "datasets/gsm8k/train_first8.jsonl", "routerops/envs/replay.py"),
        params=("replay.table", "replay.contaminated", "replay.fewshot"),
        outs=("data/replay/routellm_gsm8k.parquet",))),
    "materialise": Stage(lambda: stages_pipeline().materialise, MAIN, lambda L: (L.replay_table,), dvc=Dvc(
        deps=("data/replay/routellm_gsm8k.parquet", "datasets/gsm8k/test_answers.jsonl", "routerops/envs/suites.py",
              "routerops/envs/table_tasks.py"),
        params=("materialise",), outs=("data/suites/tasks.jsonl",))),
    # Collection talks to live endpoints; the engine retries single calls, and a rerun of the task
    # resumes from its journals, so retrying the whole task is safe and never duplicates an episode.
    # Its dependency is the *collection* price book (budgets are enforced under it); only reprice and
    # what follows depend on the evaluation price book, so a price change makes no LLM call.
    "collect": Stage(lambda: stages_pipeline().collect, MAIN, lambda L: (L.tasks,), retries=2, retry_delay_seconds=5, dvc=Dvc(
        deps=("data/suites/tasks.jsonl", POOL, COLLECTION_BOOK,
              "data/replay/routellm_gsm8k.parquet",  # the answers the pool's replay endpoints give
              "routerops/rollout.py", "routerops/shards.py", "routerops/policies.py", "routerops/envs/qa.py",
              "stages/pipeline.py"),
        params=("collect", "pool", "prices.collection", "evaluate.splits"), outs=("data/raw/episodes.parquet", "data/raw/turns.parquet"))),
    "reprice": Stage(lambda: stages_pipeline().reprice, MAIN, lambda L: (L.raw,), dvc=Dvc(
        deps=("data/raw/episodes.parquet", "data/raw/turns.parquet", EVALUATION_BOOK),
        params=("prices.evaluation",), outs=("data/priced/episodes.parquet", "data/priced/turns.parquet"))),
    "validate": Stage(lambda: stages_pipeline().validate, MAIN, lambda L: (L.priced,), dvc=Dvc(
        deps=("data/priced/episodes.parquet", "data/priced/turns.parquet", POOL, "routerops/validation.py"),
        params=("pool", "prices.evaluation"),
        outs=(uncached("reports/validation.json"),))),
    "evaluate": Stage(lambda: stages_pipeline().evaluate, MAIN, lambda L: (L.priced, L.validation), dvc=Dvc(
        deps=("data/priced/episodes.parquet", "data/priced/turns.parquet", "reports/validation.json",
              "routerops/report.py", "routerops/metrics.py"),
        params=("evaluate",),
        outs=(uncached("reports/eval/leaderboard.csv"), uncached("reports/eval/leaderboard.md"),
              uncached("reports/eval/breakdown.csv"), uncached("reports/eval/accuracy_cost.png")),
        metrics=(uncached("reports/eval/metrics.json"),))),
    "grid": Stage(lambda: stages_routers().grid, MAIN, lambda L: (L.priced, L.tasks), dvc=Dvc(
        deps=("data/priced/episodes.parquet", "data/suites/tasks.jsonl", "routerops/grid.py"),
        outs=("data/grid/outcomes.parquet",))),
    "routers": Stage(lambda: stages_routers().routers, MAIN, lambda L: (L.grid,), dvc=Dvc(
        deps=("data/grid/outcomes.parquet", EVALUATION_BOOK, "models", "evaluation/replay.py"),
        params=("routers", "prices.evaluation", "evaluate.splits"),
        outs=(uncached("reports/routers/leaderboard.csv"), uncached("reports/routers/leaderboard.md"),
              uncached("reports/routers/curves.csv"), uncached("reports/routers/meta.json"),
              uncached("reports/routers/accuracy_cost.png")))),
    # The pool's and price book's versions are recorded on the registered router and its decision.
    "register": Stage(lambda: stages_routers().register, MAIN,
                      lambda L: (L.grid, {"leaderboard": L.routers_dir / "leaderboard.csv"}), dvc=Dvc(
        deps=("data/grid/outcomes.parquet", "reports/routers/leaderboard.csv", "evaluation/registry.py",
              *POOL_AND_PRICES),
        params=("register", "pool", "prices.evaluation"), outs=(uncached("reports/registry.json"),))),
    "replay": Stage(lambda: stages_replay().replay, MAIN, lambda L: (L.replay_table,), dvc=Dvc(
        deps=("data/replay/routellm_gsm8k.parquet", REPLAY_BOOK, "models", "evaluation/replay.py"),
        params=("replay", "prices.replay"),
        outs=(uncached("reports/replay/leaderboard.csv"),
              uncached("reports/replay/leaderboard.md"), uncached("reports/replay/curves.csv"),
              uncached("reports/replay/accuracy_cost.png")),
        metrics=(uncached("reports/replay/metrics.json"),))),
    # The parent run is tagged with the pool and price book versions.
    "track": Stage(lambda: stages_track().track, MAIN, lambda L: (L.registry_report, L.replay_dir / "leaderboard.csv"), dvc=Dvc(
        deps=("reports/stages", "reports/eval/metrics.json", "reports/registry.json", "reports/replay/leaderboard.csv",
              *POOL_AND_PRICES),
        params=("track", "pool", "prices.evaluation"), outs=(uncached("reports/mlflow_runs.json"),))),

    # --- critique (pipelines/critique/dvc.yaml; no flow) ---
    "critique": Stage(lambda: stages_critique().critique, load_critique_config, lambda L: (), dvc=Dvc(
        deps=("datasets/routellm", "datasets/gsm8k/train_first8.jsonl", REPLAY_BOOK, "models/critique",
              "evaluation/critique.py"),
        params=("critique", "prices.replay"), outs=(uncached("reports/critique/results.json"),),
        metrics=(uncached("reports/critique/metrics.json"),),
        note="critique-and-route (002) + CoRL modes (003), RouteLLM GSM8K logs")),
    "critique-lm": Stage(lambda: stages_critique().critique_lm, CRITIQUE_LM, lambda L: (), dvc=Dvc(
        deps=("datasets/routellm", "datasets/gsm8k/train_first8.jsonl", REPLAY_BOOK,
              "models/critique", "models/orchestrator/rl.py", "models/orchestrator/sft.py", "evaluation/critique_lm.py"),
        params=("critique_lm", "prices.replay"),
        outs=(uncached("reports/critique/lm_results.json"), {"reports/critique/lm": {"persist": False}}),
        metrics=(uncached("reports/critique/lm_metrics.json"),),
        note="the LM controllers of 002 / 003 trained by the shared RL core (issue 24); "
             "CPU defaults: ~30 min per (seed, controller) on 2 cores")),
    "critique-lm-register": Stage(lambda: stages_critique().critique_lm_register, CRITIQUE_LM,
                                  lambda L: (L.critique_dir / "lm_results.json",), dvc=Dvc(
        deps=("reports/critique/lm_results.json", "reports/critique/lm", "evaluation/serving/critique.py"),
        params=("critique_lm", "track"), outs=(uncached("reports/critique/lm_registry.json"),),
        note="the RL'd LM controller → MLflow `critique-lm`, through the promotion gate")),

    # --- the arena (issue 39; pipelines/arena/dvc.yaml, flows/arena.py): every method on the RouteLLM GSM8K
    # pool, one split. Each stage skips the (method, seed) outputs it already made with the same settings,
    # so a retry (or a rerun) resumes.
    "arena-policies": Stage(lambda: stages_arena().policies, ARENA, lambda L: (), retries=1, dvc=Dvc(
        deps=(*ARENA_DATA, "models", "evaluation/arena_policies.py"), params=("arena", "prices.replay"),
        outs=({"data/arena/policies": {"persist": True}},),
        note="trivial policies, routers, cascade: fit on train, knob chosen on val, read on test")),
    "arena-lm": Stage(lambda: stages_arena().lm, ARENA, lambda L: (), retries=1, dvc=Dvc(
        deps=(*ARENA_DATA, "models/critique", "evaluation/critique_lm.py"),
        params=("arena", "critique_lm", "prices.replay"),
        outs=({"data/arena/lm": {"persist": True}},),
        note="the LM critique-and-route (002) and CoRL (003) controllers on the arena's split")),
    "arena-orchestra": Stage(lambda: stages_arena_orchestra().orchestrator, ARENA, lambda L: (), retries=1, dvc=Dvc(
        deps=(*ARENA_DATA, "datasets/gsm8k/test_answers.jsonl", "data/replay/routellm_gsm8k.parquet", "configs/pool.yaml",
              "configs/prices/current.yaml", "routerops/orchestra", "models/orchestrator", "stages/orchestra",
              "evaluation/arena_orchestra.py", "stages/arena_orchestra.py"), params=("arena",),
        outs=({"data/arena/orchestrator": {"persist": True}},),
        note="Uno-Orchestra (004): search teacher, SFT, four RL variants on the arena's split (arena.orchestrator.run)")),
    "arena-report": Stage(lambda: stages_arena().report, ARENA, lambda L: (L.arena_data / "policies", L.arena_data / "lm"),
                          dvc=Dvc(
        deps=("data/arena/policies", "data/arena/lm", "data/arena/orchestrator", "evaluation/arena.py",
              "evaluation/arena_report.py"),
        params=("arena", "track"),
        outs=(uncached("reports/arena/accuracy_cost.png"),), metrics=(uncached("benchmarks/results/arena.json"),))),

    # --- MTRouter (pipelines/mtrouter/dvc.yaml, flows/mtrouter.py) ---
    # Rollouts through live workers; a rerun resumes, so one retry never duplicates an episode.
    "mtrouter-collect": Stage(lambda: stages_mtrouter().collect, MT, lambda L: (), retries=1, retry_delay_seconds=5, dvc=Dvc(
        deps=(*MTROUTER_POOL_AND_PRICES, "routerops/envs/scienceworld_env.py", "routerops/rollout.py"),
        params=("mtrouter", "prices.evaluation"), outs=("data/mtrouter/tasks.jsonl", "data/mtrouter/train"))),
    "mtrouter-ablations": Stage(lambda: stages_mtrouter().ablations, MT, lambda L: (L.mtrouter_tasks, L.mtrouter_train), dvc=Dvc(
        deps=("data/mtrouter/tasks.jsonl", "data/mtrouter/train", "models/mtrouter"),
        params=("mtrouter", "prices.evaluation"), outs=(uncached("reports/mtrouter/ablations.md"),))),
    "mtrouter-evaluate": Stage(lambda: stages_mtrouter().evaluate, MT, lambda L: (L.mtrouter_tasks, L.mtrouter_train), dvc=Dvc(
        deps=("data/mtrouter/tasks.jsonl", "data/mtrouter/train", "models"),
        params=("mtrouter", "prices.evaluation"),
        outs=("data/mtrouter/eval", "data/mtrouter/routers", uncached("reports/mtrouter/evaluation.csv")))),
    "mtrouter-analyses": Stage(lambda: stages_mtrouter().analyses_stage, MT,
                               lambda L: (L.mtrouter_reports / "evaluation.csv",), dvc=Dvc(
        deps=("data/mtrouter/eval", "reports/mtrouter/evaluation.csv", "routerops/analyses.py"),
        outs=(uncached("reports/mtrouter/analyses"),))),
    "mtrouter-register": Stage(lambda: stages_mtrouter().register, MT,
                               lambda L: (L.mtrouter_tasks, L.mtrouter_train, L.mtrouter_reports / "evaluation.csv"),
                               dvc=Dvc(
        deps=("data/mtrouter/routers", "data/mtrouter/eval", "reports/mtrouter/evaluation.csv", "evaluation/registry.py"),
        params=("mtrouter", "prices.evaluation"), outs=(uncached("reports/mtrouter/registry.json"),))),
    "mtrouter-track": Stage(lambda: stages_track().mtrouter_track, MT, lambda L: (L.mtrouter_reports / "registry.json",), dvc=Dvc(
        deps=("reports/mtrouter/stages", "reports/mtrouter/registry.json"),
        params=("track",), outs=(uncached("reports/mtrouter/mlflow_runs.json"),))),

    # --- the orchestrator (pipelines/orchestra/dvc.yaml, flows/orchestra.py) ---
    "orchestra-tasks": Stage(lambda: stages_orchestra_data().tasks, ORCH, lambda L: (), dvc=Dvc(
        deps=("routerops/envs/suites.py",), params=("orchestra.tasks",), outs=("data/orchestra/tasks.jsonl",))),
    # Rolls single workers and the random router out through live workers; a rerun resumes from the journal.
    "orchestra-baselines": Stage(lambda: stages_orchestra_data().baselines, ORCH, lambda L: (L.orchestra_tasks,),
                                 retries=1, retry_delay_seconds=5, dvc=Dvc(
        deps=("data/orchestra/tasks.jsonl", *ORCH_POOL_AND_PRICES, "evaluation/baselines.py", "models",
              "routerops/envs/qa.py", "routerops/rollout.py"),
        params=(*ORCH_RUN, "orchestra.baselines"),
        outs=("data/orchestra/baselines", uncached("reports/orchestra/baselines.csv"),
              uncached("reports/orchestra/baselines.md"), uncached("reports/orchestra/baselines_selection.csv")))),
    # The teacher calls live workers; a rerun resumes from its journal, so a retry never duplicates an episode.
    "orchestra-teacher": Stage(lambda: stages_orchestra_teacher().teacher, ORCH, lambda L: (L.orchestra_tasks,),
                               retries=1, retry_delay_seconds=5, dvc=Dvc(
        deps=("data/orchestra/tasks.jsonl", *ORCH_POOL_AND_PRICES, "routerops/orchestra"),
        params=(*ORCH_RUN, "orchestra.teacher"),
        outs=("data/orchestra/teacher/episodes.parquet", "data/orchestra/teacher/turns.parquet"))),
    # The LM controller's rollouts call live workers and resume from their journal: a retry never duplicates.
    "orchestra-probe": Stage(lambda: stages_orchestra_sft().probe, ORCH, lambda L: (L.orchestra_tasks,),
                             retries=1, retry_delay_seconds=5, dvc=Dvc(
        deps=("data/orchestra/tasks.jsonl", *ORCH_POOL_AND_PRICES, "models/orchestrator", "routerops/orchestra"),
        params=(*ORCH_RUN, "orchestra.anonymize_workers", "orchestra.teacher.splits", "orchestra.evaluation",
                "orchestra.model", "orchestra.controller"),
        outs=("data/orchestra/probe/episodes.parquet", "data/orchestra/probe/turns.parquet"))),
    "orchestra-filter": Stage(lambda: stages_orchestra_sft().verifier_filter, ORCH,
                              lambda L: (L.orchestra_tasks, L.orchestra_teacher, L.orchestra_probe), dvc=Dvc(
        deps=("data/orchestra/tasks.jsonl", "data/orchestra/teacher/episodes.parquet",
              "data/orchestra/teacher/turns.parquet", "data/orchestra/probe/episodes.parquet",
              "routerops/orchestra/curriculum.py"),
        outs=("data/orchestra/curriculum/sft.jsonl", "data/orchestra/curriculum/rl_tasks.jsonl",
              "data/orchestra/curriculum/decisions.csv"))),
    # Resumes from its last checkpoint when rerun. Prints stay prints (log_prints=False, whatever the flow says):
    # TRL maps the dataset through `datasets`, whose fingerprint finds a function's globals with dill, which
    # reads `dis.dis(f)` from a captured stdout; Prefect's print-to-log patch sent the disassembly to the run's
    # log instead (~180 lines of bytecode in `make orchestra`) and left dill an empty list of globals.
    "orchestra-sft": Stage(lambda: stages_orchestra_sft().sft, ORCH, lambda L: (L.orchestra_sft,), log_prints=False, dvc=Dvc(
        deps=("data/orchestra/curriculum/sft.jsonl", "models/orchestrator"),
        params=("orchestra.model", "orchestra.sft"),
        outs=("data/orchestra/sft/adapter", "data/orchestra/sft/sft_result.json"))),
    # RL rolls out through live workers and resumes from its last checkpoint; not retried (a retry would
    # redo the steps since that checkpoint with new samples, which is correct but costs their time twice).
    "orchestra-rl": Stage(lambda: stages_orchestra_rl().rl, ORCH, lambda L: (L.orchestra_rl_tasks, L.orchestra_adapter), dvc=Dvc(
        deps=("data/orchestra/tasks.jsonl", "data/orchestra/curriculum/rl_tasks.jsonl",
              "data/orchestra/curriculum/sft.jsonl", "data/orchestra/sft/adapter", *ORCH_POOL_AND_PRICES,
              "models/orchestrator", "routerops/orchestra"),
        params=(*ORCH_RUN, *ORCH_LM, "orchestra.rl"),
        outs=("data/orchestra/rl/adapter", "data/orchestra/rl/rl_result.json", uncached("reports/orchestra/rl_curves.png")),
        note="Agentic-GRPO from the SFT adapter (004 §4.2, App. B)")),
    # Rolls the controllers out through live workers, resumable from the rollouts' journal
    # (stages/orchestra/workers.py: controller_rollouts): a retry never duplicates an episode.
    "orchestra-evaluate": Stage(lambda: stages_orchestra_evaluate().evaluate, ORCH,
                                lambda L: (L.orchestra_tasks, L.orchestra_adapter, L.orchestra_rl_adapter,
                                           L.orchestra_baselines_table), retries=1, retry_delay_seconds=5, dvc=Dvc(
        deps=("data/orchestra/tasks.jsonl", "data/orchestra/sft/adapter", "data/orchestra/rl/adapter",
              "reports/orchestra/baselines.csv", *ORCH_POOL_AND_PRICES, "evaluation/orchestra_results.py",
              "models/orchestrator", "routerops/orchestra"),
        params=(*ORCH_RUN, *ORCH_LM, "orchestra.rl"),
        outs=("data/orchestra/eval/episodes.parquet", "data/orchestra/eval/turns.parquet",
              uncached("reports/orchestra/results.csv"), uncached("reports/orchestra/results.md")))),
    "orchestra-register": Stage(lambda: stages_orchestra_register().register, ORCH,
                                lambda L: (L.orchestra_tasks, L.orchestra_rl_adapter, L.orchestra_results), dvc=Dvc(
        deps=("data/orchestra/tasks.jsonl", "data/orchestra/rl/adapter", "reports/orchestra/results.csv",
              *ORCH_POOL_AND_PRICES),
        params=(*ORCH_RUN, *ORCH_LM, "orchestra.gate"),
        outs=(uncached("reports/orchestra/registry.json"),))),

    # --- the retrain (flows/retrain.py; no dvc.yaml: it runs in its own workspace under the price book
    # and pool in force, which the flow decides at run time) ---
    "retrain-in-force": Stage(lambda: stages_retrain().in_force, MAIN, lambda L: ()),
    "retrain-retire": Stage(lambda: stages_retrain().retire, MAIN, None),
    # Collects only what the per-worker journals lack; a rerun resumes, so retrying never duplicates.
    "retrain-collect-grid": Stage(lambda: stages_retrain().collect_grid, MAIN, None, retries=2, retry_delay_seconds=5),
    "retrain-track": Stage(lambda: stages_retrain().track, MAIN, None),
}


@dataclass(frozen=True)
class Pipeline:
    help: str
    config: Callable[[Any], Any]  # loads and checks the params file
    stages: tuple[str, ...]  # in the order they run (the flow calls them so; dvc.yaml lists them so)
    dvc_file: str = ""  # where its stages' DVC entries are written, relative to the repository root


PIPELINES: dict[str, Pipeline] = {
    "main": Pipeline("collect → validate → evaluate → routers → register → replay → track (make demo)", MAIN,
                     MAIN_ORDER, dvc_file="dvc.yaml"),
    "mtrouter": Pipeline("MTRouter on ScienceWorld (paper 001; make mtrouter)", MT,
                         MTROUTER_ORDER, dvc_file="pipelines/mtrouter/dvc.yaml"),
    "orchestra": Pipeline("the LM orchestrator: teacher → filter → SFT → RL → evaluate → register (paper 004; "
                          "make orchestra)", ORCH,
                          ("orchestra-tasks", "orchestra-baselines", "orchestra-teacher", "orchestra-probe",
                           "orchestra-filter", "orchestra-sft", "orchestra-rl", "orchestra-evaluate",
                           "orchestra-register"), dvc_file="pipelines/orchestra/dvc.yaml"),
    "critique": Pipeline("critique-and-route and CoRL, MLP controllers (papers 002, 003; make critique)",
                         load_critique_config, ("critique",),
                         dvc_file="pipelines/critique/dvc.yaml"),
    "critique-lm": Pipeline("the LM critique / CoRL controller, then registration (make critique-lm)", CRITIQUE_LM,
                            ("critique-lm", "critique-lm-register"), dvc_file="pipelines/critique/dvc.yaml"),
    "arena": Pipeline("every method on the RouteLLM GSM8K pool, one split, paired comparisons (issue 39; make arena)",
                      ARENA, ("arena-policies", "arena-lm", "arena-orchestra", "arena-report"),
                      dvc_file="pipelines/arena/dvc.yaml"),
    "retrain": Pipeline("retrain on the published prices and pool, then the gate (make retrain)", MAIN,
                        ("retrain-in-force", "retrain-retire", "materialise", "retrain-collect-grid", "reprice",
                         "validate", "grid", "routers", "register", "retrain-track")),
}


@dataclass(frozen=True)
class DvcFile:
    header: str  # the comment at the top of the file
    tail: str = ""  # YAML after the stages (the main file's plots)


def dvc_stage_names(path: str) -> list[str]:
    """The stages of dvc file `path`: those of the pipelines written there, in pipeline order, each once."""
    names = [s for p in PIPELINES.values() if p.dvc_file == path for s in p.stages]
    return list(dict.fromkeys(names))


PLOTS = """plots:
  - accuracy vs cost:
      template: scatter
      x: usd_per_query
      y:
        reports/eval/leaderboard.csv: accuracy
  - reports/eval/accuracy_cost.png
  - reports/routers/accuracy_cost.png
  - reports/replay/accuracy_cost.png
"""

DVC_FILES: dict[str, DvcFile] = {
    "dvc.yaml": DvcFile(
        "The main pipeline's stages for DVC. Every stage runs `routerops stage NAME`, the same function the\n"
        "Prefect flow (flows/pipeline.py) runs; paths are the Layout's (routerops/layout.py). Collection\n"
        "depends on the collection price book (budgets are enforced under it); only reprice and what\n"
        "follows depend on the evaluation price book, so a price change re-prices and re-evaluates without\n"
        "a single LLM call. The MTRouter pipeline's stages are in pipelines/mtrouter/dvc.yaml\n"
        "(`dvc repro pipelines/mtrouter/dvc.yaml`).", tail=PLOTS),
    "pipelines/mtrouter/dvc.yaml": DvcFile(
        "The MTRouter pipeline (paper 000) for DVC: `dvc repro pipelines/mtrouter/dvc.yaml`. Every stage\n"
        "runs `routerops stage mtrouter-…` from the repository root (wdir), the same functions the Prefect\n"
        "flow (flows/mtrouter.py, `make mtrouter`) runs. It lives apart from the main dvc.yaml because it\n"
        "takes about half an hour on 2 cores: a plain `dvc repro` (the main pipeline) never starts it."),
    "pipelines/orchestra/dvc.yaml": DvcFile(
        "The orchestrator pipeline (paper 004) for DVC: `dvc repro pipelines/orchestra/dvc.yaml`. Every stage\n"
        "runs `routerops stage orchestra-…` from the repository root (wdir), the same functions the Prefect\n"
        "flow (flows/orchestra.py, `make orchestra`) runs. It lives apart from the main dvc.yaml because it\n"
        "trains a language model: a plain `dvc repro` (the main pipeline) never starts it."),
    "pipelines/arena/dvc.yaml": DvcFile(
        "The arena (issue 39) for DVC: `dvc repro pipelines/arena/dvc.yaml` (or `make arena`): no live call; the\n"
        "LM controllers' stage is the long one (about 30 min per controller and seed on 2 cores)."),
    "pipelines/critique/dvc.yaml": DvcFile(
        "`dvc repro pipelines/critique/dvc.yaml` (or `make critique`): no live call, ~15 min on 2 cores."),
}
