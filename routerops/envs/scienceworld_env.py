"""ScienceWorld as a multi-turn environment (MTRouter §4.1, Appendix A, B, E.1).

The agent model emits one text command per turn; the environment executes it in the ScienceWorld
simulator (the `scienceworld` package: a Scala simulator in a JVM, reached through py4j) and shows
the new observation. Each episode owns one simulator (one JVM) in `state.env_state["simulator"]`,
started in reset() and shut down in close().

Scoring: the terminal score is the simulator's own, an integer in [-100, 100] (its progress score
×100; negative when the agent did something that fails the task, which also ends the episode).
`score()` returns it raw (not rescaled to [0, 1]); `success_threshold` = 100, i.e. success means the
simulator judged the task fully completed.

Errors (Appendix B): only commands the simulator's parser does not recognise count — `no_known_action`,
severity high. Feedback such as "the door is not open" is normal exploration, not an error.

Free queries (§4.1): the agent may send `?all` or `?<category>` (e.g. `?navigation`, `?object`) to list
the currently valid commands; they are answered from the simulator's valid-action list and consume no
simulator step (they still cost the model call that produced them).

Cost of the simulator (`python -m routerops.envs.scienceworld_env`, 2 CPU cores, idle machine):
JVM start ~1.5 s, first load + reset ~0.9 s (later loads ~0.16 s), one step ~0.04 s, close ~0.07 s.
reset() blocks for those ~2.4 s, so a collection pays them once per episode.
"""

from __future__ import annotations

import random
import re
import subprocess
import time
from typing import Any, Sequence

from routerops.errors import InputError, RouteropsError
from routerops.types import EpisodeState, Observation, Task

SUITE = "scienceworld"
# Table 5 (Appendix A): 13 in-distribution task types, 12 held-out task types for OOD.
SCIENCEWORLD_ID_TYPES = (
    "boil", "melt", "chemistry-mix", "find-animal", "find-plant", "grow-plant", "identify-life-stages-1",
    "lifespan-longest-lived", "inclined-plane-determine-angle", "measure-melting-point-known-substance",
    "power-component", "test-conductivity", "mendelian-genetics-known-plant",
)
SCIENCEWORLD_OOD_TYPES = (
    "freeze", "change-the-state-of-matter-of", "chemistry-mix-paint-secondary-color", "find-non-living-thing",
    "grow-fruit", "identify-life-stages-2", "lifespan-shortest-lived", "inclined-plane-friction-unnamed-surfaces",
    "use-thermometer", "power-component-renewable-vs-nonrenewable-energy",
    "test-conductivity-of-unknown-substances", "mendelian-genetics-unknown-plant",
)
SPLIT_RATIOS = (0.6, 0.2, 0.2)  # Appendix A: variations of ID types → train / val / test
SUCCESS_SCORE = 100.0
NO_KNOWN_ACTION_TEXT = "No known action matches that input"
NO_KNOWN_ACTION = {"rule": "no_known_action", "severity": "high"}  # Table 7
FINISH_COMMAND = "task completed"  # the agent's submission (§3.1: "or by an agent submission")
TOOL_PRIMITIVES = ("python", "sympy")
# Command verbs by category, for the free `?category` queries and for per-action-type analyses (§4.3).
ACTION_CATEGORIES = {
    "navigation": ("go ", "teleport "),
    "object": ("pick up ", "put ", "move ", "pour ", "dunk ", "drop "),
    "observation": ("look", "examine ", "inventory", "read ", "wait"),
    "device": ("activate ", "deactivate ", "use ", "turn on ", "turn off "),
    "door": ("open ", "close "),
    "electrical": ("connect ", "disconnect "),
    "interaction": ("mix", "eat ", "flush ", "focus on "),
}
SYSTEM_PROMPT = (
    "You are an agent in ScienceWorld, a text simulator of science experiments. Each turn, reply with "
    "exactly one command, written as:\nAction: <command>\n"
    "Commands include: look around, look at <object>, go to <place>, open <door or container>, "
    "pick up <object>, put <object> in <container>, activate <device>, focus on <object>, "
    "wait, inventory. To list the commands that are valid now, send ?all, or ?navigation, ?object, "
    "?observation, ?device, ?door, ?electrical, ?interaction for one kind. "
    f"When the task is done, send: Action: {FINISH_COMMAND}"
)


# ---------------------------------------------------------------- simulator processes


def open_simulator(step_limit: int = 100) -> Any:
    """Start one simulator (a JVM); imported here so importing this module starts nothing."""
    from scienceworld import ScienceWorldEnv

    return ScienceWorldEnv("", envStepLimit=step_limit)


def shutdown_simulator(simulator: Any, timeout_s: float = 10.0) -> None:
    """Close the py4j gateway and make sure the JVM has exited (killed if it lingers)."""
    # The package's close() asks the JVM to exit but does not wait for it; its process handle is
    # only reachable through the gateway, so we read that private attribute to reap it.
    process = getattr(getattr(simulator, "_gateway", None), "java_process", None)
    try:
        simulator.close()
    finally:
        if process is not None:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout_s)


def known_task_types() -> list[str]:
    from scienceworld.constants import ID2TASK  # a JSON file shipped with the package, no JVM

    return list(ID2TASK.values())


def count_variations(task_types: Sequence[str]) -> dict[str, int]:
    """Number of variations of each task type, asked from one simulator."""
    simulator = open_simulator()
    try:
        return {name: int(simulator.get_max_variations(name)) for name in task_types}
    finally:
        shutdown_simulator(simulator)


# ---------------------------------------------------------------- task splits (Appendix A)


def split_variations(
    task_types: Sequence[str], counts: dict[str, int], max_variations: int, seed: int = 42
) -> dict[str, dict[str, list[int]]]:
    """Per ID task type: its first `max_variations` variations shuffled and cut 60/20/20.

    One generator seeded once and drawn in task-type order, as the paper's release does, so the
    same lists and seed give the same split (Appendix A: fixed seed 42).
    """
    rng = random.Random(seed)
    splits = {}
    for name in task_types:
        n = min(int(counts[name]), int(max_variations))
        variations = list(range(n))
        rng.shuffle(variations)
        n_train, n_val = int(n * SPLIT_RATIOS[0]), int(n * SPLIT_RATIOS[1])
        splits[name] = {
            "train": sorted(variations[:n_train]),
            "val": sorted(variations[n_train:n_train + n_val]),
            "test": sorted(variations[n_train + n_val:]),
        }
    return splits


def check_task_types(id_types: Sequence[str], ood_types: Sequence[str], known: Sequence[str]) -> None:
    for field, names in (("id_types", id_types), ("ood_types", ood_types)):
        for name in names:
            if name not in known:
                raise InputError("<scienceworld tasks>", field, f"unknown task type {name!r}; known: {sorted(known)}")
    overlap = sorted(set(id_types) & set(ood_types))
    if overlap:
        raise InputError("<scienceworld tasks>", "ood_types", f"held-out types also in id_types: {overlap}")


def scienceworld_tasks(
    id_types: Sequence[str] = SCIENCEWORLD_ID_TYPES,
    ood_types: Sequence[str] = SCIENCEWORLD_OOD_TYPES,
    max_variations: int = 30,
    seed: int = 42,
    variation_counts: dict[str, int] | None = None,
    with_descriptions: bool = True,
) -> list[Task]:
    """Tasks for the ID splits (train/val/test: variations of `id_types`) and OOD (the first
    `max_variations` variations of every held-out type). Task.meta holds task_name and variation.

    `variation_counts` skips asking the simulator how many variations each type has; with
    `with_descriptions` one simulator loads every variation to read its task description (the
    prompt), otherwise the prompt names the task type and variation only.
    """
    if max_variations < 1:
        raise InputError("<scienceworld tasks>", "max_variations", "must be at least 1")
    check_task_types(id_types, ood_types, known_task_types())
    counts = variation_counts if variation_counts is not None else count_variations([*id_types, *ood_types])
    planned = [
        (name, variation, split)
        for name, by_split in split_variations(id_types, counts, max_variations, seed).items()
        for split in ("train", "val", "test")
        for variation in by_split[split]
    ]
    planned += [(name, v, "ood") for name in ood_types for v in range(min(int(counts[name]), max_variations))]
    descriptions = read_descriptions([(n, v) for n, v, _ in planned]) if with_descriptions else {}
    return [
        Task(
            task_id=f"{name}/var{variation}",
            suite=f"{SUITE}/{name}",
            split=split,
            prompt=descriptions.get((name, variation), f"ScienceWorld task {name}, variation {variation}"),
            answer="",  # scored by the simulator, not against a reference answer
            meta={"task_name": name, "variation": variation},
        )
        for name, variation, split in planned
    ]


def read_descriptions(coordinates: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
    simulator = open_simulator()
    try:
        descriptions = {}
        for name, variation in coordinates:
            simulator.load(name, variation, "")
            descriptions[(name, variation)] = str(simulator.get_task_description())
        return descriptions
    finally:
        shutdown_simulator(simulator)


# ---------------------------------------------------------------- parsing the agent's reply


def parse_command(text: str) -> str:
    """The one command in a model reply: a ```text block, else the first `Action:` line, else the
    first non-empty line that is not a lead-in ending in ":"; quotes, backticks and a trailing full
    stop are stripped. Whatever comes out goes to the simulator, whose parser decides whether it is
    a valid command."""
    block = re.search(r"```(?:text)?\s*\n(.*?)\n\s*```", text, re.S)
    if block:
        lines = [block.group(1)]
    else:
        lines = re.findall(r"^\s*(?:action|command)\s*:\s*(.+)$", text, re.I | re.M)
        lines += [line for line in text.splitlines() if line.strip() and not line.rstrip().endswith(":")]
    candidate = lines[0].strip().splitlines()[0] if lines and lines[0].strip() else ""
    return re.sub(r"^[`\"'\s]+|[`\"'.\s]+$", "", candidate)


def action_category(text: str) -> str:
    """Action type of a model reply, for specialisation analyses (§4.3, Figure 6): query, finish,
    one of ACTION_CATEGORIES, or other."""
    command = parse_command(text).lower()
    if command.startswith("?"):
        return "query"
    if command == FINISH_COMMAND:
        return "finish"
    for category, verbs in ACTION_CATEGORIES.items():
        if any(command.startswith(v) or command == v.strip() for v in verbs):
            return category
    return "other"


def answer_query(query: str, valid_actions: Sequence[str], limit: int) -> str:
    """The reply to a free `?` query: the valid commands of one category, or all of them."""
    name = query.lstrip("?").strip().lower()
    if name in ("", "all"):
        listed, title = list(valid_actions), "valid actions"
    elif name in ACTION_CATEGORIES:
        verbs = ACTION_CATEGORIES[name]
        listed = [a for a in valid_actions if any(a.lower().startswith(v) for v in verbs)]
        title = f"valid {name} actions"
    else:
        return f"Unknown query {query!r}. Queries: ?all, " + ", ".join(f"?{c}" for c in ACTION_CATEGORIES)
    more = f"\n... and {len(listed) - limit} more" if len(listed) > limit else ""
    return f"{title} ({len(listed)}):\n" + "\n".join(listed[:limit]) + more


# ---------------------------------------------------------------- the environment


class ScienceWorldEnvironment:
    """Environment protocol (routerops.types) over one ScienceWorld simulator per episode."""

    name = SUITE
    success_threshold = SUCCESS_SCORE

    def __init__(self, history_chars: int = 3000, step_limit: int = 100, listed_actions: int = 50,
                 simplification: str = ""):
        self.history_chars = history_chars  # most recent (command, observation) pairs within this many characters
        self.step_limit = step_limit  # simulator's own move limit; the rollout turn limit is usually lower
        self.listed_actions = listed_actions  # most commands one `?` query lists
        self.simplification = simplification  # ScienceWorld simplification string, "" = none (paper)

    def reset(self, state: EpisodeState) -> None:
        task_name, variation = task_coordinates(state.task)
        simulator = open_simulator(self.step_limit)
        try:
            simulator.load(task_name, variation, self.simplification)
            observation, info = simulator.reset()
        except Exception:
            shutdown_simulator(simulator)
            raise
        state.env_state.update(
            simulator=simulator, task_description=str(info["taskDesc"]), valid_actions=list(info["valid"]),
            score=float(info["score"]), history=[], moves=0,
        )
        state.observation = str(observation)

    def request(self, state: EpisodeState, primitive: str) -> list[dict[str, str]]:
        if primitive in TOOL_PRIMITIVES:
            raise RouteropsError(f"ScienceWorld serves LLM workers only; primitive {primitive!r} has no meaning here")
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": self.prompt(state)}]

    def prompt(self, state: EpisodeState) -> str:
        env = state.env_state
        parts = [f"Task: {env['task_description']}"]
        earlier = recent_pairs(env["history"][:-1], self.history_chars)  # the last pair is shown below
        if earlier:
            parts.append("Earlier steps:\n" + "\n".join(f"Action: {a}\nObservation: {o}" for a, o in earlier))
        if env["history"]:
            parts.append(f"Your last action: {env['history'][-1][0]}")
        parts.append(f"Current observation:\n{state.observation}")
        parts.append(f"Score so far: {env['score']:.0f}. Reply with your next command as: Action: <command>")
        return "\n\n".join(parts)

    def observe(self, state: EpisodeState, primitive: str, text: str) -> Observation:
        env = state.env_state
        command = parse_command(text)
        errors: list[dict[str, str]] = []
        done = False
        if command.startswith("?"):
            observation = answer_query(command, env["valid_actions"], self.listed_actions)
        elif command.lower() == FINISH_COMMAND:
            observation, done = "You declared the task completed; the episode ends.", True
        else:
            observation, _, done, info = env["simulator"].step(command)
            observation = str(observation)
            env.update(valid_actions=list(info["valid"]), score=float(info["score"]), moves=int(info["moves"]))
            if NO_KNOWN_ACTION_TEXT in observation:
                errors.append(dict(NO_KNOWN_ACTION))
        env["history"].append((command, observation))
        state.observation = observation
        return Observation(answer=None, errors=errors, observation=observation, done=bool(done))

    def score(self, state: EpisodeState) -> float:
        """The simulator's score in [-100, 100] after the last command (0 before any)."""
        return float(state.env_state.get("score", 0.0))

    def close(self, state: EpisodeState) -> None:
        simulator = state.env_state.pop("simulator", None)
        if simulator is not None:
            shutdown_simulator(simulator)


def recent_pairs(pairs: Sequence[tuple[str, str]], char_budget: int) -> list[tuple[str, str]]:
    """The most recent pairs whose text fits in `char_budget` characters: like the paper's history
    truncation (§3.2) the task block is always kept by the caller and the oldest context goes first,
    so the prompt stays inside a small model's context window."""
    kept, used = [], 0
    for first, second in reversed(pairs):
        used += len(first) + len(second)
        if used > char_budget:
            break
        kept.append((first, second))
    return kept[::-1]


def task_coordinates(task: Task) -> tuple[str, int]:
    try:
        return str(task.meta["task_name"]), int(task.meta["variation"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"<task {task.task_id}>", "meta", f"needs task_name and an integer variation ({exc})") from exc


def measure_simulator(task_name: str = "boil", variation: int = 0, steps: int = 20) -> dict[str, float]:
    """Seconds to start a simulator, load a task, and take one step (mean over `steps` looks)."""
    started = time.perf_counter()
    simulator = open_simulator()
    try:
        opened = time.perf_counter()
        simulator.load(task_name, variation, "")
        simulator.reset()
        loaded = time.perf_counter()
        for _ in range(steps):
            simulator.step("look around")
        stepped = time.perf_counter()
    finally:
        shutdown_simulator(simulator)
    closed = time.perf_counter()
    return {"start_s": opened - started, "load_reset_s": loaded - opened,
            "step_s": (stepped - loaded) / steps, "close_s": closed - stepped}


if __name__ == "__main__":
    print(measure_simulator())
