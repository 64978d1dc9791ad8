"""The closed primitive vocabulary: what a worker can be asked to do with a (sub)task.

Uno-Orchestra routes every subtask to a (model, primitive) pair drawn from a closed vocabulary that
covers model-internal operations (direct answer, chain-of-thought), skills (verification) and tool
calls (code execution, computer algebra) (004 §4 and App. A.6, Tab. 6). A pool file declares its
vocabulary under `primitives:` and, per worker, the primitives it admits; `routerops.pricing.load_pool`
checks both. A pool file without `primitives:` gets DEFAULT_PRIMITIVES, the three every flat router
already used (`answer`, `python`, `sympy`), so older pool files load unchanged.

How each primitive runs (`run`):
- `llm`: one chat call to an LLM worker; `instruction` (if any) is sent as the system message, after
  the worker's own system prompt.
- `llm_program`: an LLM worker writes a Python program (prompted by `instruction`); the python worker
  named by `runner` runs it in the sandbox; the program's output is the result (004 Tab. 6,
  execute_python: "the sandbox returns stdout and stderr"). Two calls, both priced.
- `python`: the python tool runs the code it is given, in the sandbox.
- `sympy`: the sympy tool evaluates the expression it is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PRIMITIVE_RUNS = ("llm", "llm_program", "python", "sympy")
# The worker kind (WorkerSpec.kind) that can execute each way of running.
WORKER_KIND_OF_RUN = {"llm": "llm", "llm_program": "llm", "python": "python", "sympy": "sympy"}
PRIMITIVE_KEYS = ("run", "contract", "instruction", "runner", "max_tokens")
# Primitive names appear verbatim in the controller's grammar (skill="..."): keep them plain words.
PRIMITIVE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


@dataclass(frozen=True)
class PrimitiveSpec:
    """One entry of the vocabulary."""

    name: str
    run: str  # one of PRIMITIVE_RUNS
    # One line on what the primitive does, shown to the controller beside the pool's prices (the
    # "functional contract" column of 004 Tab. 6).
    contract: str = ""
    # llm / llm_program: the system message sent for this primitive; "" leaves the worker's own.
    instruction: str = ""
    runner: str = ""  # llm_program: name of the python worker that runs the program
    max_tokens: int | None = None  # llm / llm_program: completion cap; None = the worker's generation.max_tokens

    @property
    def worker_kind(self) -> str:
        """The kind of worker that admits this primitive."""
        return WORKER_KIND_OF_RUN[self.run]


DEFAULT_PRIMITIVES: dict[str, PrimitiveSpec] = {
    "answer": PrimitiveSpec("answer", "llm", "Answer directly, under the worker's own system prompt."),
    "python": PrimitiveSpec("python", "python", "Run the given Python code in the sandbox; returns what it prints."),
    "sympy": PrimitiveSpec("sympy", "sympy", "Evaluate the given math expression exactly with sympy."),
}
