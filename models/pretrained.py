"""One transformers model load at a time in a process.

transformers 5's `from_pretrained` turns weight tying off for the whole process while it builds the
model: `transformers.initialization.no_tie_weights` swaps `PreTrainedModel.tie_weights` for a no-op
and puts back the method it saved when it entered. Two loads in two threads (a gateway swapping two
champions in, Prefect tasks in a thread pool) interleave as enter A, enter B, exit A, exit B: B saved
A's no-op, so the no-op is what stays. Every later load in that process then leaves a tied `lm_head`
uninitialised on the meta device ("Cannot copy out of meta tensor"). Every model load of ours goes
through `one_load_at_a_time()`; loads are seconds, and a second caller waits for the first.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOAD = threading.RLock()  # re-entrant: a load may build another model inside it (sentence-transformers)


@contextmanager
def one_load_at_a_time() -> Iterator[None]:
    with _LOAD:
        yield
