"""Where every pipeline keeps its data: one `Layout(root)` instead of paths relative to the working dir.

Stages (stages/) take their inputs and return their outputs as paths from a Layout, so a stage runs the
same under the repository (`routerops stage NAME`, DVC, the Prefect flows) and under a test's temp
dir. dvc.yaml names the same paths relative to the repository root (tests/stages/test_layout.py
checks that they agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Trajectories:
    """The two tables of one trajectory set (routerops/schema.py)."""

    episodes: Path
    turns: Path

    @classmethod
    def under(cls, folder: Path) -> "Trajectories":
        return cls(folder / "episodes.parquet", folder / "turns.parquet")

    @property
    def folder(self) -> Path:
        return self.episodes.parent

    def paths(self) -> list[Path]:
        return [self.episodes, self.turns]


@dataclass(frozen=True)
class Layout:
    """Every path of every pipeline under `root` (the repository root by default)."""

    root: Path = Path(".")

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def resolve(self, path: str | Path) -> Path:
        """A path from params.yaml (relative to the repository root) under this layout's root."""
        path = Path(path)
        return path if path.is_absolute() else self.root / path

    # ---- main pipeline: data
    @property
    def tasks(self) -> Path:
        return self.root / "data/suites/tasks.jsonl"

    @property
    def raw(self) -> Trajectories:
        return Trajectories.under(self.root / "data/raw")

    @property
    def priced(self) -> Trajectories:
        return Trajectories.under(self.root / "data/priced")

    @property
    def grid(self) -> Path:
        """(task × worker) logged outcomes of the single-worker episodes, every split, `split` column kept."""
        return self.root / "data/grid/outcomes.parquet"

    @property
    def journals(self) -> Path:
        """Resumable collection state (not a DVC output)."""
        return self.root / ".routerops/journals"

    @property
    def model_cache(self) -> Path:
        """Base LMs converted once into plain transformers folders (the SmolLM2 GGUF, dequantised)."""
        return self.root / ".routerops/models"

    # ---- main pipeline: reports
    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def manifests(self) -> Path:
        """One JSON per stage run (params, metrics, hashes) that the track stage logs to MLflow."""
        return self.reports / "stages"

    @property
    def validation(self) -> Path:
        return self.reports / "validation.json"

    @property
    def eval_dir(self) -> Path:
        return self.reports / "eval"

    @property
    def routers_dir(self) -> Path:
        return self.reports / "routers"

    @property
    def registry_report(self) -> Path:
        return self.reports / "registry.json"

    @property
    def mlflow_runs(self) -> Path:
        return self.reports / "mlflow_runs.json"

    def run_log(self, flow: str) -> Path:
        """The full log of the last run of `flow` started from its command line (routerops/runlog.py)."""
        return self.reports / "logs" / f"{flow}.log"

    # ---- replay on real model outcomes (bundled RouteLLM GSM8K table)
    @property
    def replay_table(self) -> Path:
        return self.root / "data/replay/routellm_gsm8k.parquet"

    @property
    def replay_dir(self) -> Path:
        return self.reports / "replay"

    @property
    def critique_dir(self) -> Path:
        """Critique-and-route / CoRL results on the RouteLLM GSM8K logs (stages/critique.py)."""
        return self.reports / "critique"

    # ---- the arena: every method on the RouteLLM GSM8K pool, one split (stages/arena.py)
    @property
    def arena_data(self) -> Path:
        """One cached output per (method, seed), so a rerun skips the done ones."""
        return self.root / "data/arena"

    @property
    def arena_reports(self) -> Path:
        return self.reports / "arena"

    @property
    def arena_results(self) -> Path:
        """Every row and its paired comparisons (committed with the benchmarks' results)."""
        return self.root / "benchmarks/results/arena.json"

    # ---- MTRouter pipeline (paper 000)
    @property
    def mtrouter_data(self) -> Path:
        return self.root / "data/mtrouter"

    @property
    def mtrouter_tasks(self) -> Path:
        return self.mtrouter_data / "tasks.jsonl"

    @property
    def mtrouter_train(self) -> Trajectories:
        return Trajectories.under(self.mtrouter_data / "train")

    @property
    def mtrouter_routers(self) -> Path:
        """Every evaluated estimator seed's saved router; seeds[0] is registered."""
        return self.mtrouter_data / "routers"

    @property
    def mtrouter_eval(self) -> Trajectories:
        return Trajectories.under(self.mtrouter_data / "eval")

    @property
    def mtrouter_rollouts(self) -> Path:
        """Journals of the evaluation and gate rollouts (resumable; not DVC outputs)."""
        return self.root / ".routerops/mtrouter"

    @property
    def mtrouter_reports(self) -> Path:
        return self.reports / "mtrouter"

    @property
    def mtrouter_manifests(self) -> Path:
        return self.mtrouter_reports / "stages"

    # ---- orchestrator pipeline (paper 004): tasks → teacher → filter → SFT → evaluate → register
    @property
    def orchestra_data(self) -> Path:
        return self.root / "data/orchestra"

    @property
    def orchestra_tasks(self) -> Path:
        return self.orchestra_data / "tasks.jsonl"

    @property
    def orchestra_reports(self) -> Path:
        return self.reports / "orchestra"

    @property
    def orchestra_manifests(self) -> Path:
        return self.orchestra_reports / "stages"

    @property
    def orchestra_journals(self) -> Path:
        """Resumable rollout journals of the orchestra stages (not DVC outputs)."""
        return self.root / ".routerops/orchestra"


    @property
    def worker_cache(self) -> Path:
        """Deterministic workers' results (routerops/workers/cache.py), shared by the stages that call
        workers through the orchestrator's executor; a cache, not a DVC output."""
        return self.root / ".routerops/worker_cache.sqlite"

    # ---- orchestrator pipeline: the baseline rows of its results table (stages/orchestra.baselines)
    @property
    def orchestra_baselines(self) -> Trajectories:
        """Single-worker episodes (every split) and the random router's (test, OOD) on the orchestra tasks."""
        return Trajectories.under(self.orchestra_data / "baselines")

    @property
    def orchestra_grid(self) -> Path:
        """(task × worker) logged outcomes of those single-worker episodes, `split` column kept."""
        return self.orchestra_baselines.folder / "grid.parquet"

    @property
    def orchestra_baselines_table(self) -> Path:
        """One row per (baseline, split ∈ {test, ood}): accuracy and USD per episode."""
        return self.orchestra_reports / "baselines.csv"

    @property
    def orchestra_baselines_markdown(self) -> Path:
        return self.orchestra_reports / "baselines.md"

    @property
    def orchestra_baselines_selection(self) -> Path:
        """Every learned router's operating point and val numbers: how the reported ones were chosen."""
        return self.orchestra_reports / "baselines_selection.csv"

    # ---- orchestrator pipeline: the curriculum (teacher → verifier filter)
    @property
    def orchestra_teacher(self) -> Trajectories:
        """The teacher's trajectories (episodes with their conversations) on the train tasks."""
        return Trajectories.under(self.orchestra_data / "teacher")

    @property
    def orchestra_probe(self) -> Trajectories:
        """The cold-start controller π(0)'s episodes on the train tasks (004 App. A.4)."""
        return Trajectories.under(self.orchestra_data / "probe")

    @property
    def orchestra_sft(self) -> Path:
        """D_SFT: verifier-passing teacher conversations, one JSON line each."""
        return self.orchestra_data / "curriculum/sft.jsonl"

    @property
    def orchestra_rl_tasks(self) -> Path:
        """D_RL: the residual hard pool (tasks no teacher trajectory solved)."""
        return self.orchestra_data / "curriculum/rl_tasks.jsonl"

    @property
    def orchestra_decisions(self) -> Path:
        """Every teacher trajectory: kept or dropped, and why."""
        return self.orchestra_data / "curriculum/decisions.csv"


    # ---- orchestrator pipeline: SFT → evaluate → register
    @property
    def orchestra_sft_run(self) -> Path:
        """The SFT run: its checkpoints (resume), `adapter/` and sft_result.json."""
        return self.orchestra_data / "sft"

    @property
    def orchestra_adapter(self) -> Path:
        """The SFT'd controller's LoRA adapter (PEFT folder, tokenizer included)."""
        return self.orchestra_sft_run / "adapter"

    @property
    def orchestra_rl_run(self) -> Path:
        """The RL run (orchestra-rl): `checkpoints/` (resume), `adapter/`, rl_run.json and rl_result.json."""
        return self.orchestra_data / "rl"

    @property
    def orchestra_rl_adapter(self) -> Path:
        """The RL'd controller's LoRA adapter (PEFT folder, tokenizer included)."""
        return self.orchestra_rl_run / "adapter"

    @property
    def orchestra_rl_result(self) -> Path:
        return self.orchestra_rl_run / "rl_result.json"

    @property
    def orchestra_rl_curves(self) -> Path:
        """The RL run's training curves per step (reward, success, KL, USD)."""
        return self.orchestra_reports / "rl_curves.png"

    @property
    def orchestra_eval(self) -> Trajectories:
        """The LM controller's episodes, before and after SFT, on the val, test and OOD tasks."""
        return Trajectories.under(self.orchestra_data / "eval")

    @property
    def orchestra_results(self) -> Path:
        """The results table (004 §6 Tab. 1 at our scale): the controller beside the baselines."""
        return self.orchestra_reports / "results.csv"

    @property
    def orchestra_results_markdown(self) -> Path:
        return self.orchestra_reports / "results.md"

    @property
    def orchestra_registry(self) -> Path:
        """The register stage's record: registered version and the promotion decision."""
        return self.orchestra_reports / "registry.json"
