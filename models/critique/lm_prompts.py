"""The LM controller's prompts and its strict parser (paper 002 App. B Table 8; CoRL, paper 003 §3.3).

Template I (turn 1, prompt c) and Template II (turns t > 1, prompt c') are the paper's system prompts
word for word, with AGENT LIST (weaker → stronger, as the template says) and AGENT NAME filled in. The
user message holds the problem, and from turn 2 the previous agent's solution: 002 §3.2's state
s_t = (q, c', g_{t−1}) is Markovian, so a conversation is one system prompt, one user message and the
controller's one turn (Alg. 1 branches from states, not from histories).

The parser is strict: anything but the template's exact structure is `malformed` with a reason, never
an exception (design card: "malformed output is a typed, logged, penalised event, never a crash"):
- Template I:  <thinking>…</thinking> <model>NAME</model>, NAME one of the listed agents;
- Template II: <checking>…</checking> <verdict>True|False</verdict>, then <model>NAME</model> if and
  only if the verdict is False, NAME *stronger* than the draft's author (Template II: "select exactly
  one model that is stronger than AGENT NAME"). On the strongest agent's draft (only reached when
  rewards.verify_strongest is on) a False verdict has no stronger model to name and names none.
- CoRL:        <thinking>…</thinking> <model>self|EXPERT</model>.
Whitespace between tags is free; text outside the tags, a repeated or nested tag, an unclosed tag (a
turn cut at max_new_tokens) or an unknown name is malformed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from routerops.orchestra.controller import Message

# 002 App. B, Table 8, verbatim but for the placeholders.
TEMPLATE_I = (
    "You are a router. Given a math problem, your task is to route the problem to the appropriate model based on "
    "its difficulty. Rules: The available models, ordered from weaker to stronger, are: {agent_list}. Choose the "
    "appropriate model based on the problem difficulty. Output format: First, put your thinking process inside "
    "<thinking></thinking> tags. Then, output your choice in the format <model>AGENT NAME</model>. Your thinking "
    "should briefly explain the difficulty only. You don't need to solve the problem.")
TEMPLATE_II = (
    "You are a math solution verifier and router. Given a math problem and a proposed solution from {author}, "
    "determine whether the proposed solution is fully correct. Rules: Check the proposed solution step by step. If "
    "any step is incorrect, unjustified, incomplete, or relies on invalid assumptions, return False and route the "
    "problem to a stronger model. If the solution is fully correct, return True and stop. The available models, "
    "ordered from weaker to stronger, are: {agent_list}. If routing is needed, select exactly one model that is "
    "stronger than {author}. Output format (you MUST use exactly this structure): First, put your verification "
    "inside <checking></checking>. Then output either <verdict>True</verdict> or <verdict>False</verdict>. If and "
    "only if the verdict is False, output in the next line: <model>AGENT NAME</model>")
# 003's system prompts (its App. B) are lost from our copy; this one follows its §3.3 eq. 8 (the budget
# mode named in the prompt) and §4.5's "Prompt B" (no hard rule, a preference per mode), in Template
# I's output format so one controller model serves both papers.
SELF = "self"
CORL_GUIDANCE = {
    "low": "The budget is low: answer yourself unless the problem clearly needs the expert.",
    "medium": "The budget is medium: call the expert only when the problem looks hard.",
    "high": "The budget is high: prefer calling the expert whenever it may help.",
}
TEMPLATE_CORL = (
    "You are the controller of a multi-model system. Given a math problem, decide whether to answer it yourself "
    "or to call the expert model. Budget mode: {mode}. {guidance} The options are: {options}. Output format: "
    "First, put your thinking process inside <thinking></thinking> tags. Then, output your choice in the format "
    "<model>NAME</model>, where NAME is self or {expert}.")

# The CPU cut (prompts.template: short): the same rules and output format in a third of the tokens. On two
# CPU cores the prompt's prefill is most of a turn's cost, sampling and training alike.
TEMPLATE_I_SHORT = ("Route the math problem to one model by its difficulty. Models, weaker to stronger: {agent_list}. "
                    "Write <thinking>the difficulty, briefly</thinking> then <model>AGENT NAME</model>.")
TEMPLATE_II_SHORT = ("Verify the solution from {author}. Models, weaker to stronger: {agent_list}. Write "
                     "<checking>your check</checking>, then <verdict>True</verdict> if it is fully correct, else "
                     "<verdict>False</verdict> and <model>AGENT NAME</model> of a model stronger than {author}.")
TEMPLATE_CORL_SHORT = ("Budget mode: {mode}. {guidance} Answer the math problem yourself or call the expert. Write "
                       "<thinking>briefly why</thinking> then <model>NAME</model>, NAME one of: {options}.")
TEMPLATES = ("full", "short")

ROUTE, ACCEPT, REJECT = "route", "accept", "reject"


def display_name(worker: str, short: bool = True) -> str:
    return worker.rsplit("/", 1)[-1] if short else worker


def tail_tokens(text: str, n: int, tokenizer: Any | None = None) -> str:
    """The last n tokens of `text` (0: all of it). With a tokenizer its own tokens, else whitespace words."""
    if n <= 0:
        return text
    if tokenizer is None:
        words = text.split()
        return text if len(words) <= n else "… " + " ".join(words[-n:])
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= n else "… " + tokenizer.decode(ids[-n:]).lstrip()


def routing_messages(question: str, agents: list[str], template: str = "full") -> list[Message]:
    """Turn 1: Template I (agents weaker → stronger) and the problem."""
    system = TEMPLATE_I if template == "full" else TEMPLATE_I_SHORT
    return [{"role": "system", "content": system.format(agent_list=", ".join(agents))},
            {"role": "user", "content": f"Problem: {question.strip()}"}]


def verify_messages(question: str, agents: list[str], author: int, draft: str, template: str = "full") -> list[Message]:
    """Turns t > 1: Template II about agent `author`'s draft (already cut to its tail if so configured)."""
    name = agents[author]
    system = TEMPLATE_II if template == "full" else TEMPLATE_II_SHORT
    return [{"role": "system", "content": system.format(agent_list=", ".join(agents), author=name)},
            {"role": "user", "content": f"Problem: {question.strip()}\n\nProposed solution from {name}:\n{draft.strip()}"}]


def corl_messages(question: str, expert: str, mode: str, template: str = "full") -> list[Message]:
    """CoRL's controller prompt for one budget mode (003 §3.3 eq. 8)."""
    system = (TEMPLATE_CORL if template == "full" else TEMPLATE_CORL_SHORT).format(mode=mode, guidance=CORL_GUIDANCE[mode], options=f"{SELF}, {expert}", expert=expert)
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Problem: {question.strip()}"}]


@dataclass(frozen=True)
class ParsedTurn:
    """One controller turn, parsed. kind: route (turn 1 / CoRL), accept (verdict True), reject (verdict
    False); model: the named agent's index, or None; error: why the turn is malformed, or None."""

    kind: str | None
    model: int | None = None
    error: str | None = None
    text: str = ""  # the <thinking> or <checking> text

    @property
    def malformed(self) -> bool:
        return self.error is not None


TAGS = ("thinking", "checking", "verdict", "model")
_BLOCK = {tag: re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL) for tag in TAGS}


def _structure(text: str, expected: list[tuple[str, bool]]) -> tuple[dict[str, str], str | None]:
    """Match `text` against tags in order, each (tag, required); returns ({tag: inner}, error)."""
    for tag in TAGS:
        if text.count(f"<{tag}>") > 1 or text.count(f"</{tag}>") > 1:
            return {}, f"repeated <{tag}>"
        if text.count(f"<{tag}>") != text.count(f"</{tag}>"):
            return {}, f"unclosed <{tag}> (truncated?)"
    found, rest = {}, text
    for tag, required in expected:
        stripped = rest.lstrip()
        match = _BLOCK[tag].match(stripped)
        if match is None:
            if required:
                return found, f"missing <{tag}>" if f"<{tag}>" not in text else f"<{tag}> out of place"
            continue
        inner = match.group(1)
        if "<" in inner and any(f"<{t}>" in inner or f"</{t}>" in inner for t in TAGS):
            return found, f"a tag inside <{tag}>"
        found[tag] = inner
        rest = stripped[match.end():]
    if rest.strip():
        return found, "text after the last tag"
    return found, None


def _agent(name: str, agents: list[str]) -> int | None:
    name = name.strip()
    return agents.index(name) if name in agents else None


def parse_routing(text: str, agents: list[str]) -> ParsedTurn:
    """Template I's answer: <thinking>…</thinking><model>NAME</model>."""
    found, error = _structure(text, [("thinking", True), ("model", True)])
    if error:
        return ParsedTurn(None, error=error, text=found.get("thinking", ""))
    model = _agent(found["model"], agents)
    if model is None:
        return ParsedTurn(None, error=f"unknown model {found['model'].strip()[:40]!r}", text=found["thinking"])
    return ParsedTurn(ROUTE, model, text=found["thinking"])


def parse_verification(text: str, agents: list[str], author: int) -> ParsedTurn:
    """Template II's answer about agent `author`'s draft (agents weaker → stronger)."""
    found, error = _structure(text, [("checking", True), ("verdict", True), ("model", False)])
    checking = found.get("checking", "")
    if error:
        return ParsedTurn(None, error=error, text=checking)
    verdict = found["verdict"].strip()
    if verdict not in ("True", "False"):
        return ParsedTurn(None, error=f"verdict {verdict[:20]!r} is not True or False", text=checking)
    if verdict == "True":
        if "model" in found:
            return ParsedTurn(None, error="<model> after a True verdict", text=checking)
        return ParsedTurn(ACCEPT, text=checking)
    strongest = author == len(agents) - 1
    if "model" not in found:
        if strongest:  # no stronger model exists to name
            return ParsedTurn(REJECT, text=checking)
        return ParsedTurn(None, error="verdict False without <model>", text=checking)
    model = _agent(found["model"], agents)
    if model is None:
        return ParsedTurn(None, error=f"unknown model {found['model'].strip()[:40]!r}", text=checking)
    if model <= author:
        return ParsedTurn(None, error="routes to a model that is not stronger (Template II routes upward only)",
                          text=checking)
    return ParsedTurn(REJECT, model, text=checking)


def parse_corl(text: str, expert: str) -> ParsedTurn:
    """CoRL's answer: model 0 = self, 1 = the expert."""
    return parse_routing(text, [SELF, expert])


def routing_target(thinking: str, agent: str) -> str:
    return f"<thinking>{thinking}</thinking>\n<model>{agent}</model>"


def verification_target(checking: str, verdict: bool, agent: str | None = None) -> str:
    out = f"<checking>{checking}</checking>\n<verdict>{verdict}</verdict>"
    return out if verdict or agent is None else f"{out}\n<model>{agent}</model>"


Parser = Callable[[str], ParsedTurn]
