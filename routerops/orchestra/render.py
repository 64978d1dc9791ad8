"""Writing the orchestrator's grammar (grammar.py): canonical controller turns (what a teacher writes
for SFT, 004 App. F.3), the executor's <obs> and <error> messages with worker text escaped, and
reading stored <obs> messages back."""

from __future__ import annotations

import re
from typing import Sequence

from routerops.orchestra.grammar import (
    ATTRIBUTE_PATTERN, RESERVED_TOKEN, FinalAnswer, GrammarError, Plan, Turn, Verify, escape_text, read_tag,
    unescape_text,
)

_SUBTASK_ID = re.compile(r"[0-9]{1,9}\Z")  # ASCII digits, as the grammar's ids (grammar._INTEGER)


def render_turn(turn: Turn) -> str:
    """The canonical text of a turn (what a teacher writes); parse_turn reads it back to `turn`."""
    parts = [render_verify(turn.verify)] if turn.verify is not None else []
    if isinstance(turn.action, FinalAnswer):
        parts.append(f"<final_answer>{escape_text(turn.action.text)}</final_answer>")
    else:
        parts.append(render_plan(turn.action))
    return "\n".join(parts)


def render_verify(verify: Verify) -> str:
    body = escape_text(verify.text) + ("\n<replan/>" if verify.replan else "")
    return f"<verify>\n{body.strip()}\n</verify>"


def render_plan(plan: Plan) -> str:
    nodes = [f'<subtask id="{s.id}" depends_on="{",".join(map(str, s.depends_on))}">\n'
             f"{escape_text(s.description)}\n</subtask>" for s in plan.subtasks]
    routes = [f'<route subtask="{s.id}" model="{s.model}" skill="{s.primitive}">\n'
              f"{escape_text(s.instruction)}\n</route>" for s in plan.subtasks]
    return "\n".join([f'<plan round="{plan.round}">', *nodes, "</plan>", *routes])


def render_observations(results: Sequence[tuple[int, str]]) -> str:
    """<obs> blocks for (subtask id, worker text) pairs; the text is escaped (module docstring)."""
    return "\n".join(f'<obs subtask="{k}">\n{escape_text(text)}\n</obs>' for k, text in results)


def render_error(error: GrammarError) -> str:
    """What the executor answers to a malformed turn."""
    return f'<error kind="{error.kind}">\n{escape_text(error.message)}\n</error>'


def parse_observations(text: str) -> list[tuple[int, str]]:
    """The (subtask id, worker text) pairs of an executor message, unescaped; for readers of stored
    conversations. Raises ValueError on text the executor did not write."""
    pairs, pos = [], 0
    for match in RESERVED_TOKEN.finditer(text):
        if match.start() < pos:
            continue
        tag = read_tag(text, match.start())
        if tag is None or tag.name != "obs" or tag.closing:
            raise ValueError(f"not an <obs> block at offset {match.start()}")
        close = RESERVED_TOKEN.search(text, tag.end)
        if close is None or not text.startswith("</obs>", close.start()):
            raise ValueError(f"<obs> at offset {match.start()} is not closed")
        # render_observations writes exactly subtask="<non-negative integer>" (what the grammar's ids are)
        subtask = ATTRIBUTE_PATTERN.fullmatch(tag.raw_attributes)
        if subtask is None or subtask.group(1) != "subtask" or not _SUBTASK_ID.match(subtask.group(2) or ""):
            raise ValueError(f"<obs> at offset {match.start()} has no subtask=\"<id>\" attribute: "
                             f"{tag.raw_attributes.strip()!r}")
        body = text[tag.end:close.start()]
        body = body[1:-1] if len(body) >= 2 and body[0] == body[-1] == "\n" else body  # render_observations' newlines
        pairs.append((int(subtask.group(2)), unescape_text(body)))
        pos = close.start() + len("</obs>")
    return pairs
