"""The gateway serves the LM critique-and-route controller (paper 002) as the `critique` family, end
to end at tiny scale: a real SmolLM2 controller whose LoRA adapter the SFT stage fitted in a few steps
to reject (Template II: False, route to the stronger agent), registered in a real MLflow registry and
served through the official openai client over the real llama.cpp workers (tests/gateway/conftest.py).
The weak agent drafts, the controller says False, the strong agent answers; the explanation shows the
verdict and both calls."""

from __future__ import annotations

import json
from pathlib import Path
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import openai  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from evaluation.registry import CHAMPION_ALIAS, register  # noqa: E402
from gateway.app import Gateway, GatewayConfig  # noqa: E402
from gateway.champion import serving_problem  # noqa: E402
from gateway.families import CRITIQUE, family_of  # noqa: E402
from gateway.store import period_start  # noqa: E402
from routerops.pricing import load_pool, load_price_book  # noqa: E402
from tests.gateway.test_champion_families import BOOK_FILE, POOL_FILE  # noqa: E402

POOL, BOOK = load_pool(POOL_FILE), load_price_book(BOOK_FILE)
WEAK, STRONG = "smol-direct", "smol-cot"
NAME = "critique-lm"
TASK = "What is 12 * 7 + 5?"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def critique_champion(mlflow_registry, tmp_path_factory):
    import mlflow
    import torch

    from evaluation.serving.critique import ServedCritique
    from models.critique.lm_config import PromptSettings
    from models.critique.lm_prompts import tail_tokens, verification_target, verify_messages
    from models.orchestrator.config import GenerationSettings, ModelSpec, OrchestraConfig, SFTSettings
    from models.orchestrator.sft import train_sft

    torch.set_num_threads(2)
    tmp = tmp_path_factory.mktemp("critique-controller")
    prompts = PromptSettings(template="short", draft_tail_tokens=32)
    rows = []
    for i, draft in enumerate(["12 * 7 = 84, 84 + 5 = 89", "The answer is 91.", "Let me think. 12 * 7 + 5 = 88"]):
        messages = verify_messages(TASK, [WEAK, STRONG], 0, tail_tokens(draft, 32), prompts.template)
        rows.append({"task_id": f"t{i}", "messages": messages + [
            {"role": "assistant", "content": verification_target("check", False, STRONG)}]})
    (tmp / "warmup.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = OrchestraConfig(sft=SFTSettings(learning_rate=3e-3, warmup_steps=0, max_steps=6, batch_size=1,
                                          max_seq_len=512, save_steps=6, logging_steps=1))
    trained = train_sft(run, tmp / "warmup.jsonl", tmp / "sft")
    served = ServedCritique.from_files(ModelSpec(), GenerationSettings(max_new_tokens=40), trained.adapter_dir,
                                       [WEAK, STRONG], [WEAK, STRONG], prompts)
    assert family_of(served) == CRITIQUE and serving_problem(served, POOL, BOOK) is None
    registered = register(served, include_code=False)
    mlflow.MlflowClient().set_registered_model_alias(NAME, CHAMPION_ALIAS, registered.version)
    return served, registered


def test_the_servable_predicts_a_verdict_and_a_route(critique_champion):
    served, _ = critique_champion
    out = served.predict(pd.DataFrame({"task": [TASK], "draft": ["The answer is 91."], "author": [WEAK]}))
    assert list(out.columns) == ["action", "worker", "verdict", "turn", "error", "p_false"]
    assert (out.action[0], out.verdict[0], out.worker[0]) == ("reject", "False", STRONG), out.turn[0]
    assert out.p_false[0] == ""  # greedy: no threshold, no p(False)


def test_a_fitted_threshold_decides_the_verdict_and_travels_with_the_artifact(critique_champion, tmp_path):
    """The same weights at τ = 1 never reject (p(False) > 1 is impossible: the turn ends after True,
    though this controller was trained only to reject) and at τ just above 0 always do; each verdict
    reports its p(False); save → load keeps τ."""
    from evaluation.serving.critique import ServedCritique

    served, _ = critique_champion
    draft = pd.DataFrame({"task": [TASK, TASK], "draft": ["The answer is 91.", "12 * 7 = 84, 84 + 5 = 89"],
                          "author": [WEAK, WEAK]})
    lenient = served.with_threshold(1.0)
    out = lenient.predict(draft)
    assert list(out.action) == ["accept", "accept"] and list(out.worker) == ["", ""], list(out.turn)
    assert list(out.verdict) == ["True", "True"]
    p = [float(x) for x in out.p_false]
    assert all(0.5 < x <= 1.0 for x in p), p  # the SFT taught False: greedy rejects, τ = 1 overrules it
    strict = served.with_threshold(1e-6)
    out = strict.predict(draft)
    assert list(out.action) == ["reject", "reject"] and list(out.worker) == [STRONG, STRONG]
    assert [float(x) for x in out.p_false] == pytest.approx(p, abs=1e-5)  # same weights, same p(False)
    again = served.predict(draft.iloc[:1])  # the copies share its weights, not their verdict rule
    assert (again.action[0], again.p_false[0]) == ("reject", "")
    loaded = ServedCritique.load(lenient.save(tmp_path / "saved"))
    assert loaded.verdict_threshold == 1.0 and loaded.tags()["verdict"] == "p(False) > 1"
    assert list(loaded.predict(draft.iloc[:1]).action) == ["accept"]


def test_a_critique_champion_escalates_when_the_controller_says_false(critique_champion, llm_url, serve_gateway,
                                                                      tmp_path):
    _, registered = critique_champion
    cfg = GatewayConfig(routers=(NAME,), db_url=f"sqlite:///{tmp_path / 'gw.db'}", local_base_url=llm_url,
                        watch_interval_s=0.2)
    gw = Gateway(cfg, POOL, BOOK)
    url = serve_gateway(gw)
    key, info = gw.store.create_key(1.0, "day")
    raw = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=300).chat.completions.with_raw_response.create(
        model=f"router:{NAME}", messages=[{"role": "user", "content": TASK}], max_tokens=16, extra_body={"explain": True})
    completion = raw.parse()
    extra = completion.model_extra["routerops"]
    explained = extra["explanation"]
    assert explained["family"] == CRITIQUE and extra["router_version"] == registered.version
    assert [c["worker"] for c in explained["calls"]] == [WEAK, STRONG]  # the draft, then the escalation
    assert explained["verdicts"][0]["verdict"] == "False" and explained["verdicts"][0]["escalate_to"] == STRONG
    assert explained["verdicts"][0]["threshold"] is None and explained["verdicts"][0]["p_false"] is None  # greedy
    assert raw.headers["x-routerops-calls"] == f"{WEAK},{STRONG}" and raw.headers["x-routerops-worker"] == STRONG
    cost = float(raw.headers["x-routerops-cost-usd"])
    assert cost == pytest.approx(sum(BOOK.cost(c["worker"], c["prompt_tokens"], c["completion_tokens"])
                                     for c in explained["calls"]), abs=1e-12) and cost > 0
    assert completion.usage.completion_tokens == sum(c["completion_tokens"] for c in explained["calls"]) > 0
    spent, reserved = gw.store.spend(info.key_id, period_start("day"))
    assert spent == pytest.approx(cost, abs=1e-9) and reserved == 0


def test_the_gateway_decides_at_the_champion_s_fitted_threshold(critique_champion, llm_url, serve_gateway, tmp_path):
    """A champion registered with τ = 1 accepts the weak draft the greedy champion rejected: one call,
    the verdict True with its p(False) and τ in the explanation."""
    import mlflow

    served, _ = critique_champion
    registered = register(served.with_threshold(1.0), include_code=False)
    mlflow.MlflowClient().set_registered_model_alias(NAME, CHAMPION_ALIAS, registered.version)
    cfg = GatewayConfig(routers=(NAME,), db_url=f"sqlite:///{tmp_path / 'gw.db'}", local_base_url=llm_url,
                        watch_interval_s=0.2)
    gw = Gateway(cfg, POOL, BOOK)
    key, _ = gw.store.create_key(1.0, "day")
    completion = openai.OpenAI(base_url=serve_gateway(gw), api_key=key, max_retries=0, timeout=300).chat.completions.create(
        model=f"router:{NAME}", messages=[{"role": "user", "content": TASK}], max_tokens=16, extra_body={"explain": True})
    explained = completion.model_extra["routerops"]["explanation"]
    assert explained["router_version"] == registered.version
    assert [c["worker"] for c in explained["calls"]] == [WEAK]
    verdict = explained["verdicts"][0]
    assert (verdict["verdict"], verdict["escalate_to"], verdict["threshold"]) == ("True", "", 1.0)
    assert 0.5 < verdict["p_false"] <= 1.0


def test_registration_goes_through_the_promotion_gate_on_validation_queries(critique_champion, tmp_path):
    """register_critique_lm judges the candidate on the fixed split's validation queries (never the
    test ones) and runs the paired gate against the champion, whose pool differs here (smol workers
    vs RouteLLM's Mixtral / GPT-4): the gate says so and the candidate replaces it."""
    import mlflow

    from evaluation.critique_lm import register_critique_lm
    from models.critique.lm_config import critique_lm_config

    served, first = critique_champion
    cfg = critique_lm_config({"generation": {"max_new_tokens": 40}})
    REPO = Path(__file__).resolve().parents[2]
    registered, decision = register_critique_lm(cfg, REPO, served.adapter, val_queries=2, n_boot=100, fit_queries=3)
    assert registered.name == NAME and int(registered.version) > int(first.version)
    assert decision.promote and "cannot route this pool" in decision.reason
    assert len(decision.evidence["gate_ids"]) == 2
    # The verdict threshold was fitted on 3 other validation queries and registered with the controller.
    logged = mlflow.MlflowClient().get_run(registered.run_id).data
    assert logged.metrics["verdict_fit_queries"] == 3 and 0 < logged.metrics["verdict_threshold"] <= 1
    assert logged.params["verdict_threshold"] == str(logged.metrics["verdict_threshold"])
