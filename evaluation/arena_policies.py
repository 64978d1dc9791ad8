"""The arena's non-LM policies on one split of a logged-outcome table (issue 39, item 3): the trivial
policies (always each worker, random mixes, the oracle), the registry's routers and the cascade. Each
router is fitted on the train queries only; its knob (λ of q̂ − λ·c, or the cascade's threshold) is
chosen on the val queries; the test queries are read once, with the chosen knob and along the sweep
(the curve the plot draws and the matched comparisons read).

Each (method, seed) is one file, data/arena/policies/<method>_seed<s>.npz, with the settings' key in it:
a rerun skips the done ones."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from evaluation.arena import Curve, Outcome, settings_key
from evaluation.arena_config import ArenaConfig
from evaluation.replay import knob_grid, operating_points, strong_weak
from models.base import RoutingData
from models.registry import make_router
from routerops import schema
from routerops.splits import check_split, fixed_split

log = logging.getLogger(__name__)
DETERMINISTIC = {"knn", "knn_smollm2", "oracle"}  # one seed is all seeds


def load_arena_data(cfg: ArenaConfig, root: Path) -> RoutingData:
    """The RouteLLM GSM8K table as the critique pipelines load it (the same query order, so the same
    split rows), priced under cfg.price_book."""
    from evaluation.critique import load_table

    return load_table(cfg, Path(root))


def arena_split(cfg: ArenaConfig, data: RoutingData, source: str = "arena.split") -> dict[str, np.ndarray]:
    split = fixed_split(len(data), cfg.split.seed, cfg.split.fractions)
    check_split(split, len(data), cfg.split.min_test_queries, source)
    return split


# ---- one outcome per (method, seed) ---------------------------------------------------------------

def outcome_from_choice(policy: str, family: str, seed: int, data: RoutingData, rows: np.ndarray,
                        choice: np.ndarray, paid: np.ndarray, strong: int, curve: Curve | None = None,
                        meta: dict | None = None) -> Outcome:
    return Outcome(policy, family, seed, np.asarray(rows), data.scores[rows, choice].astype(float),
                   np.asarray(paid, dtype=float), (choice == strong).astype(float),
                   [data.workers[j] for j in choice], curve, meta or {})


def trivial_outcomes(cfg: ArenaConfig, data: RoutingData, test: np.ndarray, strong: int, seed: int) -> list[Outcome]:
    """Always each worker and the oracle (first seed only: nothing random), and the random mixes."""
    costs = data.costs[test]
    out = []
    if seed == cfg.seeds[0]:
        for j, worker in enumerate(data.workers):
            choice = np.full(len(test), j)
            out.append(outcome_from_choice(f"always {worker}", "trivial", seed, data, test, choice,
                                           costs[:, j], strong))
        oracle = make_router("oracle", seed)
        choice, paid = oracle.decide(oracle.predict_quality(data.subset(test)), costs, 0.0)
        out.append(outcome_from_choice("oracle (cheapest correct)", "oracle", seed, data, test, choice, paid, strong))
    weak = 1 - strong
    for share in cfg.random_mixes:
        pick = np.random.default_rng([seed, int(round(share * 1000))]).random(len(test)) < share
        choice = np.where(pick, strong, weak)
        out.append(outcome_from_choice(f"random {share:g} GPT-4", "trivial", seed, data, test, choice,
                                       costs[np.arange(len(test)), choice], strong))
    return out


def chosen_knob(router, quality_val: np.ndarray, val: RoutingData, strong: int, fraction: float,
                points: int) -> tuple[float, dict]:
    """The cheapest knob whose val accuracy reaches `fraction` of the strong worker's val accuracy (the
    most accurate knob when none does); the val sweep's numbers at it."""
    ops = operating_points(router, quality_val, val, knob_grid(router, quality_val, val.costs, points))
    acc, usd = ops.correct.mean(axis=1), ops.paid.mean(axis=1)
    target = fraction * float(np.nanmean(val.scores[:, strong]))
    ok = np.flatnonzero(acc >= target)
    k = int(ok[np.argmin(usd[ok])]) if ok.size else int(np.lexsort((usd, -acc))[0])
    return float(ops.knobs[k]), {"val_accuracy": float(acc[k]), "val_usd_per_query": float(usd[k]),
                                 "val_target_accuracy": target, "val_reached_target": bool(ok.size)}


def router_outcome(name: str, cfg: ArenaConfig, data: RoutingData, split: dict, strong: int, seed: int) -> Outcome:
    """Fit on train, choose the knob on val, read the test queries at it and along the sweep."""
    start = time.perf_counter()
    train, val, test = (data.subset(split[p]) for p in ("train", "val", "test"))
    router = make_router(name, seed).fit(train)
    q_val, q_test = router.predict_quality(val), router.predict_quality(test)
    knob, at_val = chosen_knob(router, q_val, val, strong, cfg.strong_fraction, cfg.knob_points)
    grid = np.union1d(knob_grid(router, q_test, test.costs, cfg.knob_points), [knob])
    ops = operating_points(router, q_test, test, grid)
    strong_calls = (ops.choice == strong).astype(float)  # two workers: the strong one is called iff it answers
    curve = Curve(ops.knobs, ops.correct.astype(float), ops.paid, strong_calls)
    k = int(np.flatnonzero(ops.knobs == knob)[0])
    family = "cascade" if name == "cascade" else "router"
    meta = {"knob_name": router.knob_name, "knob_chosen_on_val": knob, **at_val,
            "fit_seconds": time.perf_counter() - start}
    return outcome_from_choice(name, family, seed, data, split["test"], ops.choice[k], ops.paid[k], strong, curve, meta)


# ---- the cache ---------------------------------------------------------------------------------------

def save_outcome(outcome: Outcome, key: str, path: Path) -> Path:
    """One outcome as .npz (atomic: a killed run leaves no half file behind)."""
    meta = {"policy": outcome.policy, "family": outcome.family, "seed": outcome.seed, "key": key,
            "actions": outcome.actions, "meta": outcome.meta}
    arrays = {"rows": outcome.rows, "correct": outcome.correct, "usd": outcome.usd, "strong": outcome.strong,
              "meta": np.array(json.dumps(meta))}
    if outcome.curve is not None:
        c = outcome.curve
        arrays |= {"curve_knobs": c.knobs, "curve_correct": c.correct, "curve_usd": c.usd, "curve_strong": c.strong}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    os.close(fd)
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, path)
    return path


def load_outcome(path: Path) -> tuple[Outcome, str]:
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        curve = Curve(z["curve_knobs"], z["curve_correct"], z["curve_usd"], z["curve_strong"]) \
            if "curve_knobs" in z else None
        outcome = Outcome(meta["policy"], meta["family"], meta["seed"], z["rows"], z["correct"], z["usd"],
                          z["strong"], meta["actions"], curve, meta["meta"])
    return outcome, meta["key"]


def file_name(policy: str, seed: int) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in policy)
    return f"{safe}_seed{seed}.npz"


def run_policies(cfg: ArenaConfig, root: Path, folder: Path, data: RoutingData | None = None) -> list[Path]:
    """Every trivial policy, router and the cascade on every seed, skipping the cached ones."""
    data = load_arena_data(cfg, root) if data is None else data
    split = arena_split(cfg, data)
    strong, _ = strong_weak(data.subset(split["train"]))  # the stronger worker on train: GPT-4 here
    base = (cfg.split.seed, list(cfg.split.fractions), cfg.table, cfg.price_book, len(data))
    paths = []  # every current output, cached or made now (the index the report reads)
    for seed in cfg.seeds:
        key = settings_key("trivial", base, list(cfg.random_mixes), seed, cfg.seeds[0])
        marker = folder / f"trivial_seed{seed}.done"
        if marker.is_file() and marker.read_text() == key:
            log.info("arena: trivial policies of seed %d cached", seed)
            paths += [folder / name for name in json.loads(marker.with_suffix(".json").read_text())]
        else:
            made = [save_outcome(outcome, key, folder / file_name(outcome.policy, seed))
                    for outcome in trivial_outcomes(cfg, data, split["test"], strong, seed)]
            marker.with_suffix(".json").write_text(json.dumps([p.name for p in made]))
            marker.write_text(key)
            paths += made
        for name in (*cfg.routers, "cascade"):
            if name in DETERMINISTIC and seed != cfg.seeds[0]:
                continue
            path = folder / file_name(name, seed)
            key = settings_key(name, base, seed, cfg.strong_fraction, cfg.knob_points)
            if path.is_file() and load_outcome(path)[1] == key:
                log.info("arena: %s seed %d cached", name, seed)
            else:
                log.info("arena: fitting %s (seed %d)", name, seed)
                save_outcome(router_outcome(name, cfg, data, split, strong, seed), key, path)
            paths.append(path)
    index = {"split": {p: [int(r) for r in split[p]] for p in ("train", "val", "test")},
             "workers": list(data.workers), "strong": data.workers[strong], "outputs": [p.name for p in paths]}
    schema.write_json_atomic(index, folder / "index.json")
    return paths


def load_outcomes(folder: Path) -> tuple[list[Outcome], dict]:
    """The outputs the last run_policies made or kept (its index.json), and that index."""
    index = json.loads((Path(folder) / "index.json").read_text())
    return [load_outcome(Path(folder) / name)[0] for name in index["outputs"]], index
