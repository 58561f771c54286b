"""Result tables: per-run accuracies, the papers' summary table (targets x Avg.), file output."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from raydg.simulation import SimulationResult

SELECTIONS = {
    "selected": "selected round (training-domain validation)",
    "last": "last round",
    "oracle": "oracle round (best target accuracy: optimistic, not a model selection; the rule "
              "behind CSAC's published numbers)",
}


def write_table(rows: Sequence[dict[str, Any]], stem: Path) -> None:
    """Write ``rows`` as ``stem.parquet`` and ``stem.csv``."""
    table = pa.Table.from_pylist(list(rows))
    pq.write_table(table, stem.with_suffix(".parquet"))
    pcsv.write_csv(table, stem.with_suffix(".csv"))


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


def long_rows(method: str, results: Sequence[SimulationResult]) -> list[dict[str, Any]]:
    """One row per (target, seed, inference mode, selection), accuracy in percent."""
    def round_of(r: SimulationResult, sel: str, mode: str) -> int:
        return {"selected": r.selected_round, "last": len(r.history),
                "oracle": r.oracle_round[mode]}[sel]

    return [
        {"method": method, "target": r.target, "seed": r.seed, "mode": mode,
         "selection": sel, "round": round_of(r, sel, mode),
         "accuracy": 100.0 * getattr(r, sel)[mode]}
        for r in results for sel in SELECTIONS for mode in r.selected
    ]


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single seed)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def summary_rows(rows: list[dict[str, Any]], targets: list[str]) -> list[dict[str, Any]]:
    """The papers' table: per (method, mode, selection), mean and std over seeds per target;
    ``Avg`` averages the targets within each seed, then takes mean and std over seeds."""
    out = []
    keys = sorted({(r["method"], r["mode"], r["selection"]) for r in rows},
                  key=lambda k: (k[2] != "selected", k[0], k[1]))
    for method, mode, sel in keys:
        mine = [r for r in rows if (r["method"], r["mode"], r["selection"]) == (method, mode, sel)]
        row: dict[str, Any] = {"method": method, "mode": mode, "selection": sel}
        seeds = sorted({r["seed"] for r in mine})
        for t in targets:
            row[t], row[f"{t}_std"] = _mean_std([r["accuracy"] for r in mine if r["target"] == t])
        per_seed = [np.mean([r["accuracy"] for r in mine if r["seed"] == s]) for s in seeds]
        row["Avg"], row["Avg_std"] = _mean_std(per_seed)
        out.append(row)
    return out


def format_summary(summary: list[dict[str, Any]], targets: list[str], seeds: int) -> str:
    """Plain-text tables, one per selection rule: rows method (and mode), columns targets, Avg."""
    cols = [*targets, "Avg"]
    blocks = []
    for sel, title in SELECTIONS.items():
        rows = [r for r in summary if r["selection"] == sel]
        if not rows:
            continue
        modes = {r["mode"] for r in rows}
        names = [r["method"] if len(modes) == 1 else f"{r['method']} [{r['mode']}]"
                 for r in rows]
        cells = [[f"{r[c]:.2f} ± {r[c + '_std']:.2f}" if seeds > 1 else f"{r[c]:.2f}"
                  for c in cols] for r in rows]
        widths = [max(len(c), *(len(cell[i]) for cell in cells)) for i, c in enumerate(cols)]
        first = max(len("Method"), *(len(n) for n in names))
        lines = [f"Accuracy (%) on the held-out domain, {title}, {seeds} seed(s)",
                 "  ".join(["Method".ljust(first), *(c.rjust(w) for c, w in zip(cols, widths,
                                                                                  strict=True))])]
        lines.append("-" * len(lines[-1]))
        for name, cell in zip(names, cells, strict=True):
            lines.append("  ".join([name.ljust(first),
                                    *(v.rjust(w) for v, w in zip(cell, widths, strict=True))]))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
