"""The small value types every layer shares: tasks, actions, worker results, episode state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

# A chat request (list of {"role", "content"}) for LLM workers, or plain text for tool workers.
Payload = list[dict[str, str]] | str


@dataclass(frozen=True)
class Task:
    """One unit of work an episode solves."""

    task_id: str  # unique within the suite
    suite: str  # e.g. "rg/basic_arithmetic", "gsm8k", "replay/routellm-gsm8k"
    split: str  # train | val | test | ood
    prompt: str
    answer: str  # reference answer, as the suite's verifier expects it
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    """What a policy chose at a turn; `propensity` is its probability under the behaviour policy."""

    worker: str
    primitive: str
    propensity: float = 1.0


STOP = Action(worker="", primitive="stop")


@dataclass
class WorkerResult:
    text: str
    prompt_tokens: int = 0  # from the server's usage field, never estimated
    completion_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0
    error: str = ""  # non-empty when the call failed after its retries


@dataclass
class TurnRecord:
    """One turn as the rollout engine saw it; becomes a row of the turns table."""

    turn_index: int
    actor: str
    worker: str
    primitive: str
    message: str
    response: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float
    cost_usd: float
    errors: list[dict[str, Any]]  # [{"rule": str, "severity": "high"|"medium"|"low"}]
    propensity: float
    subtask_id: str = ""
    depends_on: list[str] = field(default_factory=list)
    # What the environment showed after this turn's reply (Observation.observation): o_{t+1} of
    # MTRouter's history h_t (§3.2, eq. 2). "" when it said nothing (QA, a failed worker call).
    observation: str = ""


@dataclass
class EpisodeState:
    """What a policy may look at when it chooses the next action."""

    task: Task
    turns: list[TurnRecord] = field(default_factory=list)
    answer: str | None = None  # current candidate final answer
    spent_usd: float = 0.0
    budget_usd: float = float("inf")
    turn_limit: int = 1
    observation: str = ""  # latest environment observation (multi-turn environments)
    done: bool = False  # the environment says the episode is over (e.g. the simulator finished)
    env_state: dict[str, Any] = field(default_factory=dict)  # per-episode data owned by the environment


@dataclass
class Observation:
    """An environment's reading of one worker reply."""

    answer: str | None = None  # new candidate final answer, or None to keep the old one
    errors: list[dict[str, Any]] = field(default_factory=list)  # [{"rule", "severity"}]
    observation: str = ""  # what the environment shows next (multi-turn); "" for QA
    done: bool = False


class Worker(Protocol):
    name: str

    async def call(self, payload: Payload, max_tokens: int | None = None) -> WorkerResult: ...


class Policy(Protocol):
    name: str
    version: str

    def act(self, state: EpisodeState, actions: Sequence[Action], rng: Any) -> Action:
        """Choose one of `actions` (all affordable) or STOP."""
        ...


class Environment(Protocol):
    """A task source plus the rules for talking to workers about a task and scoring the result."""

    name: str

    def reset(self, state: EpisodeState) -> None:
        """Prepare a new episode (QA: nothing; simulators: load the task into state.env_state)."""
        ...

    def request(self, state: EpisodeState, primitive: str) -> Payload:
        """The payload to send for `primitive` given the episode so far."""
        ...

    def observe(self, state: EpisodeState, primitive: str, text: str) -> Observation:
        """Parse a worker's reply (and, for simulators, act on it)."""
        ...

    def score(self, state: EpisodeState) -> float:
        """Verifier: score of the episode's final answer (or final simulator state), in [0, 1]
        unless the environment documents otherwise; success means score >= the env's threshold."""
        ...

    def close(self, state: EpisodeState) -> None:
        """Release per-episode resources; always called, also after errors."""
        ...
