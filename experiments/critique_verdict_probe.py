"""What a critique controller's verdict reads from the draft, on training rows only (issue 24).

For an adapter (a warm-up's or an RL run's), at Template II on the weak agent's draft of each training
row in `--rows` (by default rows the CPU warm-up does not train on), p(False) at the verdict token with
the warm-up's own `<checking>Final: …</checking>` teacher-forced, i.e. the controller's readiness to
reject that draft. Reported: the mean p(False) on right and on wrong drafts, on drafts with and without
GSM8K's "#### N" answer line (experiments/critique_draft_signal.py's most telling visible feature),
the ROC AUC of p(False) for "the draft is wrong", and the share of drafts greedy decoding would reject
(p(False) > p(True)). Nothing here reads validation or test rows.

    python experiments/critique_verdict_probe.py --adapter DIR [--rows 400 600] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation.critique_lm import critique_paths, fixed_split, load_table  # noqa: E402
from evaluation.draft_signal import visible_features  # noqa: E402
from models.critique.lm_config import load_critique_lm_config  # noqa: E402
from models.critique.lm_env import outcome_table, turn_messages  # noqa: E402
from models.critique.lm_train import final_line  # noqa: E402
from models.orchestrator.lm import load_controller_model  # noqa: E402
from routerops.schema import write_json_atomic  # noqa: E402


def p_false(model, tokenizer, table, q: int, draft_tail: int, checking_words: int) -> float:
    """p(False) / (p(True) + p(False)) at the verdict token of the weak agent's draft of row q."""
    text = tokenizer.apply_chat_template(turn_messages(table, q, 0, draft_tail, tokenizer), tokenize=False,
                                         add_generation_prompt=True)
    text += f"<checking>Final: {final_line(table.drafts[q][0], checking_words)}</checking>\n<verdict>"
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    true_id, false_id = (tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in ("True", "False"))
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    pair = torch.softmax(logits[[true_id, false_id]], -1)
    return float(pair[1])


def summarise(p: np.ndarray, wrong: np.ndarray, no_answer: np.ndarray) -> dict:
    from sklearn.metrics import roc_auc_score

    def mean(mask: np.ndarray) -> float | None:
        return float(p[mask].mean()) if mask.any() else None

    def rejected(mask: np.ndarray) -> float | None:
        return float((p[mask] > 0.5).mean()) if mask.any() else None

    return {"rows": int(len(p)), "wrong_share": float(wrong.mean()),
            "p_false_on_right": mean(~wrong), "p_false_on_wrong": mean(wrong),
            "p_false_with_answer_line": mean(~no_answer), "p_false_without_answer_line": mean(no_answer),
            "auc_p_false_for_wrong": float(roc_auc_score(wrong, p)) if 0 < wrong.sum() < len(wrong) else None,
            "greedy_reject_share": rejected(np.ones_like(wrong)), "greedy_reject_share_right": rejected(~wrong),
            "greedy_reject_share_wrong": rejected(wrong),
            "greedy_reject_share_without_answer_line": rejected(no_answer)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", type=Path, required=True)
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--rows", type=int, nargs=2, default=(400, 600), help="a slice of the training rows")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("critique_verdict_probe.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_critique_lm_config(args.params)
    data = load_table(critique_paths(cfg), REPO)
    train = fixed_split(len(data), cfg.protocol.split_seed, cfg.protocol.fractions)["train"]
    table = outcome_table(data, train, cfg.prompts.short_names, cfg.prompts.template)
    rows = train[slice(*args.rows)]
    model, tokenizer = load_controller_model(cfg.model, args.adapter)
    p = np.array([p_false(model, tokenizer, table, int(q), cfg.prompts.draft_tail_tokens,
                          cfg.prompts.max_checking_words) for q in rows])
    wrong = ~table.correct[rows, 0].astype(bool)
    no_answer = np.array([visible_features(table.drafts[int(q)][0])["no_answer_line"] > 0 for q in rows])
    report = {"command": " ".join(["python", "experiments/critique_verdict_probe.py", *(argv or sys.argv[1:])]),
              "adapter": str(args.adapter), "training_rows": list(args.rows), **summarise(p, wrong, no_answer)}
    write_json_atomic(report, args.out)
    print(report)
    return report


if __name__ == "__main__":
    main()
