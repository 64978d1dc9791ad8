"""Stage arena-orchestra (issue 39, item 3): Uno-Orchestra (004) on the arena's pool, one record per
(RL variant, seed) under data/arena/orchestrator/, which the arena report turns into rows of family
`orchestrator`, each paired with its SFT start (evaluation/arena_report.py: orchestrator_outcomes).

Per seed, in a flow root of its own (.routerops/arena-orchestra/seed<s>/, the orchestrator's Layout):
the arena's tasks (evaluation/arena_orchestra.py) → the search teacher over the pool (every candidate run
through the real executor and workers) → π(0) on the teacher's tasks → the verifier filter of eq. 3
(D_SFT: the cheapest passing trajectory per task π(0) fails; D_RL: tasks no candidate passes) → the
trajectories relabelled for blind workers → LoRA SFT → the SFT start read on the test queries (greedy).
Then per variant (GRPO, tree-GRPO, MT-GRPO, Agentic-GRPO of App. B), from that same SFT adapter, in a
root of its own: the orchestra-rl stage (eq. 5's reward with its cost term) and the greedy read of the
test queries. Every step is the orchestrator pipeline's own stage function (stages/orchestra/*), each
resumable from its journal or checkpoints; a (variant, seed) whose record was made with the same
settings (its `key`) is skipped, so a killed run resumes."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from pathlib import Path

from evaluation.arena_config import ArenaRun
from evaluation.arena_orchestra import (
    SFT_ROW, adapter_change, arena_tasks, behaviour, blind_sft_records, decisions_changed, episode_records, held_out,
    orchestra_section, pool_with_absolute_tables, row_name, train_curve, with_estimator,
)
from routerops import schema
from routerops.layout import Layout
from stages.arena import cached, settings_key

log = logging.getLogger(__name__)
SFT_START_FILE = "sft_start.json"


def orchestrator(run: ArenaRun, layout: Layout) -> Path:
    """data/arena/orchestrator/<variant>_seed<s>.json for every variant and seed of arena.orchestrator."""
    settings = run.arena.orchestrator
    folder = layout.arena_data / "orchestrator"
    folder.mkdir(parents=True, exist_ok=True)  # the stage's DVC output, empty when the family is off
    if not settings.run:
        log.info("arena-orchestra: arena.orchestrator.run is false; nothing to do")
        return folder
    from evaluation.arena_policies import arena_split, load_arena_data

    data = load_arena_data(run.arena, layout.root)
    split = arena_split(run.arena, data)
    for seed in settings.seeds:
        keys = {v: unit_key(run, v, seed) for v in settings.variants}
        todo = [v for v in settings.variants if cached(folder / f"{v}_seed{seed}.json", keys[v]) is None]
        if not todo:
            log.info("arena-orchestra: seed %d cached", seed)
            continue
        unit = prepare(run, layout, data, split, seed, work_root(layout) / f"seed{seed}")
        for variant in todo:
            record = variant_record(unit, variant, seed)
            schema.write_json_atomic({"key": keys[variant], **record}, folder / f"{variant}_seed{seed}.json")
    return folder


def work_root(layout: Layout) -> Path:
    """The units' flow roots: journals, checkpoints and adapters, not the stage's output."""
    return (layout.root / ".routerops/arena-orchestra").resolve()  # absolute: the unit's paths outlive its root


def unit_key(run: ArenaRun, variant: str, seed: int) -> str:
    """What one record depends on: the orchestrator's settings but the list of variants and seeds, the
    arena's split and table."""
    own = {k: v for k, v in dataclasses.asdict(run.arena.orchestrator).items() if k not in ("run", "reason", "seeds",
                                                                                         "variants")}
    arena = run.arena
    return settings_key("orchestrator", variant, seed, own, dataclasses.asdict(arena.split), arena.table,
                        arena.contaminated, arena.fewshot)


@dataclasses.dataclass
class Unit:
    """One seed's flow root, its run, its SFT adapter and the SFT start's held-out records."""

    run: object  # stages.orchestra.config.OrchestraRun
    flow: Layout
    tasks: list
    adapter: Path
    start: list[dict]
    curriculum: dict


def load_orchestra_run(params: Path, track):
    """The unit's params file as the orchestrator's typed run, loaded as `routerops run orchestra` loads
    params.yaml (every key checked, the LM and RL sections typed once); the arena's tracking store."""
    from stages.orchestra.config import lm_config, load_run

    run = dataclasses.replace(load_run(params), track=track)
    lm_config(run, str(params))
    return run


def prepare(run: ArenaRun, layout: Layout, data, split: dict, seed: int, work: Path) -> Unit:
    """Tasks → teacher → π(0) probe → verifier filter → blind relabel → SFT → the SFT start on test."""
    import yaml

    from routerops.envs.suites import write_tasks
    from stages.orchestra.sft import probe, sft, verifier_filter
    from stages.orchestra.teacher import teacher

    settings = run.arena.orchestrator
    flow = Layout(work)
    link_model_cache(layout, flow)
    pool_file = pool_with_absolute_tables(layout.resolve(settings.pool), layout.root.resolve(), work / "pool.yaml",
                                          tuple(settings.drop_primitives))
    section = orchestra_section(settings, pool_file.resolve(), seed)
    # The book is the top-level prices section's (issue 41: no pipeline section names a book).
    book = str(layout.resolve(settings.price_book).resolve())
    params = schema.write_text_atomic(yaml.safe_dump({"orchestra": section, "prices": {"evaluation": book}},
                                                     sort_keys=False), work / "params.yaml")
    orun = load_orchestra_run(params, run.track)
    tasks = arena_tasks(data, split, layout.resolve(settings.answers), settings.train_queries, settings.eval_queries,
                        run.arena.split.seed)
    write_tasks(tasks, flow.orchestra_tasks)
    test = [t for t in tasks if t.split == "test"]
    start_key = lambda adapter: settings_key(unit_key(run, "sft", seed),  # noqa: E731
                                             schema.file_sha256(adapter / "adapter_model.safetensors"))
    adapter = flow.orchestra_adapter
    done = cached(work / SFT_START_FILE, start_key(adapter)) if (adapter / "adapter_model.safetensors").is_file() else None
    if done is not None:  # this seed's SFT start was made (by another variant's process): read it back
        paths = {"sft": flow.orchestra_sft, "rl": flow.orchestra_rl_tasks, "decisions": flow.orchestra_decisions}
        curriculum = done.get("curriculum") or curriculum_stats(flow, paths, None, None)
        return Unit(orun, flow, test, adapter, done["records"], curriculum)
    started = time.perf_counter()
    taught = teacher(orun, flow, flow.orchestra_tasks)
    probed = probe(orun, flow, flow.orchestra_tasks) if settings.probe else None
    paths = verifier_filter(orun, flow, flow.orchestra_tasks, taught, probed)
    sft_data = blind_sft_file(orun, flow, paths["sft"], seed) if orun.anonymize_workers else paths["sft"]
    adapter = sft(orun, flow, sft_data)
    curriculum = curriculum_stats(flow, paths, probed, time.perf_counter() - started)
    key = start_key(adapter)
    done = cached(work / SFT_START_FILE, key)
    if done is None:
        records = read_test(orun, flow, adapter, "sft", test, work / "eval-sft")
        done = {"key": key, "records": records, "curriculum": curriculum}
        schema.write_json_atomic(done, work / SFT_START_FILE)
    return Unit(orun, flow, test, adapter, done["records"], curriculum)


def link_model_cache(layout: Layout, flow: Layout) -> None:
    """The unit reads the project's converted base model (made once, on first use)."""
    layout.model_cache.mkdir(parents=True, exist_ok=True)
    flow.model_cache.parent.mkdir(parents=True, exist_ok=True)
    if not flow.model_cache.exists() and not flow.model_cache.is_symlink():
        flow.model_cache.symlink_to(layout.model_cache.resolve(), target_is_directory=True)


def blind_sft_file(orun, flow: Layout, sft_path: Path, seed: int) -> Path:
    """D_SFT as a blind controller sees it (evaluation/arena_orchestra.py: blind_sft_records)."""
    from routerops.orchestra.executor import ExecutorConfig
    from routerops.pricing import load_pool, load_price_book
    from stages.orchestra.config import lm_config
    from stages.orchestra.sft import write_jsonl_atomic

    pool, book = load_pool(Path(orun.pool)), load_price_book(Path(orun.price_book))
    # The executor's config of the controller's rollouts (stages/orchestra/workers.py), so the relabelled
    # system prompt is the one the controller is rolled out under.
    config = ExecutorConfig(budget_usd=orun.budget_usd, turn_limit=orun.turn_limit,
                            controller_max_tokens=lm_config(orun).controller.max_new_tokens,
                            end_on_malformed=orun.evaluation.end_on_malformed, prompt=orun.prompt,
                            anonymize_models=True)
    records = [json.loads(line) for line in sft_path.read_text().splitlines() if line.strip()]
    return write_jsonl_atomic(blind_sft_records(records, pool, book, config, seed),
                              flow.orchestra_data / "curriculum/sft_blind.jsonl")


def curriculum_stats(flow: Layout, paths: dict, probed, seconds: float | None) -> dict:
    """Eq. 3's outcome: tasks, D_SFT and D_RL sizes, which teacher strategies were kept, π(0)'s solves."""
    import pandas as pd

    from routerops.envs.suites import read_tasks

    decisions = pd.read_csv(paths["decisions"])
    kept = decisions[decisions.kept.astype(bool)]
    out = {"teacher_tasks": int(decisions.task_id.nunique()), "d_sft_trajectories": int(len(kept)),
           "d_rl_tasks": len(read_tasks(paths["rl"])) if Path(paths["rl"]).stat().st_size else 0,
           "kept_strategies": {k: int(v) for k, v in kept.strategy.value_counts().items()},
           "teacher_pass_rate_by_strategy": {k: float(v) for k, v in
                                             decisions.groupby("strategy").success.mean().items()},
           "reasons": {k: int(v) for k, v in decisions.reason.value_counts().items()},
           "prepare_seconds": None if seconds is None else round(seconds, 1)}
    if probed is not None and probed.episodes.is_file():
        episodes = schema.read_table(probed.episodes, "episodes")
        out["probe_solved"] = int(episodes.success.sum())
    sft_result = flow.orchestra_sft_run / "sft_result.json"
    if sft_result.is_file():
        curve = [p["loss"] for p in json.loads(sft_result.read_text()).get("loss_curve", []) if "loss" in p]
        out["sft_loss_first_last"] = [curve[0], curve[-1]] if curve else []
    return out


def read_test(orun, flow: Layout, adapter: Path, version: str, tasks: list, out: Path) -> list[dict]:
    """Greedy episodes of the controller (`adapter`) on the test tasks through the real executor and
    workers (resumable from out's journal), as per-query records."""
    from routerops.pricing import load_pool
    from stages.orchestra.workers import controller_rollouts, load_controller, rollout_run_id, run_inputs

    controller = load_controller(orun, flow, adapter, version)
    inputs = run_inputs(orun, flow, flow.orchestra_tasks, *sorted(Path(adapter).glob("*")))
    batch = (controller, tasks, rollout_run_id(orun, flow, f"arena-{version}", inputs))
    episodes, turns = controller_rollouts(orun, flow, [batch], out)
    return episode_records(episodes, turns, tasks, load_pool(Path(orun.pool)))


def variant_layout(flow: Layout, folder: Path) -> Layout:
    """A root of its own for one RL run: the seed's tasks and curriculum, its model and worker caches."""
    own = Layout(folder)
    for source, target in ((flow.orchestra_tasks, own.orchestra_tasks), (flow.orchestra_sft, own.orchestra_sft),
                           (flow.orchestra_rl_tasks, own.orchestra_rl_tasks)):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    own.model_cache.parent.mkdir(parents=True, exist_ok=True)
    for mine, shared in ((own.model_cache, flow.model_cache), (own.worker_cache, flow.worker_cache)):
        if not mine.exists() and not mine.is_symlink():
            mine.symlink_to(shared.resolve())
    return own


def variant_record(unit: Unit, variant: str, seed: int) -> dict:
    """RL of one App. B estimator from the unit's SFT adapter, then the greedy read of the test queries."""
    from stages.orchestra.rl import rl

    folder = unit.flow.root / variant
    own = variant_layout(unit.flow, folder)
    vrun = with_estimator(unit.run, variant)
    started = time.perf_counter()
    adapter = rl(vrun, own, own.orchestra_rl_tasks, unit.adapter)
    trained = time.perf_counter()
    after = read_test(vrun, own, adapter, variant, unit.tasks, folder / "eval")
    result = json.loads(own.orchestra_rl_result.read_text())
    evidence = {"train": train_curve(result), "decisions_changed_by_rl": decisions_changed(unit.start, after),
                "adapter_relative_change": adapter_change(unit.adapter, adapter), "behaviour": behaviour(after),
                "sft_start_behaviour": behaviour(unit.start), "curriculum": unit.curriculum,
                "rl_seconds": round(trained - started, 1), "eval_seconds": round(time.perf_counter() - trained, 1)}
    log.info("arena-orchestra %s seed %d: accuracy %.3f (SFT start %.3f), decisions changed %.2f", variant, seed,
             sum(r["success"] for r in after) / len(after), sum(r["success"] for r in unit.start) / len(unit.start),
             evidence["decisions_changed_by_rl"])
    return {"policy": row_name(variant), "variant": variant, "seed": seed, "held_out": held_out(after),
            "sft_start": held_out(unit.start), "sft_start_policy": SFT_ROW, "evidence": evidence,
            "episodes": [{k: r[k] for k in ("task_id", "success", "final", "mode", "ended_by", "usd")} for r in after]}
