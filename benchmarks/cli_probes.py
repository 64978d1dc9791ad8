"""The CLI probes of issue 25 (a hostile user's bad paths and files), run as subprocesses of
`python -m cli` against a checkout: each probe holds when the command exits 2 with one line on
stderr, no traceback, and nothing written where it was told to write (plus the probe's own check:
an input left unchanged, a refusal before any work, a replay that runs with --drop-overlap).

    python benchmarks/cli_probes.py [--repo .] [--out benchmarks/results/cli_probes.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
PRICES = """version: probe
effective_date: 2024-06-01
prices:
  weak: {input_per_1m: 0.6, output_per_1m: 0.6}
  strong: {input_per_1m: 10.0, output_per_1m: 30.0}
  third: {input_per_1m: 1.0, output_per_1m: 2.0}
"""
POOL = """name: probe
workers:
  - {name: smol-direct, kind: llm, primitives: [answer], endpoint: local, concurrency: %s, timeout_s: %s}
"""


def outcome_table(n: int = 40, workers=("weak", "strong", "third"), seed: int = 0, split: bool = False,
                  shared: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        part = "train" if i < n // 2 else "test"
        order = workers if (not split or part == "train") else tuple(reversed(workers))
        for w in order:
            text = f"Question {i % (n // 2) if (shared and part == 'test' and i - n // 2 < shared) else i}"
            rows.append({"dataset": "probe", "query_id": f"q{i:03d}", "query": text, "worker": w,
                         "score": float(rng.random() < 0.6), "prompt_tokens": 30, "completion_tokens": 50,
                         **({"split": part} if split else {})})
    return pd.DataFrame(rows)


def routellm_csv(path: Path, drop: str | None = None) -> Path:
    cols = {"prompt": ["What is 1+1?", "What is 2+2?"], "m1": ["True", "False"], "m1_response": ["2", "5"],
            "m2": ["True", "True"], "m2_response": ["2", "4"]}
    if drop:
        cols.pop(drop)
    pd.DataFrame(cols).to_csv(path, index=False)
    return path


def trajectories(folder: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests/stages"))
    sys.path.insert(0, str(REPO))
    from test_cli import trajectories as make, write_set  # noqa: PLC0415 - the test suite's fixture
    folder.mkdir(parents=True, exist_ok=True)
    return write_set(folder, *make())


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(repo: Path, *args: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cli", *args], cwd=repo, capture_output=True, text=True,
                          timeout=timeout)
    return done, time.perf_counter() - start


def probes(tmp: Path) -> list[tuple[str, list[str], callable]]:
    """(name, argv, extra check on the result) for each probe; built in `tmp`."""
    blocker = tmp / "a-file"
    blocker.write_text("not a folder\n")
    prices = tmp / "prices.yaml"
    prices.write_text(PRICES)
    table = tmp / "table.csv"
    outcome_table().to_csv(table, index=False)
    split = tmp / "split.csv"
    outcome_table(split=True).to_csv(split, index=False)
    overlap_train, overlap_test = tmp / "overlap_train.csv", tmp / "overlap_test.csv"
    both = outcome_table(split=True, shared=5)
    both[both.split == "train"].drop(columns="split").to_csv(overlap_train, index=False)
    both[both.split == "test"].drop(columns="split").to_csv(overlap_test, index=False)
    src = trajectories(tmp / "raw")
    book = REPO / "configs/prices/current.yaml"
    csv = routellm_csv(tmp / "routellm.csv")
    not_sqlite = tmp / "not-sqlite.db"
    not_sqlite.write_text("hello\n")
    replay = ["replay", "--prices", str(prices), "--routers", "random", "oracle", "--seeds", "0", "--bootstrap", "0"]
    pools = {}
    for name, (conc, timeout) in {"negative": ("-3", "10"), "nan": ("2", ".nan"), "zero": ("0", "10"),
                                  "inf": ("2", ".inf")}.items():
        pools[name] = tmp / f"pool-{name}.yaml"
        pools[name].write_text(POOL % (conc, timeout))
    params = tmp / "root/params.yaml"
    params.parent.mkdir()
    params.write_text(f"pool: {{file: {REPO / 'configs/pool.yaml'}}}\nreprice: {{price_book: {book}}}\n"
                      f"ops: {{publish_dir: {tmp / 'root/published'}}}\n")
    csv_hash = digest(csv)
    return [
        ("replay --out under a file", [*replay, "--table", str(table), "--out", str(blocker / "board.csv")], None),
        ("replay --out under /proc", [*replay, "--table", str(table), "--out", "/proc/routerops/board.csv"], None),
        ("reprice --out under a file", ["reprice", "--src", str(src), "--price-book", str(book), "--out",
                                        str(blocker / "priced")], None),
        ("reprice --out under /proc", ["reprice", "--src", str(src), "--price-book", str(book), "--out",
                                       "/proc/routerops/priced"], None),
        ("import-routellm --out under a file", ["import-routellm", "--csv", str(csv), "--out", str(blocker / "t.parquet")],
         None),
        ("import-routellm --out under /proc", ["import-routellm", "--csv", str(csv), "--out", "/proc/routerops/t.parquet"],
         None),
        ("gateway keys create: missing folder", ["gateway", "keys", "create", "--budget-usd", "1", "--db-url",
                                                 f"sqlite:///{tmp / 'no-such-folder/gw.db'}"], None),
        ("gateway keys create: not SQLite", ["gateway", "keys", "create", "--budget-usd", "1", "--db-url",
                                             f"sqlite:///{not_sqlite}"], None),
        ("gateway keys create: unknown scheme", ["gateway", "keys", "create", "--budget-usd", "1", "--db-url",
                                                 "nosuchdb://x/y"], None),
        ("import-routellm --out equal to --csv", ["import-routellm", "--csv", str(csv), "--out", str(csv)],
         lambda: digest(csv) == csv_hash or "the input CSV changed"),
        ("import-routellm: no correctness column", ["import-routellm", "--csv", str(routellm_csv(tmp / "nc.csv", "m2")),
                                                    "--out", str(tmp / "nc.parquet")], None),
        ("import-routellm: no response column", ["import-routellm", "--csv",
                                                 str(routellm_csv(tmp / "nr.csv", "m2_response")),
                                                 "--out", str(tmp / "nr.parquet")], None),
        *[(f"pool publish: {name}", ["pool", "publish", str(path), "--params", str(params), "--root", str(tmp / "root")],
           lambda: not (tmp / "root/published").exists() or "published anyway") for name, path in pools.items()],
        ("replay --split-column, workers in another order",
         [*replay, "--table", str(split), "--split-column", "split", "--out", str(tmp / "split/board.csv")], "ok"),
        ("replay: train/test share queries, refused before any work",
         [*replay, "--table", str(overlap_test), "--train-table", str(overlap_train), "--out", str(tmp / "ov/b.csv")],
         "fast"),
        ("replay --drop-overlap scores the unseen queries",
         [*replay, "--table", str(overlap_test), "--train-table", str(overlap_train), "--drop-overlap",
          "--out", str(tmp / "ovd/b.csv")], "ok-dropped"),
    ]


def judge(name, done, seconds, check, tmp: Path, out_paths: list[Path]) -> tuple[bool, str]:
    err = done.stderr.strip().splitlines()
    if check == "ok":
        return done.returncode == 0, f"exit {done.returncode}: {(err or [''])[-1][:200]}"
    if check == "ok-dropped":
        meta = tmp / "ovd/b.meta.json"
        dropped = json.loads(meta.read_text()).get("drop_overlap") if meta.exists() else None
        return done.returncode == 0 and bool(dropped), f"exit {done.returncode}, metadata drop_overlap={dropped}"
    held = done.returncode == 2 and "Traceback" not in done.stderr and len([x for x in err if "error" in x]) == 1
    held = held and len(err) == 1
    why = f"exit {done.returncode}, {len(err)} stderr lines: {(err or [''])[-1][:200]}"
    if check == "fast":  # refused before the embedding, and offering the way on
        held = held and seconds < 30 and "--drop-overlap" in done.stderr
        why += f" ({seconds:.1f} s)"
    elif callable(check):
        said = check()
        if said is not True:
            held, why = False, f"{why}; {said}"
    return held, why


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=str(REPO))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        for name, argv, check in probes(tmp):
            done, seconds = run(Path(args.repo), *argv)
            held, why = judge(name, done, seconds, check, tmp, [])
            results.append({"probe": name, "held": bool(held), "seconds": round(seconds, 1), "said": why})
            print(f"{'held  ' if held else 'FAILED'} {name}: {why}", flush=True)
    summary = {"benchmark": "cli_probes", "repo": str(args.repo), "attempted": len(results),
               "held": sum(r["held"] for r in results), "probes": results}
    print(f"{summary['held']} / {summary['attempted']} held")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
