"""SFT examples from controller conversations, with the loss on the controller's own tokens only.

Paper 004 App. E: "All observation tokens are loss-masked; only assistant tokens carry gradient", and
§4.2: the masked set coincides with the RL objective's, so SFT and RL optimise the same positions.

SmolLM2's chat template (like Qwen2.5's) has no `{% generation %}` markers, so the tokenizer cannot
return an assistant mask itself. We find each assistant turn's characters in the rendered conversation
(the template rendered up to the turn's generation prompt is a prefix of the whole), tokenise the whole
text once with character offsets, and mark the tokens that start inside an assistant turn: its content
and the end-of-turn token that stops it (`<|im_end|>`), not the newline the template adds after it,
which the controller never generates. TRL's SFTTrainer takes the result pre-tokenised: `input_ids` and
`assistant_masks` (1 = trained), from which it builds `labels` (-100 where the mask is 0).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.orchestrator.lm import check_conversation
from routerops.errors import InputError
from routerops.files import read_json_lines
from routerops.orchestra.controller import Message


@dataclass(frozen=True)
class Conversation:
    """One training row: a task's verifier-kept trajectory as chat messages."""

    task_id: str
    messages: list[Message]


@dataclass(frozen=True)
class TokenizedConversation:
    input_ids: list[int]
    assistant_masks: list[int]  # 1 on the controller's tokens (trained), 0 elsewhere

    @property
    def assistant_tokens(self) -> int:
        return sum(self.assistant_masks)


def read_conversations(path: str | Path) -> list[Conversation]:
    """Rows {"task_id": str, "messages": [{role, content}, ...]} (other keys, e.g. the paper's provenance
    fields teacher and distillation_pass, are kept out of training); errors name the file and line."""
    path = Path(path)
    conversations = []
    for line, row in read_json_lines(path):
        task_id = row.get("task_id")
        if not isinstance(task_id, str) or not task_id:
            raise InputError(path, f"line {line}: task_id", "expected a non-empty string")
        problem = check_conversation(row.get("messages"))
        if problem:
            raise InputError(path, f"line {line}: messages", problem)
        if not any(m["role"] == "assistant" for m in row["messages"]):
            raise InputError(path, f"line {line}: messages", "no assistant turn: nothing to train on")
        conversations.append(Conversation(task_id, row["messages"]))
    if not conversations:
        raise InputError(path, "<file>", "no conversations")
    return conversations


def render(tokenizer: Any, messages: list[Message], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_char_spans(tokenizer: Any, messages: list[Message]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and, per assistant turn, the [start, end) characters the controller
    writes: from the end of the generation prompt to the end-of-turn token, trailing whitespace out."""
    text = render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(tokenizer, messages[:i], generation_prompt=True) if i else ""
        through = render(tokenizer, messages[: i + 1])
        if not (text.startswith(before) and through.startswith(before) and text.startswith(through)):
            raise ValueError(f"the chat template renders assistant turn {i} differently in the whole "
                             "conversation than at its generation prompt; the loss mask cannot be placed")
        turn = through[len(before):].rstrip()
        if message["content"].strip() not in turn:
            raise ValueError(f"the chat template drops or rewrites assistant turn {i}'s content")
        spans.append((len(before), len(before) + len(turn)))
    return text, spans


def tokenize_conversation(tokenizer: Any, messages: list[Message]) -> TokenizedConversation:
    """input_ids of the rendered conversation (as the controller sees it at inference) and its
    assistant mask: 1 on tokens that start inside an assistant turn's span."""
    text, spans = assistant_char_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(start <= begin < end for start, end in spans)) for begin, _ in encoded["offset_mapping"]]
    return TokenizedConversation(list(encoded["input_ids"]), mask)


@dataclass(frozen=True)
class SFTExamples:
    """The pre-tokenised training set and what it holds (before TRL truncates to max_seq_len)."""

    rows: list[TokenizedConversation]
    task_ids: list[str]

    def to_dataset(self) -> Any:
        """A datasets.Dataset with exactly the columns TRL's SFTTrainer consumes pre-tokenised."""
        from datasets import Dataset  # optional dependency of the SFT stage only

        return Dataset.from_dict({"input_ids": [r.input_ids for r in self.rows],
                                  "assistant_masks": [r.assistant_masks for r in self.rows]})

    def token_counts(self, max_seq_len: int) -> dict[str, int]:
        """Tokens per epoch as trained (each sequence cut to its first max_seq_len tokens)."""
        kept = [(r.input_ids[:max_seq_len], r.assistant_masks[:max_seq_len]) for r in self.rows]
        kept = [(ids, mask) for ids, mask in kept if any(mask)]  # TRL drops rows left with no trained token
        return {"conversations": len(self.rows), "trained_conversations": len(kept),
                "tokens": sum(len(ids) for ids, _ in kept), "assistant_tokens": sum(sum(m) for _, m in kept),
                "truncated": sum(len(r.input_ids) > max_seq_len for r in self.rows)}


def build_examples(tokenizer: Any, conversations: list[Conversation]) -> SFTExamples:
    rows = []
    for conversation in conversations:
        try:
            rows.append(tokenize_conversation(tokenizer, conversation.messages))
        except ValueError as exc:
            raise ValueError(f"task {conversation.task_id}: {exc}") from exc
    return SFTExamples(rows, [c.task_id for c in conversations])


def file_fingerprint(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
