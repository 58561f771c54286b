"""Result tables: one federation's result and its stored form, per-run accuracies, the papers'
summary table (targets x Avg.), hyper-parameter selection over a search, file output.

This module reads and writes results only; it imports nothing of the engine (no Ray, no torch).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from raydg.config import setting_label

State = dict[str, np.ndarray]
# in the method's label, not the setting
METHOD_KEYS = ("method", "augment", "aggregation", "equal_compute")
MISSING = "—"  # a table's cell without a run


@dataclass
class FederationResult:
    """What one federation (target, seed, setting) ends with."""

    method: str  # as reported: ``fedbn`` or ``fedbn+ccst``
    target: str
    seed: int
    history: list[dict[str, float]]  # one row of metrics per round
    selected_round: int
    selected: dict[str, float]  # target accuracy per inference mode at the selected round
    last: dict[str, float]  # ... and at the last round
    oracle: dict[str, float]  # ... the best over rounds (target-domain selection: optimistic)
    oracle_round: dict[str, int]  # the round of that best, per mode
    global_state: State  # the final global model
    selected_state: State | None = None  # the global model of the selected round
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    plots: dict[str, tuple[str, ...]] = field(default_factory=dict)  # table -> plot spec
    setting: dict[str, Any] = field(default_factory=dict)  # the searched keys' values
    final: dict[str, float] = field(default_factory=dict)  # the method's summary metrics
    model: dict[str, Any] = field(default_factory=dict)  # rebuilds it: raydg.saved_model

    SUMMARY = ("method", "target", "seed", "selected_round", "selected", "last", "oracle",
               "oracle_round", "plots", "setting", "final", "model")

    @property
    def mode(self) -> str:
        """The inference mode the method reports (its first)."""
        return next(iter(self.selected))

    def save(self, path: Path) -> None:
        """Write into the folder ``path``: ``result.json`` (scalars), ``global_state.npz``
        and ``selected_state.npz`` (numpy, read back without pickle) and one Parquet file per
        table (``history`` too)."""
        path.mkdir(parents=True, exist_ok=True)
        summary = {k: getattr(self, k) for k in self.SUMMARY}
        (path / "result.json").write_text(json.dumps(summary, indent=1))
        np.savez(path / "global_state.npz", **self.global_state)
        if self.selected_state is not None:
            np.savez(path / "selected_state.npz", **self.selected_state)
        for name, rows in {"history": self.history, **self.tables}.items():
            columns = dict.fromkeys(k for r in rows for k in r)  # every row's keys, not the first's
            pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in columns}),
                           path / f"{name}.parquet")

    @classmethod
    def load(cls, path: Path) -> FederationResult:
        """Read what :meth:`save` wrote."""
        summary = json.loads((path / "result.json").read_text())
        summary["plots"] = {k: tuple(v) for k, v in summary["plots"].items()}
        selected = path / "selected_state.npz"
        tables = {p.stem: pq.read_table(p).to_pylist() for p in sorted(path.glob("*.parquet"))}
        return cls(history=tables.pop("history"), global_state=load_state(
            path / "global_state.npz"), selected_state=load_state(selected)
            if selected.exists() else None, tables=tables, **summary)


def round_summaries(history: list[dict[str, float]], modes: list[str]) -> dict[str, Any]:
    """A federation's rounds, summed up per inference mode: the selected round (the best
    source validation, the earliest of ties; the last round is always validated) and the
    target accuracy there, at the last round, and at the oracle round (the best target
    accuracy, the earliest of ties)."""
    best = max((r for r in history if "val_acc" in r), key=lambda r: (r["val_acc"], -r["round"]))
    acc = {m: f"target_acc/{m}" for m in modes}
    return {"selected_round": int(best["round"]),
            "selected": {m: best[k] for m, k in acc.items()},
            "last": {m: history[-1][k] for m, k in acc.items()},
            "oracle": {m: max(r[k] for r in history) for m, k in acc.items()},
            "oracle_round": {m: int(max(history, key=lambda r, k=k: (r[k], -r["round"]))["round"])
                             for m, k in acc.items()}}


def timing_free(history: list[dict[str, float]]) -> list[dict[str, float]]:
    """History rows without the values that depend on time, load and placement
    (``round_seconds``, ``clients_moved``, ``time/*``): what equal runs must share."""
    return [{k: v for k, v in r.items()
             if k not in ("round_seconds", "clients_moved") and not k.startswith("time/")}
            for r in history]


def load_state(path: Path) -> State:
    """A model state saved as ``.npz`` (a result's ``global_state.npz``, an MLflow run's
    ``model/final.npz``), read without pickle; load it into a model with
    ``raydg.state.load``."""
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


# Accuracies: fractions inside a federation (its history, checkpoints, result.json), percent
# wherever a user reads them (console, MLflow, tables and plots logged there, reports, the API).
UNIT_TAG = "raydg.accuracy_unit"  # "percent" on runs logged so; runs without it hold fractions
WARNINGS_TAG = "raydg.warnings"  # a child run's warnings (divergence, collapse), one per line
MACHINE_TAG = "raydg.machine"  # what ran a child run's driver: CPU model and count, its GPU


def is_accuracy(name: str) -> bool:
    """Whether the metric ``name`` is an accuracy: a ``/`` part of it has the word ``acc``
    (``val_acc``, ``final/target_acc_selected/global``, ``ga/local_acc``)."""
    return any("acc" in part.split("_") for part in name.split("/"))


def in_percent(values: dict[str, Any], scale: float = 100.0) -> dict[str, Any]:
    """``values`` with each accuracy multiplied by ``scale`` (fractions to percent)."""
    return {k: scale * v if is_accuracy(k) and isinstance(v, (int, float, np.number)) else v
            for k, v in values.items()}


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


def steps_per_client(result: FederationResult) -> float:
    """Local steps (minibatches) a client took over the whole run, setup phases included: the
    compute a comparison must hold equal."""
    return sum(r["steps"] for r in result.history) / len(result.tables["clients"])


def long_rows(results: Sequence[FederationResult]) -> list[dict[str, Any]]:
    """One row per (federation, inference mode, selection): the round it selects, the mean
    source-validation accuracy there (NaN in a round left unvalidated) and the target
    accuracy, both in percent, and the local steps per client."""
    def round_of(r: FederationResult, sel: str, mode: str) -> int:
        return {"selected": r.selected_round, "last": len(r.history),
                "oracle": r.oracle_round[mode]}[sel]

    return [
        {"method": r.method, "setting": setting_label(
            {k: v for k, v in r.setting.items() if k not in METHOD_KEYS}), "target": r.target,
         "seed": r.seed, "mode": mode, "selection": sel, "round": round_of(r, sel, mode),
         "val_acc": 100.0 * r.history[round_of(r, sel, mode) - 1].get("val_acc", np.nan),
         "accuracy": 100.0 * getattr(r, sel)[mode], "steps": steps_per_client(r)}
        for r in results for sel in SELECTIONS for mode in r.selected
    ]


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single seed; both NaN for none)."""
    arr = np.asarray(values, dtype=np.float64)
    if not len(arr):
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0


def first_seen(values: Sequence[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def whole_seeds(rows: Sequence[dict[str, Any]], value: str, targets: Sequence[str]
                ) -> dict[int, dict[str, float]]:
    """Per seed, ``value`` of its row on each target, for the seeds that ran every one of
    ``targets``: a table's average is over those only (one over fewer targets is not the
    table's)."""
    by_seed: dict[int, dict[str, float]] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], {})[r["target"]] = r[value]
    return {s: v for s, v in by_seed.items() if set(targets) <= v.keys()}


def summary_rows(rows: list[dict[str, Any]], targets: list[str]) -> list[dict[str, Any]]:
    """The papers' table: per (method, setting, mode, selection), mean and std over seeds per
    target (NaN where it has no run); ``Avg`` averages the targets within each seed that has
    every one of them, then takes mean and std over those seeds (NaN where none has: an
    average over fewer targets is not the table's). Settings keep the search's order."""
    out = []
    order = {s: i for i, s in enumerate(first_seen(r["setting"] for r in rows))}
    keys = sorted({(r["method"], r["setting"], r["mode"], r["selection"]) for r in rows},
                  key=lambda k: (k[3] != "selected", k[0], order[k[1]], k[2]))
    for method, setting, mode, sel in keys:
        mine = [r for r in rows
                if (r["method"], r["setting"], r["mode"], r["selection"]) == (
                    method, setting, mode, sel)]
        row: dict[str, Any] = {"method": method, "setting": setting, "mode": mode,
                               "selection": sel}
        seeds = sorted({r["seed"] for r in mine})
        for t in targets:
            _stat(row, t, [r["accuracy"] for r in mine if r["target"] == t])
        _stat(row, "Avg", [np.mean(list(v.values()))
                           for v in whole_seeds(mine, "accuracy", targets).values()])
        row["seeds"] = len(seeds)
        row["steps"] = float(np.mean([r["steps"] for r in mine]))
        out.append(row)
    return out


def _stat(row: dict[str, Any], column: str, values: list[float]) -> None:
    """A summary cell: ``column``, ``column_std`` (:func:`mean_std`) and ``column_seeds``."""
    row[column], row[f"{column}_std"] = mean_std(values)
    row[f"{column}_seeds"] = len(values)


def duration(seconds: float) -> str:
    """``MmSSs``, e.g. ``3m07s``."""
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def format_summary(summary: list[dict[str, Any]], targets: list[str], seeds: int) -> str:
    """Plain-text tables, one per selection rule: rows method (and mode), columns targets, Avg
    and the local steps per client (mean over the runs)."""
    cols = [*targets, "Avg"]
    bodies: dict[str, list[list[str]]] = {}
    for sel in SELECTIONS:
        rows = [r for r in summary if r["selection"] == sel]
        modes = {r["mode"] for r in rows}
        names = [" ".join([r["method"], *([f"[{r['setting']}]"] if r["setting"] else []),
                           *([f"[{r['mode']}]"] if len(modes) > 1 else [])]) for r in rows]
        bodies[sel] = [[n, *(cell(r[c], r[c + "_std"], r[c + "_seeds"]) for c in cols),
                        f"{r['steps']:.0f}"] for n, r in zip(names, rows, strict=True)]
    blocks = []
    for sel, title in SELECTIONS.items():  # a table equal to an earlier one is not repeated
        same = [s for s in SELECTIONS if s != sel and bodies[s] == bodies[sel]]
        if not bodies[sel] or any(list(SELECTIONS).index(s) < list(SELECTIONS).index(sel)
                                  for s in same):
            continue
        also = "".join(f"; the same at the {SELECTIONS[s].split(' (')[0]}" for s in same)
        blocks.append(text_table(
            f"Accuracy (%) on the held-out domain, {title}, {over_seeds(seeds)}{also}",
            ["Method", *cols, "Steps/client"], bodies[sel]))
    return "\n\n".join(blocks)


ERRORS = {"std": "std", "se": "standard error"}  # what a table's ± is, over seeds


def over_seeds(seeds: int | str, error: str = "std") -> str:
    """What a table's cells are: ``mean ± std over 5 seeds (Avg: of the per-seed means over
    the targets)``; one seed: its accuracy."""
    if seeds == 1:
        return "1 seed"
    return (f"mean ± {ERRORS[error]} over {seeds} seeds (Avg: of the per-seed means over the "
            "targets)")


def cell(mean: float, std: float, seeds: int, row_seeds: int = 0, error: str = "std") -> str:
    """``mean ± std`` over ``seeds`` (``error="se"``: ± the standard error, std / sqrt(n), as
    DomainBed reports; the mean alone for one seed; ``—`` for none), followed by ``(seeds)``
    where its row has more (``row_seeds``): a cell over fewer runs than its row says so
    (:data:`FEWER_SEEDS`)."""
    if np.isnan(mean):
        return MISSING
    spread = std / np.sqrt(seeds) if error == "se" and seeds > 1 else std
    text = f"{mean:.2f} ± {spread:.2f}" if seeds > 1 else f"{mean:.2f}"
    return text + (f" ({seeds})" if seeds < row_seeds else "")


FEWER_SEEDS = "(n): a cell over n seeds, fewer than its row's"


def text_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: columns of numbers right-aligned, the others left-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    numeric = [all(not r[i] or r[i][0].isdigit() or r[i][0] in ("-", "+", MISSING) for r in rows)
               for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(cells, widths, numeric, strict=True)).rstrip()

    head = line(header)
    return "\n".join([title, head, "-" * len(head), *(line(r) for r in rows)])


def select_settings(rows: list[dict[str, Any]], targets: list[str]) -> list[dict[str, Any]]:
    """Hyper-parameter selection the DomainBed way, per (method, mode) and held-out target.

    Among the settings of a search, the selected one has the best mean over seeds of the
    source-validation accuracy at each run's selected round (training-domain validation; ties
    go to the earlier setting). Its target accuracy (mean and std over seeds) is what a table
    reports. Beside it, the *oracle* setting, the one with the best mean target accuracy: it
    peeks at the target domain, an upper bound and not a selection. ``Avg`` averages the
    chosen settings' accuracies over the targets within each seed, then over seeds.
    """
    sel = [r for r in rows if r["selection"] == "selected"]
    out = []
    for method, mode in first_seen((r["method"], r["mode"]) for r in sel):
        mine = [r for r in sel if (r["method"], r["mode"]) == (method, mode)]
        chosen: dict[str, dict[int, float]] = {}
        for t in targets:
            runs = {s: [r for r in mine if r["target"] == t and r["setting"] == s]
                    for s in first_seen(r["setting"] for r in mine)}

            def mean_of(key: str, s: str, runs=runs) -> float:
                return float(np.mean([r[key] for r in runs[s]]))

            best = max(runs, key=lambda s: mean_of("val_acc", s))
            oracle = max(runs, key=lambda s: mean_of("accuracy", s))
            acc, std = mean_std([r["accuracy"] for r in runs[best]])
            oacc, ostd = mean_std([r["accuracy"] for r in runs[oracle]])
            chosen[t] = {r["seed"]: r["accuracy"] for r in runs[best]}
            out.append({"method": method, "mode": mode, "target": t, "setting": best,
                        "val_acc": mean_of("val_acc", best), "accuracy": acc,
                        "accuracy_std": std, "oracle_setting": oracle, "oracle_accuracy": oacc,
                        "oracle_accuracy_std": ostd})
        seeds = sorted(set.intersection(*(set(c) for c in chosen.values())))
        avg, std = mean_std([np.mean([chosen[t][s] for t in targets]) for s in seeds])
        out.append({"method": method, "mode": mode, "target": "Avg", "setting": "",
                    "val_acc": float("nan"), "accuracy": avg, "accuracy_std": std,
                    "oracle_setting": "", "oracle_accuracy": float("nan"),
                    "oracle_accuracy_std": float("nan")})
    return out


def format_selection(selection: list[dict[str, Any]], seeds: int) -> str:
    """The selected setting per target, with the oracle's beside it, as a plain-text table."""
    modes = {r["mode"] for r in selection}
    rows = []
    for r in selection:
        name = r["method"] + (f" [{r['mode']}]" if len(modes) > 1 else "")
        avg = r["target"] == "Avg"
        rows.append([name, r["target"], r["setting"], "" if avg else f"{r['val_acc']:.2f}",
                     cell(r["accuracy"], r["accuracy_std"], seeds),
                     r["oracle_setting"],
                     "" if avg else cell(r["oracle_accuracy"], r["oracle_accuracy_std"], seeds)])
    title = (f"Hyper-parameters selected per held-out domain by training-domain validation (best "
             f"mean source-validation accuracy over {seeds} seed(s)); accuracy (%) at the "
             "selected round. Oracle = best mean target accuracy: an upper bound, not a "
             "selection")
    return text_table(title, ["Method", "Target", "Selected setting", "Source val",
                              "Target acc", "Oracle setting", "Oracle acc"], rows)


def seed_differences(rows: list[dict[str, Any]], method: str, baseline: str) -> np.ndarray:
    """``method`` against ``baseline`` on the same seeds (same partitions and initial model):
    per seed, the difference of their accuracies averaged over the targets. Only seeds that
    both have on every target of ``rows`` count."""
    targets = first_seen(r["target"] for r in rows)
    a, b = (whole_seeds([r for r in rows if r["method"] == name], "accuracy", targets)
            for name in (method, baseline))
    return np.array([np.mean([a[s][t] - b[s][t] for t in a[s]])
                     for s in sorted(set(a) & set(b))])


def paired_difference(rows: list[dict[str, Any]], method: str,
                      baseline: str) -> tuple[float, float, int]:
    """:func:`seed_differences`: their mean, the half-width of its 95 % t-interval (NaN for
    one seed) and the number of seeds."""
    d = seed_differences(rows, method, baseline)
    return (*t_interval(d), len(d))


def t_interval(d: np.ndarray) -> tuple[float, float]:
    """The mean of ``d`` (NaN for none) and the half width of its 95 % t-interval (NaN for
    fewer than two values)."""
    from scipy import stats

    if len(d) < 2:
        return (float(d.mean()) if len(d) else float("nan")), float("nan")
    return float(d.mean()), float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1)
                                  / np.sqrt(len(d)))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (Holm 1979): the i-th smallest is
    multiplied by (m - i + 1), made non-decreasing in that order, capped at 1."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        out[i] = running
    return out
