"""The orchestrator's stages (paper 004, Uno-Orchestra §4): tasks → baselines, teacher, probe → verifier
filter → SFT → RL → evaluate → register.

orchestra-rl (`rl`) continues from the SFT adapter with the App. B estimator of orchestra.rl (Agentic-GRPO
by default; tree-GRPO rolls out trees) on train tasks (004 §4.2, App. B).

Each is `stage(run, layout, *inputs) -> outputs` like every other stage (stages/pipeline.py): the
Prefect tasks of flows/orchestra.py and `routerops stage orchestra-…` (dvc.yaml) call them. Defaults
live in params.yaml, section `orchestra` (small scale for this CPU); configs/paper/orchestra.yaml is
the paper-scale run. The controller trains on train tasks only; the promotion gate judges on val;
test and OOD are only rolled out on.

One module per stage (or pair of small ones): config (params.yaml's `orchestra` section), workers (the
pool and the controller's rollouts), data (tasks, baselines), teacher, sft (probe, filter, SFT), rl
(the RL stage; one step of it is models/orchestrator/rl_step.py, beside the trainer), evaluate,
register. What the stages, flows, tests and
benchmarks import is re-exported here, except the stage functions named like their module
(`stages.orchestra.rl:rl`, as stages/__init__.py names them).
"""

from __future__ import annotations

from stages.orchestra.config import (  # noqa: F401
    CONTROLLER_NAME, OrchestraTasks, OrchestraBaselines, OrchestraTeacher, OrchestraEvaluation, OrchestraRun, load_run, check_run, check_teacher, lm_config,
)
from stages.orchestra.workers import (  # noqa: F401
    workers_with_servers, close_workers, load_controller, rollout_run_id, controller_rollouts, worker_cache, tasks_of, run_inputs,
)
from stages.orchestra.data import (  # noqa: F401
    tasks, baselines,
)
from stages.orchestra.teacher import (  # noqa: F401
    teacher_batches, _teach, lazy_answers,
)
from stages.orchestra.sft import (  # noqa: F401
    verifier_filter, check_curriculum, write_jsonl_atomic, probe,
)
from stages.orchestra.rl import (  # noqa: F401
    RL_RUN_FILE, RL_RESULT_FILE, RL_PROGRESS_FILE, RL_ROLLOUTS_FILE, RL_CHECKPOINTS, RL_KEEP_CHECKPOINTS, rl_task_order, train_tasks, signal_pool, probe_success_rates, PROBE_SEED, rl_run_record, ADVANTAGE_KEYS_ADDED, rl_checkpoints, STEP_KEYS_NOT_LOGGED, RL_POOL_FILE, rl_pool, shutil_rmtree, copy_tree_atomic, _RLTracker, rl_tracking,
)
from stages.orchestra.evaluate import (  # noqa: F401
    EVAL_SPLITS,
)
from stages.orchestra.register import (  # noqa: F401
    gate_config, judged_on_val, champion_on_val, REGISTERED_VERSION,
)
