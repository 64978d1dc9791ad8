"""What CoRL's first RL steps do to the choice, read on training rows only (issue 24's diagnosis).

From a CoRL warm-up adapter (`--adapter`; without it, the warm-up is trained first as
experiments/critique_lm.py does), run `--steps` RL steps of `train_controller` and report:
- per step, for each (mode, choice) the drawn nodes' count, summed advantage (after the configured
  weighting) and mean reward, i.e. the direction that step pushes each mode;
- p(expert) at the choice token, at T = the RL temperature, with the `<thinking>` text teacher-forced,
  averaged over 40 training prompts that are not among the warm-up's rows, before and after.

Nothing here reads validation or test rows. Settings are params.yaml's `critique_lm`, with
`--lr`, `--queries-per-step`, `--group`, `--balance/--no-balance` and `--contrast/--no-contrast` to
replay older settings. Writes the report as JSON to `--out`.

    python experiments/corl_step_probe.py [--adapter DIR] [--seed 0] [--steps 1] [--lr 1e-4] \
        [--queries-per-step 6] [--group 4] [--no-balance] [--no-contrast] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import models.critique.lm_train as lm_train  # noqa: E402
from evaluation.critique_lm import critique_paths, corl_warmup_rows, fixed_split, load_table  # noqa: E402
from models.critique.lm_config import load_critique_lm_config  # noqa: E402
from models.critique.lm_env import MODES, outcome_table  # noqa: E402
from models.critique.lm_prompts import corl_messages  # noqa: E402
from models.orchestrator.lm import base_model_folder, load_controller_model  # noqa: E402
from routerops.schema import write_json_atomic  # noqa: E402

PROBE_ROWS = slice(200, 240)  # training rows past the warm-up's first 24


def choice_probability(model, tokenizer, table, rows, temperature: float) -> dict[str, float]:
    """Mean p(expert) / (p(expert) + p(self)) at the choice token's first position, per mode."""
    expert = table.agents[table.strongest]
    self_id = tokenizer("self", add_special_tokens=False)["input_ids"][0]
    expert_id = tokenizer(expert, add_special_tokens=False)["input_ids"][0]
    out = {}
    for mode in MODES:
        shares = []
        for q in rows:
            text = tokenizer.apply_chat_template(corl_messages(table.questions[q], expert, mode, table.template),
                                                 tokenize=False, add_generation_prompt=True)
            text += f"<thinking>{lm_train.corl_thinking(mode)}</thinking>\n<model>"
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            with torch.no_grad():
                p = torch.softmax(model(input_ids=ids).logits[0, -1] / temperature, -1)
            shares.append(float(p[expert_id] / (p[expert_id] + p[self_id])))
        out[mode] = round(float(np.mean(shares)), 3)
    return out


def step_directions(nodes, table) -> dict[str, dict]:
    """Per (mode, choice): nodes, summed advantage, mean reward."""
    agg = defaultdict(lambda: [0, 0.0, 0.0])
    for n in nodes:
        key = f"{MODES[n.extra['mode']]}/{'expert' if n.step.called == table.strongest else 'self'}"
        agg[key][0] += 1
        agg[key][1] += n.advantage
        agg[key][2] += n.step.reward
    return {k: {"nodes": c, "advantage_sum": round(a, 3), "mean_reward": round(r / c, 3)} for k, (c, a, r) in sorted(agg.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--queries-per-step", type=int)
    parser.add_argument("--group", type=int)
    parser.add_argument("--balance", action=argparse.BooleanOptionalAction)
    parser.add_argument("--contrast", action=argparse.BooleanOptionalAction)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("corl_step_probe.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_critique_lm_config(REPO / "params.yaml")
    changes = {"steps": args.steps, "learning_rate": args.lr, "queries_per_step": args.queries_per_step,
               "group": args.group, "balance_modes": args.balance, "mode_contrast": args.contrast}
    cfg = dataclasses.replace(cfg, corl=dataclasses.replace(cfg.corl, **{k: v for k, v in changes.items() if v is not None}))
    data = load_table(critique_paths(cfg), REPO)
    split = fixed_split(len(data), cfg.protocol.split_seed, cfg.protocol.fractions)
    table = outcome_table(data, split["train"], cfg.prompts.short_names, cfg.prompts.template)
    probe = split["train"][PROBE_ROWS]
    with tempfile.TemporaryDirectory(prefix="corl-probe-") as work:
        adapter = args.adapter or lm_train.warmup(cfg, table, corl_warmup_rows(cfg, split), Path(work),
                                                  args.seed, corl=True)
        model, tokenizer = load_controller_model(cfg.model, adapter)
        before = choice_probability(model, tokenizer, table, probe, cfg.rl.temperature)
        del model
        steps: list[dict] = []
        update = lm_train.update

        def recording_update(trainer, nodes, *rest, **kw):
            steps.append(step_directions(nodes, table))
            return update(trainer, nodes, *rest, **kw)

        lm_train.update = recording_update
        try:
            trainer, summary = lm_train.train_controller(cfg, table, split["train"], base_model_folder(cfg.model),
                                                         args.seed, corl=True, sft_adapter=adapter)
        finally:
            lm_train.update = update
        trainer.model.eval()
        after = choice_probability(trainer.model, trainer.tokenizer, table, probe, cfg.rl.temperature)
    report = {"command": " ".join(["python", "experiments/corl_step_probe.py", *(argv or sys.argv[1:])]),
              "corl": dataclasses.asdict(cfg.corl), "seed": args.seed,
              "p_expert_before": before, "p_expert_after": after, "steps": steps,
              "sampled_expert_share": [{k: v for k, v in r.items() if k.startswith("expert_share")} for r in summary["history"]]}
    write_json_atomic(report, args.out)
    print(report["p_expert_before"], "->", report["p_expert_after"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
