"""What ran a page's rows: per row and machine, its federations and wall time; and
federations run again on another machine beside their rows, which measures what a change of
machine alone does to one federation (a design's pair may span two machines). Reads rows
only, as :mod:`raydg.reporting.reproduction`, which shows these sections.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raydg.reporting.reproduction_rows import federation
from raydg.results import t_interval


def machines_section(rows: list[dict[str, Any]]) -> list[str]:
    """Per row of the rows file (method, variant) and machine: its federations and their mean
    wall seconds (rows exported before these were recorded: unrecorded)."""
    lines = ["## Machines and wall time", "",
             "What ran each row's federations (the driver's CPU model and count, its GPU) and "
             "their mean wall seconds, from the rows file's `machine` and `wall_s` columns "
             "(from a federation's start to its end: it also depends on what ran beside it, "
             "and holds any pause between a stop and its resume).", "",
             "| row | machine | federations | wall s per federation |", "|---|---|---|---|"]
    for key in sorted({(r["method"], r["variant"], r.get("machine") or "") for r in rows}):
        mine = [r for r in rows if (r["method"], r["variant"], r.get("machine") or "") == key]
        walls = [float(r["wall_s"]) for r in mine if r.get("wall_s") not in ("", None)]
        lines.append(f"| {_label(key[0], key[1])} | {key[2] or 'unrecorded'} | {len(mine)} | "
                     + (f"{np.mean(walls):.0f}" if walls else "—") + " |")
    return [*lines, ""]


def repeats_section(rows: list[dict[str, Any]], repeats: list[dict[str, Any]], source: str
                    ) -> list[str]:
    """Each federation of ``repeats`` (from ``source``) beside its row: both machines' selected
    and oracle accuracies and their differences; then the mean difference with its 95 %
    t-interval and the mean absolute difference."""
    first = {federation(r): r for r in rows}
    pairs = [(first[federation(r)], r) for r in repeats if federation(r) in first]
    if not pairs:
        return []
    names = {m: chr(ord("A") + i)
             for i, m in enumerate(sorted({r["machine"] for p in pairs for r in p}))}
    legend = [f"{k} = {m or 'unrecorded (a row exported before the machine column)'}"
              for m, k in names.items()]
    lines = ["## The same federations on a second machine", "",
             f"Federations of the rows file run again on another machine with the same seed "
             f"and images (`{source}`): what a change of machine alone (its arithmetic, its "
             "torch build) does to one federation. A design's pair whose two rows ran on "
             "different machines carries this difference too.", "",
             "Machines: " + "; ".join(legend) + ".", "",
             "| row | target | seed | machine | selected | oracle | again on | selected | "
             "oracle | difference, selected | difference, oracle |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a, b in pairs:
        lines.append(f"| {_label(a['method'], a['variant'])} | {a['target']} | {a['seed']} | "
                     f"{names[a['machine']]} | {a['selected']:.1f} | {a['oracle']:.1f} | "
                     f"{names[b['machine']]} | {b['selected']:.1f} | {b['oracle']:.1f} | "
                     f"{b['selected'] - a['selected']:+.1f} | {b['oracle'] - a['oracle']:+.1f} |")
    lines.append("")
    for selection in ("selected", "oracle"):
        d = np.array([b[selection] - a[selection] for a, b in pairs])
        mean, half = t_interval(d)
        interval = f" [{mean - half:+.2f}, {mean + half:+.2f}]" if len(d) > 1 else ""
        lines.append(f"- {selection.capitalize()} round, second machine minus first over "
                     f"{len(d)} federations: mean {mean:+.2f}{interval} (95 % t-interval), "
                     f"mean absolute difference {np.abs(d).mean():.2f}.")
    return [*lines, ""]


def _label(method: str, variant: str) -> str:
    return method + (f" [{variant}]" if variant else "")
