"""The critique stage: the critique-and-route controller (paper 002) and CoRL's budget modes (paper 003)
trained and evaluated on RouteLLM's GSM8K logged outcomes (bundled under datasets/), cross-fitted,
beside the single-turn replay routers on the same folds. No live call."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from evaluation.critique import run_critique_benchmark
from models.critique.config import CritiqueConfig
from routerops import schema
from routerops.layout import Layout
from stages.manifest import write_manifest

if TYPE_CHECKING:
    from models.critique.lm_config import CritiqueLMConfig


def critique(cfg: CritiqueConfig, layout: Layout) -> dict[str, Path]:
    result = run_critique_benchmark(cfg, layout.root)
    out = layout.critique_dir
    paths = {"results": schema.write_json_atomic(result, out / "results.json")}
    metrics = {f"{name}/{key}": value for name, row in result["summary"].items() if name != "corl"
               for key, value in row.items()}
    metrics |= {f"corl/{mode}/{key}": value for mode, row in result["summary"]["corl"].items() for key, value in row.items()}
    paths["metrics"] = schema.write_json_atomic(metrics, out / "metrics.json")
    sources = [layout.resolve(p) for p in (cfg.table, cfg.contaminated, cfg.fewshot, cfg.price_book)]
    write_manifest(layout.manifests, "critique", cfg, sources, list(paths.values()), metrics)
    return paths


def critique_lm(cfg: CritiqueLMConfig, layout: Layout) -> dict[str, Path]:
    """The LM controllers (issue 24): warm-up, RL through the shared core, evaluation on the fixed
    split's test queries beside the logistic router and the cascade; adapters under critique/lm/."""
    from evaluation.critique_lm import run_critique_lm  # the LM stack (torch, transformers, peft) only here

    out = layout.critique_dir
    result = run_critique_lm(cfg, layout.root, out / "lm", layout.model_cache)
    paths = {"results": schema.write_json_atomic(result, out / "lm_results.json")}
    metrics = {f"{name}/{key}": value for name, row in result["summary"].items() if name != "corl"
               for key, value in row.items()}
    metrics |= {f"corl/{mode}/{key}": value for mode, row in result["summary"].get("corl", {}).items()
                for key, value in row.items()}
    paths["metrics"] = schema.write_json_atomic(metrics, out / "lm_metrics.json")
    sources = [layout.resolve(p) for p in (cfg.table, cfg.contaminated, cfg.fewshot, cfg.price_book)]
    adapters = [Path(a) for run in result["per_seed"].values() for a in run.get("adapters", {}).values()]
    write_manifest(layout.manifests, "critique-lm", cfg, sources, list(paths.values()), metrics, adapters)
    return paths


def critique_lm_register(cfg: CritiqueLMConfig, layout: Layout, results: Path) -> Path:
    """Register the first seed's RL'd controller (with the multipliers) through the promotion gate."""
    import json

    from evaluation.critique_lm import register_critique_lm
    from evaluation.tracking import use_tracking
    from routerops.config import load_params

    result = json.loads(Path(results).read_text())
    adapter = Path(next(iter(result["per_seed"].values()))["adapters"]["with_multipliers"])
    use_tracking(load_params(layout.resolve("params.yaml"), sections=("track",)).track)
    registered, decision = register_critique_lm(cfg, layout.root, adapter, model_cache=layout.model_cache)
    summary = {"name": registered.name, "version": registered.version, "model_uri": registered.model_uri,
               "decision": decision.to_dict()}
    return schema.write_json_atomic(summary, layout.critique_dir / "lm_registry.json")
