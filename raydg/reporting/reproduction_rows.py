"""The rows a reproduction page is made from: one per finished federation of a paper
config's protocol, read from MLflow runs (``export_rows``) and kept as CSV (``write_rows``,
``read_rows``; the file committed under ``docs/reproduction-rows/``). Reads stored results
only and imports no engine module.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raydg.errors import RaydgError

SELECTIONS = ("oracle", "selected", "last")
COMPOSED = ("method", "augment", "aggregation")  # the params that name a row's method
COLUMNS = ("method", "variant", "target", "seed", "selected", "last", "oracle",
           "selected_round", "steps_per_client", "options", "fingerprint", "machine", "wall_s")


def protocol_mismatch(params: dict[str, str], expected: dict[str, str],
                      unlogged: dict[str, str]) -> list[str]:
    """The settings whose value a run's params do not have; a setting the run did not log
    (an older raydg) counts as its value in ``unlogged``."""
    return [k for k, v in expected.items() if params.get(k, unlogged.get(k)) != v]


def composition(params: dict[str, str]) -> tuple[str | None, ...]:
    """A run's (method, augment, aggregation) from its params (None where unset)."""
    return tuple(None if params.get(k, "None") == "None" else params[k] for k in COMPOSED)


def export_rows(runs: Sequence[Any], expected: Callable[[tuple[str | None, ...]], dict[str, str]],
                fingerprints: dict[str, str], variant: dict[str, str] | None = None,
                unlogged: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Rows of the finished runs (:class:`raydg.reporting.runs.Run`) that ran the protocol
    (``expected(composition)``: every result-relevant param of the config resolved for the
    run's method, augmentation and aggregation, their options included), with the fingerprint
    of their images (by run id); a run that differs elsewhere is an error naming the settings.
    ``variant``: the settings in which ``expected`` changes the paper's protocol (an ablation,
    or a model that a method needs), the label of the rows."""
    rows = []
    for r in runs:
        if r.status != "FINISHED":
            continue
        bad = protocol_mismatch(r.params, expected(composition(r.params)), unlogged or {})
        if bad:
            raise RaydgError(f"run {r.run_id} ({r.method} {r.target} seed {r.seed}) differs from "
                             f"the config in {bad[:3]}: keep it out (--experiment), or name "
                             "the change as a variant")
        rows.append({
            "method": r.method, "variant": " ".join(f"{k}={v}" for k, v in (variant or {}).items()),
            "target": r.target, "seed": r.seed,
            **{s: round(r.accuracy(s), 4) for s in SELECTIONS},
            "selected_round": int(r.metrics["selected_round"]),
            "steps_per_client": int(r.metrics["steps_per_client"]),
            "options": " ".join(f"{k[8:]}={v}" for k, v in r.options()),
            "fingerprint": fingerprints.get(r.run_id, ""),
            "machine": r.machine, "wall_s": "" if np.isnan(r.wall_s) else round(r.wall_s),
        })
    return rows


def federation(row: dict[str, Any]) -> tuple[str, str, str, int]:
    """What a row is a federation of: (method, variant, target, seed)."""
    return row["method"], row["variant"], row["target"], int(row["seed"])


def row_label(row: dict[str, Any]) -> str:
    """The row as a design names it: its method, and the options its run set in square
    brackets where it set any (``fedfd [cafl_reduction=mean]``, a regime's choice), so that a
    setting that is not the paper's never passes under the plain method name."""
    return row["method"] + (f" [{row['options']}]" if row.get("options") else "")


def on_machine(row: dict[str, Any]) -> tuple[str, str, str, int, str]:
    """A federation on one machine: :func:`federation` and the row's ``machine``."""
    return (*federation(row), row["machine"])


def merge(old: list[dict[str, Any]], new: list[dict[str, Any]],
          key: Callable[[dict[str, Any]], tuple] = federation) -> list[dict[str, Any]]:
    """``old`` plus the rows of ``new`` whose ``key`` (by default the federation) it lacks,
    sorted."""
    have = {key(r) for r in old}
    return sorted(old + [r for r in new if key(r) not in have], key=key)


def repeats(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``new`` that run a federation of ``old`` again on another machine: kept
    apart from the rows (one per federation), where the page compares the two."""
    first = {federation(r): r for r in old}
    again = [r for r in new if federation(r) in first and r["machine"]
             and r["machine"] != first[federation(r)]["machine"]]
    for r in again:
        if r["fingerprint"] != first[federation(r)]["fingerprint"]:
            raise RaydgError(f"{r['method']} {r['target']} seed {r['seed']} on {r['machine']} "
                             f"ran on other images ({r['fingerprint']}) than its row "
                             f"({first[federation(r)]['fingerprint']}): not the same federation")
    return again


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def read_rows(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r.setdefault("machine", "")  # a rows file from before the machine and wall columns
        r["wall_s"] = int(r["wall_s"]) if r.get("wall_s") else ""
        for key in ("seed", "selected_round", "steps_per_client"):
            r[key] = int(r[key])
        for s in SELECTIONS:
            r[s] = float(r[s])
    return rows
