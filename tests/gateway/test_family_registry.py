"""The gateway looks every family up by name (gateway/families): one adapter per served family of
evaluation/serving, and a family added in both registries is served with no other change (what
docs/guides/add-served-family.md promises)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from evaluation.serving import CRITIQUE, ORCHESTRATOR, SERVED_FAMILIES, ServedFamily
from gateway.champion import Champion, serving_problem
from gateway.families import GATEWAY_FAMILIES, GatewayFamily, family_of, scorer_for
from gateway.routing import Estimate
from routerops.pricing import Pool, PriceBook

BOOK_OK, BOOK_OTHER = PriceBook("ok", dt.date(2026, 1, 1), {}), PriceBook("other", dt.date(2026, 1, 1), {})


def test_the_gateway_has_one_adapter_for_each_served_family():
    assert list(GATEWAY_FAMILIES) == list(SERVED_FAMILIES)
    for name, adapter in GATEWAY_FAMILIES.items():
        assert adapter.served is SERVED_FAMILIES[name]
        assert (adapter.scorer is None) != (adapter.answer is None)  # per call, or a whole episode
    assert {n for n, a in GATEWAY_FAMILIES.items() if a.runs_episodes} == {ORCHESTRATOR, CRITIQUE}


def test_an_adapter_must_say_how_it_answers():
    family = SERVED_FAMILIES[CRITIQUE]
    with pytest.raises(ValueError, match="exactly one of scorer"):
        GatewayFamily(family)


class Echo:
    """A toy servable of a new family: every worker scores its position."""

    served_as = "echo"
    family = "echo"
    workers = ["w1", "w2"]


class EchoScorer:
    family = "echo"
    workers = Echo.workers

    def __init__(self, servable, embed):
        self.servable = servable

    def is_quick(self, messages):
        return True

    def estimate(self, messages, budget_usd, turns_left):
        return Estimate(self.workers, np.array([0.25, 0.75]), "q")


def echo_problem(servable, pool, book):
    return None if book.version == "ok" else "echo refuses this book"


def test_a_family_added_in_both_registries_is_served(monkeypatch):
    assert family_of(Echo()) is None
    assert "no family the gateway serves" in serving_problem(Echo(), Pool("p", ()), BOOK_OK)
    served = ServedFamily("echo", "echo", lambda: Echo, "test family")
    monkeypatch.setitem(SERVED_FAMILIES, "echo", served)
    monkeypatch.setitem(GATEWAY_FAMILIES, "echo", GatewayFamily(served, problem=echo_problem, scorer=EchoScorer))
    assert family_of(Echo()) == "echo"
    assert isinstance(scorer_for(Echo()), EchoScorer)
    champion = Champion("router-echo", "1", Echo(), "now")
    assert champion.family == "echo" and champion.adapter.answer is None
    assert list(champion.scorer.estimate([], 1.0, 1.0).quality) == [0.25, 0.75]
    assert serving_problem(Echo(), Pool("p", ()), BOOK_OK) is None
    assert serving_problem(Echo(), Pool("p", ()), BOOK_OTHER) == "echo refuses this book"
