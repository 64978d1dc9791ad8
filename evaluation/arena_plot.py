"""reports/arena/accuracy_cost.png: every arena row a point (the routers' and the cascade's test sweeps as
curves), the Pareto frontier of every point and sweep read on the whole test split drawn, labels in a legend (no text
on the axes to overlap). Rows read on a subset of the test queries (the LM controllers at demo scale)
are hollow markers and stay off the frontier: their accuracy is on other queries."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evaluation.arena import pareto_front

FAMILY_MARKERS = {"trivial": "s", "oracle": "*", "router": "o", "cascade": "D", "critique_lm": "^", "corl_lm": "v",
                  "orchestrator": "P"}


def plot_arena(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    rows = result["rows"]
    full = max(r["test_queries"] for r in rows)
    colours = plt.get_cmap("tab20")(np.linspace(0, 1, max(len(rows), 2)))
    fig, ax = plt.subplots(figsize=(12, 6.5))
    for i, row in enumerate(rows):
        curve = result["curves"].get(row["policy"])
        if curve is not None:
            order = np.argsort(curve["usd_per_query"])
            ax.plot(np.asarray(curve["usd_per_query"])[order], np.asarray(curve["accuracy"])[order], "-",
                    color=colours[i], alpha=0.6, linewidth=1)
        subset = row["test_queries"] < full
        label = f"{row['policy']} ({row['test_queries']} q)" if subset else row["policy"]
        if row["constant"]:
            label += " [constant]"
        ax.plot(row["usd_per_query"], row["accuracy"], FAMILY_MARKERS.get(row["family"], "o"), markersize=9,
                color=colours[i], markerfacecolor="none" if subset else colours[i], markeredgewidth=1.5,
                label=label, linestyle="none")
    # The frontier of every operating point read on all test queries: the rows and the sweeps' points
    # (oracle excluded: it reads the outcome). The sweeps' points are read, not chosen, on test.
    on_full = [r for r in rows if r["test_queries"] == full and r["family"] != "oracle"]
    usd = np.array([r["usd_per_query"] for r in on_full] + [x for c in result["curves"].values() for x in c["usd_per_query"]])
    acc = np.array([r["accuracy"] for r in on_full] + [y for c in result["curves"].values() for y in c["accuracy"]])
    front = pareto_front(usd, acc)
    ax.step(usd[front], acc[front], where="post", color="black", linestyle="--", linewidth=1.2,
            label="Pareto frontier of every point and sweep on all test queries (oracle excluded)")
    ax.set_xscale("log")
    ax.set_xlabel("USD per query (test split, log scale)")
    ax.set_ylabel("accuracy (test split)")
    ax.set_title("Every policy on RouteLLM GSM8K (GPT-4-1106 vs Mixtral-8x7B): one split, fits on train, "
                 "choices on val", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path
