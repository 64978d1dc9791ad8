"""Replay endpoints: a logged-outcome table answered over the OpenAI chat API. The app is tested in
process (starlette's TestClient) on a hand-written table; one slow test starts the real server as a
subprocess through a pool file and calls it with the project's LLMWorker."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from routerops.envs.replay import import_routellm_gsm8k, write_logged_outcomes
from routerops.errors import InputError
from routerops.workers.replay_endpoint import ReplayBook, create_app, load_replay_table

REPO = Path(__file__).resolve().parents[3]
QUERIES = {"q1": "A farmer has  3 cows and buys 2 more. How many cows?",
           "q2": "What is 7 times 6?",
           "q3": "What is 7 times 6? Then add 1."}
RESPONSES = {("q1", "weak"): "3 + 2 = 5. The answer is 5.", ("q1", "strong"): "He has 3 + 2 = 5 cows.\n#### 5",
             ("q2", "weak"): "7 * 6 = 48", ("q2", "strong"): "7 * 6 = 42\n#### 42",
             ("q3", "weak"): "43", ("q3", "strong"): "7 * 6 + 1 = 43\n#### 43"}


def tiny_table(tmp_path: Path, with_response: bool = True, name: str = "tiny.csv") -> Path:
    rows = [{"dataset": "toy", "query_id": q, "query": text, "worker": w, "score": 1.0,
             "prompt_tokens": 10 + i, "completion_tokens": 3 * (i + 1) + (w == "strong"),
             **({"response": RESPONSES[(q, w)]} if with_response else {})}
            for i, (q, text) in enumerate(QUERIES.items()) for w in ("weak", "strong")]
    path = tmp_path / name
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.fixture
def client(tmp_path):
    return TestClient(create_app(ReplayBook.from_path(tiny_table(tmp_path))))


def chat(client, model: str, content: str, **extra):
    return client.post("/v1/chat/completions", json={"model": model, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": content}], **extra})


def test_a_known_query_is_answered_with_the_logged_response_and_token_counts(client):
    answer = chat(client, "strong", QUERIES["q2"])
    assert answer.status_code == 200
    body = answer.json()
    assert body["choices"][0]["message"]["content"] == RESPONSES[("q2", "strong")]
    assert body["choices"][0]["finish_reason"] == "stop" and body["model"] == "strong"
    assert body["usage"]["prompt_tokens"] == 11 and body["usage"]["completion_tokens"] == 7
    assert answer.headers["x-replay-query-id"] == "q2"
    # Each worker answers with its own log: the weak one's wrong answer, not the strong one's.
    assert chat(client, "weak", QUERIES["q2"]).json()["choices"][0]["message"]["content"] == "7 * 6 = 48"


def test_the_query_is_found_with_other_whitespace_in_a_fewshot_prompt_and_before_more_text(client):
    rewrapped = "A farmer has 3 cows and\nbuys 2 more.  How many cows?  "  # the log has a double space
    assert chat(client, "weak", rewrapped).json()["choices"][0]["message"]["content"] == RESPONSES[("q1", "weak")]
    fewshot = "Question: What is 1+1?\nAnswer: 2\n\nQuestion: What is 7 times 6?\nAnswer:"
    assert chat(client, "strong", fewshot).json()["choices"][0]["message"]["content"] == RESPONSES[("q2", "strong")]
    # A later turn (the question, then a summary or a critique): the longest logged query it starts with.
    later = QUERIES["q3"] + "\n\nPrevious answer: 42. Give the final answer."
    assert chat(client, "strong", later).json()["usage"]["completion_tokens"] == 10
    assert chat(client, "strong", QUERIES["q2"] + "x").status_code == 404  # not a word boundary: no match


def test_an_unknown_query_is_a_404_naming_the_worker_never_an_answer(client):
    answer = chat(client, "weak", "What is the capital of France?")
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert "'weak'" in error["message"] and "What is the capital of France?" in error["message"]
    assert error["code"] == "query_not_logged" and "choices" not in answer.json()


def test_an_unknown_model_is_a_404_naming_the_tables_workers(client):
    answer = chat(client, "gpt-5", QUERIES["q1"])
    assert answer.status_code == 404
    assert "weak, strong" in answer.json()["error"]["message"]
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["weak", "strong"]


def test_streaming_chunks_reassemble_the_response_and_end_with_usage(client):
    with client.stream("POST", "/v1/chat/completions", json={
            "model": "strong", "messages": [{"role": "user", "content": QUERIES["q1"]}], "stream": True,
            "stream_options": {"include_usage": True}}) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in answer.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == RESPONSES[("q1", "strong")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"


def test_max_tokens_below_the_logged_completion_cuts_it_and_counts_the_cap(client):
    body = chat(client, "strong", QUERIES["q3"], max_tokens=5).json()  # logged: 10 tokens
    text = body["choices"][0]["message"]["content"]
    assert RESPONSES[("q3", "strong")].startswith(text) and len(text) < len(RESPONSES[("q3", "strong")])
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5


def test_a_table_without_responses_is_refused_naming_the_file_and_the_column(tmp_path, capsys):
    from cli.main import main

    path = tiny_table(tmp_path, with_response=False)
    with pytest.raises(InputError, match="response") as refused:
        load_replay_table(path)
    assert str(path) in str(refused.value)
    assert main(["replay", "serve", "--table", str(path), "--port", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "'response'" in err and "column missing" in err


def test_the_routellm_table_answers_its_fewshot_prompt_and_its_bare_question(tmp_path):
    table = import_routellm_gsm8k(REPO / "datasets/routellm/gsm8k_responses.csv",
                                  REPO / "datasets/routellm/gsm8k_contaminated_prompts.jsonl",
                                  train_path=REPO / "datasets/gsm8k/train_first8.jsonl",
                                  count_tokens=lambda text: len(text.split()))
    path = write_logged_outcomes(table, tmp_path / "gsm8k.parquet")
    client = TestClient(create_app(ReplayBook.from_path(path)))
    row = table[table.worker == "gpt-4-1106-preview"].iloc[5]
    as_routellm_sent_it = f"{table.attrs['prompt_prefix']}Question: {row['query']}\nAnswer:"
    for content in (row["query"], as_routellm_sent_it):
        body = chat(client, "gpt-4-1106-preview", content).json()
        assert body["choices"][0]["message"]["content"] == row["response"]
        assert body["usage"]["prompt_tokens"] == row["prompt_tokens"]


@pytest.mark.slow
async def test_an_llm_worker_of_a_pool_calls_the_replay_server_it_starts(tmp_path):
    from routerops.pricing import load_pool
    from routerops.workers import build_workers, pool_endpoints
    from routerops.workers.endpoints import EndpointError

    tiny_table(tmp_path)
    pool_file = tmp_path / "pool.yaml"
    pool_file.write_text("name: replayed\nworkers:\n"
                         "  - {name: cheap, kind: llm, endpoint: 'replay:tiny.csv', model: weak, primitives: [answer]}\n"
                         "  - {name: dear, kind: llm, endpoint: 'replay:tiny.csv', model: strong, primitives: [answer],"
                         " generation: {max_tokens: 64, system: 'Be brief.'}}\n")
    pool = load_pool(pool_file)
    with pytest.raises(EndpointError, match="not running"):
        build_workers(pool, None)  # no server: a clear refusal, not a call to nowhere
    with pool_endpoints(pool, root=tmp_path) as endpoints:
        assert len(endpoints.replay) == 1  # one server per table, whatever the number of its workers
        workers = build_workers(pool, endpoints)
        result = await workers["dear"].call(QUERIES["q2"])
        missing = await workers["cheap"].call("Not in the table")
        for worker in workers.values():
            await worker.aclose()
    assert result.error == "" and result.text == RESPONSES[("q2", "strong")]
    assert (result.prompt_tokens, result.completion_tokens) == (11, 7)
    assert "404" in missing.error and "'weak'" in missing.error and "after 1 attempts" in missing.error


def test_a_replay_worker_whose_model_is_not_in_its_table_is_refused_before_any_server(tmp_path):
    from routerops.pricing import load_pool
    from routerops.workers import pool_endpoints
    from routerops.workers.endpoints import EndpointError

    tiny_table(tmp_path)
    (tmp_path / "pool.yaml").write_text("name: p\nworkers:\n  - {name: x, kind: llm, endpoint: 'replay:tiny.csv', "
                                        "model: gpt-4, primitives: [answer]}\n")
    with pytest.raises(EndpointError, match="weak, strong"):
        with pool_endpoints(load_pool(tmp_path / "pool.yaml"), root=tmp_path):
            pass


def test_the_gateway_refuses_replay_urls_that_are_not_a_json_object_of_replay_endpoints():
    from gateway.app import GatewayConfig
    from routerops.workers.endpoints import ServedEndpoints

    with pytest.raises(InputError, match="replay_urls"):
        GatewayConfig(routers=("r",), replay_urls='{"data/t.csv": "http://127.0.0.1:1/v1"}')  # no replay: scheme
    served = ServedEndpoints(local="http://127.0.0.1:2/v1", replay=(("replay:t.csv", "http://127.0.0.1:3/v1"),))
    again = ServedEndpoints.from_settings(served.local, served.replay_json())
    assert again == served  # what `gateway serve --local-server` hands each process comes back whole
