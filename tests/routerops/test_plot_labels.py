"""Legible accuracy–cost plots (issue 40): names at one point become one label, near labels are moved
apart, and a one-point frontier or router curve is drawn as a marker, not a line."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from routerops import report  # noqa: E402
from routerops.plot_labels import annotate_points, label_offsets, merge_coincident  # noqa: E402


def test_names_at_one_point_share_one_label():
    points = merge_coincident([0.1, 0.1, 0.2], [0.5, 0.5, 0.7], ["knn", "mf", "oracle"])
    assert points == [(0.1, 0.5, "knn, mf"), (0.2, 0.7, "oracle")]


def test_labels_of_near_points_are_a_line_apart_on_screen():
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    try:
        ax.scatter([0.100, 0.101, 0.102, 0.9], [0.500, 0.501, 0.502, 0.1])
        assert annotate_points(ax, [0.100, 0.101, 0.102, 0.9], [0.500, 0.501, 0.502, 0.1], ["a", "b", "c", "far"]) == 4
        fig.canvas.draw()
        boxes = {t.get_text(): t.get_window_extent() for t in ax.texts}
        near = [boxes[k] for k in "abc"]
        assert not any(p.overlaps(q) for i, p in enumerate(near) for q in near[i + 1:])
    finally:
        plt.close(fig)
    assert label_offsets(np.array([[10.0, 100.0], [500.0, 100.0]])) == [5.0, 5.0]  # far apart: untouched


def test_a_one_point_frontier_and_a_one_point_router_are_markers_not_lines(tmp_path, monkeypatch):
    drawn = []
    real_subplots = plt.subplots

    def keep(*args, **kwargs):
        fig, ax = real_subplots(*args, **kwargs)
        drawn.append(ax)
        return fig, ax

    monkeypatch.setattr(plt, "subplots", keep)
    board = pd.DataFrame({"policy": ["cheap", "dear", "router"], "usd_per_query": [0.001, 0.01, 0.001],
                          "accuracy": [0.9, 0.5, 0.9], "accuracy_lo": [0.8, 0.4, 0.8], "accuracy_hi": [1, 0.6, 1],
                          "on_frontier": [True, False, True]})
    report.plot_accuracy_cost(board, tmp_path / "policies.png")
    ax = drawn[-1]
    assert not [line for line in ax.get_lines() if line.get_label() == "Pareto frontier"]
    assert [t.get_text() for t in ax.texts] == ["cheap, router", "dear"]

    curves = pd.DataFrame({"router": ["flat"] * 3 + ["sweep"] * 3 + ["single:a", "single:b"],
                           "usd_per_query": [0.002] * 3 + [0.001, 0.002, 0.003] + [0.001, 0.003],
                           "accuracy": [0.6] * 3 + [0.5, 0.6, 0.7] + [0.5, 0.7]})
    leaderboard = pd.DataFrame({"router": ["flat", "sweep"], "aiq": [0.6, 0.6]})
    report.plot_router_curves(curves, leaderboard, tmp_path / "routers.png")
    ax = drawn[-1]
    assert [line.get_label() for line in ax.get_lines()] == ["sweep (AIQ 0.600)"]  # flat is a marker
    assert "flat (AIQ 0.600)" in [c.get_label() for c in ax.collections]
    assert (tmp_path / "routers.png").stat().st_size > 1000
