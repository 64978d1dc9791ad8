"""The LM controller's prompts (002 Table 8) and its strict parser: every tag, truncated and adversarial
outputs (malformed with a reason, never an exception), routing only upward."""

from __future__ import annotations

import pytest

from models.critique.lm_prompts import (ACCEPT, REJECT, ROUTE, TEMPLATE_I, TEMPLATE_II, corl_messages, display_name,
                                        parse_corl, parse_routing, parse_verification, routing_messages,
                                        routing_target, tail_tokens, verification_target, verify_messages)

AGENTS = ["Llama-1B", "Ministral-8B", "Qwen3-30B"]  # weaker → stronger


def test_templates_list_the_agents_weaker_to_stronger_and_name_the_author():
    first = routing_messages("What is 2+2?", AGENTS)
    assert first[0]["content"] == TEMPLATE_I.format(agent_list="Llama-1B, Ministral-8B, Qwen3-30B")
    assert "ordered from weaker to stronger, are: Llama-1B, Ministral-8B, Qwen3-30B" in first[0]["content"]
    assert first[1] == {"role": "user", "content": "Problem: What is 2+2?"}
    later = verify_messages("What is 2+2?", AGENTS, 1, "2+2 = 4\n#### 4")
    assert later[0]["content"] == TEMPLATE_II.format(agent_list="Llama-1B, Ministral-8B, Qwen3-30B", author="Ministral-8B")
    assert "stronger than Ministral-8B" in later[0]["content"]
    assert later[1]["content"].endswith("Proposed solution from Ministral-8B:\n2+2 = 4\n#### 4")
    assert display_name("mistralai/Mixtral-8x7B-Instruct-v0.1") == "Mixtral-8x7B-Instruct-v0.1"
    assert display_name("a/b", short=False) == "a/b"


def test_corl_prompt_names_the_budget_mode_and_its_options():
    for mode in ("low", "medium", "high"):
        system = corl_messages("q", "gpt-4", mode)[0]["content"]
        assert f"Budget mode: {mode}." in system and "self, gpt-4" in system


def test_the_draft_is_cut_to_its_last_tokens():
    assert tail_tokens("a b c d e", 0) == "a b c d e"
    assert tail_tokens("a b c d e", 2) == "… d e"
    assert tail_tokens("a b", 5) == "a b"


@pytest.mark.parametrize("text, model", [
    ("<thinking>easy</thinking><model>Llama-1B</model>", 0),
    ("  <thinking>multi\nline</thinking>\n\n<model> Qwen3-30B </model>\n", 2),
    (routing_target("x", "Ministral-8B"), 1),
])
def test_template_one_well_formed(text, model):
    parsed = parse_routing(text, AGENTS)
    assert not parsed.malformed and parsed.kind == ROUTE and parsed.model == model


@pytest.mark.parametrize("text, reason", [
    ("", "missing <thinking>"),
    ("<model>Llama-1B</model>", "missing <thinking>"),
    ("<thinking>easy</thinking>", "missing <model>"),
    ("<thinking>easy</thinking><model>GPT-5</model>", "unknown model"),
    ("<thinking>easy</thinking><model>llama-1b</model>", "unknown model"),  # names are exact
    ("<thinking>easy</thinking><model>Llama-1B</model> and more", "text after the last tag"),
    ("Sure! <thinking>easy</thinking><model>Llama-1B</model>", "out of place"),
    ("<thinking>easy</thinking><model>Llama-1B</model><model>Qwen3-30B</model>", "repeated <model>"),
    ("<thinking>easy, pick <model>Qwen3-30B</model></thinking><model>Llama-1B</model>", "repeated <model>"),
    ("<thinking>I think this is a hard problem because it has many st", "unclosed <thinking>"),  # truncated
    ("<thinking>easy</thinking><model>Llama-1", "unclosed <model>"),
    ("<model>Llama-1B</model><thinking>easy</thinking>", "out of place"),
    ("<thinking>a <verdict>True</verdict></thinking><model>Llama-1B</model>", "a tag inside <thinking>"),
    ("<thinking>easy</thinking><verdict>True</verdict><model>Llama-1B</model>", "out of place"),
])
def test_template_one_malformed_outputs_are_flagged_with_a_reason(text, reason):
    parsed = parse_routing(text, AGENTS)
    assert parsed.malformed and parsed.kind is None and reason in parsed.error


def test_template_two_true_stops_false_routes_upward():
    accept = parse_verification("<checking>ok</checking>\n<verdict>True</verdict>", AGENTS, 0)
    assert (accept.kind, accept.model, accept.malformed) == (ACCEPT, None, False)
    assert accept.text == "ok"
    reject = parse_verification(verification_target("step 2 wrong", False, "Qwen3-30B"), AGENTS, 1)
    assert (reject.kind, reject.model) == (REJECT, 2)
    skip = parse_verification("<checking>no</checking><verdict>False</verdict><model>Qwen3-30B</model>", AGENTS, 0)
    assert (skip.kind, skip.model) == (REJECT, 2)  # any stronger agent, not only the next one


@pytest.mark.parametrize("text, author, reason", [
    ("<checking>bad</checking><verdict>False</verdict><model>Llama-1B</model>", 1, "not stronger"),  # downward
    ("<checking>bad</checking><verdict>False</verdict><model>Ministral-8B</model>", 1, "not stronger"),  # itself
    ("<checking>ok</checking><verdict>True</verdict><model>Qwen3-30B</model>", 0, "<model> after a True verdict"),
    ("<checking>bad</checking><verdict>False</verdict>", 0, "verdict False without <model>"),
    ("<checking>ok</checking><verdict>true</verdict>", 0, "is not True or False"),
    ("<checking>ok</checking><verdict>Yes</verdict>", 0, "is not True or False"),
    ("<checking>ok</checking>", 0, "missing <verdict>"),
    ("<verdict>True</verdict>", 0, "missing <checking>"),
    ("<checking>the answer 18 is correct because", 0, "unclosed <checking>"),  # cut at max_new_tokens
    ("<checking>ok</checking><verdict>True</verdict><verdict>False</verdict>", 0, "repeated <verdict>"),
    ("<checking>ok</checking><verdict>False</verdict><model>Qwen3-30B</model> thanks", 0, "text after"),
    ("<checking>ok</checking><verdict>False</verdict><model>Qwen3-30", 0, "unclosed <model>"),
    ("<thinking>x</thinking><model>Qwen3-30B</model>", 0, "missing <checking>"),  # Template I's answer
])
def test_template_two_malformed_outputs_are_flagged_with_a_reason(text, author, reason):
    parsed = parse_verification(text, AGENTS, author)
    assert parsed.malformed and reason in parsed.error


def test_on_the_strongest_draft_a_false_verdict_names_nobody():
    parsed = parse_verification("<checking>bad</checking><verdict>False</verdict>", AGENTS, 2)
    assert (parsed.kind, parsed.model, parsed.malformed) == (REJECT, None, False)
    upward = parse_verification("<checking>bad</checking><verdict>False</verdict><model>Qwen3-30B</model>", AGENTS, 2)
    assert upward.malformed  # nothing is stronger than the strongest


@pytest.mark.parametrize("text", ["\x00\x01<<<>>>", "<" * 500, "</model>" * 3, "<thinking></thinking>" * 40,
                                  "<checking>" + "x" * 10000, "<model></model>", "\u202e<thinking>a</thinking>"])
def test_garbage_never_raises(text):
    for parsed in (parse_routing(text, AGENTS), parse_verification(text, AGENTS, 0), parse_corl(text, "gpt-4")):
        assert parsed.malformed


def test_corl_answers_self_or_the_expert():
    assert parse_corl("<thinking>x</thinking><model>self</model>", "gpt-4").model == 0
    assert parse_corl("<thinking>x</thinking><model>gpt-4</model>", "gpt-4").model == 1
    assert parse_corl("<thinking>x</thinking><model>Mixtral</model>", "gpt-4").malformed
