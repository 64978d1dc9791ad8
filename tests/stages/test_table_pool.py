"""The default pool (issue 39): replayed GPT-4-1106 and Mixtral-8x7B beside SmolLM2, over the GSM8K
questions of RouteLLM's table in one seeded split by query."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from routerops.config import MaterialiseConfig, Params
from routerops.envs.suites import read_tasks
from routerops.envs.table_tasks import split_by_query
from routerops.layout import Layout
from routerops.pricing import check_pool_priced, load_pool, load_price_book

REPO = Path(__file__).resolve().parents[2]


def test_the_split_is_by_query_seeded_disjoint_and_test_stays_put_when_train_grows():
    ids = [f"q{i}" for i in range(50)]
    small = split_by_query(ids, {"train": 10, "val": 5, "test": 20}, seed=3)
    bigger = split_by_query(list(reversed(ids)), {"train": 25, "val": 5, "test": 20}, seed=3)
    assert sorted(small.values()).count("test") == 20 and len(small) == 35
    assert {q for q, s in small.items() if s == "test"} == {q for q, s in bigger.items() if s == "test"}
    assert {q for q, s in small.items() if s == "test"} != {q for q, s in split_by_query(ids, {"test": 20}, 4).items()}


def test_the_default_pool_is_a_real_choice_priced_as_routellm_published():
    pool = load_pool(REPO / "configs/pool.yaml")
    llms = {w.name: w for w in pool.workers if w.kind == "llm"}
    assert set(llms) == {"mixtral-8x7b", "gpt-4-1106", "smollm2-135m"}
    assert llms["gpt-4-1106"].endpoint == llms["mixtral-8x7b"].endpoint == "replay:data/replay/routellm_gsm8k.parquet"
    assert llms["smollm2-135m"].endpoint == "local"
    assert pool.actions() == [(name, "answer") for name in llms]  # the tools are the orchestrator's only
    assert ("python", "python") in pool.admissible_pairs() and ("sympy", "sympy") in pool.admissible_pairs()
    published = load_price_book(REPO / "configs/prices/routellm-2024.yaml")
    for book in ("collection-2026-11.yaml", "current.yaml"):
        prices = load_price_book(REPO / "configs/prices" / book)
        check_pool_priced(pool, prices)
        for name in ("mixtral-8x7b", "gpt-4-1106"):
            assert prices.price(name) == published.price(llms[name].model)


def tiny_gsm8k_table(path: Path, n: int = 12) -> Path:
    from routerops.envs.replay import write_logged_outcomes

    rows = [{"dataset": "gsm8k", "query_id": f"gsm8k/test/{i}", "query": f"Question number {i}?", "worker": w,
             "score": float(w == "strong"), "prompt_tokens": 50, "completion_tokens": 5, "response": f"#### {i}"}
            for i in range(n) for w in ("weak", "strong")]
    return write_logged_outcomes(pd.DataFrame(rows), path)


@pytest.mark.slow  # imports the pipeline's stages (~5 s)
def test_materialise_draws_the_tasks_from_the_tables_questions_with_their_reference_answers(tmp_path):
    from stages.pipeline import materialise

    table = tiny_gsm8k_table(tmp_path / "outcomes.parquet")
    cfg = MaterialiseConfig(source="table", train=5, val=2, test=4, answers=str(REPO / "datasets/gsm8k/test_answers.jsonl"))
    tasks = read_tasks(materialise(Params(materialise=cfg), Layout(tmp_path), table))
    assert [sum(t.split == s for t in tasks) for s in ("train", "val", "test")] == [5, 2, 4]
    assert len({t.task_id for t in tasks}) == 11
    first = next(t for t in tasks if t.task_id == "gsm8k/test/0")
    assert first.prompt == "Question number 0?" and first.answer == "18"  # GSM8K test line 0: Janet's ducks
    assert first.meta["verifier"] == "math-verify"
    with pytest.raises(Exception, match="12"):
        materialise(Params(materialise=MaterialiseConfig(source="table", train=10, val=2, test=4)), Layout(tmp_path), table)


@pytest.mark.slow
def test_collect_calls_the_replayed_workers_over_http_and_scores_them_with_math_verify(tmp_path):
    """The collect stage on a pool of two replay workers (no live model): the stage starts the replay
    server, every episode's turns carry the logged token counts, and math-verify scores the answers."""
    from stages.pipeline import collect, materialise

    table = tiny_gsm8k_table(tmp_path / "data/replay/outcomes.parquet", n=6)
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({"name": "replayed", "workers": [
        {"name": w, "kind": "llm", "endpoint": "replay:data/replay/outcomes.parquet", "model": w,
         "primitives": ["answer"], "generation": {"max_tokens": 16}} for w in ("weak", "strong")]}))
    (tmp_path / "prices.yaml").write_text(yaml.safe_dump({"version": "t", "effective_date": "2026-12-01", "prices": {
        "weak": {"input_per_1m": 1.0, "output_per_1m": 1.0}, "strong": {"input_per_1m": 10.0, "output_per_1m": 30.0}}}))
    from routerops.config import load_params

    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "pool": {"file": "pool.yaml"},
        "materialise": {"source": "table", "train": 2, "val": 1, "test": 2,
                        "answers": str(REPO / "datasets/gsm8k/test_answers.jsonl")},
        "prices": {"collection": "prices.yaml", "evaluation": "prices.yaml"},
        "collect": {"budget_usd": 1.0, "concurrency": 2,
                    "train_policies": ["uniform_random"]},
        "evaluate": {"splits": ["test"]}}))
    params, layout = load_params(tmp_path / "params.yaml"), Layout(tmp_path)
    raw = collect(params, layout, materialise(params, layout, table))
    turns, episodes = pd.read_parquet(raw.turns), pd.read_parquet(raw.episodes)
    assert set(turns.worker) == {"weak", "strong"} and (turns.prompt_tokens == 50).all()
    assert (turns.completion_tokens == 5).all() and turns.errors.eq("[]").all()  # no 404: later turns resolve too
    # "#### i" is right only where GSM8K's answer to line i is i: never for these ids, so every score is 0
    # except that math-verify really compared (a made-up "answer" would not have reached it).
    single = episodes[episodes.policy.str.startswith("single/")]
    assert len(single) == 2 * 5 and (single.score == 0).all() and (single.cost_usd > 0).all()
    assert json.loads((tmp_path / "reports/stages/materialise.json").read_text())["metrics"]["tasks_test"] == 2
