"""The orchestrator's executor: plays a controller's turns through the pool's workers (004 §4, App. A.7).

An episode: the system prompt (grammar, rules, the admissible (model, primitive) pairs with prices)
and the task as the first user message; then, turn by turn, the controller writes; the executor parses
the turn (grammar.py) and either ends the episode on a <final_answer>, or runs the plan: subtasks whose
dependencies are done are dispatched in parallel, blind (dispatch.py), and their results come back in
one user message of escaped <obs> blocks. A group of episodes of one task (RL's G rollouts, 004 §5)
shares each controller call: every turn of the group is one batched `respond`. `run_tree` grows the
group as a rollout tree for tree-GRPO (004 App. B): siblings split off a running episode and share its
prefix.

Limits, checked before every call: the turn limit Tmax (controller turns; 004 §5 uses 8) before each
controller turn, the budget before each controller turn and each worker call (dispatch.py). A refused
worker call ends the episode ("budget") once the calls already made have returned. The episode
row's `turn_limit` is Tmax: it counts controller turns, while `turns` counts every row.

Malformed turns (004 §4.1 rewards schema-valid turns, S(τ), and penalises invalid ones through the
per-turn shaping r_t): the turn row records the GrammarError as an error (rule "grammar/<kind>",
severity high), the executor answers with an <error> block and the controller tries again, within
Tmax; `ExecutorConfig.end_on_malformed` ends the episode instead. A turn after observations that
skips <verify> (F.2 asks for one) is executed and recorded with a low-severity error.

Records (routerops.schema): each controller turn is a row with actor "controller" (its own tokens,
the kind of turn in `primitive`, the user message it answered in `message`, the executor's reply in
`observation`); each worker call is a row with actor "worker" and subtask_id, depends_on and the
primitive filled. The episode row holds the behaviour mode (modes.py) and the whole conversation
as JSON; `EpisodeResult` also keeps the controller's token ids and log-probabilities for RL.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from routerops import schema
from routerops.envs.qa import score_answer
from routerops.errors import InputError, RouteropsError
from routerops.orchestra import modes
from routerops.orchestra.controller import Controller, ControllerTurn, Message
from routerops.orchestra.dispatch import OK, REFUSED, SKIPPED, BudgetLedger, SubtaskOutcome, SubtaskRunner
from routerops.orchestra.grammar import (
    FinalAnswer, GrammarError, Plan, RouteTable, Subtask, Turn, TurnContext, parse_turn,
)
from routerops.orchestra.prompt import PROMPT_STYLES, PoolRow, render_system_prompt
from routerops.orchestra.render import render_error, render_observations
from routerops.policies import episode_rng
from routerops.pricing import Pool, PriceBook, check_pool_priced
from routerops.rollout import message_text, prompt_token_bound, spec_of, turn_row
from routerops.types import Task, TurnRecord, Worker
from routerops.workers.cache import WorkerCache

logger = logging.getLogger(__name__)

WORKER_ACTOR = "worker"
TMAX = 8  # 004 §5: at most 8 orchestrator turns
Verifier = Callable[[Task, "str | None"], float]


@dataclass(frozen=True)
class ExecutorConfig:
    budget_usd: float = 0.05  # B per episode: controller and worker calls, checked before each
    turn_limit: int = TMAX  # controller turns per episode
    # The controller's completion cap: its worst-case cost, reserved before each turn, assumes it.
    controller_max_tokens: int = 1024
    end_on_malformed: bool = False  # True: a malformed turn ends the episode ("error") instead of a retry
    # 004 §5 blind pool: LLM workers appear to the controller as Worker1..K, the mapping drawn anew per
    # episode, so the policy learns workers from their results, not their brand names.
    anonymize_models: bool = False
    success_threshold: float = 1.0  # score at or above which an episode counts as a success
    prompt: str = "full"  # the system prompt's style (prompt.py): full, or compact for small controllers

    def __post_init__(self) -> None:
        if not self.budget_usd >= 0:
            raise InputError("executor config", "budget_usd",
                             f"expected a non-negative number, got {self.budget_usd!r}")
        for name in ("turn_limit", "controller_max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError("executor config", name, f"expected a positive integer, got {value!r}")
        if self.prompt not in PROMPT_STYLES:
            raise InputError("executor config", "prompt", f"{self.prompt!r} is not one of {PROMPT_STYLES}")


@dataclass
class EpisodeResult:
    episode: dict[str, Any]  # the episodes-table row
    turns: list[dict[str, Any]]  # the turns-table rows
    messages: list[Message]  # the conversation (JSON in episode["conversation"])
    controller_turns: list[ControllerTurn]  # as the controller returned them: token ids, log-probabilities
    malformed_turns: int
    # Per controller turn, its node in the group's rollout tree (`Executor.run_tree`): siblings share the
    # nodes of their common prefix. Independent episodes have nodes of their own.
    nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TreeShape:
    """Uno-tree-GRPO's sampling geometry (004 App. B, "Tree-GRPO and Uno-tree-GRPO": "first samples a
    shared prefix and then branches at selected decision points, producing sibling continuations under
    the same partial context"): `roots` independent episodes; before controller turn `branch_turn`
    (0-based; the turns before it are the shared prefix) every episode still running splits into
    `branches` siblings that continue from the same conversation, ledger and worker results. An episode
    that ends before the branch point stays one leaf."""

    roots: int
    branches: int
    branch_turn: int = 1

    def __post_init__(self) -> None:
        for name, low in (("roots", 1), ("branches", 2), ("branch_turn", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InputError("tree shape", name, f"expected an integer ≥ {low}, got {value!r}")

    @property
    def max_leaves(self) -> int:
        return self.roots * self.branches


@dataclass
class _Episode:
    """One episode while it runs."""

    episode_id: str
    seed: int
    labels: dict[str, str]  # label the controller writes -> pool worker
    routes: RouteTable
    ledger: BudgetLedger
    messages: list[Message]
    turns: list[TurnRecord] = field(default_factory=list)
    replies: list[ControllerTurn] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # kind of each controller turn (modes.TURN_KINDS)
    outputs: dict[int, str] = field(default_factory=dict)  # subtask id -> result, for its dependents
    failed: set[int] = field(default_factory=set)  # subtasks without a result
    last_round: int = 0
    out_of_budget: bool = False
    answer: str | None = None
    ended_by: str | None = None
    error: str = ""
    reserved_usd: float = 0.0  # the controller turn's reservation, while it is being generated
    branch: str = ""  # the path in a rollout tree ("r0", then "r0.1" after a split); names turn nodes
    nodes: list[str] = field(default_factory=list)  # each controller turn's tree node

    def end(self, reason: str, error: str = "") -> None:
        self.ended_by, self.error = reason, error

    def context(self) -> TurnContext:
        return TurnContext(self.routes, self.last_round, frozenset(self.outputs) | frozenset(self.failed))


class Executor:
    """Runs controllers' episodes over one pool, its workers and a price book."""

    def __init__(self, pool: Pool, workers: Mapping[str, Worker], book: PriceBook,
                 config: ExecutorConfig = ExecutorConfig(), verifier: Verifier = score_answer,
                 cache: WorkerCache | None = None):
        check_pool_priced(pool, book)
        missing = sorted({w for w, _ in pool.admissible_pairs()} - set(workers))
        if missing:
            raise RouteropsError(f"pool {pool.name!r}: no worker object for {missing[0]!r}")
        for name in workers:
            spec_of(workers[name])  # every worker carries its WorkerSpec
        self.pool, self.workers, self.book, self.config, self.verifier = pool, workers, book, config, verifier
        # Deterministic workers' results replayed from `cache` (routerops/workers/cache.py), if given.
        self.cache = cache
        self.runner = SubtaskRunner(pool, workers, book, cache)

    # ------------------------------------------------ episodes and groups

    async def run_episode(self, task: Task, controller: Controller, run_id: str, seed: int) -> EpisodeResult:
        return (await self.run_group(task, controller, run_id, [seed]))[0]

    async def run_group(self, task: Task, controller: Controller, run_id: str,
                        seeds: Sequence[int]) -> list[EpisodeResult]:
        """One episode per seed, all of `task`; each controller turn of the group is one batched call."""
        if len(set(seeds)) != len(seeds) or not seeds:
            raise InputError("run_group", "seeds", f"expected distinct seeds, got {list(seeds)}")
        return await self.run_batch([(task, seed) for seed in seeds], controller, run_id)

    async def run_batch(self, items: Sequence[tuple[Task, int]], controller: Controller,
                        run_id: str) -> list[EpisodeResult]:
        """One episode per (task, seed), in lockstep: each round of controller turns over every running
        episode is one batched `respond` (a language-model controller generates them in one batch,
        the only way a CPU evaluates dozens of tasks in minutes); their plans then run concurrently."""
        self.check_controller(controller)
        if len({(task.task_id, seed) for task, seed in items}) != len(items):
            raise InputError("run_batch", "items", "a (task, seed) pair is listed twice")
        episodes = [self.start(task, controller, run_id, seed) for task, seed in items]
        await self.play(episodes, controller)
        return [self.finish(e, task, controller, run_id) for e, (task, _) in zip(episodes, items)]

    async def run_tree(self, task: Task, controller: Controller, run_id: str, seeds: Sequence[int],
                       shape: TreeShape) -> list[EpisodeResult]:
        """A rollout tree of `task` (`TreeShape`): one EpisodeResult per leaf, each a whole trajectory
        (its shared prefix's turns, calls and costs included), its turns' tree nodes in `nodes`.
        `seeds` (distinct, at least shape.max_leaves) name the roots, then the siblings in order."""
        if len(set(seeds)) != len(seeds) or len(seeds) < shape.max_leaves:
            raise InputError("run_tree", "seeds", f"expected {shape.max_leaves} distinct seeds, got {list(seeds)}")
        self.check_controller(controller)
        spare = iter(seeds[shape.roots:])
        episodes = []
        for i, seed in enumerate(seeds[:shape.roots]):
            episodes.append(self.start(task, controller, run_id, seed))
            episodes[-1].branch = f"r{i}"

        def split(ready: list[_Episode]) -> list[_Episode]:
            grown = []
            for e in ready:
                grown.append(e)
                if len(e.replies) == shape.branch_turn:
                    parent = e.branch
                    e.branch = f"{parent}.0"
                    for k in range(1, shape.branches):
                        sibling = self.sibling(e, task, controller, run_id, next(spare), f"{parent}.{k}")
                        episodes.append(sibling)
                        grown.append(sibling)
            return grown

        await self.play(episodes, controller, split)
        return [self.finish(e, task, controller, run_id) for e in episodes]

    def sibling(self, e: _Episode, task: Task, controller: Controller, run_id: str, seed: int,
                branch: str) -> _Episode:
        """A copy of running episode `e` under a new id: same conversation, ledger (with the pending
        reservation), worker labels and results; from here on it samples its own turns."""
        twin = copy.deepcopy(e)
        twin.episode_id, twin.seed, twin.branch = schema.episode_id(run_id, task.task_id, controller.name, seed), seed, branch
        return twin

    async def play(self, episodes: list[_Episode], controller: Controller,
                   before_round: Callable[[list[_Episode]], list[_Episode]] | None = None) -> None:
        """Controller rounds until every episode has ended; `before_round` may grow a round (run_tree)."""
        while True:
            ready = [e for e in episodes if e.ended_by is None and self.may_call_controller(e, controller)]
            if before_round is not None:
                ready = before_round(ready)
            if not ready:
                break
            replies, latency = await self.respond(controller, ready)
            plans = [(e, taken) for e, reply in zip(ready, replies)
                     if (taken := self.take_turn(e, reply, latency, controller)) is not None]
            await asyncio.gather(*(self.execute_plan(e, plan, row) for e, (plan, row) in plans))

    def check_controller(self, controller: Controller) -> None:
        if controller.name not in self.book.prices:
            raise InputError(f"price book {self.book.version}", f"prices.{controller.name}",
                             "the controller has no price: give it one (0 for a self-hosted controller) so "
                             "its turns are costed, budgeted and re-priceable like every call")

    def start(self, task: Task, controller: Controller, run_id: str, seed: int) -> _Episode:
        eid = schema.episode_id(run_id, task.task_id, controller.name, seed)
        labels = worker_labels(self.pool, self.config.anonymize_models, episode_rng(seed, eid))
        table, messages = opening(self.pool, self.book, self.config, task.prompt, labels)
        return _Episode(eid, seed, labels, table, BudgetLedger(self.config.budget_usd), messages)

    # ------------------------------------------------ controller turns

    def may_call_controller(self, e: _Episode, controller: Controller) -> bool:
        """Tmax and the budget, checked before the controller is called; ends the episode if not."""
        if len(e.replies) >= self.config.turn_limit:
            e.end(schema.END_TURN_LIMIT)
            return False
        prompt = prompt_token_bound(e.messages)
        worst = max(self.book.cost(controller.name, prompt, self.config.controller_max_tokens, c) for c in (0, prompt))
        if not e.ledger.reserve(worst):
            e.end(schema.END_BUDGET)
            return False
        e.reserved_usd = worst
        return True

    async def respond(self, controller: Controller, ready: list[_Episode]) -> tuple[list[ControllerTurn], float]:
        started = time.perf_counter()
        replies = await asyncio.to_thread(controller.respond, [list(e.messages) for e in ready])
        latency = time.perf_counter() - started
        if len(replies) != len(ready) or not all(isinstance(r, ControllerTurn) for r in replies):
            raise RouteropsError(f"controller {controller.name!r} answered {len(replies)} conversations with "
                                 f"{type(replies).__name__}; expected {len(ready)} ControllerTurn")
        return list(replies), latency

    def take_turn(self, e: _Episode, reply: ControllerTurn, latency: float,
                  controller: Controller) -> tuple[Plan, TurnRecord] | None:
        """Record the turn and act on it; returns the plan to execute, if it is one."""
        cost = self.book.cost(controller.name, reply.prompt_tokens, reply.completion_tokens, 0)
        e.ledger.settle(e.reserved_usd, cost)
        parsed = parse_turn(reply.text, e.context())
        row = TurnRecord(
            turn_index=len(e.turns), actor=modes.CONTROLLER_ACTOR, worker=controller.name, primitive="",
            message=e.messages[-1]["content"], response=reply.text, prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens, cached_tokens=0, latency_s=latency, cost_usd=cost,
            errors=[], propensity=1.0,
        )
        e.turns.append(row)
        e.nodes.append(f"{e.branch or e.episode_id}/t{len(e.replies)}")
        e.replies.append(reply)
        e.messages.append({"role": "assistant", "content": reply.text})
        if isinstance(parsed, GrammarError):
            self.reject(e, parsed, row)
            return None
        row.primitive = self.kind_of(parsed)
        e.kinds.append(row.primitive)
        if e.last_round > 0 and parsed.verify is None:
            row.errors.append({"rule": "grammar/missing_verify", "severity": "low"})
        if isinstance(parsed.action, FinalAnswer):
            e.answer = parsed.action.text
            e.end(schema.END_DONE)
            return None
        return parsed.action, row

    @staticmethod
    def kind_of(turn: Turn) -> str:
        if isinstance(turn.action, FinalAnswer):
            return modes.KIND_FINAL_ANSWER
        return modes.KIND_REPAIR if turn.is_repair else modes.KIND_PLAN

    def reject(self, e: _Episode, error: GrammarError, row: TurnRecord) -> None:
        """A malformed turn: recorded and penalised, then answered with an <error> (or the end)."""
        logger.info("episode %s, turn %d malformed (%s): %s", e.episode_id, len(e.replies), error.kind, error.message)
        row.primitive = modes.KIND_MALFORMED
        row.errors.append({"rule": error.rule, "severity": "high", "detail": error.message})
        e.kinds.append(modes.KIND_MALFORMED)
        if self.config.end_on_malformed:
            e.end(schema.END_ERROR, f"malformed turn ({error.kind}): {error.message}")
            return
        row.observation = render_error(error)
        e.messages.append({"role": "user", "content": row.observation})

    # ------------------------------------------------ plans

    async def execute_plan(self, e: _Episode, plan: Plan, row: TurnRecord) -> None:
        """Dispatch the plan's subtasks as their dependencies finish; record; reply with the <obs>."""
        outcomes = await self.dispatch(e, plan)
        for subtask in plan.subtasks:
            for call in outcomes[subtask.id].calls:
                e.turns.append(self.call_row(len(e.turns), subtask, call))
        e.last_round = plan.round
        row.observation = render_observations([(s.id, outcomes[s.id].text) for s in plan.subtasks])
        e.messages.append({"role": "user", "content": row.observation})
        if e.out_of_budget:
            e.end(schema.END_BUDGET)

    async def dispatch(self, e: _Episode, plan: Plan) -> dict[int, SubtaskOutcome]:
        """Every subtask starts as soon as the subtasks it depends on have finished (A.7), so
        independent ones run concurrently."""
        finished = {s.id: asyncio.Event() for s in plan.subtasks}
        outcomes: dict[int, SubtaskOutcome] = {}

        async def run(subtask: Subtask) -> None:
            try:
                for dependency in subtask.depends_on:
                    if dependency in finished:
                        await finished[dependency].wait()
                outcomes[subtask.id] = outcome = await self.run_subtask(e, subtask)
                if outcome.status == OK:
                    e.outputs[subtask.id] = outcome.text
                else:
                    e.failed.add(subtask.id)
            finally:
                finished[subtask.id].set()

        await asyncio.gather(*(run(s) for s in plan.subtasks))
        return outcomes

    async def run_subtask(self, e: _Episode, subtask: Subtask) -> SubtaskOutcome:
        if e.out_of_budget:
            return SubtaskOutcome(REFUSED, "[not run: the episode's budget is spent]")
        blocked = [d for d in subtask.depends_on if d in e.failed]
        if blocked:
            return SubtaskOutcome(SKIPPED, f"[not run: subtask {blocked[0]} has no result]")
        # Blind (004 §5): the worker gets this subtask and its dependencies' outputs, nothing else.
        inputs = {d: e.outputs[d] for d in subtask.depends_on}
        outcome = await self.runner.run(subtask, e.labels[subtask.model], inputs, e.ledger)
        if outcome.status == REFUSED:
            e.out_of_budget = True
        return outcome

    @staticmethod
    def call_row(index: int, subtask: Subtask, call) -> TurnRecord:
        result = call.result
        return TurnRecord(
            turn_index=index, actor=WORKER_ACTOR, worker=call.worker, primitive=subtask.primitive,
            message=message_text(call.payload), response=result.text, prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens, cached_tokens=result.cached_tokens,
            latency_s=result.latency_s, cost_usd=call.cost_usd,
            errors=[{"rule": "worker_error", "severity": "high"}] if result.error else [], propensity=1.0,
            subtask_id=str(subtask.id), depends_on=[str(d) for d in subtask.depends_on],
        )

    # ------------------------------------------------ the end

    def finish(self, e: _Episode, task: Task, controller: Controller, run_id: str) -> EpisodeResult:
        """Score the final answer with the task's verifier and build the table rows."""
        score = float(self.verifier(task, e.answer)) if e.answer is not None else 0.0
        malformed = e.kinds.count(modes.KIND_MALFORMED)
        episode = {
            "episode_id": e.episode_id, "run_id": run_id, "task_id": task.task_id, "suite": task.suite,
            "split": task.split, "policy": controller.name, "policy_version": str(getattr(controller, "version", "1")),
            "seed": int(e.seed), "budget_usd": float(self.config.budget_usd), "turn_limit": self.config.turn_limit,
            "price_book_version": self.book.version, "final_answer": e.answer or "", "score": score,
            "success": score >= self.config.success_threshold, "turns": len(e.turns),
            "prompt_tokens": sum(t.prompt_tokens for t in e.turns),
            "completion_tokens": sum(t.completion_tokens for t in e.turns),
            "cached_tokens": sum(t.cached_tokens for t in e.turns), "cost_usd": sum(t.cost_usd for t in e.turns),
            "ended_by": e.ended_by, "error": e.error, "mode": modes.behaviour_mode(e.kinds),
            "conversation": json.dumps(e.messages, ensure_ascii=False),
        }
        return EpisodeResult(episode, [turn_row(e.episode_id, t) for t in e.turns], e.messages, e.replies, malformed,
                             list(e.nodes))


def worker_labels(pool: Pool, anonymize: bool, rng: random.Random) -> dict[str, str]:
    """Label -> worker, in the order the pool table lists them."""
    names = list(dict.fromkeys(w for w, _ in pool.admissible_pairs()))
    if not anonymize:
        return {name: name for name in names}
    llms = [n for n in names if pool.worker(n).kind == "llm"]
    shuffled = rng.sample(llms, len(llms))
    anonymous = {f"Worker{i + 1}": name for i, name in enumerate(shuffled)}
    return {**anonymous, **{n: n for n in names if n not in llms}}  # tools keep their names


def opening(pool: Pool, book: PriceBook, config: ExecutorConfig, prompt: str,
            labels: Mapping[str, str]) -> tuple[RouteTable, list[Message]]:
    """What the controller may route to, and the conversation's first two messages: the system prompt
    (grammar, rules, the admissible pairs with prices, budget, Tmax) and the task. Served controllers
    (evaluation/serving/orchestra.py) open a conversation with it too."""
    pairs = pool.admissible_pairs()
    table = RouteTable({label: tuple(p for w, p in pairs if w == worker) for label, worker in labels.items()},
                       frozenset(pool.primitives))
    rows = [PoolRow(label, table.models[label], book.price(worker)) for label, worker in labels.items()]
    system = render_system_prompt(rows, pool.primitives, config.budget_usd, config.turn_limit, config.prompt)
    return table, [{"role": "system", "content": system}, {"role": "user", "content": prompt}]


def run_batch_sync(executor: Executor, items: Sequence[tuple[Task, int]], controller: Controller,
                   run_id: str) -> list[EpisodeResult]:
    """`Executor.run_batch` for callers without an event loop."""
    return asyncio.run(executor.run_batch(items, controller, run_id))


def run_group_sync(executor: Executor, task: Task, controller: Controller, run_id: str,
                   seeds: Sequence[int]) -> list[EpisodeResult]:
    """`Executor.run_group` for callers without an event loop."""
    return asyncio.run(executor.run_group(task, controller, run_id, seeds))
