"""Hostile-client probes of the gateway (issue 25's gateway section), once benchmarks/gateway_probes.py:
each is one attempt to dodge a budget or draw a 500 / a traceback, and holds when the gateway answers as
it should (the expected status with an OpenAI-format error body and nothing called or charged, or a
charge equal to what the worker billed and within its reservation). Only the probes that
test_hardening.py does not already hold are here; one live gateway (test_hardening's `Served`) for all
of them."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.test_hardening import IMAGE, IMAGE_TOKENS, TEXT, Served, billed_cost, router  # noqa: F401

pytestmark = pytest.mark.slow
BIG = "x" * 6000

# Message shapes no worker here accepts: refused before any call or charge.
REFUSED = {
    "input_audio part": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}],
    "file part": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}],
    "unknown part type": [{"role": "user", "content": [{"type": "video", "video": BIG}]}],
    "image part in a system message": [{"role": "system", "content": IMAGE[0]["content"]}, *TEXT],
}
# Large strings in places the reservation must count: answered, charged what was billed, within the bound.
WITHIN = {
    "unknown message field": ([{"role": "user", "content": "hi", "metadata": BIG}], {}),
    "assistant refusal part": ([*TEXT, {"role": "assistant", "content": [{"type": "refusal", "refusal": BIG}]}, *TEXT],
                               {}),
    "response_format schema": (TEXT, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"description": BIG}}}}),
    "multi-byte text": ([{"role": "user", "content": "漢字🙂" * 1500}], {}),
}
# Bodies and fields that once drew a 500 or a traceback: a 400 in OpenAI's format.
RAW_400 = {
    "NaN in a passed field": b'{"model": "auto", "messages": [{"role": "user", "content": "x"}], '
                             b'"response_format": {"a": NaN}}',
    "a 5,000-digit integer": b'{"max_tokens": ' + b"9" * 5000 + b"}",
    "unpaired surrogate escape": b'{"model": "auto", "messages": [{"role": "user", "content": "\\ud800"}]}',
}
FIELD_400 = {
    "messages as a string": {"messages": "hi"},
    "message without a role": {"messages": [{"content": "hi"}]},
    "tool message without tool_call_id": {"messages": [{"role": "tool", "content": "x"}]},
    "max_tokens as a string": {"max_tokens": "8"},
    "max_tokens 0": {"max_tokens": 0},
    "max_tokens over the cap": {"max_tokens": 10**9},
    "n = 2": {"n": 2},
    "stream 'yes'": {"stream": "yes"},
    "budget_usd -1": {"budget_usd": -1},
    "temperature as an object": {"temperature": {}},
    "stop as a number": {"stop": 3},
}
GOOD = {"model": "auto", "messages": TEXT, "max_tokens": 8}


@pytest.fixture(scope="module")
def gateway(router, tmp_path_factory):  # noqa: F811 - test_hardening's fitted router
    served = Served(router, tmp_path_factory.mktemp("probes"))
    yield served
    served.close()


@pytest.fixture(scope="module")
def accepting(router, tmp_path_factory):  # noqa: F811
    served = Served(router, tmp_path_factory.mktemp("accepting"), accepts={"smol-direct": {"image_url": IMAGE_TOKENS}})
    yield served
    served.close()


def is_error(response: httpx.Response, status: int) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return response.status_code == status and set(error) == {"message", "type", "param", "code"}


def within(s: Served, response: httpx.Response) -> None:
    assert response.status_code == 200, response.text
    routed = response.json()["routerops"]
    billed = billed_cost(s.endpoint.received[-1], routed["worker"])
    assert routed["cost_usd"] == pytest.approx(billed, rel=1e-9, abs=1e-12) and billed <= routed["worst_cost_usd"]


@pytest.mark.parametrize("name", REFUSED)
def test_a_message_shape_no_worker_accepts_is_refused_before_any_call(gateway, name):
    calls, spent = gateway.endpoint.requests, gateway.spent()
    assert is_error(gateway.chat(REFUSED[name]), 400)
    assert gateway.endpoint.requests == calls and gateway.spent() == spent


@pytest.mark.parametrize("name", WITHIN)
def test_large_strings_anywhere_are_charged_within_the_reservation(gateway, name):
    messages, extra = WITHIN[name]
    within(gateway, gateway.chat(messages, **extra))


def test_three_image_parts_are_reserved_and_charged_within_the_bound(accepting):
    within(accepting, accepting.chat([{"role": "user", "content": IMAGE[0]["content"] * 3}]))


@pytest.mark.parametrize("name", RAW_400)
def test_bodies_that_drew_a_500_are_400s(gateway, name):
    response = httpx.post(f"{gateway.url}/chat/completions", content=RAW_400[name], timeout=30,
                          headers={**gateway.headers, "content-type": "application/json"})
    assert is_error(response, 400), response.text


def test_a_text_plain_body_is_a_400_and_a_nul_in_content_is_answered(gateway):
    response = httpx.post(f"{gateway.url}/chat/completions", content=b"hello", timeout=30,
                          headers={**gateway.headers, "content-type": "text/plain"})
    assert is_error(response, 400), response.text
    nul = httpx.post(f"{gateway.url}/chat/completions", headers=gateway.headers, timeout=30,
                     json={**GOOD, "messages": [{"role": "user", "content": "a\x00b"}]})
    assert nul.status_code == 200, nul.text


@pytest.mark.parametrize("name", FIELD_400)
def test_a_field_of_the_wrong_type_or_range_is_a_400(gateway, name):
    response = httpx.post(f"{gateway.url}/chat/completions", headers=gateway.headers, timeout=30,
                          json={**GOOD, **FIELD_400[name]})
    assert is_error(response, 400), response.text


def test_keys_decisions_and_models_not_yours_are_401_or_404(gateway):
    chat = f"{gateway.url}/chat/completions"
    decision = gateway.chat(TEXT).json()["routerops"]["decision_id"]
    other, _ = gateway.gw.store.create_key(1.0, "day")
    assert is_error(httpx.post(chat, json=GOOD, timeout=30), 401)
    assert is_error(httpx.post(chat, json=GOOD, timeout=30, headers={"authorization": b"Bearer rk-\xc3\xa9\xff"}), 401)
    assert is_error(httpx.get(f"{gateway.url}/decisions/{decision}", timeout=30,
                              headers={"Authorization": f"Bearer {other}"}), 404)
    assert is_error(httpx.get(f"{gateway.url}/decisions/{'d' * 10_000}", headers=gateway.headers, timeout=30), 404)
    assert is_error(httpx.post(chat, headers=gateway.headers, json={**GOOD, "model": "gpt-9"}, timeout=30), 404)
