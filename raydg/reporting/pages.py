"""Docs pages regenerated from runs files, never edited by hand.

A page's template is markdown with three kinds of placeholders:

* a ``report`` block: a fenced block whose body is a YAML mapping, the query of one
  ``raydg report``::

      ```report
      id: gma                      # how references name it
      rows: fedgma-step-digits-style   # the runs file ROWS_DIR/<rows>.json.gz
      make: python benchmarks/fidelity.py ablation fedgma-step-digits-style
      versus: fedavg               # and any of: method (list), dataset, filter, selection,
      per_round: [target_acc]      #   per_round and metric (lists), hidden (true: print
                                   #   nothing)
      ```

  becomes the command that prints it and its markdown tables, or, while the runs file is
  missing, a line that says so and how it is made (``make``: the command);
* a reference ``{{gma | fedgma [defaults] | Avg}}``: one number of that report, the column
  (a target, ``Avg``, ``Avg_std``, ``vs fedavg (95% CI)``, a ``metric``, or
  ``METRIC round N``) of the row of that method, as the report prints it; ``(not yet run)``
  while its runs file is missing;
* a ``diagnostic`` block (``id`` and ``name``): the table that the function of that name,
  given to :func:`render`, computes (a diagnostic of the data, not of runs): records whose
  first key, ``method``, names the row; references read it as they read a report.

A query that matches no run, an unknown id, method or column is an error: a page never shows
a blank where a number was meant to be.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from raydg.errors import RaydgError
from raydg.reporting.report import report
from raydg.reporting.rows import StoredRuns
from raydg.results import MISSING as EMPTY_CELL

BLOCK = re.compile(r"^```(?P<kind>report|diagnostic)\n(?P<body>.*?)^```\n",
                   re.MULTILINE | re.DOTALL)
REFERENCE = re.compile(r"\{\{([^}|]+)\|([^}|]+)\|([^}]+)\}\}")
QUERY_KEYS = {"id", "rows", "make", "hidden", "method", "dataset", "filter", "selection",
              "versus", "per_round", "metric"}
MISSING = "(not yet run)"


def command(path: Path, query: dict[str, Any]) -> str:
    """The ``raydg report`` command line of a query."""
    words = ["raydg", "report", "--rows", str(path)]
    for key, flag in (("method", "--method"), ("dataset", "--dataset"), ("filter", "--filter"),
                      ("selection", "--selection"), ("versus", "--versus"),
                      ("per_round", "--per-round"), ("metric", "--metric")):
        values = query.get(key)
        for value in values if isinstance(values, list) else [values] if values else []:
            words += [flag, str(value)]
    return shlex.join([*words, "--format", "markdown"])


def run_query(runs: StoredRuns, query: dict[str, Any], fmt: str) -> str:
    text, _ = report(runs, methods=query.get("method", ()),
                     dataset=query.get("dataset"), filter_string=query.get("filter", ""),
                     selection=query.get("selection", "selected"), fmt=fmt,
                     baseline=query.get("versus"), per_round=query.get("per_round", ()),
                     metrics=query.get("metric", ()))
    return text


Diagnostic = Callable[[], tuple[str, list[dict[str, Any]]]]  # -> (caption, records)


def render(template: str, rows_dir: Path, shown: Path | None = None,
           diagnostics: Mapping[str, Diagnostic] | None = None) -> str:
    """The page: every block and reference of ``template`` filled in from the runs files in
    ``rows_dir``, which the page calls ``shown`` (e.g. relative to the repository, so that the
    page does not depend on where the checkout lives), and from ``diagnostics``."""
    records: dict[str, list[dict[str, Any]] | None] = {}

    def block(match: re.Match[str]) -> str:
        query = yaml.safe_load(match["body"])
        if match["kind"] == "diagnostic":
            return diagnostic(query, diagnostics or {}, records)
        unknown = set(query) - QUERY_KEYS
        if unknown or "id" not in query or "rows" not in query:
            raise RaydgError(f"report block {query}: needs id and rows; unknown keys "
                             f"{sorted(unknown)}")
        path, name = (d / f"{query['rows']}.json.gz" for d in (rows_dir, shown or rows_dir))
        if not path.exists():
            records[query["id"]] = None
            how = f"; `{query['make']}` makes it" if "make" in query else ""
            return "" if query.get("hidden") else f"*Not yet run:* `{name}` is missing{how}.\n"
        runs = StoredRuns([path])  # read once for both formats
        records[query["id"]] = json.loads(run_query(runs, query, "json"))
        if query.get("hidden"):
            return ""
        return f"```\n{command(name, query)}\n```\n\n{run_query(runs, query, 'markdown')}\n"

    def reference(match: re.Match[str]) -> str:
        name, method, column = (part.strip() for part in match.groups())
        if name not in records:
            raise RaydgError(f"{match[0]}: no report block with id {name!r} before it")
        found = records[name]
        return MISSING if found is None else value(found, method, column, match[0])

    return REFERENCE.sub(reference, BLOCK.sub(block, template))


def diagnostic(query: dict[str, Any], diagnostics: Mapping[str, Diagnostic],
               records: dict[str, list[dict[str, Any]] | None]) -> str:
    """A ``diagnostic`` block: its caption and table, its records kept for references."""
    if set(query) != {"id", "name"} or query["name"] not in diagnostics:
        raise RaydgError(f"diagnostic block {query}: needs id and name, one of "
                         f"{sorted(diagnostics)}")
    caption, rows = diagnostics[query["name"]]()
    records[query["id"]] = rows
    head = list(dict.fromkeys(k for r in rows for k in r))
    lines = [f"**{caption}** (diagnostic `{query['name']}`)", "",
             "| " + " | ".join(["", *head[1:]]) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in head) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def value(records: list[dict[str, Any]], method: str, column: str, where: str) -> str:
    """One cell of a report's records, formatted as the markdown tables print it."""
    metric, _, rnd = column.rpartition(" round ")
    if metric and rnd.isdigit():
        rows = [r for r in records if r.get("metric") == metric and r["method"] == method]
        column = f"round {rnd}"
    else:
        rows = [r for r in records if "metric" not in r and r["method"] == method]
    if len(rows) != 1 or column not in rows[0]:
        raise RaydgError(f"{where}: {len(rows)} rows of method {method!r}"
                         + (f" and none has column {column!r}" if rows else ""))
    found = rows[0][column]
    if isinstance(found, str):
        return found
    if found is None:  # a cell without a run
        return EMPTY_CELL
    return f"{found:.4g}" if metric and rnd.isdigit() else f"{found:.2f}"
