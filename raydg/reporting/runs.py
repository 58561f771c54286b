"""The runs of an MLflow store (or a runs file) as records, grouped into tables: runs that
differ in any setting other than method, target, seed and the method's own options are never
averaged together."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raydg.config import NOT_RESULTS
from raydg.errors import RaydgError
from raydg.results import (
    MACHINE_TAG,
    UNIT_TAG,
    WARNINGS_TAG,
    first_seen,
    in_percent,
    is_accuracy,
    summary_rows,
)

# params a table's rows may differ in: they name the row, not the table
ROW_KEYS = ("method", "augment", "aggregation", "equal_compute", "target", "seeds", "seed")
UNSET = "(unset)"  # a setting that runs logged by an older raydg do not have


@dataclass
class Run:
    """One finished or unfinished federation, as MLflow has it."""

    run_id: str
    status: str
    method: str
    target: str
    seed: int
    mode: str  # the reported inference mode
    params: dict[str, str]
    metrics: dict[str, float]  # accuracies in percent, whatever the run logged
    not_paper: str = ""  # options that are not the paper's (tag raydg.not_paper), k=v k=v
    setting: str = ""  # the searched setting that made the run (tag raydg.setting)
    scale: float = 1.0  # what turns its logged accuracies into percent (100: fractions)
    warnings: str = ""  # what the run warned of (tag raydg.warnings), one per line
    machine: str = ""  # what ran its driver (tag raydg.machine); "" in runs before it
    wall_s: float = np.nan  # seconds from the child run's start to its end

    def accuracy(self, selection: str) -> float:
        return self.metrics.get(f"final/target_acc_{selection}/{self.mode}", np.nan)

    def history(self, client: Any, metric: str) -> list[tuple[int, float]]:
        """``metric``'s (round, value) as logged, accuracies in percent."""
        scale = self.scale if is_accuracy(metric) else 1.0
        return [(m.step, scale * m.value) for m in client.get_metric_history(self.run_id, metric)]

    def settings(self) -> tuple[tuple[str, str], ...]:
        """What a table holds fixed: every result-relevant param but the row's."""
        return tuple(sorted((k, v) for k, v in self.params.items()
                            if k not in ROW_KEYS and k not in NOT_RESULTS
                            and not k.startswith(("options.", "method_options"))))

    def options(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, v) for k, v in self.params.items() if k.startswith("options.")))


@dataclass
class Table:
    settings: dict[str, str]
    targets: list[str]
    runs: list[Run]
    rows: list[dict[str, Any]] = field(default_factory=list)  # summary rows, one per method


def matching(client: Any, experiments: Sequence[str], dataset: str | None,
             methods: Sequence[str], filter_string: str) -> list[Any]:
    """The child runs (MLflow's) of raydg experiments (all, or those named) that match the
    filters, in the order they started (which gives the tables' order of methods and
    targets)."""
    from mlflow.exceptions import MlflowException

    if experiments:
        found = [client.get_experiment_by_name(name) for name in experiments]
        missing = [n for n, e in zip(experiments, found, strict=True) if e is None]
        if missing:
            raise RaydgError(f"no MLflow experiment {missing[0]!r} in {client.tracking_uri}")
    else:
        found = client.search_experiments()
    try:
        runs = client.search_runs([e.experiment_id for e in found], filter_string,
                                  max_results=50000, order_by=["attributes.start_time ASC"])
    except MlflowException as err:
        raise RaydgError(f"--filter {filter_string!r}: {err.message.splitlines()[0]}") from None
    return [r for r in runs if "raydg.target" in r.data.tags
            and not (dataset and r.data.tags.get("raydg.dataset") != dataset)
            and not (methods and r.data.tags.get("raydg.method") not in methods)]


def find_runs(client: Any, experiments: Sequence[str], dataset: str | None,
              methods: Sequence[str], filter_string: str) -> list[Run]:
    """:func:`matching`, as :class:`Run` records."""
    out = []
    for r in matching(client, experiments, dataset, methods, filter_string):
        tags = r.data.tags
        scale = 1.0 if tags.get(UNIT_TAG) == "percent" else 100.0  # older runs: fractions
        out.append(Run(r.info.run_id, r.info.status, tags["raydg.method"], tags["raydg.target"],
                       int(tags["raydg.seed"]), tags.get("raydg.mode", "global"),
                       dict(r.data.params), in_percent(dict(r.data.metrics), scale),
                       tags.get("raydg.not_paper", ""), tags.get("raydg.setting", ""), scale,
                       tags.get(WARNINGS_TAG, ""), tags.get(MACHINE_TAG, ""),
                       _seconds(r.info.start_time, r.info.end_time)))
    return out


def _seconds(start_ms: int | None, end_ms: int | None) -> float:
    return (end_ms - start_ms) / 1000 if start_ms and end_ms else np.nan


def repeated(runs: list[Run]) -> list[Run]:
    """The finished runs that a later one repeats (same settings, method, options, target and
    seed: e.g. a grid's run and a sweep's): each counts once, its latest run."""
    latest = {(r.settings(), r.method, r.options(), r.target, r.seed): r
              for r in runs if r.status == "FINISHED"}  # oldest first: the last one stays
    kept = {id(r) for r in latest.values()}
    return [r for r in runs if r.status == "FINISHED" and id(r) not in kept]


def tables(runs: list[Run], selection: str, order: Sequence[str] = ()) -> list[Table]:
    """Finished runs grouped by settings, a repeated run once (:func:`repeated`); per table,
    the summary rows of each method (a method's option values join its name where one table
    holds several). Targets are in ``order`` (a paper's), then in the order first seen."""
    left = {id(r) for r in repeated(runs)}
    done = [r for r in runs if r.status == "FINISHED" and id(r) not in left]
    out = []
    for key in first_seen([r.settings() for r in done]):
        mine = [r for r in done if r.settings() == key]
        targets = sorted(first_seen([r.target for r in mine]),
                         key=lambda t: list(order).index(t) if t in order else len(order))
        table = Table(dict(key), targets, mine)
        table.rows = summary_rows(long_rows(mine, selection), targets)
        out.append(table)
    return out


def row_name(run: Run, runs: list[Run]) -> str:
    """``method``, or ``method [options]``: the options that are not the paper's, and those
    in which runs of the same method differ."""
    variants = {r.options() for r in runs if r.method == run.method}
    shared = set.intersection(*(set(v) for v in variants))
    flagged = {f"options.{kv.split('=', 1)[0]}" for kv in run.not_paper.split()}
    own = " ".join(f"{k[8:]}={v}" for k, v in run.options()
                   if (k, v) not in shared or k in flagged)
    if own or len(variants) > 1:
        return f"{run.method} [{own or 'defaults'}]"
    return run.method


def long_rows(runs: list[Run], selection: str) -> list[dict[str, Any]]:
    return [{"method": row_name(r, runs), "setting": "", "target": r.target, "seed": r.seed,
             "mode": "reported", "selection": selection, "accuracy": r.accuracy(selection),
             "steps": r.metrics.get("steps_per_client", np.nan)} for r in runs]


def differing(tabs: list[Table]) -> list[str]:
    """The settings in which the tables differ."""
    keys = sorted({k for t in tabs for k in t.settings})
    return [k for k in keys if len({t.settings.get(k) for t in tabs}) > 1]


def setting_note(table: Table, tabs: list[Table]) -> str:
    """`` [key=value, ...]``: the table's values of the settings the tables differ in."""
    note = ", ".join(f"{k}={table.settings.get(k, UNSET)}" for k in differing(tabs))
    return f" [{note}]" if note else ""
