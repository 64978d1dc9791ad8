"""A controller that replays given turns: the input of executor tests, and the way to run turns a
teacher wrote (controller.py) through the real workers."""

from __future__ import annotations

from typing import Mapping, Sequence

from routerops.errors import RouteropsError
from routerops.orchestra.controller import ControllerTurn, Message


class ScriptedController:
    """Answers the k-th assistant turn of a conversation with the k-th text of its script.

    `script` is one list of turns for every conversation, or a mapping from a task's text (the first
    user message) to its turns. What it was asked is kept in `received` (one list of conversations per
    `respond` call), so a test can read the prompts and observations the executor sent.
    """

    def __init__(self, script: Sequence[str] | Mapping[str, Sequence[str]], name: str = "scripted",
                 version: str = "1"):
        self.script = script
        self.name = name
        self.version = version
        self.received: list[list[list[Message]]] = []

    def respond(self, conversations: Sequence[list[Message]]) -> list[ControllerTurn]:
        self.received.append([list(c) for c in conversations])
        return [ControllerTurn(text=self.turn_for(conversation)) for conversation in conversations]

    def turn_for(self, conversation: list[Message]) -> str:
        turns = self.script_for(conversation)
        k = sum(1 for m in conversation if m["role"] == "assistant")
        if k >= len(turns):
            raise RouteropsError(f"controller {self.name!r}: the script has {len(turns)} turns, turn {k + 1} was asked")
        return turns[k]

    def script_for(self, conversation: list[Message]) -> Sequence[str]:
        if not isinstance(self.script, Mapping):
            return self.script
        task = next((m["content"] for m in conversation if m["role"] == "user"), "")
        if task not in self.script:
            raise RouteropsError(f"controller {self.name!r} has no script for the task {task[:80]!r}")
        return self.script[task]
