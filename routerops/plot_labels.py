"""Point labels that can be read: on an accuracy–cost plane many policies share a point (every router
that always picks the cheap worker sits on it) or nearly so, and their names were drawn over each other
(issue 40). Names at the same point become one label; labels that would still touch are moved apart,
top to bottom, in screen space (so it works on a log axis too)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LINE_SPACING = 1.3  # a label line's height, in font sizes (the glyphs' box with its descent)
NEAR_X_PX = 90.0  # labels closer than this horizontally may overlap


def merge_coincident(xs: Sequence[float], ys: Sequence[float], names: Sequence[str]) -> list[tuple[float, float, str]]:
    """One (x, y, "a, b") per distinct point (to 9 significant digits), in first-seen order."""
    merged: dict[tuple[float, float], list[str]] = {}
    for x, y, name in zip(xs, ys, names):
        key = (float(f"{float(x):.9g}"), float(f"{float(y):.9g}"))
        merged.setdefault(key, []).append(str(name))
    return [(x, y, ", ".join(group)) for (x, y), group in merged.items()]


def label_offsets(pixels: np.ndarray, line_px: float = 14.0) -> list[float]:
    """Vertical offsets (pixels) that keep labels at least a line apart where they are horizontally near;
    labels are placed from the top of the plot down."""
    order = np.argsort(-pixels[:, 1], kind="mergesort")
    placed: list[tuple[float, float]] = []  # (x px, label y px)
    offsets = [0.0] * len(pixels)
    for i in order:
        x, y = pixels[i]
        label_y = y + 5.0
        for px, py in sorted(placed, key=lambda p: -p[1]):
            if abs(px - x) < NEAR_X_PX and abs(py - label_y) < line_px:
                label_y = py - line_px
        placed.append((x, label_y))
        offsets[i] = label_y - y
    return offsets


def annotate_points(ax, xs: Sequence[float], ys: Sequence[float], names: Sequence[str], fontsize: int = 8) -> int:
    """Label every point by name, coincident names merged and near labels moved apart; call after the
    axes' scales are set. Returns how many labels were drawn."""
    points = merge_coincident(xs, ys, names)
    if not points:
        return 0
    ax.autoscale_view()
    pixels = ax.transData.transform(np.array([(x, y) for x, y, _ in points], dtype=float))
    dpi_scale = ax.figure.dpi / 72.0
    for (x, y, text), offset in zip(points, label_offsets(pixels, fontsize * LINE_SPACING * dpi_scale)):
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(6, offset / dpi_scale), fontsize=fontsize,
                    va="bottom")
    return len(points)
