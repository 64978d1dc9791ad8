"""The served orchestrator (evaluation/serving/orchestra.py): its first turn read by the strict parser,
and a save/load round trip with the real SmolLM2 and a real (untrained) LoRA adapter."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from evaluation.serving.orchestra import Episodes, ServedOrchestrator, first_turn_row  # noqa: E402
from evaluation.serving import load_servable  # noqa: E402
from routerops.errors import InputError  # noqa: E402
from routerops.orchestra.executor import ExecutorConfig, opening, worker_labels  # noqa: E402
from routerops.pricing import load_pool, load_price_book  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
POOL, BOOK = REPO / "configs/pools/embedded-smollm2.yaml", REPO / "configs/prices/current.yaml"


@pytest.fixture(scope="module")
def table_and_labels():
    pool = load_pool(POOL)
    labels = worker_labels(pool, False, None)
    table, messages = opening(pool, load_price_book(BOOK), ExecutorConfig(), "What is 2 + 2?", labels)
    assert messages[1] == {"role": "user", "content": "What is 2 + 2?"} and "<plan" in messages[0]["content"]
    return table, labels


def test_first_turn_rows_read_plans_lazy_answers_and_malformed_turns(table_and_labels):
    table, labels = table_and_labels
    plan = ('<plan round="1">\n<subtask id="1" depends_on="">2 + 2</subtask>\n</plan>\n'
            '<route subtask="1" model="sympy" skill="sympy">2 + 2</route>')
    row = first_turn_row(plan, table, labels)
    assert (row["action"], row["worker"], json.loads(row["routes"]), row["error"]) == ("plan", "sympy", [["sympy", "sympy"]], "")
    lazy = first_turn_row("<final_answer> 4 </final_answer>", table, labels)
    assert (lazy["action"], lazy["worker"], lazy["answer"].strip()) == ("final_answer", "controller", "4")
    bad = first_turn_row('<route subtask="1" model="nobody" skill="sympy">x</route>', table, labels)
    assert bad["action"] == "malformed" and bad["error"].startswith("grammar/") and bad["worker"] == ""


@pytest.mark.slow
def test_a_saved_orchestrator_loads_back_and_answers_as_before(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    from models.orchestrator.config import GenerationSettings, ModelSpec
    from models.orchestrator.lm import base_model_folder, load_causal_lm, load_tokenizer

    torch.set_num_threads(2)
    spec = ModelSpec()
    folder = base_model_folder(spec)
    adapter = tmp_path / "adapter"
    peft_model = get_peft_model(load_causal_lm(folder, "float32", "cpu"), LoraConfig(r=4, target_modules=["q_proj"]))
    peft_model.save_pretrained(adapter)
    load_tokenizer(folder).save_pretrained(adapter)
    settings = GenerationSettings(max_new_tokens=24)
    served = ServedOrchestrator.from_files(spec, settings, adapter, POOL, BOOK, Episodes(0.01, 8))
    request = pd.DataFrame({"task": ["What is 12 * 7 + 5?", "gcd(12, 18)?"]})
    before = served.predict(request)
    assert list(before.columns) == ["action", "worker", "routes", "answer", "turn", "error"] and len(before) == 2

    again = load_servable(served.save(tmp_path / "saved"))
    assert isinstance(again, ServedOrchestrator) and again.workers == served.workers
    assert again.tags()["price_book"] == load_price_book(BOOK).version
    pd.testing.assert_frame_equal(again.predict(request), before)  # greedy: the same turns
    with pytest.raises(InputError, match="budget"):
        again.predict(pd.DataFrame({"task": ["x"], "budget": [1.0]}))
