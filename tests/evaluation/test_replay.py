"""Cross-fitting, sweeps and the leaderboard; the RouteLLM GSM8K table when ../shared is present."""

from __future__ import annotations

import json

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from models.base import Router, RoutingData
from models.baselines import Oracle, RandomRouter
from models.registry import make_router
from models.baselines.synthetic import make_synthetic_table
from evaluation.replay import (
    cost_at_accuracy, cross_fit, curve_aiq, knob_grid, operating_points, run_replay_benchmark, sweep,
    two_worker_metrics,
)

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / "../shared/data"
ROUTELLM = SHARED / "routellm"


class RecordingRouter(Router):
    """Remembers every query id it was fitted on and refuses to score any of them."""

    name = "recording"
    fitted_ids: list[set[str]] = []

    def fit(self, data: RoutingData) -> "RecordingRouter":
        self.ids = set(data.query_ids)
        RecordingRouter.fitted_ids.append(self.ids)
        self.mean = data.scores.mean(axis=0)
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        leaked = self.ids & set(data.query_ids)
        assert not leaked, f"scored {len(leaked)} queries it was trained on"
        return np.tile(self.mean, (len(data), 1))


@pytest.fixture(scope="module")
def table():
    return make_synthetic_table(n_queries=240, n_workers=3, dim=16, seed=2)


@pytest.fixture(scope="module")
def pair():
    return make_synthetic_table(n_queries=400, n_workers=2, dim=16, seed=3)


def test_cross_fit_never_scores_a_training_query(table):
    RecordingRouter.fitted_ids = []
    quality = cross_fit(table, lambda seed: RecordingRouter(), k=4, seed=0)
    assert not np.isnan(quality).any()
    assert len(RecordingRouter.fitted_ids) == 4
    # every query was held out exactly once: it is missing from exactly one training set
    for qid in table.query_ids:
        assert sum(qid not in ids for ids in RecordingRouter.fitted_ids) == 1


def test_cross_fit_rejects_bad_fold_counts(table):
    with pytest.raises(ValueError, match="folds"):
        cross_fit(table, lambda seed: Oracle(), k=1)


def test_sweep_traces_from_dearest_to_cheapest(table):
    router = Oracle()
    curve = sweep(router, router.predict_quality(table), table)
    assert curve["usd_per_query"].is_monotonic_decreasing
    assert curve["accuracy"].iloc[0] == pytest.approx(table.scores.max(axis=1).mean())
    assert curve["share:w0"].iloc[-1] == 1.0
    assert np.allclose(curve.filter(like="share:").sum(axis=1), 1.0)


def test_oracle_apgr_tops_random_which_is_near_half(pair):
    # How far above 1 an oracle goes depends on how often only the weak model is right; on this
    # table that is rare (on RouteLLM's GSM8K it is not, see the shared test below).
    oracle = two_worker_metrics(Oracle().predict_quality(pair), pair)
    randoms = [two_worker_metrics(RandomRouter(seed=s).predict_quality(pair), pair)["apgr"] for s in range(20)]
    assert abs(np.mean(randoms) - 0.5) < 0.05
    assert oracle["apgr"] > max(randoms) + 0.15
    assert oracle["cpt50"] < np.mean([two_worker_metrics(RandomRouter(seed=s).predict_quality(pair), pair)["cpt50"]
                                      for s in range(5)])


def test_cost_at_accuracy_interpolates_on_the_hull():
    usd = np.array([1.0, 2.0, 3.0])
    acc = np.array([0.5, 0.7, 0.9])
    assert cost_at_accuracy(usd, acc, 0.8) == pytest.approx(2.5)
    assert cost_at_accuracy(usd, acc, 0.4) == pytest.approx(1.0)
    assert np.isnan(cost_at_accuracy(usd, acc, 0.95))


def test_aiq_orders_oracle_above_random_above_nothing(table):
    def aiq_of(router):
        q = router.predict_quality(table)
        ops = operating_points(router, q, table)
        from evaluation.replay import cost_window

        return curve_aiq(ops.paid.mean(axis=1), ops.correct.mean(axis=1), cost_window(table))

    assert aiq_of(Oracle()) > aiq_of(RandomRouter(seed=0)) > 0


def test_leaderboard_on_a_synthetic_pair(pair):
    board = run_replay_benchmark(pair, None, ["random", "oracle", "knn"], k=3, seeds=(0, 1), n_boot=50,
                                 progress=False)
    assert set(board["router"]) == {"single:w0", "single:w1", "random", "oracle", "knn"}
    row = board.set_index("router")
    assert row.loc["oracle", "apgr"] > row.loc["knn", "apgr"] > row.loc["random", "apgr"] - 0.1
    assert row.loc["knn", "aiq_lo"] <= row.loc["knn", "aiq"] <= row.loc["knn", "aiq_hi"]
    assert row.loc["oracle", "aiq"] == board["aiq"].max()
    assert np.isnan(row.loc["single:w1", "apgr"])
    assert set(board.attrs["curves"]["router"]) == set(board["router"])


def test_cascade_knob_grid_is_a_threshold_grid(table):
    cascade = make_router("cascade")
    q = np.random.default_rng(0).random((len(table), 3))
    grid = knob_grid(cascade, q, table.costs)
    assert grid.min() == 0.0 and grid.max() > q.max()


# ------------------------------------------------------------------ the real RouteLLM GSM8K table

shared = pytest.mark.skipif(not ROUTELLM.is_dir(), reason="../shared/data/routellm is absent")


@pytest.fixture(scope="module")
def routellm() -> RoutingData:
    from evaluation.replay import to_routing_data
    from routerops.envs.replay import import_routellm_gsm8k
    from routerops.pricing import load_price_book

    df = import_routellm_gsm8k(ROUTELLM / "gsm8k_responses.csv", ROUTELLM / "gsm8k_contaminated_prompts.jsonl")
    return to_routing_data(df, load_price_book(REPO / "configs/prices/routellm-2024.yaml"))


@pytest.mark.slow
@shared
@pytest.mark.shared
def test_random_router_apgr_on_routellm_gsm8k_is_half(routellm):
    assert len(routellm) == 1307
    apgrs = [two_worker_metrics(RandomRouter(seed=s).predict_quality(routellm), routellm)["apgr"] for s in range(10)]
    assert np.mean(apgrs) == pytest.approx(0.50, abs=0.02)


@shared
@pytest.mark.shared
def test_oracle_apgr_on_routellm_gsm8k(routellm):
    result = two_worker_metrics(Oracle().predict_quality(routellm), routellm)
    print(f"oracle APGR on RouteLLM GSM8K: {result['apgr']:.3f}")
    assert result["apgr"] > 1.0


# ------------------------------------------------------------------ files in, leaderboard out


def long_table(n: int = 40) -> pd.DataFrame:
    """A logged-outcome table in the documented long format: 'cheap' is right on even queries."""
    rows = []
    for i in range(n):
        query = f"Question {i}: what is {i} plus {2 * i}?"
        for worker, right, completion in (("cheap", i % 2 == 0, 20), ("dear", i % 5 != 0, 80)):
            rows.append({"dataset": "toy", "query_id": f"toy/{i}", "query": query, "worker": worker,
                         "score": float(right), "prompt_tokens": 30 + i, "completion_tokens": completion})
    return pd.DataFrame(rows)


def price_book(path: Path, dear_output: float) -> Path:
    path.write_text(
        "version: v-" + str(dear_output) + "\neffective_date: 2026-01-01\nprices:\n"
        "  cheap: {input_per_1m: 0.1, output_per_1m: 0.2}\n"
        f"  dear: {{input_per_1m: 5.0, output_per_1m: {dear_output}}}\n"
    )
    return path


@pytest.mark.slow
def test_cli_reprices_without_touching_accuracy(tmp_path, monkeypatch):
    from routerops.envs.replay import write_logged_outcomes
    from cli.main import main as cli

    def main(argv):
        return cli(["replay", *argv])

    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(tmp_path / "cache"))
    table = write_logged_outcomes(long_table(), tmp_path / "toy.parquet")
    boards = {}
    for dear_output in (15.0, 60.0):
        out = tmp_path / f"board-{dear_output}.csv"
        argv = ["--table", str(table), "--prices", str(price_book(tmp_path / f"p{dear_output}.yaml", dear_output)),
                "--routers", "random", "oracle", "--k", "4", "--seeds", "0", "--bootstrap", "20", "--out", str(out)]
        assert main(argv) == 0
        assert out.with_suffix(".curves.csv").is_file() and out.with_suffix(".meta.json").is_file()
        boards[dear_output] = pd.read_csv(out).set_index("router")
    cheap, dear = boards[15.0], boards[60.0]
    pd.testing.assert_series_equal(cheap["best_accuracy"], dear["best_accuracy"])
    assert dear.loc["single:dear", "usd_per_query_at_best"] > cheap.loc["single:dear", "usd_per_query_at_best"]
    cheap_worker = ("single:cheap", "usd_per_query_at_best")
    assert dear.loc[cheap_worker] == pytest.approx(cheap.loc[cheap_worker])
    assert '"price_book": "v-60.0"' in (tmp_path / "board-60.0.meta.json").read_text()


def test_cross_fit_accepts_classes_and_zero_argument_factories(table):
    from models.baselines import KNNRouter

    by_class = cross_fit(table, KNNRouter, k=3, seed=0)
    by_lambda = cross_fit(table, lambda: KNNRouter(), k=3, seed=0)
    np.testing.assert_array_equal(by_class, by_lambda)


def test_a_cascades_apgr_score_reads_only_the_cheap_workers_answer(pair):
    from evaluation.replay import strong_call_score

    cascade = make_router("cascade")
    q = np.random.default_rng(1).random((len(pair), 2))
    altered = q.copy()
    altered[:, 1] = 1 - altered[:, 1]  # w1 is the dear worker: the cascade has not seen its answer
    np.testing.assert_array_equal(strong_call_score(q, pair, cascade), strong_call_score(altered, pair, cascade))
    np.testing.assert_array_equal(strong_call_score(q, pair), q[:, 1] - q[:, 0])


class SeenRouter(RandomRouter):
    """A random router that remembers every query id it was fitted on."""

    seen: list[str] = []

    def fit(self, data):
        SeenRouter.seen.extend(data.query_ids)
        return super().fit(data)


def test_replay_cli_fits_on_the_train_split_only_and_says_so(tmp_path, monkeypatch):
    from routerops.envs.replay import write_logged_outcomes
    from models import registry
    from cli.main import main as cli

    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(registry.ROUTER_FACTORIES, "recording", lambda seed: SeenRouter(seed=seed))
    SeenRouter.seen = []
    frame = long_table(40)
    frame["split"] = np.where(frame.query_id.str.split("/").str[1].astype(int) < 24, "train", "test")
    table = write_logged_outcomes(frame, tmp_path / "split.parquet")
    out = tmp_path / "board.csv"
    assert cli(["replay", "--table", str(table), "--prices", str(price_book(tmp_path / "p.yaml", 15.0)),
                "--split-column", "split", "--routers", "recording", "oracle", "--seeds", "0", "1",
                "--bootstrap", "0", "--out", str(out)]) == 0
    train_ids = set(frame[frame.split == "train"].query_id)
    assert SeenRouter.seen and set(SeenRouter.seen) <= train_ids
    board = pd.read_csv(out)
    assert board.protocol.str.startswith("fixed split: fit on split=train").all()
    meta = json.loads(out.with_suffix(".meta.json").read_text())
    assert meta["n_queries"] == 16 and meta["n_train_queries"] == 24


def test_replay_cli_fits_on_another_table_and_refuses_overlap(tmp_path, monkeypatch):
    from routerops.envs.replay import write_logged_outcomes
    from models import registry
    from cli.main import main as cli

    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(registry.ROUTER_FACTORIES, "recording", lambda seed: SeenRouter(seed=seed))
    SeenRouter.seen = []
    frame = long_table(40)
    ids = frame.query_id.str.split("/").str[1].astype(int)
    other = write_logged_outcomes(frame[ids < 25].assign(dataset="other"), tmp_path / "other.parquet")
    scored = write_logged_outcomes(frame[ids >= 25], tmp_path / "scored.parquet")
    prices = str(price_book(tmp_path / "p.yaml", 15.0))
    out = tmp_path / "board.csv"
    common = ["--prices", prices, "--routers", "recording", "--seeds", "0", "--bootstrap", "0", "--out", str(out)]
    assert cli(["replay", "--train-table", str(other), "--table", str(scored), *common]) == 0
    assert set(SeenRouter.seen) == set(frame[ids < 25].query_id)
    assert pd.read_csv(out).protocol.str.startswith(f"fit on {other}").all()
    # The same table on both sides would score routers on their own training queries: refused.
    assert cli(["replay", "--train-table", str(other), "--table", str(other), *common]) == 2


@pytest.mark.slow
def test_the_ensembles_row_reuses_its_members_folds_and_equals_fitting_it_whole(pair):
    """run_replay_benchmark averages the members' own out-of-fold predictions; that must be exactly
    what cross-fitting the EnsembleRouter itself predicts (same seed, same folds)."""
    from evaluation.replay import SharedPredictions
    from models.registry import ENSEMBLES, ROUTER_FACTORIES

    shared = SharedPredictions(pair, 3, None, ROUTER_FACTORIES, ENSEMBLES)
    reused = shared("ensemble", [1])[1]
    whole = cross_fit(pair, lambda seed: make_router("ensemble", seed), k=3, seed=1)
    np.testing.assert_allclose(reused, whole, rtol=0, atol=1e-9)
    assert {key for key in shared._done} == {("ensemble", 1)} | {(m, 1) for m in ENSEMBLES["ensemble"]}


def test_bootstrap_intervals_bracket_the_estimate_and_mark_undefined_apgr():
    from evaluation.replay import bootstrap_intervals, operating_points

    # 60 queries, 70% vs 75% right (issue 9): many resamples make the two equally accurate.
    rng = np.random.default_rng(0)
    scores = np.zeros((60, 2))
    scores[rng.permutation(60)[:42], 0] = 1
    scores[rng.permutation(60)[:45], 1] = 1
    data = RoutingData(query_ids=[f"q{i}" for i in range(60)], queries=[f"q{i}" for i in range(60)],
                       workers=["weak", "strong"], scores=scores, costs=np.tile([1e-4, 1e-2], (60, 1)),
                       embeddings=rng.normal(size=(60, 4)).astype(np.float32))
    router = RandomRouter(seed=0)
    quality = rng.random((60, 2))
    ops = operating_points(router, quality, data)
    out = bootstrap_intervals(router, ops, data, quality, n_boot=400, seed=0)
    aiq = curve_aiq(ops.paid.mean(axis=1), ops.correct.mean(axis=1),
                    (data.costs.min(axis=1).mean(), data.costs.mean(axis=0).max()))
    assert out["aiq_lo"] <= aiq <= out["aiq_hi"]
    assert out["apgr_lo"] < out["apgr_hi"]
    assert 0 < out["apgr_boot_undefined"] < 400


@pytest.mark.slow
def test_worker_processes_give_the_same_predictions_as_one_process(pair):
    from evaluation.replay import held_out_qualities

    factory = lambda seed: make_router("logistic", seed)  # noqa: E731
    alone = held_out_qualities(factory, pair, 3, [0, 1], n_jobs=1)
    workers = held_out_qualities(factory, pair, 3, [0, 1], n_jobs=2)
    for seed in (0, 1):
        np.testing.assert_allclose(workers[seed], alone[seed], rtol=0, atol=1e-9)
        assert not np.isnan(workers[seed]).any()


@pytest.mark.slow
def test_a_cascade_without_logged_responses_predicts_what_logistic_predicts(pair):
    """models.registry.same_predictions lets the replay fit them once; this is the claim it rests on."""
    cascade = cross_fit(pair, lambda seed: make_router("cascade", seed), k=3, seed=2)
    logistic = cross_fit(pair, lambda seed: make_router("logistic", seed), k=3, seed=2)
    assert pair.responses is None
    np.testing.assert_array_equal(cascade, logistic)


@pytest.mark.slow
def test_pooled_fits_equal_each_router_fitted_alone_and_charge_their_seconds_once(pair):
    """run_replay_benchmark fits every learned router's folds in one pool (prefetch): the predictions
    must be those of each router cross-fitted alone, a twin (cascade → logistic) or an ensemble must
    not fit again, and each fit's seconds are charged to the first router that reads it."""
    from evaluation.replay import SharedPredictions, held_out_qualities
    from models.registry import ENSEMBLES, ROUTER_FACTORIES

    parallel = {"cascade", "knn", "logistic", "mf"}
    shared = SharedPredictions(pair, 3, None, ROUTER_FACTORIES, ENSEMBLES, n_jobs=2, parallel=parallel,
                               cost={"mf": 5.0})
    shared.prefetch(["cascade", "knn", "mf", "logistic"], [0, 1])
    assert set(shared._done) == {(name, seed) for name in ("logistic", "knn", "mf") for seed in (0, 1)}
    for name in ("logistic", "knn", "mf"):
        alone = held_out_qualities(lambda seed, _n=name: make_router(_n, seed), pair, 3, [0, 1])
        for seed in (0, 1):
            np.testing.assert_allclose(shared._done[(name, seed)], alone[seed], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(shared("cascade", [0, 1])[1], shared._done[("logistic", 1)])
    assert shared.take_seconds() > 0  # logistic's fits, read first for the cascade
    shared("logistic", [0, 1])
    assert shared.take_seconds() == 0.0
    shared("knn", [0, 1])
    assert shared.take_seconds() > 0


@pytest.mark.slow
def test_pooled_tasks_go_dearest_first(pair):
    from evaluation.replay import held_out_qualities_of

    order = []

    def recording(name):
        def factory(seed):
            order.append(name)
            return make_router(name, seed)
        return factory

    quality, seconds = held_out_qualities_of({"knn": recording("knn"), "logistic": recording("logistic")}, pair, 3,
                                             [0], cost={"logistic": 4.0})
    assert order == ["logistic"] * 3 + ["knn"] * 3
    assert set(quality) == set(seconds) == {"knn", "logistic"} and all(s > 0 for s in seconds.values())
