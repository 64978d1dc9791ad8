"""Replay endpoints: a logged-outcome table with responses (docs/replay_format.md), served over the
OpenAI chat-completions API, so logged models (RouteLLM's GPT-4-1106 and Mixtral-8x7B answers to
GSM8K) are workers of a pool like any vLLM or llama.cpp endpoint: every stage, the executor, the
critique loop, the gateway and the OPE log call them through the same client (routerops/workers/llm.py).

`POST /v1/chat/completions` with `model` = a worker of the table answers with that worker's logged
`response` to the query, and `usage` = the logged `prompt_tokens` / `completion_tokens` (what the
logged call consumed, whatever the request looked like; the table's attrs["token_counts"] says how they
were obtained: RouteLLM logged none, so the bundled table holds SmolLM2-BPE estimates). `stream: true`
answers in OpenAI's SSE chunks, with a last usage chunk when `stream_options.include_usage`.
`GET /v1/models` lists the table's workers.

Which query (see `query_candidates`): the user turns, the last first, each tried as
1. the whole text, whitespace-normalised (the table's `query`, as import-routellm keeps it);
2. the question of a RouteLLM-style prompt: the text after the last "Question:" and before a final
   "Answer:" (RouteLLM sent each model its 8-shot block, then "Question: <query>\nAnswer:");
3. the longest logged query the text begins with (a later turn that adds a summary of earlier turns,
   or a critique: the logged answer cannot read what follows, it is the answer the model gave).
A query the table does not hold is a 404 naming the worker and the query's start: never an answer
made up. `max_tokens` below the logged completion cuts the logged text in proportion (characters per
token of that response) and says so (`finish_reason: "length"`), as a live model stops at its cap; the
usage then counts `max_tokens`, so a caller's worst-case budget bound holds.

Run it with `routerops replay serve --table T`; pipelines start it as a subprocess with
`routerops.workers.endpoints.replay_server` (the way the llama.cpp server is started).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from routerops.envs.replay import load_logged_outcomes, worker_order
from routerops.errors import InputError, RouteropsError

LATENCY_COLUMN = "latency_s"  # optional: seconds the logged call took (served with --latency)
SHOWN_QUERY_CHARS = 60  # of an unknown query, in the 404's message
STREAM_WORDS = 8  # words per streamed chunk
_QUESTION = re.compile(r"Question:\s*(.*?)\s*Answer:\s*\Z", re.DOTALL)


@dataclass(frozen=True)
class Logged:
    """One worker's logged outcome on one query."""

    query_id: str
    response: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float | None = None


class ReplayError(Exception):
    """A request the table cannot answer: an HTTP status and an OpenAI-format error."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}


def normalise(text: str) -> str:
    """Runs of whitespace as one space, none at the ends: a client that re-wraps or strips the
    question still finds it (the import keeps RouteLLM's text as it was, double spaces included)."""
    return " ".join(text.split())


def check_replay_table(frame: pd.DataFrame, source: Any, latency: bool = False) -> pd.DataFrame:
    """The table, refused unless it can be served: a `response` column (the answers), and with
    `latency` a `latency_s` column of seconds ≥ 0."""
    if "response" not in frame.columns:
        raise InputError(source, "response", "column missing: a replay endpoint answers with each worker's "
                                             "logged response")
    if latency:
        if LATENCY_COLUMN not in frame.columns:
            raise InputError(source, LATENCY_COLUMN, "column missing: --latency sleeps each call's logged latency")
        values = pd.to_numeric(frame[LATENCY_COLUMN], errors="coerce")
        bad = values.isna() | (values < 0)
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0]) + 1
            raise InputError(source, LATENCY_COLUMN, f"row {row}: expected seconds ≥ 0, got "
                                                     f"{frame[LATENCY_COLUMN].iloc[row - 1]!r}")
    return frame


def load_replay_table(path: str | Path, latency: bool = False) -> pd.DataFrame:
    """A logged-outcome table checked by the format's own validation, then for serving."""
    return check_replay_table(load_logged_outcomes(path), Path(path), latency)


class ReplayBook:
    """The table as lookups: worker → normalised query → its logged outcome."""

    def __init__(self, frame: pd.DataFrame, source: Any = "<table>", latency: bool = False):
        check_replay_table(frame, source, latency)
        self.source = str(source)
        self.latency = latency
        self.workers = worker_order(frame)
        self.token_counts = str(frame.attrs.get("token_counts", "as logged in the table"))
        self.prefix = normalise(str(frame.attrs.get("prompt_prefix", "")))
        self._by_worker: dict[str, dict[str, Logged]] = {w: {} for w in self.workers}
        latencies = frame[LATENCY_COLUMN] if latency else [None] * len(frame)
        for row, seconds in zip(frame.itertuples(index=False), latencies):
            self._by_worker[row.worker][normalise(row.query)] = Logged(
                row.query_id, row.response, int(row.prompt_tokens), int(row.completion_tokens),
                None if seconds is None else float(seconds))
        # Longest first: the prefix rule (3) takes the most specific logged query.
        self._by_length = sorted(self._by_worker[self.workers[0]], key=len, reverse=True)

    @classmethod
    def from_path(cls, path: str | Path, latency: bool = False) -> "ReplayBook":
        return cls(load_replay_table(path, latency), Path(path), latency)

    def lookup(self, model: Any, messages: Any) -> Logged:
        """The logged outcome `model` gave for the query in `messages`, or ReplayError (404)."""
        if model not in self._by_worker:
            raise ReplayError(404, f"model {model!r} is not a worker of replay table {self.source}; its workers: "
                                   f"{', '.join(self.workers)}", "model_not_found", "model")
        logged = self._by_worker[model]
        texts = user_texts(messages)
        for text in texts:
            for key in self.query_candidates(text):
                if key in logged:
                    return logged[key]
        shown = normalise(texts[0])[:SHOWN_QUERY_CHARS] if texts else ""
        raise ReplayError(404, f"worker {model!r} has no logged response for the query {shown!r}… in replay table "
                               f"{self.source}: a replay endpoint answers only the table's queries",
                          "query_not_logged", "messages")

    def query_candidates(self, text: str) -> Iterator[str]:
        """The keys `text` may be logged under, in the order of the module docstring's rules."""
        whole = normalise(text)
        yield whole
        if self.prefix and whole.startswith(self.prefix):
            yield whole[len(self.prefix):].strip()
        if "Question:" in text:  # RouteLLM's form: the last "Question: <query>\nAnswer:" of the prompt
            question = _QUESTION.search("Question:" + text.rsplit("Question:", 1)[1])
            if question:
                yield normalise(question.group(1))
        for query in self._by_length:
            if whole.startswith(query) and whole[len(query):len(query) + 1] in ("", " "):
                yield query
                return


def user_texts(messages: Any) -> list[str]:
    """The text of each user turn, the last first (content parts: their text parts joined)."""
    if not isinstance(messages, list):
        raise ReplayError(400, "`messages` must be a list of chat messages", "invalid_messages", "messages")
    texts = []
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if isinstance(content, str) and content.strip():
            texts.append(content)
    if not texts:
        raise ReplayError(400, "no user message with text: a replay endpoint looks the query up by its text",
                          "invalid_messages", "messages")
    return texts


# ---------------------------------------------------------------- answers


def capped(logged: Logged, max_tokens: Any) -> tuple[str, int, str]:
    """(text, completion tokens, finish reason) under the request's max_tokens."""
    if max_tokens is None:
        return logged.response, logged.completion_tokens, "stop"
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ReplayError(400, f"max_tokens must be a positive integer, got {max_tokens!r}", "invalid_value",
                          "max_tokens")
    if max_tokens >= logged.completion_tokens:
        return logged.response, logged.completion_tokens, "stop"
    # Characters per token of this very response: the cut falls where the max_tokens-th token would.
    keep = len(logged.response) * max_tokens // max(logged.completion_tokens, 1)
    return logged.response[:keep], max_tokens, "length"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": 0}}


def completion_body(model: str, logged: Logged, text: str, completion_tokens: int, finish: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-replay-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "system_fingerprint": f"replay:{logged.query_id}",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": usage(logged.prompt_tokens, completion_tokens)}


def stream_chunks(model: str, logged: Logged, text: str, completion_tokens: int, finish: str,
                  include_usage: bool) -> Iterator[str]:
    """The answer as OpenAI's SSE stream: a role chunk, the text a few words a chunk, the finish
    chunk, the usage chunk (choices empty) when asked for, then [DONE]."""
    common = {"id": f"chatcmpl-replay-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
              "created": int(time.time()), "model": model, "system_fingerprint": f"replay:{logged.query_id}"}

    def event(choices: list, **extra) -> str:
        return f"data: {json.dumps({**common, 'choices': choices, **extra})}\n\n"

    yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    words = re.findall(r"\s*\S+\s*", text) or ([text] if text else [])
    for start in range(0, len(words), STREAM_WORDS):
        piece = "".join(words[start:start + STREAM_WORDS])
        yield event([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
    yield event([{"index": 0, "delta": {}, "finish_reason": finish}])
    if include_usage:
        yield event([], usage=usage(logged.prompt_tokens, completion_tokens))
    yield "data: [DONE]\n\n"


def create_app(book: ReplayBook):
    """The FastAPI app serving `book`."""
    app = FastAPI(title="routerops replay endpoint", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ReplayError)
    async def on_replay_error(_request: Request, exc: ReplayError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": w, "object": "model", "created": 0, "owned_by": "replay",
                                            "table": book.source, "token_counts": book.token_counts}
                                           for w in book.workers]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise ReplayError(400, "the request body is not JSON", "invalid_json") from None
        if not isinstance(body, dict):
            raise ReplayError(400, "the request body must be a JSON object", "invalid_json")
        model = body.get("model")
        logged = book.lookup(model, body.get("messages"))
        text, completion_tokens, finish = capped(logged, body.get("max_completion_tokens", body.get("max_tokens")))
        if book.latency and logged.latency_s:
            await asyncio.sleep(logged.latency_s)
        headers = {"x-replay-query-id": logged.query_id}
        if body.get("stream"):
            options = body.get("stream_options") or {}
            include = bool(options.get("include_usage")) if isinstance(options, dict) else False
            return StreamingResponse(stream_chunks(model, logged, text, completion_tokens, finish, include),
                                     media_type="text/event-stream", headers=headers)
        return JSONResponse(completion_body(model, logged, text, completion_tokens, finish), headers=headers)

    return app


def serve(table: str | Path, host: str = "127.0.0.1", port: int = 8100, latency: bool = False) -> None:
    """Serve `table` until stopped (uvicorn). The table is checked first: a bad one never binds the port."""
    import uvicorn

    book = ReplayBook.from_path(table, latency)
    print(f"replay endpoint: {len(book.workers)} workers ({', '.join(book.workers)}) of {table} on "
          f"http://{host}:{port}/v1", flush=True)
    uvicorn.run(create_app(book), host=host, port=port, log_level="warning", access_log=False)


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--table", required=True, help="logged-outcome table with a `response` column (.parquet/.csv)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--latency", action="store_true", help="sleep each call's logged latency (column latency_s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m routerops.workers.replay_endpoint --table T --port P` (what replay_server starts)."""
    args = add_serve_arguments(argparse.ArgumentParser(prog="routerops replay serve")).parse_args(argv)
    try:
        serve(args.table, args.host, args.port, args.latency)
    except RouteropsError as exc:
        print(f"routerops: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
