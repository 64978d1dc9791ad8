"""The primitive vocabulary of pool files (routerops.primitives): the shipped pools, the admissible
(model, primitive) pairs, and an InputError naming file and field for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from routerops.errors import InputError
from routerops.pricing import Pool, WorkerSpec, load_pool
from routerops.primitives import DEFAULT_PRIMITIVES

REPO = Path(__file__).resolve().parents[3]


def embedded() -> dict:
    return yaml.safe_load((REPO / "configs/pools/embedded-smollm2.yaml").read_text())


def load(tmp_path, data) -> Pool:
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_pool(path)


def test_the_embedded_pool_declares_the_five_kinds_of_primitive():
    pool = load_pool(REPO / "configs/pools/embedded-smollm2.yaml")
    runs = {name: p.run for name, p in pool.primitives.items()}
    # direct answer, chain-of-thought, verification, code execution (written or given), computer algebra
    assert runs == {"answer": "llm", "reason": "llm", "verify": "llm", "execute_python": "llm_program",
                    "python": "python", "sympy": "sympy"}
    assert pool.primitive("execute_python").runner == "python"
    assert all(p.contract for p in pool.primitives.values())


def test_flat_actions_are_unchanged_and_subtask_primitives_only_widen_the_orchestrator_s_pairs():
    pool = load_pool(REPO / "configs/pools/embedded-smollm2.yaml")
    assert pool.actions() == [("smol-direct", "answer"), ("smol-cot", "answer"), ("python", "python"),
                              ("sympy", "sympy")]
    pairs = pool.admissible_pairs()
    assert set(pool.actions()) < set(pairs)
    assert ("smol-direct", "execute_python") in pairs and ("smol-cot", "reason") in pairs
    assert {p for _, p in pairs} == set(pool.primitives)  # every declared primitive has a worker


def test_the_paper_pool_admits_reason_and_verify_on_every_model():
    pool = load_pool(REPO / "configs/paper/pool.yaml")
    assert {p for w in pool.workers for p in w.subtask_primitives} == {"reason", "verify"}
    assert all(p == "answer" for _, p in pool.actions())


def test_a_pool_without_a_vocabulary_gets_the_flat_routers_three(tmp_path):
    data = embedded()
    data.pop("primitives")
    for worker in data["workers"]:
        worker.pop("subtask_primitives", None)
    pool = load(tmp_path, data)
    assert set(pool.primitives) == set(DEFAULT_PRIMITIVES) == {"answer", "python", "sympy"}
    assert Pool("p", pool.workers).primitives == DEFAULT_PRIMITIVES  # pools built in code get the same


def test_specs_read_back_from_json_lists_equal_the_originals():
    spec = WorkerSpec(name="w", kind="llm", primitives=["answer"], subtask_primitives=["reason"])
    assert spec == WorkerSpec(name="w", kind="llm", primitives=("answer",), subtask_primitives=("reason",))


def mutate_worker(index: int, **changes):
    def apply(data: dict) -> None:
        data["workers"][index].update(changes)
    return apply


def mutate_primitive(name: str, **changes):
    def apply(data: dict) -> None:
        data["primitives"][name].update(changes)
    return apply


def drop_key(name: str, key: str):
    def apply(data: dict) -> None:
        data["primitives"][name].pop(key)
    return apply


def add_primitive(name: str, entry):
    def apply(data: dict) -> None:
        data["primitives"][name] = entry
    return apply


@pytest.mark.parametrize("change, field, words", [
    (mutate_worker(0, primitives=["answer", "dance"]), "workers[0].primitives[1]", "unknown primitive 'dance'"),
    (mutate_worker(1, subtask_primitives=["summarise"]), "workers[1].subtask_primitives[0]", "unknown primitive"),
    (mutate_worker(0, subtask_primitives=["answer"]), "workers[0].subtask_primitives[0]", "listed twice"),
    (mutate_worker(2, subtask_primitives=["reason"]), "workers[2].subtask_primitives[0]", "runs on a llm worker"),
    (mutate_worker(0, subtask_primitives=["sympy"]), "workers[0].subtask_primitives[0]", "runs on a sympy worker"),
    (mutate_worker(0, subtask_primitives="verify"), "workers[0].subtask_primitives", "expected a list"),
    (mutate_primitive("reason", run="think"), "primitives.reason.run", "is not one of"),
    (drop_key("verify", "run"), "primitives.verify.run", "missing"),
    (mutate_primitive("execute_python", runner="sympy"), "primitives.execute_python.runner", "not a python worker"),
    (drop_key("execute_python", "runner"), "primitives.execute_python.runner", "missing"),
    (mutate_primitive("reason", runner="python"), "primitives.reason.runner", "only an llm_program"),
    (mutate_primitive("python", instruction="Be careful."), "primitives.python.instruction", "runs its input as given"),
    (mutate_primitive("reason", max_tokens=0), "primitives.reason.max_tokens", "positive integer"),
    (mutate_primitive("reason", temperature=0.3), "primitives.reason.temperature", "unknown key"),
    (mutate_primitive("verify", contract=3), "primitives.verify.contract", "expected text"),
    (add_primitive("Deep Think", {"run": "llm"}), "primitives.Deep Think", "lower-case word"),
    (add_primitive("plan", "llm"), "primitives.plan", "expected a mapping"),
])
def test_a_bad_vocabulary_names_the_file_and_the_field(tmp_path, change, field, words):
    data = embedded()
    change(data)
    with pytest.raises(InputError) as err:
        load(tmp_path, data)
    assert err.value.field == field and words in err.value.problem
    assert str(tmp_path / "pool.yaml") in str(err.value)


def test_an_empty_vocabulary_is_refused(tmp_path):
    data = embedded()
    data["primitives"] = {}
    with pytest.raises(InputError, match="primitives"):
        load(tmp_path, data)
