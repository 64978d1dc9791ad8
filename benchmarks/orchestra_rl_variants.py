"""SFT vs each RL variant of the LM controller (004 Tab. 3's ladder at our scale): GRPO, tree-GRPO and
Agentic-GRPO, each continued from the same SFT adapter with the same budget of rollouts (steps × G
leaves), several sampling seeds, then rolled out greedily on the held-out tasks (test and OOD) of a
finished orchestrator flow (`make orchestra`).

Per variant: reward R = V − α·ĉ, accuracy and USD per episode on the held-out tasks, pooled over seeds,
with 95 % percentile-bootstrap intervals over tasks (each task's mean over the seeds is one unit, so the
interval covers task sampling; the seed spread is reported beside it). ĉ for reporting is √c over the
95th percentile of √c of every evaluated episode (one fixed normaliser for all rows, 004 §4.1's form;
the training normaliser is the rolling one of the RL stage). α is orchestra.rl.alpha.

Protocol: RL trains on train tasks only (the stage refuses others); nothing here is tuned on the
held-out tasks; every variant uses orchestra.rl of the params file except the estimator, max_steps and
the sampling seed (orchestra.controller.seed, which seeds the rollouts' sampling; evaluation is greedy).
Writes benchmarks/results/orchestra_rl_variants.json (and .md).

    python benchmarks/orchestra_rl_variants.py [--steps 8] [--seeds 0 1 2] [--root .] [--params params.yaml]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep (see sft_throughput.py)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from models.embeddings import cpu_flags  # noqa: E402
from models.orchestrator.rl import rl_config  # noqa: E402
from routerops import schema  # noqa: E402
from routerops.envs.suites import read_tasks  # noqa: E402
from routerops.errors import InputError  # noqa: E402
from routerops.layout import Layout  # noqa: E402
from routerops.metrics import bootstrap_ci  # noqa: E402
from routerops.report import to_markdown  # noqa: E402
from stages.orchestra import (  # noqa: E402
    CONTROLLER_NAME, OrchestraRun, controller_rollouts, load_controller, load_run, rl, rollout_run_id, run_inputs,
)

log = logging.getLogger("orchestra_rl_variants")
VARIANTS = ("grpo", "tree_grpo", "agentic_grpo")
HELD_OUT = ("test", "ood")


def variant_run(run: OrchestraRun, layout: Layout, estimator: str, seed: int, steps: int) -> OrchestraRun:
    """The flow's run with one estimator, `steps` RL steps and sampling seed `seed`; paths absolute so a
    variant's own root can hold its RL folder."""
    rl_section = {**run.rl, "estimator": estimator, "max_steps": steps, "save_steps": steps}
    controller = {**run.controller, "seed": seed}
    return dataclasses.replace(run, rl=rl_section, controller=controller, pool=str(layout.resolve(run.pool)),
                               price_book=str(layout.resolve(run.price_book)))


def variant_layout(flow: Layout, folder: Path) -> Layout:
    """A root of its own for one RL run, reading the flow's tasks, curriculum and model cache."""
    own = Layout(folder)
    for source, target in ((flow.orchestra_tasks, own.orchestra_tasks), (flow.orchestra_sft, own.orchestra_sft),
                           (flow.orchestra_rl_tasks, own.orchestra_rl_tasks)):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    own.model_cache.parent.mkdir(parents=True, exist_ok=True)
    if not own.model_cache.exists():
        own.model_cache.symlink_to(flow.model_cache.resolve(), target_is_directory=True)
    return own


def train_variants(run: OrchestraRun, flow: Layout, out: Path, steps: int, seeds: list[int]) -> dict[str, dict]:
    """Each (estimator, seed)'s RL run from the flow's SFT adapter; resumable (the stage resumes)."""
    trained = {}
    for seed in seeds:  # seed-major: a first seed of every variant before the next seed
        for estimator in VARIANTS:
            name = f"{estimator}-s{seed}"
            layout = variant_layout(flow, out / name)
            started = time.perf_counter()
            adapter = rl(variant_run(run, flow, estimator, seed, steps), layout, layout.orchestra_rl_tasks,
                         flow.orchestra_adapter)
            result = json.loads(layout.orchestra_rl_result.read_text())
            trained[name] = {"estimator": estimator, "seed": seed, "adapter": adapter,
                             "seconds": round(time.perf_counter() - started, 1),
                             "rollouts": sum(s["leaves"] for s in result["steps"]),
                             "train_verifier_mean": float(np.mean([s["reward/verifier_mean"] for s in result["steps"]]))}
            log.info("%s: %d rollouts in %.0f s", name, trained[name]["rollouts"], trained[name]["seconds"])
    return trained


def evaluate_held_out(run: OrchestraRun, flow: Layout, out: Path, adapters: dict[str, Path]) -> pd.DataFrame:
    """Greedy episodes of each adapter on the held-out tasks, through the real executor and workers."""
    tasks = [t for t in read_tasks(flow.orchestra_tasks) if t.split in HELD_OUT]
    run = dataclasses.replace(run, pool=str(flow.resolve(run.pool)), price_book=str(flow.resolve(run.price_book)))
    batches = []
    for version, adapter in adapters.items():
        controller = load_controller(run, flow, adapter, version)
        inputs = run_inputs(run, flow, flow.orchestra_tasks, *sorted(adapter.glob("*")))
        batches.append((controller, tasks, rollout_run_id(run, flow, f"variants-{version}", inputs)))
    episodes, _ = controller_rollouts(run, flow, batches, out / "eval")
    return episodes[episodes.policy == CONTROLLER_NAME]


def variant_table(episodes: pd.DataFrame, alpha: float, n_boot: int = 2000) -> pd.DataFrame:
    """One row per variant (versions `<estimator>-s<seed>` pooled over seeds, `sft` alone)."""
    root_cost = np.sqrt(episodes.cost_usd.clip(lower=0))
    scale = float(np.percentile(root_cost, 95)) or 1.0
    frame = episodes.assign(variant=episodes.policy_version.str.replace(r"-s\d+$", "", regex=True),
                            reward=episodes.score - alpha * np.minimum(root_cost / scale, 1.0))
    rows = []
    for variant, group in frame.groupby("variant", sort=False):
        per_task = group.groupby("task_id")[["reward", "score", "cost_usd"]].mean()
        per_seed = group.groupby("policy_version")[["reward", "score"]].mean()
        row = {"variant": variant, "seeds": group.policy_version.nunique(), "tasks": len(per_task),
               "episodes": len(group)}
        for column, label in (("reward", "reward"), ("score", "accuracy"), ("cost_usd", "usd_per_episode")):
            mean, low, high = bootstrap_ci(per_task[column].to_numpy(), n_boot=n_boot)
            row.update({label: mean, f"{label}_low": low, f"{label}_high": high})
        row["accuracy_seed_std"] = float(per_seed.score.std(ddof=0)) if len(per_seed) > 1 else 0.0
        row["reward_seed_std"] = float(per_seed.reward.std(ddof=0)) if len(per_seed) > 1 else 0.0
        rows.append(row)
    order = {v: i for i, v in enumerate(("sft", *VARIANTS))}
    return pd.DataFrame(rows).sort_values("variant", key=lambda s: s.map(order)).reset_index(drop=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=".", help="the flow's root (data/orchestra from `make orchestra`)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--steps", type=int, default=8, help="RL steps per run (G leaves at most each)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--work", default=".routerops/rl_variants", help="RL runs and episodes (resumable)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/orchestra_rl_variants.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    flow = Layout(Path(args.root).resolve())
    if not (flow.orchestra_adapter / "adapter_model.safetensors").is_file():
        raise InputError(flow.orchestra_adapter, "adapter", "no SFT adapter: run `make orchestra` first")
    run = load_run(flow.resolve(args.params))
    cfg = rl_config(run.rl, args.params)
    work = flow.resolve(args.work)
    load_before, started = os.getloadavg(), time.perf_counter()
    trained = train_variants(run, flow, work, args.steps, args.seeds)
    episodes = evaluate_held_out(run, flow, work, {"sft": flow.orchestra_adapter,
                                                    **{k: v["adapter"] for k, v in trained.items()}})
    table = variant_table(episodes, cfg.advantages.alpha)
    result = {
        "benchmark": "orchestra_rl_variants", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/orchestra_rl_variants.py " + " ".join(sys.argv[1:]),
        "protocol": "RL on train tasks from the flow's SFT adapter; greedy evaluation on the held-out test and "
                    "OOD tasks; 95% percentile bootstrap over tasks (per-task means over seeds); nothing tuned "
                    "on held-out tasks",
        "settings": {"steps": args.steps, "seeds": args.seeds, "group_size": cfg.group_size, "alpha": cfg.advantages.alpha,
                     "rl": run.rl, "held_out": list(HELD_OUT)},
        "runs": {k: {**v, "adapter": str(v["adapter"])} for k, v in trained.items()},
        "table": table.to_dict(orient="records"),
        "seconds": round(time.perf_counter() - started, 1), "cpu": cpu_flags(),
        "load_average_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
    }
    out = Path(args.out)
    schema.write_json_atomic(result, out)
    shown = table[["variant", "seeds", "tasks", "reward", "reward_low", "reward_high", "accuracy", "accuracy_low",
                   "accuracy_high", "accuracy_seed_std", "usd_per_episode"]]
    schema.write_text_atomic(to_markdown(shown.round(6)) + "\n", out.with_suffix(".md"))
    print(to_markdown(shown.round(4)))


if __name__ == "__main__":
    main()
