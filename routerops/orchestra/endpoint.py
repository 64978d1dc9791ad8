"""A controller behind an OpenAI-compatible endpoint: the paper-scale teacher (004 App. A.4: a strong model
of the pool proposes trajectories) or a controller served by vLLM / llama.cpp.

It is a pool worker used as the controller: its endpoint, model, key and generation settings come from
the pool file, its turns are priced under the worker's name in the price book (like its calls as a
worker), and token counts come from the server's `usage`. Endpoints return no token ids, so RL cannot
train on these turns; SFT can (it re-tokenises the text).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from routerops.orchestra.controller import ControllerTurn, Message
from routerops.pricing import WorkerSpec
from routerops.workers.llm import LLMWorker


class EndpointController:
    """The Controller contract over one LLM worker: every conversation of a round is one concurrent
    chat completion (the worker's `concurrency` caps them). A failed call returns an empty turn, which
    the executor records as malformed ("empty"), never a crash."""

    def __init__(self, spec: WorkerSpec, base_url: str, version: str = "1", max_tokens: int | None = None):
        self.spec, self.base_url = spec, base_url
        self.name = spec.name  # its turns are priced as this worker's calls
        self.version = version
        self.max_tokens = max_tokens
        self.errors: list[str] = []

    def respond(self, conversations: Sequence[list[Message]]) -> list[ControllerTurn]:
        # The executor calls controllers from a worker thread: one event loop (and one HTTP client) per call.
        return asyncio.run(self._respond(conversations))

    async def _respond(self, conversations: Sequence[list[Message]]) -> list[ControllerTurn]:
        worker = LLMWorker(self.spec, self.base_url)
        try:
            results = await asyncio.gather(*(worker.call(list(c), self.max_tokens) for c in conversations))
        finally:
            await worker.aclose()
        self.errors += [r.error for r in results if r.error]
        return [ControllerTurn(text=r.text, prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens)
                for r in results]
