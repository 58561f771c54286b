"""A config's ``paper`` section: the published table that a reproduction page sets beside
raydg's rows (:mod:`raydg.reporting.reproduction`), checked when the config is read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raydg.errors import RaydgError


def paper_numbers(values: dict[str, Any], where: str,
                  domains: Sequence[str] | None = None) -> dict[str, Any]:
    """A config file's ``paper`` section, checked: ``source``, ``selection`` (selected, last
    or oracle: how the paper picked the model it reports), ``accuracy`` (``{method label:
    {domain or Avg: percent}}``, at least one row and one number) and, optionally, ``errors``
    (the ± the paper prints beside ``accuracy``, in the same form, with ``error``: what they
    are, e.g. "standard error"), ``cited`` (the table's rows that the paper cites from other
    publications, in the same form; raydg runs none of them), ``selection_note`` (where the
    selection comes from, when the paper does not state it) and ``deviations`` (how the
    protocol departs from the paper's, one line each). With the dataset's ``domains``, a
    column that is none of them (nor ``Avg``) is refused."""
    paper = values.get("paper")
    ok = (isinstance(paper, dict) and isinstance(paper.get("source"), str)
          and paper.get("selection") in ("selected", "last", "oracle")
          and _is_table(paper.get("accuracy")) and _is_table(paper.get("cited", {}))
          and _is_table(paper.get("errors", {})) and isinstance(paper.get("error", ""), str)
          and isinstance(paper.get("selection_note", ""), str)
          and isinstance(paper.get("deviations", []), list)
          and all(isinstance(d, str) for d in paper.get("deviations", []))
          and any(paper["accuracy"].values()))
    if not ok:
        raise RaydgError(f"{where} has no valid 'paper' section (source, selection: "
                         "selected|last|oracle, accuracy: {method: {domain: percent}} with at "
                         "least one number, optionally errors: {method: {domain: points}} "
                         "and error: TEXT, cited: {row: {domain: percent}}, selection_note: "
                         "TEXT, deviations: [TEXT, ...])")
    unknown = sorted({c for row in paper["accuracy"].values() for c in row} - {"Avg"}
                     - set(domains if domains is not None else paper_targets(paper)))
    if unknown:
        raise RaydgError(f"{where}: the paper's columns {unknown} are not domains of "
                         f"{values.get('dataset')} ({', '.join(domains or [])})")
    return paper


def paper_targets(paper: dict[str, Any]) -> list[str]:
    """The paper table's target columns (its rows' columns but ``Avg``), in order."""
    return [c for c in dict.fromkeys(c for row in paper["accuracy"].values() for c in row)
            if c != "Avg"]


def _is_table(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(row, dict) and all(isinstance(v, int | float) for v in row.values())
        for row in value.values())
