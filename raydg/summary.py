"""An experiment's summary: its tables, printed and logged to the parent run with the headline
metrics that MLflow's runs table compares and every federation's curves."""

from __future__ import annotations

from typing import Any

from raydg.config import setting_label
from raydg.plan import Plan
from raydg.results import (
    FederationResult,
    format_selection,
    format_summary,
    in_percent,
    long_rows,
    select_settings,
    summary_rows,
)
from raydg.tracking.tracker import Tracker


def summarise(plan: Plan, runs: list[FederationResult], tracker: Tracker
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """The summary, the selected settings of a search and the printed tables of ``runs``,
    logged to the parent run."""
    seeds = len(plan.config.seeds)
    rows = long_rows(runs)
    summary = summary_rows(rows, plan.targets)
    printed = format_summary(summary, plan.targets, seeds)
    selection = select_settings(rows, plan.targets) if len(plan.settings) > 1 else []
    tables = {"results": rows, "summary": summary}
    if selection:
        printed += "\n\n" + format_selection(selection, seeds)
        tables["selection"] = selection
    tracker.log_summary(final_metrics(plan, summary, selection), tables, printed,
                        curves=curve_points(runs))
    return summary, selection, printed


def final_metrics(plan: Plan, summary: list[dict[str, Any]],
                  selection: list[dict[str, Any]]) -> dict[str, float]:
    """The parent run's headline metrics, the same names for every kind of run, so that MLflow's
    runs table compares them: ``avg/<selection>/<mode>``, the Avg over targets; for a search,
    ``avg/selected/<mode>`` is that of the hyper-parameters selected by training-domain
    validation (with one method; every method's as ``avg/selected_hparams/<method>/<mode>``)."""
    if len(plan.settings) == 1:
        return {f"avg/{r['selection']}/{r['mode']}": r["Avg"] for r in summary}
    chosen = [r for r in selection if r["target"] == "Avg"]
    out = {f"avg/selected_hparams/{r['method']}/{r['mode']}": r["accuracy"] for r in chosen}
    if len({r["method"] for r in chosen}) == 1:
        out.update({f"avg/selected/{r['mode']}": r["accuracy"] for r in chosen})
    return out


def curve_points(runs: list[FederationResult]) -> list[dict[str, Any]]:
    """Every round's target and source-validation accuracy of every federation, for
    :func:`raydg.plots.plot_curves`."""
    return [{"method": " ".join([r.method, *([setting_label(r.setting)] if r.setting else [])]),
             "target": r.target, "seed": r.seed, "round": int(h["round"]),
             **in_percent({"target_acc": h["target_acc"],
                           "val_acc": h.get("val_acc", float("nan"))})}
            for r in runs for h in r.history]


def ui_link(experiment_id: str, ui: str = "http://127.0.0.1:5000") -> str:
    """The experiment's runs in the MLflow UI. MLflow 3.x opens an experiment in the view of
    its sidebar's workflow switch, kept in the browser (GenAI in a fresh one: an empty
    traces overview) unless the URL names the workflow."""
    return f"{ui}/#/experiments/{experiment_id}?workflowType=machine_learning"
