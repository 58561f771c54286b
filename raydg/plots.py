"""Figures as PNG files: a method's own tables (:attr:`raydg.methods.Method.plots`) and
accuracy per round over seeds, for MLflow and ``raydg report --plot``."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raydg.results import first_seen


def _grouped(rows: Sequence[dict[str, Any]], key: str) -> dict[Any, list[dict[str, Any]]]:
    groups: dict[Any, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    return groups


def _lines(ax: Any, rows: Sequence[dict[str, Any]], x: str, value: str, series: str) -> None:
    for name, g in _grouped(rows, series).items():
        ax.plot([r[x] for r in g], [float(r[value]) for r in g], label=str(name))
    ax.set_xlabel(x)
    ax.set_ylabel(value)


def plot(rows: Sequence[dict[str, Any]], spec: tuple[str, ...], path: Path) -> None:
    """Save a PNG of ``rows``: ``("box", group, value)`` draws one box per group (in first-seen
    order, e.g. alpha per BN layer); ``("line", x, y, series)`` one line per series (e.g. a
    layer's w_in over rounds); ``("line", x, y, series, facet)`` one such panel per facet value
    (e.g. each client's aggregation weight over rounds, one panel per layer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind, *cols = spec
    if kind == "box":
        group, value = cols
        groups = _grouped(rows, group)
        fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * len(groups) + 1.5), 3.5))
        ax.boxplot([[float(r[value]) for r in g] for g in groups.values()], showfliers=False)
        ax.set_xticks(range(1, len(groups) + 1), [str(g) for g in groups], rotation=60,
                      ha="right", fontsize=7)
        ax.set_xlabel(group)
        ax.set_ylabel(value)
    elif kind == "line" and len(cols) == 3:
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        _lines(ax, rows, *cols)
        ax.legend(fontsize=6, ncol=2)
    elif kind == "line" and len(cols) == 4:
        panels = _grouped(rows, cols[3])
        ncol = min(4, len(panels))
        nrow = -(-len(panels) // ncol)
        fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 2.6 * nrow), squeeze=False)
        for ax, (name, g) in zip(axes.flat, panels.items(), strict=False):
            _lines(ax, g, *cols[:3])
            ax.set_title(str(name), fontsize=7)
        for ax in axes.flat[len(panels):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=6, ncol=2)
    else:
        raise ValueError(f"unknown plot spec {spec!r}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_curves(points: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Accuracy per round under ``title``, one panel per target (at most three to a row, one
    y axis), one colour per method: target accuracy (solid) and mean source-validation
    accuracy (dashed), each the mean over seeds with a band of one standard deviation; the
    legend below the panels. ``points``: dicts of method, target, seed, round, target_acc
    and val_acc (percent)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = first_seen([p["target"] for p in points])
    methods = first_seen([p["method"] for p in points])
    ncol = min(3, math.ceil(math.sqrt(len(targets))))  # near square: MLflow's preview
    nrow = -(-len(targets) // ncol)
    width = 4.2 * ncol  # inches; about 12 characters an inch at these font sizes
    entry = max(len(m) for m in methods) * 0.075 + 0.6  # a legend entry's inches: line, text
    columns = max(1, min(len(methods), 4, int(width // entry)))
    legend = 0.25 * -(-len(methods) // columns)  # inches: the legend's rows below the panels
    height = 3.2 * nrow + 1.4 + legend
    fig, axes = plt.subplots(nrow, ncol, figsize=(width, height), squeeze=False, sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, target in zip(axes.flat, targets, strict=False):
        for i, method in enumerate(methods):
            mine = [p for p in points if p["target"] == target and p["method"] == method]
            rounds = sorted({p["round"] for p in mine})
            for key, style in (("target_acc", "-"), ("val_acc", "--")):
                per_round = [[p[key] for p in mine if p["round"] == r] for r in rounds]
                mean = np.array([np.mean(v) for v in per_round])
                std = np.array([np.std(v) for v in per_round])
                colour = colours[i % len(colours)]
                ax.plot(rounds, mean, style, color=colour,
                        label=method if key == "target_acc" else None)
                ax.fill_between(rounds, mean - std, mean + std, color=colour, alpha=0.15)
        ax.set_title(f"held out: {target}", fontsize=10)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy (%)")
    for ax in axes.flat[len(targets):]:
        ax.axis("off")
    lines = [*textwrap.wrap(title, int(width * 12)),
             *textwrap.wrap("solid: held-out domain, dashed: source validation; mean ± std "
                            "over seeds", int(width * 12))]
    fig.suptitle("\n".join(lines), fontsize=10)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, legend / height + 0.02, 1, 1))
    fig.savefig(path, dpi=100, bbox_inches="tight", pad_inches=0.1)  # never cut a title
    plt.close(fig)
