"""Synthetic controller conversations (benchmarks): valid SFT rows in the F.1 grammar whose final answer
is the task's true total, in the paper's mode mix."""

from __future__ import annotations

import json
import re
from pathlib import Path

from models.orchestrator.sft_data import read_conversations
from models.orchestrator.synthetic import synthetic_conversations
from routerops.pricing import load_pool, load_price_book

REPO = Path(__file__).resolve().parents[3]


def true_total(question: str) -> int:
    parts = re.findall(r"holds (\d+) ([+×]) (\d+)", question)
    return sum(int(a) + int(b) if op == "+" else int(a) * int(b) for a, op, b in parts)


def test_rows_are_valid_grammatical_and_correct(tmp_path):
    pool = load_pool(REPO / "configs/pools/embedded-smollm2.yaml")
    rows = synthetic_conversations(60, pool, load_price_book(REPO / "configs/prices/current.yaml"), seed=3)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(read_conversations(path)) == 60  # the SFT reader accepts every row
    pairs = {(w.name, p) for w in pool.workers for p in w.primitives}
    for row in rows:
        assistant = "".join(m["content"] for m in row["messages"] if m["role"] == "assistant")
        assert assistant.count("<final_answer>") == 1
        assert re.search(r"<final_answer> (\d+) </final_answer>", assistant).group(1) == str(true_total(row["messages"][1]["content"]))
        assert set(re.findall(r'model="([^"]+)" skill="([^"]+)"', assistant)) <= pairs
        assert ("<plan" in assistant) == (row["mode"] != "lazy")
        assert ("<replan/>" in assistant) == (row["mode"] == "decomp_repair")
    assert {r["mode"] for r in rows} >= {"lazy", "oneshot", "continuation"}
