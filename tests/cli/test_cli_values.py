"""Issue 42 item 8: every value is checked, naming its key (and the `--set` that set it), before
anything runs; no command ends in a traceback on bad input. Each case failed on main at fb83603: the
run started its flow (writing data/suites/tasks.jsonl, retrying, two tracebacks; `--set
collect.budget_usd=-1` took 91 s), replay ended in tracebacks, `--port 99999` listened elsewhere,
`pool publish` put `file:///etc/passwd` in force, two runs shared one root, and an import wrote one
question under two query ids."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cli import main as cli
from cli.run import lock_root

REPO = Path(__file__).resolve().parents[2]


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().err


def one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and all(word in err for word in words), err


@pytest.fixture
def root(tmp_path) -> Path:
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    return tmp_path


@pytest.mark.parametrize(("setting", "said"), [
    ("collect.budget_usd=-1", "greater than 0"),
    ("collect.budget_usd=.nan", "finite"),
    ("collect.concurrency=0", "greater than or equal to 1"),
    ("materialise.train=-1", "greater than or equal to 0"),
    ("materialise.families=[]", "at least 1 item"),
    ("materialise.families=[basic_arithmetic, no_such_family]", "unknown reasoning-gym family 'no_such_family'"),
    ("prices.collection=/etc/shadow", "not a usable price book"),
    ("prices.evaluation=configs/pool.yaml", "not a usable price book"),
    ("collect.price_book=configs/prices/current.yaml", "unknown key"),
    ("register.k=1", "greater than or equal to 2"),
    ("routers.seeds=[-1]", "greater than or equal to 0"),
    ("orchestra.budget_usd=-1", "greater than 0"),
    ("mtrouter.concurrency=0", "greater than or equal to 1"),
])
def test_a_bad_value_set_on_the_command_line_is_refused_before_anything_runs(root, setting, said, capsys):
    started = time.monotonic()
    section = setting.partition(".")[0]
    pipeline = section if section in ("orchestra", "mtrouter") else "main"
    code, err = run(["run", pipeline, "--root", str(root), "--set", setting], capsys)
    one_line_error(code, err, f"--set {setting.partition('=')[0]}", said)
    assert time.monotonic() - started < 15  # reasoning-gym's import, at most: no flow, no retry
    assert not (root / "data").exists()  # nothing ran: materialise would have written data/suites/


@pytest.mark.parametrize(("pipeline", "setting", "said"), [
    ("critique", "critique.corl.kl=.nan", "finite"),
    ("critique", "critique.policy.lr=-1", "must be > 0"),
    ("critique", "critique.price_book=configs/prices/current.yaml", "unknown key"),
    ("critique-lm", "critique_lm.rl.learning_rate=.inf", "finite"),
    ("critique-lm", "critique_lm.tree.group=0", "critique_lm.tree.group"),
])
def test_the_critique_sections_refuse_bad_values_before_anything_runs(root, pipeline, setting, said, capsys):
    """Issue 41: the critique and critique_lm sections are range-checked too (NaN and infinities
    included), refused with one line naming the `--set`, before any stage runs."""
    code, err = run(["run", pipeline, "--root", str(root), "--set", setting], capsys)
    one_line_error(code, err, f"--set {setting.partition('=')[0]}", said)
    assert not (root / "reports").exists()


def test_a_bad_value_in_params_yaml_names_the_file_and_the_key(root, capsys):
    params = root / "params.yaml"
    values = yaml.safe_load(params.read_text())
    values["collect"]["budget_usd"] = -1
    params.write_text(yaml.safe_dump(values))
    code, err = run(["run", "main", "--root", str(root)], capsys)
    one_line_error(code, err, str(params), "collect.budget_usd")


def test_a_root_in_use_by_a_run_is_refused_naming_its_pid(root, capsys):
    with lock_root(root):
        code, err = run(["run", "main", "--root", str(root), "--set", "collect.budget_usd=-1"], capsys)
    one_line_error(code, err, "--root", f"pid {os.getpid()}", "in use")
    code, err = run(["run", "main", "--root", str(root), "--set", "collect.budget_usd=-1"], capsys)
    assert "in use" not in err  # released with its holder: the value check speaks again


def test_what_the_makefile_exports_is_the_cli_default(root, monkeypatch, capsys):
    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a value the user set wins
    run(["run", "main", "--root", str(root), "--set", "collect.budget_usd=-1"], capsys)
    assert os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "180"
    assert os.environ["HF_HUB_OFFLINE"] == "0"


@pytest.mark.slow  # building the gateway's parser imports the gateway (~3-12 s)
def test_gateway_serve_refuses_a_port_out_of_range(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["gateway", "serve", "--port", "99999"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "--port" in err and "1-65535" in err and "Traceback" not in err


@pytest.mark.parametrize(("flags", "said"), [
    (["--seeds", "-1"], "--seeds"),
    (["--routers", "random", "single:ghost"], "single:ghost"),
])
def test_replay_refuses_bad_seeds_and_unknown_workers_in_one_line(flags, said, tmp_path, capsys):
    table = tmp_path / "t.csv"
    pd.DataFrame([{"dataset": "d", "query_id": f"q{i}", "query": f"question {i}", "worker": w, "score": 1.0,
                   "prompt_tokens": 10, "completion_tokens": 5} for i in range(6) for w in ("weak", "strong")]
                 ).to_csv(table, index=False)
    prices = tmp_path / "prices.yaml"
    prices.write_text("version: v\neffective_date: 2024-01-01\nprices:\n  weak: {input_per_1m: 1, output_per_1m: 1}\n"
                      "  strong: {input_per_1m: 9, output_per_1m: 9}\n")
    out = tmp_path / "board.csv"
    code, err = run(["replay", "--table", str(table), "--prices", str(prices), "--out", str(out), "--k", "2",
                     "--routers", "random", "--seeds", "0", *flags], capsys)
    one_line_error(code, err, said)
    assert not out.exists()


POOL = """name: p
workers:
  - {{name: smol-direct, kind: llm, primitives: [answer], {entry}}}
"""


@pytest.mark.parametrize(("entry", "field"), [
    ("endpoint: 'file:///etc/passwd'", "workers[0].endpoint"),
    ("endpoint: 'ftp://host/v1'", "workers[0].endpoint"),
    ("generation: {max_tokens: -5}", "workers[0].generation.max_tokens"),
    ("generation: {temperature: .nan}", "workers[0].generation.temperature"),
    ("generation: {top_p: 3}", "workers[0].generation.top_p"),
    ("generation: {max_token: 5}", "workers[0].generation.max_token"),
])
def test_pool_publish_refuses_endpoints_and_generation_settings_out_of_range(entry, field, tmp_path, capsys):
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL.format(entry=entry))
    code, err = run(["pool", "publish", str(pool), *publish_flags(tmp_path)], capsys)
    one_line_error(code, err, field)
    assert not (tmp_path / "store").exists()


def test_prices_publish_refuses_a_price_past_its_bound(tmp_path, capsys):
    book = tmp_path / "book.yaml"
    book.write_text((REPO / "configs/prices/current.yaml").read_text().replace("version: ", "version: x", 1)
                    .replace("output_per_1m: 10.00", "output_per_1m: 1.0e+300", 1))
    code, err = run(["prices", "publish", str(book), *publish_flags(tmp_path)], capsys)
    one_line_error(code, err, "output_per_1m", "above")
    assert not (tmp_path / "store").exists()


def publish_flags(tmp_path: Path) -> list[str]:
    params = tmp_path / "params.yaml"
    params.write_text(f"pool: {{file: {REPO / 'configs/pool.yaml'}}}\nprices: {{evaluation: "
                      f"{REPO / 'configs/prices/current.yaml'}}}\nops: {{publish_dir: {tmp_path / 'store'}}}\n")
    return ["--params", str(params), "--root", str(tmp_path)]


def test_import_routellm_refuses_a_duplicated_prompt_naming_the_rows(tmp_path, capsys):
    csv = tmp_path / "r.csv"
    pd.DataFrame({"prompt": ["What is 1+1?", "What is 2+2?", "What is  1+1?"], "m1": ["True"] * 3,
                  "m1_response": ["2", "4", "2"], "m2": ["False"] * 3, "m2_response": ["3"] * 3}
                 ).to_csv(csv, index=False)
    out = tmp_path / "t.parquet"
    code, err = run(["import-routellm", "--csv", str(csv), "--out", str(out)], capsys)
    one_line_error(code, err, "rows 1 and 3", "same text")
    assert not out.exists()


def test_import_qa_refuses_a_duplicated_question_naming_the_lines(tmp_path, capsys):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": q, "answer": f"so #### {a}"}) + "\n"
                            for q, a in (("What is 1+1?", 2), ("What is 2+2?", 4), ("What is 1+1?", 2))))
    out = tmp_path / "tasks.jsonl"
    code, err = run(["import-qa", str(path), "--out", str(out)], capsys)
    one_line_error(code, err, "lines 1 and 3")
    assert not out.exists()


def test_import_llmrouter_refuses_a_duplicated_question(tmp_path, capsys):
    table = tmp_path / "dc.json"
    table.write_text(json.dumps([{"question": q, "scores": {"a": 1.0, "b": 0.0}, "cluster_id": 0}
                                 for q in ("q one", "q two", "q one")]))
    candidates = tmp_path / "c.json"
    candidates.write_text(json.dumps({m: {"input_price": 1.0, "output_price": 2.0} for m in ("a", "b")}))
    out = tmp_path / "t.parquet"
    code, err = run(["import-llmrouter", "--json", str(table), "--candidates", str(candidates), "--out", str(out),
                     "--prices-out", str(tmp_path / "p.yaml")], capsys)
    one_line_error(code, err, "records 0 and 2")
    assert not out.exists()
