"""The served families behind one registry (evaluation/serving): each family's servable class is
found by name, a saved servable loads through its family (servable.json from before the registry
included), and nothing but a registered family's class is ever loaded."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evaluation.servable import SERVABLE_FILE, Servable
from evaluation.serving import (FAMILY_OF_OLD_CLASS, SERVED_FAMILIES, SINGLE_TURN, load_servable, served_family,
                                served_family_of)
from evaluation.serving.single_turn import ServedRouter
from models.base import RoutingData
from models.baselines import LogisticRouter, QueryFeaturizer
from routerops.errors import InputError

CONTRACT = ("registered_name", "save", "load", "signature", "input_example", "tags", "params", "needs_encoder",
            "predict")


@pytest.fixture(scope="module")
def served() -> ServedRouter:
    queries = [f"What is {i} plus {i + 3}?" if i % 2 else f"Name the capital of country {i}." for i in range(30)]
    scores = np.array([[1.0, 0.0] if "plus" in q else [0.0, 1.0] for q in queries])
    data = RoutingData([f"q{i}" for i in range(30)], queries, ["a", "b"], scores, np.tile([1e-5, 1e-4], (30, 1)))
    model = LogisticRouter(seed=0)
    model.featurizer = QueryFeaturizer(use_embedding=False)
    return ServedRouter.from_fitted(model.fit(data), data, "test-book", embedding=None, family="logistic")


def test_every_family_names_its_servable_which_says_its_family_back():
    assert list(SERVED_FAMILIES) == ["single-turn", "mtrouter", "orchestrator", "critique"]
    for name, family in SERVED_FAMILIES.items():
        cls = family.servable()
        assert cls.served_as == name, cls
        assert cls.__module__.startswith("evaluation.serving."), cls  # one home per family
        missing = [m for m in CONTRACT if not callable(getattr(cls, m, None))]
        assert not missing, f"{cls.__name__} lacks {missing} of the Servable contract"
    with pytest.raises(KeyError, match="unknown served family 'nope'"):
        served_family("nope")


def test_a_servable_is_of_its_family_and_a_look_alike_is_of_none(served):
    assert isinstance(served, Servable)
    assert served_family_of(served) == SINGLE_TURN

    class LookAlike:
        served_as = SINGLE_TURN  # says it, but is not the family's class

    assert served_family_of(LookAlike()) is None
    assert served_family_of(object()) is None


def test_a_saved_servable_loads_through_its_family(served, tmp_path):
    directory = served.save(tmp_path / "saved")
    meta = json.loads((directory / SERVABLE_FILE).read_text())
    assert meta["served_as"] == SINGLE_TURN
    again = load_servable(directory)
    assert type(again) is ServedRouter
    queries = ["What is 4 plus 7?", "Name the capital of country 8."]
    assert list(again.predict(queries)["worker"]) == list(served.predict(queries)["worker"]) == ["a", "b"]


def test_a_servable_saved_before_the_registry_still_loads(served, tmp_path):
    """servable.json written when the class lived in evaluation/serving.py: no `served_as`, the old path."""
    directory = served.save(tmp_path / "old")
    meta = json.loads((directory / SERVABLE_FILE).read_text())
    del meta["served_as"]
    meta["class"] = "evaluation.serving:ServedRouter"
    (directory / SERVABLE_FILE).write_text(json.dumps(meta))
    assert FAMILY_OF_OLD_CLASS[meta["class"]] == SINGLE_TURN
    assert list(load_servable(directory).predict(["What is 1 plus 4?"])["worker"]) == ["a"]


@pytest.mark.parametrize("change", [{"served_as": "os"}, {"class": "os:system"}])
def test_a_servable_json_naming_no_family_is_refused_before_any_import(served, tmp_path, change):
    directory = served.save(tmp_path / "bad")
    meta = json.loads((directory / SERVABLE_FILE).read_text())
    meta.pop("served_as")
    meta.update(change)
    (directory / SERVABLE_FILE).write_text(json.dumps(meta))
    with pytest.raises(InputError, match="not a served family"):
        load_servable(directory)
