"""How much a draft tells about its own correctness, on the *training* rows of the critique split.

The LM critique controller (issue 24) sees the question and the weak agent's draft (its last
`prompts.draft_tail_tokens` tokens) and says True or False. It can only beat a router that reads the
question alone if the draft shows something the question does not. This measures that, before any
controller is trained: 5-fold cross-validated ROC AUC, within the training rows of the fixed split
(validation and test rows are not read), of a logistic regression predicting "Mixtral's draft is right"
from
- the question (MiniLM, what the logistic router reads),
- the draft's tail as the controller sees it (MiniLM),
- three things a reader of the tail can see: the draft ends on GSM8K's "#### N" answer line; the
  last line's arithmetic annotation `<<a=b>>` is wrong (checked here with Python); the draft's length,
- and each single visible feature, with the share of drafts that show it and Mixtral's accuracy there.

    python experiments/critique_draft_signal.py [--params params.yaml] [--out experiments/results/critique_draft_signal.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation.critique import load_table  # noqa: E402
from evaluation.critique_lm import critique_paths, fixed_split  # noqa: E402
from evaluation.draft_signal import visible_features  # noqa: E402
from models.critique.lm_config import load_critique_lm_config  # noqa: E402
from models.critique.lm_prompts import tail_tokens  # noqa: E402
from routerops import schema  # noqa: E402


def cv_auc(x: np.ndarray, y: np.ndarray, seed: int = 0) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=seed)
    p = cross_val_predict(LogisticRegression(max_iter=2000), x, y, cv=folds, method="predict_proba")[:, 1]
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(y, p))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    parser.add_argument("--out", type=Path, default=REPO / "experiments/results/critique_draft_signal.json")
    args = parser.parse_args(argv)
    from models.embeddings import SentenceEncoder

    started = time.perf_counter()
    cfg = load_critique_lm_config(args.params)
    data = load_table(critique_paths(cfg), REPO)
    train = fixed_split(len(data), cfg.protocol.split_seed, cfg.protocol.fractions)["train"]
    weak = int(np.argmin(data.costs.mean(axis=0)))
    right = data.scores[train, weak] > 0.5
    drafts = [data.responses[q][weak] for q in train]
    encoder = SentenceEncoder()
    question = encoder.encode([data.queries[q] for q in train])
    tail = encoder.encode([tail_tokens(d, cfg.prompts.draft_tail_tokens) for d in drafts])
    names = list(visible_features("").keys())
    visible = np.array([[visible_features(d)[n] for n in names] for d in drafts])
    result = {
        "benchmark": "critique_draft_signal", "command": "python experiments/critique_draft_signal.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "protocol": f"training rows of the fixed split (seed {cfg.protocol.split_seed}) only, 5-fold CV AUC",
        "weak_agent": data.workers[weak], "train_rows": len(train), "weak_accuracy": float(right.mean()),
        "auc": {"question": cv_auc(question, right), "draft_tail": cv_auc(tail, right),
                "question_and_tail": cv_auc(np.hstack([question, tail]), right),
                "visible_features": cv_auc(visible, right),
                "question_tail_and_visible": cv_auc(np.hstack([question, tail, visible]), right)},
        "features": {n: {"share": float((visible[:, i] > 0).mean()) if n != "words_per_100" else None,
                         "weak_accuracy_where_shown": float(right[visible[:, i] > 0].mean())
                         if n != "words_per_100" and (visible[:, i] > 0).any() else None,
                         "mean_right": float(visible[right, i].mean()), "mean_wrong": float(visible[~right, i].mean())}
                     for i, n in enumerate(names)},
        "seconds": round(time.perf_counter() - started, 1),
    }
    schema.write_json_atomic(result, args.out)
    print({k: result[k] for k in ("weak_accuracy", "auc", "features")})
    return result


if __name__ == "__main__":
    main()
