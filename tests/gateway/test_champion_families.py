"""The gateway serves every champion family: MTRouter (paper 000) and the orchestrator (paper 004)
beside the single-turn routers of test_gateway.py, through the official openai client, the real
llama.cpp server (SmolLM2) and a real MLflow registry (tests/gateway/conftest.py).

The MTRouter is trained on replayed episodes (routerops.envs.replay: every call is answered from a
logged-outcome table, so the episodes are deterministic) over the pool's two LLM workers. The
orchestrator is the real SmolLM2 controller with a real, untrained LoRA adapter (as in
tests/evaluation/test_orchestra_serving.py) under a two-turn limit: what it writes is not asserted,
only what the gateway makes of its episode (usage, costs, budget, decision log).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import logging
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import openai  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from evaluation.serving.mtrouter import ServedMTRouter  # noqa: E402
from evaluation.registry import CHAMPION_ALIAS, register  # noqa: E402
from gateway.app import Gateway, GatewayConfig  # noqa: E402
from gateway.champion import serving_problem  # noqa: E402
from gateway.families.mtrouter import chat_episode  # noqa: E402
from gateway.store import period_start, read_decisions  # noqa: E402
from models.mtrouter.config import MTRouterConfig  # noqa: E402
from models.mtrouter.history import Interaction  # noqa: E402
from models.mtrouter.router import MTRouter  # noqa: E402
from routerops.envs.replay import ReplayEnvironment, replay_tasks, replay_workers  # noqa: E402
from routerops.policies import RandomMultiTurnPolicy, SinglePolicy  # noqa: E402
from routerops.pricing import Price, PriceBook, WorkerSpec, load_pool, load_price_book  # noqa: E402
from routerops.rollout import collect_sync  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
POOL_FILE, BOOK_FILE = REPO / "configs" / "pools" / "embedded-smollm2.yaml", REPO / "configs" / "prices" / "current.yaml"
POOL, BOOK = load_pool(POOL_FILE), load_price_book(BOOK_FILE)
WORKERS = ["smol-direct", "smol-cot"]
MT_NAME = "mtrouter-gw-test"
ORCHESTRATOR = "orchestrator"
CFG = MTRouterConfig(encoder_kind="hashing", hashing_dim=256, hidden_dims=(32,), attr_embed_dim=8, residual_dim=4,
                     model_embed_dim=8, max_epochs=40, patience=5, disk_cache=False, surface_features=False,
                     expected_episode_length=1.0)
COUNTRIES = ["France", "Japan", "Kenya", "Peru", "Canada", "Egypt", "Norway", "Chile"]
TWO_TURNS = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": "What is 17 plus 25?"},
             {"role": "assistant", "content": "43"},
             {"role": "user", "content": "That is not right. Try again."}]
MAX_TOKENS = 8
TASK = "What is 12 * 7 + 5?"

pytestmark = pytest.mark.slow


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)


def set_champion(name: str, version: str) -> None:
    import mlflow

    mlflow.MlflowClient().set_registered_model_alias(name, CHAMPION_ALIAS, version)


async def wait_for(condition, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------- a chat as MTRouter's history


def test_a_chat_maps_to_the_task_and_action_observation_pairs():
    task, history = chat_episode(TWO_TURNS + [{"role": "assistant", "content": "42"},
                                              {"role": "tool", "content": "checked: 42"},
                                              {"role": "user", "content": "Thanks."}])
    assert task == "What is 17 plus 25?"  # the system message is not part of h_t
    assert history == [Interaction("43", "That is not right. Try again."), Interaction("42", "checked: 42\nThanks.")]
    assert chat_episode(TWO_TURNS[:2]) == ("What is 17 plus 25?", [])


def test_a_servable_of_no_served_family_is_refused_with_a_reason():
    assert "no family the gateway serves" in serving_problem(object(), POOL, BOOK)


# ---------------------------------------------------------------- MTRouter


def logged_outcomes(n: int = 48) -> pd.DataFrame:
    """Arithmetic is solved only by smol-direct, capitals only by smol-cot."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        arith = i % 2 == 0
        query = (f"What is {rng.integers(10, 999)} plus {rng.integers(10, 999)}?" if arith
                 else f"Which city is the capital of {COUNTRIES[i % len(COUNTRIES)]}?")
        for worker in WORKERS:
            rows.append({"dataset": "synthetic", "query_id": f"q{i:03d}", "query": query, "worker": worker,
                         "score": float((worker == "smol-direct") == arith), "prompt_tokens": 30,
                         "completion_tokens": 8 if worker == "smol-direct" else 60, "response": f"{worker} {i}",
                         "split": "val" if i % 4 == 3 else "train"})
    return pd.DataFrame(rows)


def fit_mtrouter(tmp: Path, extra_worker: WorkerSpec | None = None) -> ServedMTRouter:
    """MTRouter over the pool's LLM workers (plus `extra_worker`, never logged) fitted on replayed
    episodes of the single-worker policies and a random multi-turn router."""
    frame = logged_outcomes()
    tasks = replay_tasks(frame)
    policies = [SinglePolicy(w, "answer", turns=1) for w in WORKERS] + [RandomMultiTurnPolicy(stop_prob=0.5, seed=0)]
    episodes, turns = collect_sync(tasks, policies, env=ReplayEnvironment(frame), workers=replay_workers(frame),
                                   book=BOOK, budget_usd=1.0, turn_limit=2, out_dir=tmp, run_id="gw-mtrouter",
                                   seed=0, concurrency=4, progress=False)
    specs = tuple(w for w in POOL.workers if w.name in WORKERS) + ((extra_worker,) if extra_worker else ())
    book = BOOK if extra_worker is None else dataclasses.replace(
        BOOK, prices={**BOOK.prices, extra_worker.name: Price(30.0, 60.0)})
    pool = dataclasses.replace(POOL, name="gw-llms", workers=specs)
    router = MTRouter(pool, book, CFG).fit(episodes, turns, {t.task_id: t.prompt for t in tasks})
    return ServedMTRouter(router, suite="gw-test")


@pytest.fixture(scope="module")
def mtrouter(mlflow_registry, tmp_path_factory):
    served = fit_mtrouter(tmp_path_factory.mktemp("episodes"))
    registered = register(served, include_code=False)
    assert registered.name == MT_NAME
    set_champion(MT_NAME, registered.version)
    return served, registered


@pytest.fixture(scope="module")
def mt_gateway(llm_url, mtrouter, serve_gateway, tmp_path_factory):
    db = tmp_path_factory.mktemp("gateway") / "gateway.db"
    cfg = GatewayConfig(routers=(MT_NAME,), db_url=f"sqlite:///{db}", local_base_url=llm_url, watch_interval_s=0.2,
                        log_texts=True)
    gw = Gateway(cfg, POOL, BOOK)
    return gw, serve_gateway(gw)


def test_an_mtrouter_champion_answers_a_two_turn_conversation(mt_gateway, mtrouter):
    gw, url = mt_gateway
    served, registered = mtrouter
    key, info = gw.store.create_key(1.0, "day")
    raw = client(url, key).chat.completions.with_raw_response.create(
        model=f"router:{MT_NAME}", messages=TWO_TURNS, max_tokens=MAX_TOKENS, extra_body={"explain": True})
    completion = raw.parse()
    worker = raw.headers["x-routerops-worker"]
    assert completion.choices[0].message.content.strip() and worker in WORKERS
    cost = float(raw.headers["x-routerops-cost-usd"])
    assert cost == pytest.approx(BOOK.cost(worker, completion.usage.prompt_tokens, completion.usage.completion_tokens),
                                 rel=1e-6) and cost > 0
    explained = completion.model_extra["routerops"]["explanation"]
    assert explained["family"] == "mtrouter" and explained["router_version"] == registered.version
    # the explanation's qualities are MTRouter's ŝ(h_t, a) for h_t = [task, ⟨"43", "That is not right…"⟩]
    history = json.dumps([{"action": "43", "observation": "That is not right. Try again."}])
    expected = served.predict(pd.DataFrame({"task": ["What is 17 plus 25?"], "history": [history]}))
    scores = {c["worker"]: c["quality"] for c in explained["candidates"]}
    assert scores == pytest.approx({w: float(expected[f"score:{w}"][0]) for w in WORKERS})
    assert worker == explained["chosen"] == max(scores, key=scores.get)  # λ = 0, both affordable: argmax ŝ
    assert raw.headers["x-routerops-scores"] == ",".join(f"{w}={scores[w]:.4f}" for w in WORKERS)
    spent, reserved = gw.store.spend(info.key_id, period_start("day"))
    assert spent == pytest.approx(cost, abs=1e-9) and reserved == 0
    logged = read_decisions(gw.cfg.db_url).set_index("decision_id").loc[completion.model_extra["routerops"]["decision_id"]]
    assert logged.query.startswith("[Task]\nWhat is 17 plus 25?") and "[Turn 1] Action: 43" in logged.query  # h_t


def test_mtrouter_stop_is_answered_like_an_unaffordable_request(mt_gateway):
    gw, url = mt_gateway
    key, _ = gw.store.create_key(1.0, "day")
    with pytest.raises(openai.RateLimitError, match="MTRouter says STOP: no turns left"):
        client(url, key).chat.completions.create(model=f"router:{MT_NAME}", messages=TWO_TURNS,
                                                 max_tokens=MAX_TOKENS, extra_body={"turns_left": 0})
    models = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}).json()["data"]
    assert models[0]["routerops"]["family"] == "mtrouter" and models[0]["routerops"]["workers"] == WORKERS


def test_an_mtrouter_routing_outside_the_pool_is_refused_and_logged_then_a_fit_one_swaps_in(
        mt_gateway, mtrouter, caplog, tmp_path):
    gw, _ = mt_gateway
    outsider = WorkerSpec(name="gpt-9", kind="llm", primitives=("answer",), model="gpt-9",
                          attributes=dict(POOL.worker("smol-cot").attributes))
    misfit = register(fit_mtrouter(tmp_path, outsider), include_code=False)
    with caplog.at_level(logging.WARNING, logger="gateway.champion"):
        set_champion(MT_NAME, misfit.version)
        asyncio.run(wait_for(lambda: gw.champions.refusals[MT_NAME]))
    refusal = gw.champions.refusals[MT_NAME][0]
    assert refusal["version"] == misfit.version and "'gpt-9'" in refusal["reason"] and "no LLM endpoint" in refusal["reason"]
    assert any(misfit.version in r.getMessage() and refusal["reason"] in r.getMessage() for r in caplog.records)
    assert gw.champions.current(MT_NAME).version == mtrouter[1].version  # the old champion keeps serving
    again = register(mtrouter[0], include_code=False)  # a fitting new version is swapped in
    set_champion(MT_NAME, again.version)
    asyncio.run(wait_for(lambda: gw.champions.current(MT_NAME).version == again.version))


# ---------------------------------------------------------------- the orchestrator


def teacher_conversation(limits) -> list[dict[str, str]]:
    """One 004-grammar episode for TASK, opened exactly as the gateway's executor opens it: route the
    task to smol-direct, then verify and answer from its observation."""
    from routerops.orchestra.executor import ExecutorConfig, opening, worker_labels

    config = ExecutorConfig(budget_usd=limits.budget_usd, turn_limit=limits.turn_limit, prompt=limits.prompt)
    _, messages = opening(POOL, BOOK, config, TASK, worker_labels(POOL, False, None))
    plan = (f'<plan round="1">\n<subtask id="1" depends_on="">{TASK}</subtask>\n</plan>\n'
            f'<route subtask="1" model="smol-direct" skill="answer">{TASK}</route>')
    return messages + [
        {"role": "assistant", "content": plan},
        {"role": "user", "content": '<obs subtask="1"> 89 </obs>'},
        {"role": "assistant", "content": "<verify>\nThe worker's result answers the task.\n</verify>\n"
                                         "<final_answer> 89 </final_answer>"}]


@pytest.fixture(scope="module")
def orchestrator(mlflow_registry, tmp_path_factory):
    """A tiny trained orchestrator, registered as champion: SmolLM2's LoRA adapter fitted by the SFT
    stage (models/orchestrator/sft.py) on one teacher episode for six steps (~1 min on two cores),
    enough for its greedy turns on TASK to follow the grammar and route a real worker."""
    import torch

    from evaluation.serving.orchestra import Episodes, ServedOrchestrator
    from models.orchestrator.config import GenerationSettings, ModelSpec, OrchestraConfig, SFTSettings
    from models.orchestrator.sft import train_sft

    torch.set_num_threads(2)
    tmp = tmp_path_factory.mktemp("controller")
    limits = Episodes(budget_usd=0.01, turn_limit=3, prompt="compact")
    (tmp / "teacher.jsonl").write_text(json.dumps({"task_id": "t0", "messages": teacher_conversation(limits)}) + "\n")
    run = OrchestraConfig(sft=SFTSettings(learning_rate=3e-3, warmup_steps=0, max_steps=6, batch_size=1,
                                          max_seq_len=1024, lora_dropout=0.0, save_steps=6, logging_steps=1))
    trained = train_sft(run, tmp / "teacher.jsonl", tmp / "sft")
    served = ServedOrchestrator.from_files(ModelSpec(), GenerationSettings(max_new_tokens=96), trained.adapter_dir,
                                           POOL_FILE, BOOK_FILE, limits)
    registered = register(served, include_code=False)
    set_champion(ORCHESTRATOR, registered.version)
    return served, registered


@pytest.fixture(scope="module")
def orchestra_gateway(llm_url, orchestrator, serve_gateway, tmp_path_factory):
    db = tmp_path_factory.mktemp("gateway") / "gateway.db"
    cfg = GatewayConfig(routers=(ORCHESTRATOR,), db_url=f"sqlite:///{db}", local_base_url=llm_url,
                        watch_interval_s=0.2)
    gw = Gateway(cfg, POOL, BOOK)
    return gw, serve_gateway(gw)


def test_an_orchestrator_champion_answers_with_the_episode_usage_and_costs(orchestra_gateway, orchestrator):
    gw, url = orchestra_gateway
    served, registered = orchestrator
    key, info = gw.store.create_key(1.0, "day")
    raw = client(url, key).chat.completions.with_raw_response.create(
        model=f"router:{ORCHESTRATOR}", messages=[{"role": "user", "content": TASK}], extra_body={"explain": True})
    completion = raw.parse()
    extra = completion.model_extra["routerops"]
    explained = extra["explanation"]
    calls = explained["calls"]
    assert explained["family"] == "orchestrator" and extra["router_version"] == registered.version
    assert calls[0]["actor"] == "controller" and calls[0]["worker"] == ORCHESTRATOR
    assert len([c for c in calls if c["actor"] == "controller"]) <= 3  # the controller's T_max
    # its first turn routed the task to the real smol-direct (llama.cpp), blind, as one subtask
    routed = [c for c in calls if c["actor"] == "worker"]
    assert [(c["worker"], c["primitive"], c["subtask_id"]) for c in routed] == [("smol-direct", "answer", "1")]
    assert routed[0]["completion_tokens"] > 0 and routed[0]["cost_usd"] == pytest.approx(
        BOOK.cost("smol-direct", routed[0]["prompt_tokens"], routed[0]["completion_tokens"]))
    assert explained["cost_share"]["smol-direct"] > 0
    # usage and cost are the episode's calls summed; the reservation was the episode's budget
    assert completion.usage.prompt_tokens == sum(c["prompt_tokens"] for c in calls) > 0
    assert completion.usage.completion_tokens == sum(c["completion_tokens"] for c in calls) > 0
    cost = float(raw.headers["x-routerops-cost-usd"])
    assert cost == pytest.approx(sum(c["cost_usd"] for c in calls), abs=1e-9) and 0 < cost <= 0.01
    assert float(raw.headers["x-routerops-reserved-usd"]) == pytest.approx(0.01)  # min(B, the key's $1)
    assert raw.headers["x-routerops-calls"] == ",".join(c["worker"] for c in calls)
    assert explained["ended_by"] == "done" and completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.content.strip()  # the controller's <final_answer>
    spent, reserved = gw.store.spend(info.key_id, period_start("day"))
    assert spent == pytest.approx(cost, abs=1e-9) and reserved == 0
    record = httpx.get(f"{url}/decisions/{extra['decision_id']}", headers={"Authorization": f"Bearer {key}"}).json()
    assert record["explanation"]["calls"] == calls and record["cost_usd"] == pytest.approx(cost)
    logged = read_decisions(gw.cfg.db_url)
    assert (logged.decision_id == extra["decision_id"]).sum() == 1


def test_an_orchestrator_streams_its_answer_as_one_chunk_and_respects_a_small_budget(orchestra_gateway):
    gw, url = orchestra_gateway
    key, info = gw.store.create_key(1.0, "day")
    with client(url, key).chat.completions.with_streaming_response.create(
            model=f"router:{ORCHESTRATOR}", messages=[{"role": "user", "content": "gcd(12, 18)?"}],
            stream=True) as raw:
        chunks = list(raw.parse())
    assert len(chunks) == 2 and chunks[0].choices and not chunks[1].choices
    final = chunks[1].model_extra["routerops"]
    spent, _ = gw.store.spend(info.key_id, period_start("day"))
    assert final["cost_usd"] == pytest.approx(spent, abs=1e-9) and chunks[1].usage.total_tokens > 0

    models = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}).json()["data"]
    assert models[0]["routerops"]["family"] == "orchestrator" and "sympy" in models[0]["routerops"]["workers"]

    tiny, _ = gw.store.create_key(1e-7, "day")  # below the controller's first turn
    with pytest.raises(openai.RateLimitError, match="first turn may cost"):
        client(url, tiny).chat.completions.create(model=f"router:{ORCHESTRATOR}",
                                                  messages=[{"role": "user", "content": "1 + 1?"}])


def pool_with_an_outsider(tmp: Path) -> tuple[Path, Path]:
    """The pool and price book files plus `gpt-9`, a worker the gateway's pool does not have."""
    import yaml

    pool, book = yaml.safe_load(POOL_FILE.read_text()), yaml.safe_load(BOOK_FILE.read_text())
    pool["workers"].append({"name": "gpt-9", "kind": "llm", "endpoint": "http://127.0.0.1:9/v1", "model": "gpt-9",
                            "primitives": ["answer"], "attributes": {"context_limit": 8192}})
    book["prices"]["gpt-9"] = {"input_per_1m": 30.0, "output_per_1m": 60.0}
    (tmp / "pool.yaml").write_text(yaml.safe_dump(pool))
    (tmp / "prices.yaml").write_text(yaml.safe_dump(book))
    return tmp / "pool.yaml", tmp / "prices.yaml"


def test_an_orchestrator_champion_hot_swaps_and_a_misfit_is_refused_and_logged(orchestra_gateway, orchestrator,
                                                                                 caplog, tmp_path):
    from evaluation.serving.orchestra import ServedOrchestrator

    gw, url = orchestra_gateway
    served, first = orchestrator
    second = register(served, include_code=False)  # the same controller, a new version
    set_champion(ORCHESTRATOR, second.version)
    asyncio.run(wait_for(lambda: gw.champions.current(ORCHESTRATOR).version == second.version))

    pool_file, book_file = pool_with_an_outsider(tmp_path)
    misfit = register(ServedOrchestrator.from_files(served.spec, served.controller.settings, served.adapter, pool_file,
                                                    book_file, served.limits), include_code=False)
    with caplog.at_level(logging.WARNING, logger="gateway.champion"):
        set_champion(ORCHESTRATOR, misfit.version)
        asyncio.run(wait_for(lambda: gw.champions.refusals[ORCHESTRATOR]))
    refusal = gw.champions.refusals[ORCHESTRATOR][0]
    assert refusal["version"] == misfit.version and "('gpt-9', 'answer')" in refusal["reason"]
    assert any(refusal["reason"] in r.getMessage() for r in caplog.records)
    assert gw.champions.current(ORCHESTRATOR).version == second.version  # still serving the last good one
    key, _ = gw.store.create_key(1.0, "day")
    models = httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}).json()["data"]
    assert models[0]["routerops"]["version"] == second.version
    assert models[0]["routerops"]["refused"][0]["version"] == misfit.version
    set_champion(ORCHESTRATOR, first.version)


def test_an_orchestrator_whose_routes_the_pool_lacks_is_refused(orchestrator):
    served, _ = orchestrator
    no_sympy = dataclasses.replace(POOL, name="no-sympy", workers=tuple(w for w in POOL.workers if w.name != "sympy"))
    assert "('sympy', 'sympy')" in serving_problem(served, no_sympy, BOOK) and "no-sympy" in serving_problem(
        served, no_sympy, BOOK)
    unpriced = PriceBook("no-controller", dt.date(2026, 11, 1), {k: v for k, v in BOOK.prices.items() if k != ORCHESTRATOR})
    assert "controller 'orchestrator'" in serving_problem(served, POOL, unpriced)
    assert serving_problem(served, POOL, BOOK) is None
