"""The SFT loss mask (paper 004 App. E: only the controller's tokens carry gradient) on SmolLM2's real
tokenizer and chat template, what TRL's SFTTrainer makes of it, and the JSONL edge."""

from __future__ import annotations

import json

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from models.orchestrator.config import SFTSettings
from models.orchestrator.sft import trainer_args
from models.orchestrator.sft_data import (Conversation, build_examples, read_conversations,
                                          tokenize_conversation)
from routerops.errors import InputError


def trained_text(tokenizer, tokenized) -> str:
    return tokenizer.decode([t for t, m in zip(tokenized.input_ids, tokenized.assistant_masks) if m])


def test_mask_covers_exactly_the_assistant_turns_and_their_end_of_turn_token(tokenizer, conversations):
    for messages in conversations:
        tokenized = tokenize_conversation(tokenizer, messages)
        expected = "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")
        assert trained_text(tokenizer, tokenized) == expected
        # What the mask leaves out is the rest of the rendered conversation: system, task, observations
        # and the template's own role headers.
        untrained = tokenizer.decode([t for t, m in zip(tokenized.input_ids, tokenized.assistant_masks) if not m])
        for message in messages:
            if message["role"] != "assistant":
                assert message["content"] in untrained
        assert untrained.count("<|im_start|>assistant\n") == sum(m["role"] == "assistant" for m in messages)


def test_input_ids_are_the_conversation_as_the_controller_sees_it(tokenizer, conversations):
    messages = conversations[1]
    tokenized = tokenize_conversation(tokenizer, messages)
    assert tokenized.input_ids == tokenizer.apply_chat_template(messages, tokenize=True)["input_ids"]
    # Every prompt the controller answers is a prefix of the training sequence, so SFT conditions each
    # assistant turn on exactly the tokens it will see at inference.
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            prompt = tokenizer.apply_chat_template(messages[:i], tokenize=True, add_generation_prompt=True)["input_ids"]
            assert tokenized.input_ids[:len(prompt)] == prompt
            assert not any(tokenized.assistant_masks[:len(prompt)][-3:])  # the generation prompt is not trained
            assert tokenized.assistant_masks[len(prompt)] == 1  # the first token the controller writes is


def test_trl_builds_labels_from_the_mask(tokenizer, conversations, tmp_path):
    """The exact columns SFTTrainer consumes: input_ids + assistant_masks → labels (-100 off the mask),
    truncated to max_seq_len; rows left without a trained token are dropped; padding is -100."""
    examples = build_examples(tokenizer, [Conversation(f"t{i}", m) for i, m in enumerate(conversations)])
    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    from trl import SFTTrainer

    # Cuts every conversation a few tokens into its first assistant turn, and the long one (whose task
    # is longer) before it: that row has nothing left to train on.
    max_len = 70
    trainer = SFTTrainer(model=tiny, args=trainer_args(SFTSettings(max_seq_len=max_len), tmp_path, "cpu"),
                         train_dataset=examples.to_dataset(), processing_class=tokenizer)
    prepared = trainer.train_dataset
    assert prepared.column_names == ["input_ids", "labels"]
    kept = [r for r in examples.rows if any(r.assistant_masks[:max_len])]
    assert 0 < len(prepared) == len(kept) == examples.token_counts(max_len)["trained_conversations"] < len(examples.rows)
    for row, original in zip(prepared, kept):
        ids, mask = original.input_ids[:max_len], original.assistant_masks[:max_len]
        assert row["input_ids"] == ids
        assert row["labels"] == [t if m else -100 for t, m in zip(ids, mask)]
    batch = trainer.data_collator([prepared[0], prepared[1]])
    assert ((batch["labels"] == -100) | (batch["attention_mask"] == 1)).all()


def test_rows_are_validated_at_the_edge_naming_file_and_line(tmp_path, conversations):
    good = json.dumps({"task_id": "a", "messages": conversations[0]})
    cases = {
        "task_id": json.dumps({"messages": conversations[0]}),
        "messages": json.dumps({"task_id": "b", "messages": [{"role": "tool", "content": "x"}]}),
        "no assistant": json.dumps({"task_id": "c", "messages": conversations[0][:2]}),
        "not valid JSON": "{oops",
    }
    for expected, bad in cases.items():
        path = tmp_path / "rows.jsonl"
        path.write_text(good + "\n" + bad + "\n")
        with pytest.raises(InputError, match=rf"rows.jsonl: field 'line 2.*{expected}"):
            read_conversations(path)
    path.write_text(good + "\n\n" + good + "\n")  # blank lines are skipped
    assert [c.task_id for c in read_conversations(path)] == ["a", "a"]
