"""`routerops replay` on the edges of valid input (issue 9): what is defined is reported, what is not is
marked, bad arguments exit 2 naming the flag before any work, and no input is ever overwritten."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.cli.conftest import run_cli_in_process

REPO = Path(__file__).resolve().parents[2]
PRICES = """version: edge-test
effective_date: 2024-06-01
currency: USD
prices:
  weak: {input_per_1m: 0.6, output_per_1m: 0.6, cached_input_per_1m: 0.6, per_call: 0.0}
  strong: {input_per_1m: 10.0, output_per_1m: 30.0, cached_input_per_1m: 10.0, per_call: 0.0}
"""


def outcome_table(n: int = 60, accuracy: dict[str, float] | None = None, seed: int = 0) -> pd.DataFrame:
    """n queries; each worker right on exactly round(accuracy · n) of them."""
    accuracy = accuracy or {"weak": 0.70, "strong": 0.75}
    rng = np.random.default_rng(seed)
    rows = []
    for worker, acc in accuracy.items():
        right = set(rng.permutation(n)[: round(acc * n)].tolist())
        for i in range(n):
            rows.append({"dataset": "edge", "query_id": f"q{i:03d}",
                         "query": f"Question {i}: what is {i} plus {i % 7}?", "worker": worker,
                         "score": float(i in right), "prompt_tokens": 30 + i % 5, "completion_tokens": 50})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One encoder cache for the module's runs: the ONNX export and the vectors of the questions the
    first run embeds (every table here asks the same ones). The run logged to MLflow is a process of its
    own, which with a new cache paid the export and the embedding again (~20 s of CPU) for nothing it checks."""
    return tmp_path_factory.mktemp("replay-cli-cache")


@pytest.fixture
def files(tmp_path, monkeypatch, shared_cache):
    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(shared_cache))
    prices = tmp_path / "prices.yaml"
    prices.write_text(PRICES)
    return tmp_path, prices


@pytest.fixture
def cold_files(files, tmp_path, monkeypatch):
    """`files` with an empty cache dir of this test's own (tmp/cache), for the tests that no embedding ran."""
    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(tmp_path / "cache"))
    return files


def write(table: pd.DataFrame, path: Path) -> Path:
    table.to_csv(path, index=False)
    return path


def replay(table: Path, prices: Path, out: Path, *extra: str, mlflow: bool = False) -> subprocess.CompletedProcess:
    argv = ["replay", "--table", str(table), "--prices", str(prices), "--out", str(out), "--routers", "random", "oracle",
            "--seeds", "0", *extra, *([] if mlflow else ["--no-mlflow"])]
    if mlflow:  # MLflow keeps process-wide state (its store per URI): the logged run gets a process of its own
        return subprocess.run([sys.executable, "-m", "cli", *argv], cwd=REPO, capture_output=True, text=True,
                              timeout=300)
    return run_cli_in_process(argv)  # the CLI's exit code and output without a new interpreter's imports


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_apgr_undefined_on_resamples_is_reported_not_a_crash(files):
    """60 queries, 70% vs 75% right, default 1000 resamples: many resamples tie the two workers."""
    tmp, prices = files
    out = tmp / "board.csv"
    result = replay(write(outcome_table(), tmp / "t.csv"), prices, out)
    assert result.returncode == 0, result.stderr
    board = pd.read_csv(out).set_index("router")
    assert np.isfinite(board.loc["oracle", ["aiq", "apgr", "apgr_lo", "apgr_hi"]].astype(float)).all()
    assert board.loc["random", "apgr_boot_undefined"] > 0  # counted, and left out of the interval
    assert board.loc["random", "apgr_lo"] <= board.loc["random", "apgr_hi"]


@pytest.mark.slow
def test_equally_accurate_workers_leave_apgr_undefined_and_the_rest_defined(files):
    tmp, prices = files
    out = tmp / "board.csv"
    table = outcome_table(accuracy={"weak": 0.7, "strong": 0.7})
    result = replay(write(table, tmp / "t.csv"), prices, out)
    assert result.returncode == 0, result.stderr
    board = pd.read_csv(out).set_index("router")
    assert board["apgr"].isna().all()  # no gap to recover: undefined, so empty, never made up
    assert board["aiq"].notna().all()


@pytest.mark.slow
def test_a_one_worker_table_gives_a_leaderboard_without_two_worker_metrics(files):
    tmp, prices = files
    out = tmp / "board.csv"
    table = outcome_table(accuracy={"strong": 0.75})
    result = replay(write(table, tmp / "t.csv"), prices, out)
    assert result.returncode == 0, result.stderr
    board = pd.read_csv(out)
    assert set(board["router"]) == {"single:strong", "random", "oracle"}
    assert "apgr" not in board.columns
    assert board["best_accuracy"].eq(0.75).all()


@pytest.mark.slow
@pytest.mark.parametrize("flags, field", [
    (("--k", "61"), "--k"),  # more folds than the 60 queries
    (("--k", "1"), "--k"),
    (("--bootstrap", "-3"), "--bootstrap"),
    (("--routers", "random", "knnn"), "--routers"),
    (("--drop-overlap",), "--drop-overlap"),  # cross-fitting: nothing to drop
])
def test_bad_arguments_exit_2_naming_the_flag_and_write_nothing(files, flags, field):
    tmp, prices = files
    out = tmp / "board.csv"
    result = replay(write(outcome_table(), tmp / "t.csv"), prices, out, *flags)
    assert result.returncode == 2, result.stderr
    assert field in result.stderr and "Traceback" not in result.stderr
    assert not out.exists() and not out.with_suffix(".curves.csv").exists()


@pytest.mark.slow
def test_out_equal_to_table_is_refused_and_the_table_is_unchanged(files):
    tmp, prices = files
    table = write(outcome_table(), tmp / "t.csv")
    before = digest(table)
    result = replay(table, prices, table)
    assert result.returncode == 2 and "--out" in result.stderr and "overwrite" in result.stderr
    assert digest(table) == before


@pytest.mark.slow
def test_out_that_is_a_directory_is_refused_before_any_work(files):
    tmp, prices = files
    (tmp / "adir").mkdir()
    result = replay(write(outcome_table(), tmp / "t.csv"), prices, tmp / "adir")
    assert result.returncode == 2 and "directory" in result.stderr and "Traceback" not in result.stderr
    assert "routers" not in result.stdout  # refused before the leaderboard was computed


# ---------------------------------------------------------------- issue 25


@pytest.mark.slow
def test_an_unwritable_out_is_refused_before_any_work(cold_files):
    """`replay` ran the whole benchmark, then died with a traceback writing under a regular file or /proc."""
    tmp, prices = cold_files
    table = write(outcome_table(), tmp / "t.csv")
    (tmp / "a-file").write_text("not a folder\n")
    for out in (tmp / "a-file" / "board.csv", Path("/proc/routerops-test/board.csv")):
        result = replay(table, prices, out)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "--out" in result.stderr
        assert "routers" not in result.stdout and not (tmp / "cache").exists()  # no leaderboard, no embedding


def split_table_in_two_orders(n: int = 60) -> pd.DataFrame:
    """A valid table whose train rows list the workers weak, strong, and whose test rows strong, weak."""
    table = outcome_table(n).assign(split=lambda t: np.where(t["query_id"] < f"q{n // 2:03d}", "train", "test"))
    train, test = table[table.split == "train"], table[table.split == "test"]
    return pd.concat([train, test.iloc[::-1]], ignore_index=True)


@pytest.mark.slow
def test_split_column_accepts_the_same_workers_in_another_order(files):
    tmp, prices = files
    out = tmp / "board.csv"
    result = replay(write(split_table_in_two_orders(), tmp / "t.csv"), prices, out, "--split-column", "split")
    assert result.returncode == 0, result.stderr
    board = pd.read_csv(out).set_index("router")
    assert {"single:weak", "single:strong", "oracle"} <= set(board.index)
    # the columns were matched by name: the oracle is scored on the test split's own outcomes
    test = outcome_table(60).query("query_id >= 'q030'")
    best = test.groupby("query_id")["score"].max().mean()
    assert board.loc["oracle", "best_accuracy"] == pytest.approx(best)


def overlapping_tables(tmp: Path, shared: int = 5) -> tuple[Path, Path]:
    """Train on q000-q029, score q030-q059 of which `shared` carry the text of a training query."""
    table = outcome_table(60)
    train = table[table.query_id < "q030"]
    test = table[table.query_id >= "q030"].copy()
    copied = {f"q{30 + i:03d}": f"Question {i}: what is {i} plus {i % 7}?" for i in range(shared)}
    test["query"] = test["query_id"].map(copied).fillna(test["query"])
    return write(train, tmp / "train.csv"), write(test, tmp / "test.csv")


@pytest.mark.slow
def test_overlapping_train_and_test_are_refused_before_any_embedding(cold_files):
    """The refusal came after 75 s of embedding, with no way on: now before any work, offering one."""
    tmp, prices = cold_files
    train, test = overlapping_tables(tmp)
    out = tmp / "board.csv"
    result = replay(test, prices, out, "--train-table", str(train))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "5 of 30 scored queries" in result.stderr and "--drop-overlap" in result.stderr
    assert not (tmp / "cache").exists() and not out.exists()  # nothing embedded, nothing written


@pytest.mark.slow
def test_drop_overlap_scores_the_unseen_queries_and_records_how_many_were_dropped(files):
    tmp, prices = files
    train, test = overlapping_tables(tmp)
    out = tmp / "board.csv"
    result = replay(test, prices, out, "--train-table", str(train), "--drop-overlap")
    assert result.returncode == 0, result.stderr
    assert "dropped 5 of 30 scored queries" in result.stdout
    meta = __import__("json").loads(out.with_suffix(".meta.json").read_text())
    assert meta["drop_overlap"]["dropped_queries"] == 5 and meta["n_queries"] == 25
    assert "--drop-overlap" in meta["protocol"]


@pytest.mark.slow
def test_replay_of_a_semicolon_csv_is_an_mlflow_run_and_says_where_everything_went(files, monkeypatch):
    """Issue 40: a `;`-separated CSV is read; the run is logged to MLflow (params, metrics, the
    leaderboard as a table, the plot, the dataset inputs) and every output's place is printed."""
    import mlflow

    tmp, prices = files
    db = tmp / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.setenv("ROUTEROPS_ARTIFACT_ROOT", str(tmp / "artifacts"))
    table = tmp / "semicolon.csv"
    outcome_table().to_csv(table, sep=";", index=False)
    out = tmp / "out" / "board.csv"
    result = replay(table, prices, out, "--bootstrap", "0", mlflow=True)
    assert result.returncode == 0, result.stderr
    for path in (out, out.with_suffix(".curves.csv"), out.with_suffix(".meta.json"), out.with_suffix(".png")):
        assert f" {path}\n" in result.stdout and path.is_file(), result.stdout
    assert out.with_suffix(".png").stat().st_size > 1000
    run_id = result.stdout.split("MLflow run   ")[1].split()[0]
    assert f"mlflow ui --backend-store-uri sqlite:///{db}" in result.stdout  # not the demo's store: its own command

    mlflow.set_tracking_uri(f"sqlite:///{db}")
    try:
        run = mlflow.get_run(run_id)
        assert run.info.run_name == "replay" and run.info.status == "FINISHED"
        assert run.data.params["table"] == str(table) and run.data.params["protocol"] == "cross-fit k=5"
        board = pd.read_csv(out).set_index("router")
        assert run.data.metrics["aiq/oracle"] == pytest.approx(board.loc["oracle", "aiq"])
        assert run.data.metrics["best_accuracy/single_strong"] == pytest.approx(0.75)
        logged = {f.path for f in mlflow.MlflowClient().list_artifacts(run_id)}
        assert {"leaderboard.json", "board.csv", "board.png", "board.meta.json"} <= logged
        inputs = {(d.dataset.name, d.tags[0].value if d.tags else None) for d in run.inputs.dataset_inputs}
        contexts = {tag.value for d in run.inputs.dataset_inputs for tag in d.tags if tag.key == "mlflow.data.context"}
        assert {"scored", "price_book"} <= contexts, inputs
    finally:
        mlflow.set_tracking_uri(None)
