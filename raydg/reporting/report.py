"""``raydg report``: a paper's table from many runs in the MLflow store.

Reads the child runs (one per federation) of raydg experiments, however they were launched, and
prints per method (rows) and held-out domain (columns, then Avg) the accuracy at one model
selection, mean and std over seeds. Runs that differ in any setting other than method, target,
seed and the method's own options are never averaged together: each set of settings is a table
of its own, and the settings that differ are named. Runs that did not finish are listed apart.
This module reads the store only: no Ray, no torch.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raydg.errors import EmptyResult, RaydgError
from raydg.plots import plot_curves
from raydg.reporting import rows
from raydg.reporting.runs import (
    UNSET,
    Run,
    Table,
    differing,
    find_runs,
    long_rows,
    matching,
    repeated,
    row_name,
    setting_note,
    tables,
)
from raydg.results import (
    FEWER_SEEDS,
    MISSING,
    SELECTIONS,
    cell,
    first_seen,
    is_accuracy,
    over_seeds,
    paired_difference,
    text_table,
)

FORMATS = ("console", "markdown", "latex", "csv", "json")
Block = tuple[str, list[str], list[list[str]]]  # a printed table: heading, header, body


def versus(table: Table, baseline: str, selection: str) -> dict[str, dict[str, str]]:
    """Per method of ``table``: its paired difference to ``baseline`` over seeds, with the
    95 % interval (none where the table lacks the baseline)."""
    rows = long_rows(table.runs, selection)
    names = first_seen([r["method"] for r in rows])
    out = {}
    for m in names if baseline in names else []:
        if m != baseline:
            mean, half, n = paired_difference(rows, m, baseline)
            out[m] = {f"vs {baseline} (95% CI)": f"{mean:+.2f} ± {half:.2f}" if n > 1
                      else f"{mean:+.2f} (1 seed)" if n else MISSING}
    return out


def final_means(table: Table, metrics: Sequence[str]) -> dict[str, dict[str, str]]:
    """``--metric``: per method, the mean over its runs of each final metric it logged."""
    out: dict[str, dict[str, str]] = {}
    for metric in metrics:
        for method in first_seen([row_name(r, table.runs) for r in table.runs]):
            values = [r.metrics[metric] for r in table.runs
                      if row_name(r, table.runs) == method and metric in r.metrics]
            if values:
                out.setdefault(method, {})[metric] = f"{np.mean(values):.4g}"
    return out


def columns(client: Any, table: Table, selection: str, baseline: str | None, ledger: bool,
            seconds: bool, metrics: Sequence[str] = ()) -> dict[str, dict[str, str]]:
    """The optional columns of a table, by method: ``--versus``, ``--ledger``, ``--timing``,
    ``--metric``."""
    out: dict[str, dict[str, str]] = {}
    for part in (versus(table, baseline, selection) if baseline else {},
                 communication(client, table) if ledger else {},
                 timing(client, table) if seconds else {}, final_means(table, metrics)):
        for m, cols in part.items():
            out.setdefault(m, {}).update(cols)
    return out


def paper_rows(paper: dict[str, Any], targets: list[str]) -> dict[str, dict[str, float]]:
    """The published numbers of the table's targets (and Avg), by method."""
    return {m: {t: v for t, v in row.items() if t in [*targets, "Avg"]}
            for m, row in paper["accuracy"].items()}


def published_table(paper: dict[str, Any], fmt: str) -> str:
    """The paper's own table (``--paper`` where no run matches), in format ``fmt``."""
    targets = first_seen([t for row in paper["accuracy"].values() for t in row if t != "Avg"])
    cols = [*targets, "Avg"]
    rows = paper_rows(paper, targets)
    body = [[m, *(f"{row[c]:.2f}" if c in row else "" for c in cols)] for m, row in rows.items()]
    records = [{"method": m, **row} for m, row in rows.items()]
    return _format([(f"Accuracy (%) published in {paper['source']}", ["Method", *cols], body)],
                   records, fmt)


def round_means(client: Any, table: Table, metric: str) -> dict[str, dict[int, float]]:
    """Per method of ``table`` that logged ``metric``: its mean per round over the method's
    runs (held-out domains x seeds)."""
    values: dict[str, dict[int, list[float]]] = {r["method"]: {} for r in table.rows}
    for r in table.runs:
        for step, value in r.history(client, metric):
            values[row_name(r, table.runs)].setdefault(step, []).append(value)
    return {name: {step: float(np.mean(v)) for step, v in sorted(steps.items())}
            for name, steps in values.items() if steps}


def round_blocks(client: Any, tabs: list[Table], metrics: Sequence[str]
                 ) -> tuple[list[Block], list[dict[str, Any]]]:
    """``--per-round``: per table and metric, one row per method, one column per round."""
    blocks, records = [], []
    for metric in metrics:
        found = False
        for i, t in enumerate(tabs):
            means = round_means(client, t, metric)
            if not means:
                continue
            found = True
            steps = sorted({s for row in means.values() for s in row})
            unit = " (%)" if is_accuracy(metric) else ""
            blocks.append((f"{metric} per round{unit}, mean over held-out domains and seeds"
                           + setting_note(t, tabs), ["Method", *map(str, steps)],
                           [[name, *(f"{row[s]:.4g}" if s in row else "" for s in steps)]
                            for name, row in means.items()]))
            records += [{"table": i, "metric": metric, "method": name,
                         **{f"round {s}": v for s, v in row.items()}}
                        for name, row in means.items()]
        if not found:
            raise RaydgError(f"--per-round {metric}: no matching run logged that metric")
    return blocks, records


def render(tabs: list[Table], fmt: str, selection: str, extras: list[dict[str, dict[str, str]]],
           paper: dict[str, Any] | None, rounds: tuple[list[Block], list[dict[str, Any]]],
           error: str = "std") -> str:
    """The tables in one format; ``extras``: per table, additional columns by method
    (column -> text); ``rounds``: the per-round blocks and records that follow them."""
    title = f"Accuracy (%) on the held-out domain, {SELECTIONS[selection]}"
    blocks, records = [], []
    for i, (t, extra) in enumerate(zip(tabs, extras, strict=True)):
        cols = [*t.targets, "Avg"]
        counts = sorted({r["seeds"] for r in t.rows})  # seeds per row: a column where they differ
        added = [*(["Seeds"] if len(counts) > 1 else []),
                 *sorted({k for r in t.rows for k in extra.get(r["method"], {})})]
        published = paper_rows(paper, t.targets) if paper else {}
        body, fewer = [], False
        for r in t.rows:
            more = extra.get(r["method"], {})
            shown = {"Seeds": str(r["seeds"]), **more}
            body.append([r["method"], *(cell(r[c], r[c + "_std"], r[c + "_seeds"], r["seeds"],
                                             error) for c in cols),
                         *(shown.get(k, "") for k in added)])
            fewer |= any(0 < r[c + "_seeds"] < r["seeds"] for c in cols)
            records.append({"table": i, **{k: t.settings.get(k, UNSET)
                                           for k in differing(tabs)},
                            "method": r["method"], "seeds": r["seeds"],
                            **{c: _number(r[c]) for c in cols},
                            **{f"{c}_std": _number(r[c + "_std"]) for c in cols},
                            **{f"{c}_seeds": r[c + "_seeds"] for c in cols}, **more})
            if r["method"] in published:
                paper_row = published[r["method"]]
                records[-1].update({f"paper_{c}": v for c, v in paper_row.items()})
                body.append([f"  {paper['source']}", *(
                    f"{paper_row[c]:.2f}" if c in paper_row else "" for c in cols),
                    *[""] * len(added)])
                body.append(["  measured - paper", *(
                    (MISSING if np.isnan(r[c]) else f"{r[c] - paper_row[c]:+.2f}")
                    if c in paper_row else "" for c in cols),
                    *[""] * len(added)])
        seeds = (over_seeds(counts[0], error) if len(counts) == 1 else
                 over_seeds(f"{counts[0]}-{counts[-1]}", error) + "; Seeds: per row")
        heading = f"{title}, {seeds}" + f"; {FEWER_SEEDS}" * fewer + setting_note(t, tabs)
        blocks.append((heading, ["Method", *cols, *added], body))
    return _format(blocks + rounds[0], records + rounds[1], fmt)


def _number(value: float) -> float | None:
    """A cell's number in the records (JSON, CSV): none where the cell has no run."""
    return None if np.isnan(value) else value


def _format(blocks: list[Block], records: list[dict[str, Any]], fmt: str) -> str:
    """Tables (heading, header, body) as text, or their records as JSON or CSV."""
    if fmt == "json":
        return json.dumps(records, indent=1)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(dict.fromkeys(
            k for rec in records for k in rec)))
        writer.writeheader()
        writer.writerows(records)
        return buffer.getvalue()
    if fmt == "markdown":
        return "\n\n".join(
            "\n".join([f"**{h}**", "", "| " + " | ".join(head) + " |",
                       "|" + "---|" * len(head), *("| " + " | ".join(b) + " |" for b in body)])
            for h, head, body in blocks)
    if fmt == "latex":
        return "\n\n".join(_latex(h, head, body) for h, head, body in blocks)
    return "\n\n".join(text_table(h, head, body) for h, head, body in blocks)


def _latex(heading: str, header: list[str], body: list[list[str]]) -> str:
    def esc(text: str) -> str:
        for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                     ("#", r"\#"), ("±", r"$\pm$")):
            text = text.replace(a, b)
        return text

    lines = [f"% {heading}", r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}", r"\hline",
             " & ".join(esc(h) for h in header) + r" \\", r"\hline"]
    lines += [" & ".join(esc(c) for c in row) + r" \\" for row in body]
    return "\n".join([*lines, r"\hline", r"\end{tabular}"])


def curve_points(client: Any, table: Table) -> list[dict[str, Any]]:
    """Per-round target and source-validation accuracy of every run of ``table``."""
    points = []
    for r in table.runs:
        history = {key: dict(r.history(client, key)) for key in ("target_acc", "val_acc")}
        name = row_name(r, table.runs)
        points += [{"method": name, "target": r.target, "seed": r.seed, "round": step,
                    "target_acc": acc, "val_acc": history["val_acc"].get(step, np.nan)}
                   for step, acc in sorted(history["target_acc"].items())]
    return points


def communication(client: Any, table: Table) -> dict[str, dict[str, str]]:
    """Per method: mean bytes up and down per round, and the kinds of information that
    travel (from one run's ledger)."""
    import pyarrow.parquet as pq
    from mlflow.artifacts import download_artifacts

    out: dict[str, dict[str, str]] = {}
    for method in first_seen([row_name(r, table.runs) for r in table.runs]):
        runs = [r for r in table.runs if row_name(r, table.runs) == method]
        per_round = {k: np.mean([m.value for r in runs for m in
                                 client.get_metric_history(r.run_id, k)])
                     for k in ("bytes_up", "bytes_down")}
        ledger = pq.read_table(download_artifacts(run_id=runs[0].run_id,
                                                  artifact_path="ledger.parquet",
                                                  tracking_uri=client.tracking_uri))
        kinds = sorted(set(ledger.column("kind").to_pylist()))
        out[method] = {"MB up/round": f"{per_round['bytes_up'] / 1e6:.3f}",
                       "MB down/round": f"{per_round['bytes_down'] / 1e6:.3f}",
                       "shared": " ".join(kinds)}
    return out


def timing(client: Any, table: Table) -> dict[str, dict[str, str]]:
    out = {}
    for method in first_seen([row_name(r, table.runs) for r in table.runs]):
        seconds = [m.value for r in table.runs if row_name(r, table.runs) == method
                   for m in client.get_metric_history(r.run_id, "round_seconds")]
        out[method] = {"s/round": f"{np.mean(seconds):.2f}"}
    return out


def export(client: Any, path: Path, about: dict[str, Any], *, experiments: Sequence[str] = (),
           dataset: str | None = None, methods: Sequence[str] = (),
           filter_string: str = "") -> int:
    """Write the runs a report with these filters reads to the runs file ``path``
    (:mod:`raydg.reporting.rows`); the number of runs."""
    runs = matching(client, experiments, dataset, methods, filter_string)
    if not runs:
        raise EmptyResult(f"no raydg runs to export from {client.tracking_uri}")
    return rows.export(client, runs, path, about)


def report(client: Any, *, experiments: Sequence[str] = (), dataset: str | None = None,
           methods: Sequence[str] = (), filter_string: str = "", selection: str = "selected",
           fmt: str = "console", baseline: str | None = None, ledger: bool = False,
           seconds: bool = False, paper: dict[str, Any] | None = None,
           plot: Path | None = None, per_round: Sequence[str] = (),
           metrics: Sequence[str] = (), error: str = "std") -> tuple[str, list[str]]:
    """The report in format ``fmt`` and, for the formats that are data, the notes on it
    (tables kept apart, runs left out), which the console format holds in its text;
    :class:`RaydgError` for bad input, :class:`EmptyResult` when no finished run matches."""
    runs = find_runs(client, experiments, dataset, methods, filter_string)
    if not runs:
        raise EmptyResult("no raydg runs match (check --experiment, --dataset, --method, "
                          f"--filter and the store {client.tracking_uri})")
    tabs = tables(runs, selection, first_seen(
        [t for row in (paper or {}).get("accuracy", {}).values() for t in row]))
    if not tabs:
        raise EmptyResult(f"{len(runs)} matching runs, none finished")
    names = first_seen([r["method"] for t in tabs for r in t.rows])
    if baseline and baseline not in names:
        raise RaydgError(f"--versus {baseline}: no such method in the tables; methods: "
                         f"{', '.join(names)}")
    extras = [columns(client, t, selection, baseline, ledger, seconds, metrics) for t in tabs]
    absent = [m for m in metrics if not any(m in r.metrics for t in tabs for r in t.runs)]
    if absent:
        raise RaydgError(f"--metric {absent[0]}: no matching finished run logged it")
    apart = [f"{len(tabs)} tables: the runs differ in {', '.join(differing(tabs))}, which are "
             "never averaged together"] if len(tabs) > 1 else []
    unfinished = ", ".join(f"{r.method} {r.target} seed={r.seed} ({r.status})"
                           for r in runs if r.status != "FINISHED")
    left_out = [f"Not in the tables (not finished): {unfinished}"] if unfinished else []
    twice = repeated(runs)
    repeat = "1 run repeats" if len(twice) == 1 else f"{len(twice)} runs repeat"
    left_out += [f"Counted once (the latest run of each): {repeat} another's method, "
                 "settings, target and seed: " + ", ".join(
                     f"{r.method} {r.target} seed={r.seed} ({r.run_id[:8]})" for r in twice)
                 ] if twice else []
    left_out += warned(runs)
    written = [] if plot is None else plot_tables(client, tabs, plot)
    text = render(tabs, fmt, selection, extras, paper, round_blocks(client, tabs, per_round),
                  error)
    if fmt == "console":
        return "\n\n".join([*apart, text, *left_out]), written
    return text, apart + left_out + written


def warned(runs: list[Run]) -> list[str]:
    """``Warnings``: each warning a matching run logged (divergence, collapse), under the run
    it belongs to; in the tables, such a run's numbers stand as they were measured."""
    lines = [f"  {r.method} {r.target} seed={r.seed} ({r.run_id[:8]}): "
             f"{w.removeprefix('warning: ')}" for r in runs for w in r.warnings.splitlines()]
    return [f"Warnings ({len(lines)}):\n" + "\n".join(lines)] if lines else []


def plot_tables(client: Any, tabs: list[Table], plot: Path) -> list[str]:
    """One figure per table: ``plot`` itself for one table, else ``plot`` named by each
    table's settings (``curves-lr=0.5.png``); a line per figure written."""
    lines = []
    for i, t in enumerate(tabs):
        note = setting_note(t, tabs)
        name = re.sub(r"[^\w.=,+-]+", "_", note.strip(" []"))
        path = plot if len(tabs) == 1 else plot.with_name(f"{plot.stem}-{name}{plot.suffix}")
        datasets = ", ".join(first_seen([r.params.get("dataset", "") for r in t.runs]))
        title = f"{datasets}: {', '.join(r['method'] for r in t.rows)}{note}"
        plot_curves(curve_points(client, t), path, title)
        lines.append(f"figure of table {i + 1}{note} written to {path}")
    return lines

