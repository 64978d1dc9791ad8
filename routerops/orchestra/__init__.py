"""The orchestrator (paper 004, Uno-Orchestra): a language model as the controller that answers a task
itself or plans subtasks, each routed to a (model, primitive) pair of the pool, and repairs its plan
after verification. This package is the runtime every controller shares: the controller contract
(controller.py), the grammar of its turns, and the executor that runs its plans through the workers."""
