"""A design fixed before its runs: paired comparisons of rows (``method`` against a baseline
over the seeds both have, on the mean of the design's targets), each with its 95 %
t-interval and the verdict on the claim it tests. Reads rows only, as
:mod:`raydg.reporting.reproduction`, which shows designs on its page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raydg.reporting.reproduction_rows import row_label
from raydg.results import t_interval, whole_seeds


@dataclass(frozen=True)
class Comparison:
    """``method`` (the rows of ``variant`` that
    :func:`~raydg.reporting.reproduction_rows.row_label` so names) against ``baseline`` (those
    of ``baseline_variant``), paired over seeds on the mean of the design's targets;
    ``relation`` ``>=`` or ``=``: what ``source`` claims."""

    method: str
    variant: str
    baseline: str
    baseline_variant: str
    relation: str
    source: str


@dataclass(frozen=True)
class Design:
    """A design fixed before its runs: its comparisons on ``targets`` and ``seeds``, under a
    title and a text saying what it is."""

    title: str
    text: str
    targets: tuple[str, ...]
    seeds: tuple[int, ...]
    comparisons: tuple[Comparison, ...]


def _seed_means(rows: list[dict[str, Any]], method: str, variant: str,
                targets: Sequence[str], seeds: Sequence[int], selection: str
                ) -> dict[int, float]:
    """The mean over ``targets`` of each seed in ``seeds`` that has them all."""
    mine = [r for r in rows if row_label(r) == method and r["variant"] == variant
            and r["seed"] in seeds]
    return {s: float(np.mean([v[t] for t in targets]))
            for s, v in whole_seeds(mine, selection, targets).items()}


def compare(rows: list[dict[str, Any]], c: Comparison, targets: Sequence[str],
            seeds: Sequence[int], selection: str) -> dict[str, Any]:
    """``c``'s paired difference over the seeds both sides have: mean, 95 % t-interval half
    width, the two sides' means, the seeds, and a verdict once both sides have every one of
    ``seeds`` (a ``>=`` claim holds when the interval is above 0 and is reversed below it; an
    ``=`` claim is consistent when it holds 0). Before that the interval of the seeds so far
    is shown, not judged: two seeds whose differences happen to be equal give an interval of
    width 0 (FedGMA's first two on Rotated MNIST, both -3.80 at the oracle round)."""
    a = _seed_means(rows, c.method, c.variant, targets, seeds, selection)
    b = _seed_means(rows, c.baseline, c.baseline_variant, targets, seeds, selection)
    both = sorted(set(a) & set(b))
    out: dict[str, Any] = {"seeds": both, "method": np.mean([a[s] for s in both]) if both
                           else np.nan, "baseline": np.mean([b[s] for s in both]) if both
                           else np.nan}
    waits = f"waits ({len(a)} and {len(b)} of {len(seeds)} seeds)"
    if len(both) < 2:
        return {**out, "mean": np.nan, "half": np.nan, "verdict": waits}
    d = np.array([a[s] - b[s] for s in both])
    mean, half = t_interval(d)
    low, high = mean - half, mean + half
    if len(both) < len(seeds):  # an interim interval, shown but not judged
        verdict = waits
    elif c.relation == "=":
        verdict = "consistent" if low <= 0 <= high else "does not hold"
    else:
        verdict = "holds" if low > 0 else "reversed" if high < 0 else "not significant"
    return {**out, "mean": mean, "half": half, "verdict": verdict}


def machines_line(rows: list[dict[str, Any]], design: Design) -> list[str]:
    """How many of ``design``'s pairs (a row and its baseline on one whole seed) hold rows
    from two recorded machines, and how many a row whose machine is unrecorded; nothing where
    every pair ran on one machine."""
    def machines(method: str, variant: str, seed: int) -> set[str]:
        return {r["machine"] for r in rows if (row_label(r), r["variant"], r["seed"]) ==
                (method, variant, seed) and r["target"] in design.targets}

    def whole(method: str, variant: str) -> set[int]:
        return set(_seed_means(rows, method, variant, design.targets, design.seeds,
                               "selected"))

    pairs = []
    for c in design.comparisons:
        pairs += [machines(c.method, c.variant, s) | machines(c.baseline, c.baseline_variant, s)
                  for s in whole(c.method, c.variant) & whole(c.baseline, c.baseline_variant)]
    across = sum(len(m - {""}) > 1 for m in pairs)
    unknown = sum(len(m - {""}) <= 1 and "" in m for m in pairs)
    if not across and not unknown:
        return []
    return [f"Of its {len(pairs)} pairs (a row and its baseline on one seed), {across} "
            f"hold{'s' * (across == 1)} federations from two machines and {unknown} one whose "
            "machine is unrecorded (the rows file's `machine`; exported before that column): a "
            "pair across machines holds a change of machine in its difference too.", ""]


def design_section(rows: list[dict[str, Any]], design: Design, texts: dict[str, str]
                   ) -> list[str]:
    """``design``'s comparisons at the selected round (training-domain validation), then the
    oracle round (each said as ``texts`` has it): each a paired difference with its 95 %
    t-interval and the claim's verdict."""
    lines = [f"## {design.title}", "", design.text, ""]
    columns = "| row | vs | seeds | row's mean | its baseline's | paired difference [95 % CI] " \
              "| claim | verdict |"
    for selection in ("selected", "oracle"):
        lines += [f"{selection.capitalize()} round, {texts[selection]}; each seed's "
                  f"mean of {', '.join(design.targets)}:", "", columns,
                  "|---|---|---|---|---|---|---|---|"]
        for c in design.comparisons:
            got = compare(rows, c, design.targets, design.seeds, selection)
            diff = "—" if np.isnan(got["mean"]) else \
                f"{got['mean']:+.2f} [{got['mean'] - got['half']:+.2f}, " \
                f"{got['mean'] + got['half']:+.2f}]"
            means = [f"{got[k]:.2f}" if got["seeds"] else "—" for k in ("method", "baseline")]
            lines.append(f"| {_label(c.method, c.variant)} | "
                         f"{_label(c.baseline, c.baseline_variant)} | "
                         f"{', '.join(map(str, got['seeds'])) or '—'} | {means[0]} | "
                         f"{means[1]} | {diff} | {c.method} {c.relation} {c.baseline} "
                         f"({c.source}) | {got['verdict']} |")
        lines.append("")
    return lines + machines_line(rows, design)


def _label(method: str, variant: str) -> str:
    """``fedbn (model=mnist-cnn-bn)``: round brackets, which Markdown leaves alone."""
    return method + (f" ({variant})" if variant else "")
