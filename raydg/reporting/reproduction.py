"""A published table beside raydg's, from per-run rows kept in the repository.

The rows (:mod:`raydg.reporting.reproduction_rows`: one per federation, committed as CSV under
``docs/reproduction-rows/``) and the config's ``paper`` section become a Markdown page
(``page``). The page is a pure function of the rows and the config, so the committed page
can be checked against the committed rows. Like :mod:`raydg.reporting.report`, this module reads
stored results only and imports no engine module.

Statistics: per (method, target), the mean over seeds and its standard error (as the paper
reports its own rows); ``Avg`` averages the six targets within each seed that has all of them,
then over those seeds. A goal is judged only on the paper's full design (every target with each
of the config's seeds; a row of another seed is shown in no judged cell); before that a row
says how many federations it still lacks. A design fixed before its runs
(:mod:`raydg.reporting.design`) is shown as its paired comparisons.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydg.reporting.design import Design, design_section
from raydg.reporting.machines import machines_section, repeats_section
from raydg.reporting.paper import paper_targets
from raydg.reporting.reproduction_rows import SELECTIONS
from raydg.results import mean_std, whole_seeds

SELECTION_TEXT = {
    "oracle": "the round with the best target accuracy: an upper bound, not a result",
    "selected": "the round with the best mean source-validation accuracy (training-domain "
                "validation: nothing is chosen on the target)",
    "last": "the last round",
}


@dataclass(frozen=True)
class Goal:
    """Tolerances in accuracy points: the row's Avg, and every cell."""

    avg: float
    cell: float


def cells(rows: list[dict[str, Any]], method: str, targets: Sequence[str], selection: str,
          variant: str = "") -> dict[str, tuple[float, float, int]]:
    """(mean, std, seeds) per target and ``Avg`` (over the seeds that have every target)."""
    mine = [r for r in rows if r["method"] == method and r["variant"] == variant]
    out = {}
    for t in targets:
        acc = [r[selection] for r in mine if r["target"] == t]
        if acc:
            out[t] = _mean_std(acc)
    avg = [np.mean([s[t] for t in targets])
           for s in whole_seeds(mine, selection, targets).values()]
    if avg:
        out["Avg"] = _mean_std(avg)
    return out


def _cell(value: tuple[float, float, int] | None) -> str:
    """mean ± standard error (seeds), as the paper reports its own rows."""
    if value is None:
        return "—"
    mean, std, n = value
    return f"{mean:.2f} ({n})" if n == 1 else f"{mean:.2f} ± {std / np.sqrt(n):.2f} ({n})"


def _diff(value: tuple[float, float, int] | None, reference: float | None) -> str:
    return "—" if value is None or reference is None else f"{value[0] - reference:+.2f}"


def _mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    return (*mean_std(list(values)), len(values))


def verdict(measured: dict[str, tuple[float, float, int]], paper: dict[str, float],
            targets: Sequence[str], seeds: int, goal: Goal) -> str:
    """Whether the row meets ``goal`` on the paper's full design, or what it still lacks."""
    missing = _missing(measured, targets, seeds)
    if missing:
        return f"not judged: {missing} of {seeds * len(targets)} federations still to run"
    gaps = {c: measured[c][0] - paper[c] for c in (*targets, "Avg")}
    worst = max(targets, key=lambda t: abs(gaps[t]))
    beyond = _beyond(measured, paper, targets, goal)
    cells_beyond = len([c for c in beyond if c != "Avg"])
    return (f"{'missed' if beyond else 'met'}: Avg {gaps['Avg']:+.2f} "
            f"({'beyond' if 'Avg' in beyond else 'within'} ±{goal.avg:g}); {cells_beyond} of "
            f"{len(targets)} cells beyond ±{goal.cell:g}, the worst {worst} {gaps[worst]:+.2f}")


def _beyond(measured: dict[str, tuple[float, float, int]], paper: dict[str, float],
           targets: Sequence[str], goal: Goal) -> list[str]:
    """The columns (targets, then ``Avg``) whose mean is further from the paper's than
    ``goal`` allows."""
    return [c for c in (*targets, "Avg")
            if abs(measured[c][0] - paper[c]) > (goal.avg if c == "Avg" else goal.cell)]


def _missing(measured: dict[str, tuple[float, float, int]], targets: Sequence[str],
             seeds: int) -> int:
    """How many federations the paper's full design still lacks."""
    return sum(max(0, seeds - measured.get(t, (0, 0, 0))[2]) for t in targets)


def to_run(rows: list[dict[str, Any]], methods: Sequence[str], targets: Sequence[str],
           seeds: Sequence[int]) -> list[tuple[str, str, list[int]]]:
    """(method, target, seeds) of the paper's design (every method x target x seed, under
    the protocol: no variant) that the rows lack, in that order."""
    have = {(r["method"], r["target"], r["seed"]) for r in rows if not r["variant"]}
    lacking = [(m, t, [s for s in seeds if (m, t, s) not in have])
               for m in methods for t in targets]
    return [(m, t, s) for m, t, s in lacking if s]


def paired(rows: list[dict[str, Any]], method: str, variant: str, targets: Sequence[str],
           selection: str) -> tuple[dict[str, tuple[float, float, int]],
                                    dict[str, tuple[float, float, int]]]:
    """An ablation's cells and the protocol's cells of the same method on the targets and
    seeds that the ablation ran (a paired comparison: seed-to-seed spread stays out)."""
    ran = {(r["target"], r["seed"]) for r in rows
           if r["method"] == method and r["variant"] == variant}
    base = cells([r for r in rows if (r["target"], r["seed"]) in ran], method, targets, selection)
    return cells(rows, method, targets, selection, variant), base


def ablations_section(rows: list[dict[str, Any]], variants: list[tuple[str, str]],
                      targets: Sequence[str], names: dict[str, str]) -> list[str]:
    """Each (method, variant) beside the same method under the protocol on the same targets
    and seeds (a paired comparison: seed-to-seed spread stays out of the difference), per
    selection."""
    columns = [*targets, "Avg"]
    lines = ["## Ablations (settings that are not the paper's)", "",
             "Each row changes the protocol in the settings named in brackets; beside it, the "
             "same method under the protocol on the same targets and seeds. Cells: mean ± "
             "standard error over seeds (seeds).", ""]
    for selection in SELECTIONS[:2]:
        lines += [f"{selection.capitalize()} round:", "", *_header(columns)]
        for method, variant in variants:
            name = names.get(method, method)
            got, base = paired(rows, method, variant, targets, selection)
            lines.append(f"| {name} [{variant}] | " + " | ".join(
                _cell(got.get(c)) for c in columns) + " |")
            lines.append(f"| {name}, same seeds | " + " | ".join(
                _cell(base.get(c)) for c in columns) + " |")
            lines.append(f"| [{variant}] - protocol | " + " | ".join(
                _diff(got.get(c), base[c][0] if c in base else None) for c in columns) + " |")
        lines.append("")
    return lines


def misses_section(rows: list[dict[str, Any]],
                   measured: dict[str, dict[str, tuple[float, float, int]]],
                   paper: dict[str, Any], names: dict[str, str], goals: dict[str, Goal],
                   seeds: int, targets: Sequence[str]) -> list[str]:
    """Every cell (and Avg) of a judged row beyond its goal at the paper's selection
    (``measured``: each paper row's :func:`cells` there), beside what was measured about it:
    the paper's other rows that raydg ran on that column (their difference to the paper), the
    range of the paper's cited rows there, and each ablation run on that cell (its paired
    difference to the protocol, and its seeds): facts, no attribution."""
    selection = paper["selection"]
    variants = sorted({(r["method"], r["variant"]) for r in rows if r["variant"]})
    lines = []
    for method, published in paper["accuracy"].items():
        got = measured[method]
        if _missing(got, targets, seeds):
            continue
        for c in _beyond(got, published, targets, goals[method]):
            tried = [_effect(rows, m, v, c, targets, selection) for m, v in variants
                     if m == method]
            lines.append(f"| {names.get(method, method)} | {c} | {published[c]:.2f} | "
                         f"{_cell(got[c])} | {got[c][0] - published[c]:+.2f} | "
                         f"{_others(measured, paper, names, method, c)} | "
                         f"{_span(paper, c)} | {'; '.join(t for t in tried if t) or 'none yet'} |")
    if not lines:
        return []
    return [f"## Where the judged rows miss (at the {_selection_name(paper)})", "",
            "Each cell beyond its goal, beside what was measured about it: the paper's other "
            "rows on that column as raydg ran them, raydg - paper (seeds); the range of the "
            "rows the paper cites on that column (other implementations of the same "
            "benchmark); and each ablation run on that cell as its paired difference to the "
            "protocol (seeds).", "",
            "| row | cell | paper | raydg | raydg - paper | the other rows: raydg - paper | "
            "cited rows | ablations on this cell |", "|---|---|---|---|---|---|---|---|", *lines]


def _others(measured: dict[str, dict[str, tuple[float, float, int]]], paper: dict[str, Any],
            names: dict[str, str], method: str, column: str) -> str:
    """The paper's other rows on one column as raydg ran them (``measured``: each row's
    :func:`cells` at the paper's selection, any number of seeds): raydg - paper (seeds)."""
    found = []
    for other, published in paper["accuracy"].items():
        got = measured[other].get(column)
        if other != method and got is not None:
            found.append(f"{names.get(other, other)} {got[0] - published[column]:+.2f} "
                         f"({got[2]})")
    return "; ".join(found) or "—"


def _span(paper: dict[str, Any], column: str) -> str:
    """The range of the paper's cited rows on one column."""
    cited = [row[column] for row in paper.get("cited", {}).values()]
    return f"{min(cited):.2f} to {max(cited):.2f}" if cited else "—"


def _effect(rows: list[dict[str, Any]], method: str, variant: str, column: str,
            targets: Sequence[str], selection: str) -> str:
    """An ablation's paired difference to the protocol on one column, or "" if not run there."""
    ablated, base = paired(rows, method, variant, targets, selection)
    if column not in ablated or column not in base:
        return ""
    return f"[{variant}] {ablated[column][0] - base[column][0]:+.2f} ({ablated[column][2]})"


def cited_section(cited: dict[str, dict[str, float]], columns: Sequence[str]) -> list[str]:
    """The rows of the paper's table that it cites from other publications."""
    return ["## The paper's cited rows", "", "The rows of the same table that the paper cites "
            "from other publications (not run by raydg), for context.", "",
            *_header(columns), *(_published(name, row, columns) for name, row in cited.items())]


def _header(columns: Sequence[str]) -> list[str]:
    return ["| row | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]


def _published(label: str, row: dict[str, float], columns: Sequence[str],
               errors: dict[str, float] | None = None) -> str:
    """A row as the paper prints it: each cell with its ± where the paper gives one."""
    def cell(c: str) -> str:
        return f"{row[c]:.2f}" + (f" ± {errors[c]:.2f}" if errors and c in errors else "")

    return f"| {label} | " + " | ".join(cell(c) for c in columns) + " |"


def _selection_name(paper: dict[str, Any]) -> str:
    """The paper's selection as a heading names it: "oracle round, the selection of the
    authors' code; the paper states none"."""
    note = paper.get("selection_note")
    return f"{paper['selection']} round" + (f", {note}" if note else "")


def deviations_section(paper: dict[str, Any], protocol: str) -> list[str]:
    """How raydg's protocol departs from the paper's, from the config's ``deviations``."""
    if not paper.get("deviations"):
        return []
    return ["## Where raydg's protocol departs from the paper's", "",
            f"From `{protocol}` (its `paper.deviations`): every row on this page runs so.", "",
            *(f"- {d}" for d in paper["deviations"]), ""]


def _intro(rows: list[dict[str, Any]], paper: dict[str, Any], source: str, command: str,
           protocol: str) -> list[str]:
    """The page's title, what it is generated from, and the images' fingerprints."""
    n = len(rows)
    lines = [f"# Reproduction: {paper['source']}", "",
             f"Generated by `{command}` from `{source}` ({n} federation{'s' * (n != 1)}); do not "
             f"edit by hand. Protocol: `{protocol}`, which lists the paper's values and raydg's "
             "choices where the paper is silent.", ""]
    prints = _fingerprints(rows)
    return lines + ([f"Images: fingerprint {prints}.", ""] if prints else [])


def _fingerprints(rows: list[dict[str, Any]]) -> str:
    """Each fingerprint of the rows' images, with the data its rows ran on: the protocol's, or
    the ``dataset=`` of an ablation that changed the dataset."""
    protocol = "the protocol's"
    data: dict[str, set[str]] = {}
    for r in rows:
        if r["fingerprint"]:
            changed = [kv for kv in r["variant"].split() if kv.startswith("dataset=")]
            data.setdefault(r["fingerprint"], set()).update(changed or [protocol])
    return ", ".join(f"{fp} ({', '.join(sorted(d, key=lambda x: (x != protocol, x)))})"
                     for fp, d in sorted(data.items()))


def selection_section(selection: str, measured: dict[str, dict[str, Any]],
                      paper: dict[str, Any], names: dict[str, str], seeds: Sequence[int],
                      columns: list[str]) -> list[str]:
    """One selection's table: per method of the paper, its published row (with its errors),
    raydg's on ``seeds`` (``measured``) and their difference."""
    errors, what = paper.get("errors", {}), paper.get("error", "")
    note = paper.get("selection_note") or "the paper's selection"
    own = f" ({note})" if selection == paper["selection"] else ""
    lines = [f"## {selection.capitalize()} round{own}", "", f"Model selection: "
             f"{SELECTION_TEXT[selection]}. raydg's cells: mean ± standard error over "
             f"seeds (seeds), of seeds {', '.join(map(str, seeds))}"
             + (f"; the paper's ±: its {what}" if errors and what else "") + ".", "",
             *_header(columns)]
    for method, published in paper["accuracy"].items():
        got, name = measured[method], names.get(method, method)
        lines.append(_published(f"{name}, paper", published, columns, errors.get(method)))
        lines.append(f"| {name}, raydg | " + " | ".join(
            _cell(got.get(c)) for c in columns) + " |")
        lines.append("| raydg - paper | " + " | ".join(
            _diff(got.get(c), published[c]) for c in columns) + " |")
    return [*lines, ""]


def page(rows: list[dict[str, Any]], paper: dict[str, Any], names: dict[str, str],
         goals: dict[str, Goal], seeds: Sequence[int], source: str, command: str,
         protocol: str, designs: Sequence[Design] = (),
         repeats: tuple[list[dict[str, Any]], str] = ([], "")) -> str:
    """The Markdown page: how the protocol departs from the paper's; per selection, the
    paper's rows (with its errors) and raydg's on the config's ``seeds``; the goals and the
    cells that miss them; the rows the paper cites; where the methods the paper does not
    report are (docs/fidelity.md); each design fixed before its runs (``designs``); each
    ablation (a variant of the protocol) beside the row it changes; the federations run again
    on another machine (``repeats``: their rows and file); the machines and wall time of
    every row."""
    targets = paper_targets(paper)
    columns = [*targets, "Avg"]
    lines = _intro(rows, paper, source, command, protocol) + deviations_section(paper, protocol)
    judged = [r for r in rows if r["seed"] in seeds]  # a seed beyond the design's: not judged
    measured = {s: {m: cells(judged, m, targets, s) for m in paper["accuracy"]}
                for s in {*SELECTIONS[:2], paper["selection"]}}
    for selection in SELECTIONS[:2]:
        lines += selection_section(selection, measured[selection], paper, names, seeds,
                                   columns)
    lines += [f"## Goals (at the {_selection_name(paper)})", ""]
    at_paper = measured[paper["selection"]]
    for method, published in paper["accuracy"].items():
        lines.append(f"- {names.get(method, method)}: "
                     f"{verdict(at_paper[method], published, targets, len(seeds), goals[method])}")
    missed = misses_section(judged, at_paper, paper, names, goals, len(seeds), targets)
    if missed:
        lines += ["", *missed]
    if paper.get("cited"):
        lines += ["", *cited_section(paper["cited"], columns)]
    pairs = sorted({(r["method"], r["variant"]) for r in rows})
    others = sorted({m for m, _ in pairs if m not in paper["accuracy"]})
    if others:
        lines += ["", f"Other methods in the rows ({', '.join(others)}): "
                  "[fidelity.md](fidelity.md), its real-data regime, against FedAvg"
                  + (", and the designs below" if designs else "") + "."]
    for design in designs:
        lines += ["", *design_section(rows, design, SELECTION_TEXT)]
    variants = [(m, v) for m, v in pairs if v and m in paper["accuracy"]]
    if variants:
        lines += ["", *ablations_section(judged, variants, targets, names)]
    lines += ["", *repeats_section(rows, *repeats), *machines_section(rows)]
    return "\n".join(lines).rstrip("\n") + "\n"
