"""Running one subtask on its (model, primitive) pair: blind payloads, budget checks, priced calls.

Blind workers (design.md; 004 App. A.5 treats every worker as a stateless oracle): a worker sees its
route's instruction and the results of the subtasks it depends on, nothing else. `SubtaskRunner.run`
takes exactly those (a Subtask and its dependencies' outputs); the task is not among its arguments,
so no path leads the task text into a worker's payload.

How each way of running (routerops.primitives) becomes calls:
- llm: [system: the primitive's instruction, if any] + [user: instruction and inputs] to the worker.
- llm_program: the same LLM call (the instruction asks for a program), then the program (the reply's
  ```python block, one left open by the completion cap, else the whole reply) runs on the primitive's
  runner, a python worker.
- python: the instruction is the program; with dependencies, `inputs = {id: result, ...}` is put
  before it, so code can use earlier results.
- sympy: the instruction is the expression, evaluated as given.

Deterministic workers' results may come from a `WorkerCache` (routerops/workers/cache.py) given to
the runner: a replayed result is priced like a fresh one, from its tokens under the runner's book.

Every call is checked against the episode's budget first: its worst case (every prompt token at the
dearer of the cached and uncached rates, plus the full completion cap) is reserved, and the call is
refused if the reservation does not fit (MTRouter's eq. 1 rule, as in routerops.rollout). Reserving
keeps parallel calls from overrunning the budget together; the real cost replaces the reservation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from routerops.orchestra.grammar import Subtask
from routerops.pricing import Pool, PriceBook, WorkerSpec
from routerops.primitives import PrimitiveSpec
from routerops.rollout import call_worker, max_completion_tokens, prompt_token_bound, spec_of
from routerops.types import Payload, Worker, WorkerResult
from routerops.workers.cache import WorkerCache
from routerops.workers.tools import extract_code

OK, WORKER_ERROR, REFUSED, SKIPPED = "ok", "worker_error", "refused", "skipped"
_OPEN_FENCE = re.compile(r"\s*```[ \t]*(?:python|py|python3)?[ \t]*\n", re.IGNORECASE)


@dataclass
class BudgetLedger:
    """The episode's spending: settled costs plus the worst cases of calls in flight."""

    budget_usd: float
    spent_usd: float = 0.0
    reserved_usd: float = 0.0

    def reserve(self, worst_case_usd: float) -> bool:
        if self.spent_usd + self.reserved_usd + worst_case_usd > self.budget_usd:
            return False
        self.reserved_usd += worst_case_usd
        return True

    def settle(self, worst_case_usd: float, cost_usd: float) -> None:
        self.reserved_usd = max(self.reserved_usd - worst_case_usd, 0.0)
        self.spent_usd += cost_usd


@dataclass
class Call:
    """One priced call a subtask made."""

    worker: str
    payload: Payload
    result: WorkerResult
    cost_usd: float


@dataclass
class SubtaskOutcome:
    status: str  # OK | WORKER_ERROR | REFUSED (budget) | SKIPPED (a dependency has no result)
    text: str  # what the controller reads in the subtask's <obs>
    calls: list[Call] = field(default_factory=list)


def blind_input(subtask: Subtask, inputs: Mapping[int, str]) -> str:
    """The text an LLM worker gets: the route's instruction, then its dependencies' results."""
    if not inputs:
        return subtask.instruction
    results = "\n\n".join(f"[result of subtask {k}]\n{inputs[k]}" for k in sorted(inputs))
    return f"{subtask.instruction}\n\n{results}"


def llm_payload(primitive: PrimitiveSpec, text: str) -> list[dict[str, str]]:
    system = [{"role": "system", "content": primitive.instruction}] if primitive.instruction else []
    return system + [{"role": "user", "content": text}]


def python_program(subtask: Subtask, inputs: Mapping[int, str]) -> str:
    code = extract_code(subtask.instruction)
    if not inputs:
        return code
    return f"inputs = {dict(sorted(inputs.items()))!r}\n{code}"


def written_program(reply: str) -> str:
    """The program in an LLM's reply: its fenced block; a fence the completion cap cut before its
    closing ``` (small models stop there too) still counts, from its opening line on."""
    code = extract_code(reply)
    opening = _OPEN_FENCE.match(code)
    return code[opening.end():].removesuffix("```") if opening else code


def worst_case_cost(spec: WorkerSpec, payload: Payload, completion_cap: int, book: PriceBook) -> float:
    """Most a call could cost: the worker's own system prompt counts too (LLMWorker prepends it)."""
    prompt = prompt_token_bound(payload)
    system = str(spec.generation.get("system", "")) if spec.kind == "llm" else ""
    if system:
        prompt += prompt_token_bound([{"role": "system", "content": system}])
    return max(book.cost(spec.name, prompt, completion_cap, 0), book.cost(spec.name, prompt, completion_cap, prompt))


class SubtaskRunner:
    """Executes subtasks on the pool's workers under a price book."""

    def __init__(self, pool: Pool, workers: Mapping[str, Worker], book: PriceBook, cache: WorkerCache | None = None):
        self.pool = pool
        self.workers = workers
        self.book = book
        self.cache = cache  # deterministic workers' results replayed from it (None: every call is made)

    async def run(self, subtask: Subtask, worker: str, inputs: Mapping[int, str],
                  ledger: BudgetLedger) -> SubtaskOutcome:
        """Run `subtask` on `worker` (a pool name) with its dependencies' outputs (module docstring)."""
        primitive = self.pool.primitive(subtask.primitive)
        if primitive.run == "llm":
            return await self._call(worker, llm_payload(primitive, blind_input(subtask, inputs)), primitive, ledger)
        if primitive.run == "python":
            return await self._call(worker, python_program(subtask, inputs), primitive, ledger)
        if primitive.run == "sympy":
            return await self._call(worker, subtask.instruction, primitive, ledger)
        return await self._program(subtask, worker, inputs, primitive, ledger)

    async def _program(self, subtask: Subtask, worker: str, inputs: Mapping[int, str], primitive: PrimitiveSpec,
                       ledger: BudgetLedger) -> SubtaskOutcome:
        """llm_program: the LLM writes the program, the runner runs it; the runner's output is the result."""
        written = await self._call(worker, llm_payload(primitive, blind_input(subtask, inputs)), primitive, ledger)
        if written.status != OK:
            return written
        program = written_program(written.calls[-1].result.text)
        ran = await self._call(primitive.runner, program, primitive, ledger)
        return SubtaskOutcome(ran.status, ran.text, written.calls + ran.calls)

    async def _call(self, worker_name: str, payload: Payload, primitive: PrimitiveSpec,
                    ledger: BudgetLedger) -> SubtaskOutcome:
        """One call, made only if its worst case fits the budget."""
        worker = self.workers[worker_name]
        spec = spec_of(worker)
        cap = self.completion_cap(spec, primitive)
        worst = worst_case_cost(spec, payload, cap, self.book)
        if not ledger.reserve(worst):
            return SubtaskOutcome(REFUSED, "[not run: the episode's budget cannot cover this call]")
        max_tokens = cap if spec.kind == "llm" else None
        if self.cache is not None:
            result = await self.cache.call(worker, payload, max_tokens, primitive.name, self.book.version)
        else:
            result = await call_worker(worker, payload, max_tokens)
        cost = self.book.cost(spec.name, result.prompt_tokens, result.completion_tokens, result.cached_tokens)
        ledger.settle(worst, cost)
        call = Call(worker_name, payload, result, cost)
        if result.error:
            return SubtaskOutcome(WORKER_ERROR, f"[worker error: {result.error}]", [call])
        return SubtaskOutcome(OK, result.text, [call])

    @staticmethod
    def completion_cap(spec: WorkerSpec, primitive: PrimitiveSpec) -> int:
        """The completion cap a call is made with; tools produce no billed completion."""
        if spec.kind != "llm":
            return 0
        return primitive.max_tokens if primitive.max_tokens is not None else max_completion_tokens(spec)
