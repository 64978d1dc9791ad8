"""The orchestrator (paper 004, Uno-Orchestra): a language model as the controller that answers a task
itself or plans subtasks, each routed to a (model, primitive) pair of the pool, and repairs its plan
after verification. This package is the runtime every controller shares: the controller contract
(controller.py), the grammar of its turns (grammar.py parses, render.py writes), the system prompt
(prompt.py), the executor that runs its plans through blind workers (executor.py, dispatch.py), the
behaviour modes of its episodes (modes.py), and a controller that replays given turns (scripted.py)."""
