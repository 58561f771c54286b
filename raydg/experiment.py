"""A whole experiment: every held-out target x every seed (x every searched setting), run as
concurrent Ray Tune trials (:mod:`raydg.runner`), tracked and summarised."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ray

from raydg.config import RunConfig, Search
from raydg.datasets import load_dataset
from raydg.datasets.cache import cache_root
from raydg.errors import RaydgError
from raydg.plan import Plan, check_federations, plan_experiment
from raydg.pretrain import starting_weights
from raydg.results import (
    FederationResult,
    format_selection,
    format_summary,
    long_rows,
    select_settings,
    summary_rows,
)
from raydg.runner import check_storage, fit_actors, run_federations
from raydg.tracking import Tracker

CONNECT_TIMEOUT = 5.0  # seconds to reach a named Ray cluster before giving up


@dataclass
class ExperimentResult:
    plan: Plan
    runs: list[FederationResult]  # in the plan's order of federations
    summary: list[dict[str, Any]]
    selection: list[dict[str, Any]]  # hyper-parameter selection of a search (else empty)
    printed: str
    run_id: str

    @property
    def config(self) -> RunConfig:
        return self.plan.config


def check_reachable(address: str) -> None:
    """Refuse a ``host:port`` cluster address that does not answer (``ray.init`` would retry
    for minutes)."""
    host, _, port = address.split("://")[-1].rpartition(":")
    if not host or not port.isdigit():
        raise RaydgError(f"--address {address!r} is not 'auto' or HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as err:
        raise RaydgError(f"cannot reach the Ray cluster at {address}: {err}") from None


@contextlib.contextmanager
def ray_session(cfg: RunConfig) -> Iterator[bool]:
    """Use the running Ray session, join ``cfg.address`` (or ``RAY_ADDRESS``; ``auto``: the
    cluster that ``ray start`` started last on this machine), or start a local Ray (and finally
    stop what was started or joined). Yields whether no cluster was named, i.e. whether the Ray
    in use is this machine's own."""
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address and address != "auto":
        check_reachable(address)
    if ray.is_initialized():
        yield address is None
        return
    try:  # "local": a fresh Ray, never a stale one that `ray start` left in /tmp/ray
        ray.init(address=address or "local", include_dashboard=False, logging_level="ERROR",
                 log_to_driver=True)
    except ConnectionError as err:
        raise RaydgError(f"cannot join a Ray cluster at {address}: {err}") from None
    try:
        yield address is None
    finally:
        ray.shutdown()


def _final_metrics(plan: Plan, summary: list[dict[str, Any]],
                   selection: list[dict[str, Any]]) -> dict[str, float]:
    """The parent run's headline metrics: ``avg/<selection>/<mode>``; for a search, the Avg of
    the hyper-parameters selected by training-domain validation,
    ``avg/selected_hparams/<method>/<mode>``."""
    if len(plan.settings) == 1:
        return {f"avg/{r['selection']}/{r['mode']}": r["Avg"] for r in summary}
    return {f"avg/selected_hparams/{r['method']}/{r['mode']}": r["accuracy"]
            for r in selection if r["target"] == "Avg"}


def run_experiment(cfg: RunConfig, search: Search | None = None,
                   out: Callable[[str], None] = print) -> ExperimentResult:
    """Plan ``cfg`` (x ``search``), check everything that can be checked before Ray starts,
    run every federation as a Tune trial, log everything to MLflow, print the tables."""
    plan = plan_experiment(cfg, search)
    base = plan.config
    cache = cache_root(base.cache_dir) if base.cache else None
    data = load_dataset(base.dataset, base.data_root, base.image_size, base.skip_bad_images, out,
                        cache)
    check_federations(plan, data)
    weights = starting_weights(plan, data, cache_root(base.cache_dir), out)
    check_storage(base.storage)
    sources = len(data.domains) - 1
    with ray_session(base) as local, Tracker(base, plan.label, plan.search) as tracker:
        feds = fit_actors(plan, lambda c: c.clients or sources, local, out)
        search = f", {len(plan.settings)} settings" if len(plan.settings) > 1 else ""
        out(f"raydg: {plan.label} on {base.dataset}, targets {plan.targets}, seeds "
            f"{base.seeds}{search}, {base.rounds} rounds x {base.local_steps} local steps; "
            f"MLflow run {tracker.run_id}")
        runs = run_federations(plan, feds, data, weights, tracker, out)
        rows = long_rows(runs)
        summary = summary_rows(rows, plan.targets)
        printed = format_summary(summary, plan.targets, len(base.seeds))
        selection = select_settings(rows, plan.targets) if len(plan.settings) > 1 else []
        tables = {"results": rows, "summary": summary}
        if selection:
            printed += "\n\n" + format_selection(selection, len(base.seeds))
            tables["selection"] = selection
        tracker.log_summary(_final_metrics(plan, summary, selection), tables, printed)
        out(printed)
        return ExperimentResult(plan, runs, summary, selection, printed, tracker.run_id)
