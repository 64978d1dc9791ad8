"""SFT vs each RL variant of the LM controller (004 Tab. 3's ladder at our scale): GRPO, tree-GRPO,
MT-GRPO and Agentic-GRPO, each continued from the same SFT adapter with the same rollout budget (steps ×
G leaves), several sampling seeds, then rolled out greedily on the held-out tasks (test and OOD) of a
flow's root (`make orchestra`, or the stages up to orchestra-sft).

One run = one (variant, seed): its RL (the orchestra-rl stage, resumable from its checkpoints) and its
greedy held-out evaluation, written to <work>/<variant>-s<seed>/run.json when both are done, so the
table can be completed run by run (`--runs agentic_grpo-s0 grpo-s1`, or all of them by default; a run
whose run.json exists is not redone). `--report` only aggregates what is there. Each finished run is
also archived, gzipped, under experiments/results/orchestra_rl_variants_runs/ (`--archive`), so the
table can be completed over several sessions: a run found there is not redone either. Every run records
the SHA-256 of the SFT adapter it started from, and the table refuses to pool runs that started from
different ones (a rebuilt root trains a new SFT adapter; its runs start a new table).

Per run: train reward and success per step (the RL stage's records), the adapter's relative change
‖θ_RL − θ_SFT‖ / ‖θ_SFT‖, and the share of held-out tasks whose greedy controller turns differ from
SFT's (the policy moved, or not). Per variant (pooled over its seeds): reward R = V − α·ĉ, accuracy
and USD per episode on the held-out tasks, each beside SFT with a paired 95 % bootstrap interval of
the difference over tasks (per-task means over seeds; the interval covers task sampling, the seed
spread is reported beside it). ĉ for reporting is √c over the 95th percentile of √c of every
evaluated episode (one fixed normaliser for every row, 004 §4.1's form). α is orchestra.rl.alpha.

Protocol: RL on train tasks only (the stage refuses others; the signal probe reads train tasks only);
nothing here is tuned on the held-out tasks; every variant uses orchestra.rl of the params file
except the estimator, max_steps and the sampling seed (orchestra.controller.seed; evaluation is greedy).
Writes experiments/results/orchestra_rl_variants.{json,md} and a PNG of the training curves.

    python experiments/orchestra_rl_variants.py --root ROOT [--steps 30] [--seeds 0 1 2] [--runs NAME ...] [--report]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gzip
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
from routerops import schema  # noqa: E402
from routerops.envs.suites import read_tasks  # noqa: E402
from routerops.errors import InputError  # noqa: E402
from evaluation.orchestra_results import plot_rl_curves  # noqa: E402
from routerops.layout import Layout  # noqa: E402
from routerops.metrics import paired_bootstrap_diff  # noqa: E402
from routerops.report import to_markdown  # noqa: E402
from stages.orchestra import (  # noqa: E402
    CONTROLLER_NAME, OrchestraRun, controller_rollouts, load_controller, load_run, rollout_run_id, run_inputs,
)
from stages.orchestra.rl import rl  # noqa: E402

log = logging.getLogger("orchestra_rl_variants")
VARIANTS = ("grpo", "tree_grpo", "mt_grpo", "agentic_grpo")
HELD_OUT = ("test", "ood")
RUN_FILE = "run.json"
ARCHIVE = REPO / "experiments/results/orchestra_rl_variants_runs"


# The benchmark's scale (item 3 of issue 23): held-out sets large enough that an RL effect the size of
# the paper's Tab. 3 steps (a few points) is not lost in the interval: 5 families × 60 test tasks and
# 100 OOD tasks; 12 train tasks per family for the teacher, SFT and the RL pool. `products` (2-3 digit
# factors) is the family where a lazy answer of the 135M controller fails (1 of 10, suites.py) and a
# tool route succeeds (10 of 10): there is something for RL to learn.
BENCH_TASKS = {"families": ["basic_arithmetic", "chain_sum", "gcd", "lcm", "products"],
               "ood_families": ["decimal_chain_sum"], "train": 12, "val": 2, "test": 60, "ood": 100, "seed": 7}
PREPARE_STAGES = ("orchestra-tasks", "orchestra-teacher", "orchestra-probe", "orchestra-filter", "orchestra-sft")


def prepare_root(root: Path, params: Path) -> None:
    """The benchmark's own flow root: params.yaml with BENCH_TASKS, the configs it names, then the flow's
    stages up to SFT (each resumable; a finished stage's outputs are kept)."""
    import yaml

    from stages import run_stage

    root.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(params.read_text())
    raw["orchestra"]["tasks"] = {**raw["orchestra"]["tasks"], **BENCH_TASKS}
    schema.write_text_atomic(yaml.safe_dump(raw, sort_keys=False), root / "params.yaml")
    if not (root / "configs").exists():
        shutil.copytree(REPO / "configs", root / "configs")
    for name in PREPARE_STAGES:
        started = time.perf_counter()
        run_stage(name, "params.yaml", root)
        log.info("prepared %s in %.0f s", name, time.perf_counter() - started)


def variant_run(run: OrchestraRun, layout: Layout, estimator: str, seed: int, steps: int,
                eval_batch: int) -> OrchestraRun:
    """The flow's run with one estimator, `steps` RL steps and sampling seed `seed`; paths absolute so a
    variant's own root can hold its RL folder. Checkpoints every 5 steps: a killed run loses ≤ 5."""
    rl_section = dataclasses.replace(run.rl, advantages=dataclasses.replace(run.rl.advantages, estimator=estimator),
                                     settings=dataclasses.replace(run.rl.settings, max_steps=steps, save_steps=min(5, steps)))
    controller = dataclasses.replace(run.controller, seed=seed, batch_size=max(eval_batch, run.controller.batch_size))
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
    # One worker-results cache for every run (SQLite in WAL mode: safe to share): the deterministic
    # workers' answers to the same payloads are computed once across variants and seeds.
    if not own.worker_cache.exists() and not own.worker_cache.is_symlink():
        flow.worker_cache.parent.mkdir(parents=True, exist_ok=True)
        own.worker_cache.symlink_to(flow.worker_cache.resolve())
    return own


def held_out_episodes(run: OrchestraRun, layout: Layout, adapter: Path, version: str, out: Path) -> list[dict]:
    """Greedy episodes of `adapter` on the flow's held-out tasks through the real executor and workers
    (resumable from out's journal): one record per task with its score, cost and controller turns."""
    tasks = [t for t in read_tasks(layout.orchestra_tasks) if t.split in HELD_OUT]
    controller = load_controller(run, layout, adapter, version)
    inputs = run_inputs(run, layout, layout.orchestra_tasks, *sorted(adapter.glob("*")))
    batch = (controller, tasks, rollout_run_id(run, layout, f"variants-{version}", inputs))
    episodes, _ = controller_rollouts(run, layout, [batch], out)
    records = []
    for row in episodes[episodes.policy == CONTROLLER_NAME].itertuples():
        messages = json.loads(row.conversation) if isinstance(row.conversation, str) else list(row.conversation)
        records.append({"task_id": row.task_id, "split": row.split, "score": float(row.score),
                        "success": bool(row.success), "cost_usd": float(row.cost_usd),
                        "decisions": [m["content"] for m in messages if m["role"] == "assistant"]})
    return records


def adapter_change(sft: Path, rl_adapter: Path) -> float:
    """‖θ_RL − θ_SFT‖ / ‖θ_SFT‖ over every LoRA tensor of the two adapters."""
    from safetensors.torch import load_file

    start, end = load_file(sft / "adapter_model.safetensors"), load_file(rl_adapter / "adapter_model.safetensors")
    diff = sum(float((end[k].float() - start[k].float()).pow(2).sum()) for k in start)
    norm = sum(float(start[k].float().pow(2).sum()) for k in start)
    return (diff / norm) ** 0.5 if norm else float("nan")


def sft_fingerprint(flow: Layout) -> str:
    """The SFT adapter every run of one table starts from (its weights' SHA-256)."""
    return schema.file_sha256(flow.orchestra_adapter / "adapter_model.safetensors")


def archived_path(archive: Path, name: str) -> Path:
    return archive / f"{name}.json.gz"


def archive_run(record: dict, archive: Path) -> Path:
    """A finished run, gzipped beside the results (written atomically: a killed copy leaves no file)."""
    archive.mkdir(parents=True, exist_ok=True)
    target = archived_path(archive, record["name"])
    partial = target.with_suffix(".partial")
    with gzip.open(partial, "wt", encoding="utf-8") as handle:
        json.dump(record, handle, sort_keys=True)
    partial.replace(target)
    return target


def finished_run(work: Path, archive: Path, name: str, fingerprint: str) -> dict | None:
    """A run already done for this SFT adapter: from the work folder, else from the archive. A run that
    started from another SFT adapter is not this table's, and is redone (its archive is overwritten)."""
    local, stored = work / name / RUN_FILE, archived_path(archive, name)
    if local.is_file():
        record = json.loads(local.read_text())
    elif stored.is_file():
        with gzip.open(stored, "rt", encoding="utf-8") as handle:
            record = json.load(handle)
    else:
        return None
    return record if record.get("sft_sha256") == fingerprint else None


def same_sft(records: list[dict]) -> list[dict]:
    """The records of one table; refuses a mix of SFT adapters, naming the runs of each."""
    by_sft: dict[str, list[str]] = {}
    for record in records:
        by_sft.setdefault(str(record.get("sft_sha256")), []).append(record["name"])
    if len(by_sft) > 1:
        listing = "; ".join(f"{sha[:12]}: {', '.join(names)}" for sha, names in by_sft.items())
        raise InputError("runs", "sft_sha256", f"runs from different SFT adapters cannot be pooled ({listing}); "
                         "rerun them from one root or point --archive elsewhere")
    return records


def run_one(run: OrchestraRun, flow: Layout, work: Path, archive: Path, estimator: str, seed: int, steps: int,
            eval_batch: int) -> dict:
    """One (variant, seed): its RL run, its held-out evaluation, written to <work>/<name>/run.json and
    archived."""
    name = f"{estimator}-s{seed}"
    folder = work / name
    fingerprint = sft_fingerprint(flow)
    done = finished_run(work, archive, name, fingerprint)
    if done is not None:
        return done
    layout = variant_layout(flow, folder)
    share_probe(work, layout)
    own = variant_run(run, flow, estimator, seed, steps, eval_batch)
    started = time.perf_counter()
    adapter = rl(own, layout, layout.orchestra_rl_tasks, flow.orchestra_adapter)
    result = json.loads(layout.orchestra_rl_result.read_text())
    trained = time.perf_counter()
    episodes = held_out_episodes(own, layout, adapter, name, folder / "eval")
    record = {"name": name, "estimator": estimator, "seed": seed, "sft_sha256": fingerprint, "steps": result["steps"],
              "pool_tasks": result.get("pool_tasks"), "probe_success_rate": result.get("probe_success_rate"),
              "rollouts": sum(s["leaves"] for s in result["steps"]),
              "adapter_change": adapter_change(flow.orchestra_adapter, adapter),
              "train_seconds": round(trained - started, 1), "eval_seconds": round(time.perf_counter() - trained, 1),
              "episodes": episodes}
    schema.write_json_atomic(record, folder / RUN_FILE)
    archive_run(record, archive)
    log.info("%s: %d rollouts, adapter change %.4f, %.0f s RL + %.0f s evaluation", name, record["rollouts"],
             record["adapter_change"], record["train_seconds"], record["eval_seconds"])
    return record


def share_probe(work: Path, layout: Layout) -> None:
    """The signal probe describes the SFT policy, not a run: a finished run's rl_pool.json is given to
    the next one (the stage reads it back only if its candidates, samples, temperature and SFT adapter
    fingerprint match, else probes again)."""
    from stages.orchestra import RL_POOL_FILE

    target = layout.orchestra_rl_run / RL_POOL_FILE
    found = sorted(work.glob(f"*/data/orchestra/rl/{RL_POOL_FILE}"))
    if found and not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found[0], target)


def run_sft(run: OrchestraRun, flow: Layout, work: Path, archive: Path, eval_batch: int) -> dict:
    folder = work / "sft"
    fingerprint = sft_fingerprint(flow)
    done = finished_run(work, archive, "sft", fingerprint)
    if done is not None:
        return done
    own = variant_run(run, flow, run.rl.advantages.estimator, 0, 1, eval_batch)
    started = time.perf_counter()
    record = {"name": "sft", "estimator": "sft", "seed": None, "sft_sha256": fingerprint, "steps": [],
              "adapter_change": 0.0,
              "episodes": held_out_episodes(own, flow, flow.orchestra_adapter, "sft", folder / "eval")}
    record["eval_seconds"] = round(time.perf_counter() - started, 1)
    schema.write_json_atomic(record, folder / RUN_FILE)
    archive_run(record, archive)
    return record


def episode_frame(records: list[dict], alpha: float) -> pd.DataFrame:
    """Every evaluated episode with its reward V − α·ĉ under one normaliser for all runs."""
    frame = pd.DataFrame([{**e, "run": r["name"], "variant": r["estimator"]} for r in records for e in r["episodes"]])
    root_cost = np.sqrt(frame.cost_usd.clip(lower=0))
    scale = float(np.percentile(root_cost, 95)) or 1.0
    return frame.assign(reward=frame.score - alpha * np.minimum(root_cost / scale, 1.0))


def decisions_changed(frame: pd.DataFrame, run_name: str) -> float:
    """Share of held-out tasks whose greedy controller turns differ from SFT's."""
    sft = frame[frame.run == "sft"].set_index("task_id").decisions
    mine = frame[frame.run == run_name].set_index("task_id").decisions
    shared = sft.index.intersection(mine.index)
    return float(np.mean([sft[t] != mine[t] for t in shared])) if len(shared) else float("nan")


def variant_table(records: list[dict], alpha: float, n_boot: int = 2000) -> pd.DataFrame:
    """One row per variant: held-out means pooled over its seeds, each beside SFT with a paired interval
    of the difference over tasks; the policy's movement (adapter change, decisions changed) per seed."""
    frame = episode_frame(records, alpha)
    sft = frame[frame.run == "sft"].set_index("task_id")
    rows = []
    for variant in ("sft", *VARIANTS):
        group = frame[frame.variant == variant]
        if group.empty:
            continue
        per_task = group.groupby("task_id")[["reward", "score", "cost_usd"]].mean().loc[sft.index]
        runs = [r for r in records if r["estimator"] == variant]
        row = {"variant": variant, "seeds": len(runs), "tasks": len(per_task)}
        for column, label in (("reward", "reward"), ("score", "accuracy"), ("cost_usd", "usd_per_episode")):
            row[label] = float(per_task[column].mean())
            if variant != "sft":
                diff, low, high = paired_bootstrap_diff(per_task[column], sft[column], n_boot=n_boot)
                row.update({f"{label}_vs_sft": diff, f"{label}_vs_sft_low": low, f"{label}_vs_sft_high": high})
        per_seed = group.groupby("run")[["reward", "score"]].mean()
        row["reward_seed_std"] = float(per_seed.reward.std(ddof=0)) if len(per_seed) > 1 else 0.0
        if variant != "sft":
            row["adapter_change"] = float(np.mean([r["adapter_change"] for r in runs]))
            row["decisions_changed"] = float(np.mean([decisions_changed(frame, r["name"]) for r in runs]))
            first = [np.mean([s["reward/return_mean"] for s in r["steps"][:5]]) for r in runs]
            last = [np.mean([s["reward/return_mean"] for s in r["steps"][-5:]]) for r in runs]
            row["train_return_first5"], row["train_return_last5"] = float(np.mean(first)), float(np.mean(last))
        rows.append(row)
    return pd.DataFrame(rows)


def plot_curves(records: list[dict], path: Path) -> Path:
    """Train return, success, KL and USD per step, one line per variant (mean over its seeds)."""
    curves = {v: [r["steps"] for r in records if r["estimator"] == v] for v in VARIANTS}
    return plot_rl_curves({v: runs for v, runs in curves.items() if runs}, path,
                          "RL variants from one SFT adapter: training curves")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=".", help="the flow's root (its data/orchestra holds tasks and the SFT adapter)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--steps", type=int, default=30, help="RL steps per run (G leaves at most each)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--runs", nargs="*", help="only these runs, e.g. agentic_grpo-s0 (default: every one)")
    parser.add_argument("--report", action="store_true", help="aggregate the finished runs only")
    parser.add_argument("--prepare", action="store_true",
                        help="first build --root at the benchmark's scale (BENCH_TASKS) up to SFT")
    parser.add_argument("--eval-batch", type=int, default=16, help="conversations per decode batch at evaluation")
    parser.add_argument("--work", default=".routerops/rl_variants", help="runs and episodes (resumable)")
    parser.add_argument("--archive", default=str(ARCHIVE), help="finished runs, gzipped (kept across roots)")
    parser.add_argument("--out", default=str(REPO / "experiments/results/orchestra_rl_variants.json"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    flow = Layout(Path(args.root).resolve())
    if args.prepare:
        prepare_root(flow.root, REPO / args.params)
    if not (flow.orchestra_adapter / "adapter_model.safetensors").is_file():
        raise InputError(flow.orchestra_adapter, "adapter", "no SFT adapter: run `make orchestra` first")
    run = load_run(flow.resolve(args.params))
    cfg = run.rl
    work, archive = flow.resolve(args.work), Path(args.archive)
    fingerprint = sft_fingerprint(flow)
    load_before, started = os.getloadavg(), time.perf_counter()
    plan = [(v, seed) for seed in args.seeds for v in args.variants]  # seed-major: every variant once first
    if not args.report:
        run_sft(run, flow, work, archive, args.eval_batch)
        for estimator, seed in plan:
            if args.runs and f"{estimator}-s{seed}" not in args.runs:
                continue
            run_one(run, flow, work, archive, estimator, seed, args.steps, args.eval_batch)
    names = ["sft", *(f"{v}-s{seed}" for v, seed in plan)]
    found = {name: finished_run(work, archive, name, fingerprint) for name in names}
    records = same_sft([record for record in found.values() if record is not None])
    table = variant_table(records, cfg.advantages.alpha)
    out = Path(args.out)
    plot = plot_curves(records, out.with_suffix(".png"))
    result = {
        "benchmark": "orchestra_rl_variants", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python experiments/orchestra_rl_variants.py " + " ".join(sys.argv[1:]),
        "protocol": "RL on train tasks only (signal pool probed on train tasks) from the flow's SFT adapter; greedy "
                    "evaluation on the held-out test and OOD tasks; paired 95% percentile bootstrap over tasks of "
                    "(variant − SFT), per-task means over seeds; nothing tuned on held-out tasks",
        "settings": {"steps": args.steps, "seeds": args.seeds, "group_size": cfg.group_size,
                     "alpha": cfg.advantages.alpha, "rl": {**dataclasses.asdict(cfg.settings), **dataclasses.asdict(cfg.advantages)}, "held_out": list(HELD_OUT)},
        "runs": {r["name"]: {k: v for k, v in r.items() if k != "episodes"} for r in records},
        "sft_sha256": fingerprint,
        "missing_runs": [name for name, record in found.items() if record is None],
        "table": table.to_dict(orient="records"), "plot": str(plot.relative_to(REPO)) if plot.is_relative_to(REPO) else str(plot),
        "seconds": round(time.perf_counter() - started, 1), "cpu": cpu_flags(),
        "load_average_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
    }
    schema.write_json_atomic(result, out)
    columns = [c for c in ("variant", "seeds", "tasks", "reward", "reward_vs_sft", "reward_vs_sft_low",
                           "reward_vs_sft_high", "accuracy", "accuracy_vs_sft_low", "accuracy_vs_sft_high",
                           "usd_per_episode", "adapter_change", "decisions_changed", "train_return_first5",
                           "train_return_last5") if c in table]
    schema.write_text_atomic(to_markdown(table[columns].round(4)) + "\n", out.with_suffix(".md"))
    print(to_markdown(table[columns].round(4)))


if __name__ == "__main__":
    main()
