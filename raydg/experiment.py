"""A whole experiment: every held-out target x every seed (x every searched setting), run as
concurrent Ray Tune trials (:mod:`raydg.trials`), tracked and summarised."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydg import plugins
from raydg.cluster import check_cluster, cluster_address, ray_session
from raydg.config import RunConfig, Search, setting_label, to_dict
from raydg.datasets import DATASETS, MultiDomainDataset, load_dataset, resolve_root
from raydg.datasets.cache import cache_root
from raydg.errors import RaydgError
from raydg.forked import apart
from raydg.plan import Plan, check_federations, init_weights
from raydg.results import (
    FederationResult,
    duration,
    format_selection,
    format_summary,
    in_percent,
    long_rows,
    select_settings,
    summary_rows,
)
from raydg.signals import command, say_stopped, tell_parent
from raydg.tracking.store import check_store, tracking_uri
from raydg.tracking.tracker import Tracker
from raydg.trials.resources import fit_actors
from raydg.trials.storage import (
    check_storage,
    experiment_dir,
    read_manifest,
    verify_checkpoints,
    write_manifest,
)
from raydg.trials.tuner import run_federations

PROGRESS = ("lines", "live", "none")  # what run_experiment prints as it goes


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


@contextlib.contextmanager
def session(cfg: RunConfig, plan: Plan, run_id: str | None, say: Callable[[str], None]
            ) -> Iterator[tuple[bool, Tracker, list[Callable[[], None]]]]:
    """Ray (:func:`ray_session`) and the experiment's MLflow parent run, which a SIGTERM
    ends ``KILLED`` as it arrives. A tracking server that does not answer is refused
    before Ray starts; a new SQLite store's schema, which takes seconds to create, is made
    while Ray starts."""
    sqlite = cfg.tracking_uri.startswith("sqlite:///")
    if not sqlite:
        check_store(cfg.tracking_uri)
    with ThreadPoolExecutor(1) as pool:
        store = pool.submit(check_store, cfg.tracking_uri) if sqlite else None
        with ray_session(cfg, plan.plugins, say) as (local, on_stop):
            if store is not None:
                store.result()
            with Tracker(cfg, plan.label, plan.search, run_id, plan.name) as tracker:
                on_stop.append(lambda: tracker.end("KILLED"))
                yield local, tracker, on_stop


def _final_metrics(plan: Plan, summary: list[dict[str, Any]],
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


def resume_target(target: str, tracking: str | None = None) -> str:
    """The experiment folder that ``raydg resume TARGET`` continues: TARGET itself (a URI, or a
    local path in any form: relative, ``~``, absolute), or the folder recorded on the MLflow
    parent run whose id TARGET is."""
    if "://" in target:
        return target
    folder = Path(target).expanduser()
    if folder.exists() or not re.fullmatch(r"[0-9a-f]{32}", target):
        if not folder.is_dir():
            raise RaydgError(f"no experiment folder {target} (nor an MLflow run id): name the "
                             "folder raydg printed when the experiment started or stopped")
        return str(folder.resolve())
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = tracking_uri(RunConfig(tracking_uri=tracking))
    try:
        tags = MlflowClient(uri).get_run(target).data.tags
    except MlflowException as err:
        raise RaydgError(f"no MLflow run {target} in {uri}: {err.message}") from None
    if "raydg.experiment_dir" not in tags:
        raise RaydgError(f"MLflow run {target} is not the parent run of a raydg experiment")
    return tags["raydg.experiment_dir"]


def run_experiment(cfg: RunConfig, search: Search | None = None,
                   out: Callable[[str], None] = print, resume: str | None = None,
                   progress: str = "lines") -> ExperimentResult:
    """Plan ``cfg`` (x ``search``), check everything that can be checked before Ray starts,
    run every federation as a Tune trial, log everything to MLflow, print the tables.

    ``resume``: an experiment folder; its manifest gives the config and search (``cfg`` and
    ``search`` are ignored, but for ``cfg.tracking_uri`` when set: the store moved), finished
    federations are kept, unfinished ones continue from their checkpoints, into the same
    MLflow parent run. ``progress``: ``lines`` (one per
    finished round), ``live`` (a board of the running federations, for a terminal) or
    ``none`` (tables and warnings only)."""
    if progress not in PROGRESS:
        raise RaydgError(f"progress must be one of {', '.join(PROGRESS)}, not {progress!r}")
    start = time.perf_counter()
    say = out if progress != "none" else (lambda _: None)
    manifest = read_manifest(resume) if resume else None
    if manifest is not None:
        moved = cfg.tracking_uri
        cfg, search = RunConfig(**manifest["config"]), Search(**manifest["search"])
        cfg = dataclasses.replace(cfg, tracking_uri=moved or cfg.tracking_uri)
    cfg = dataclasses.replace(cfg, tracking_uri=tracking_uri(cfg))
    check_cluster(cluster_address(cfg))  # before any work (ray_session checks it again)
    if manifest is not None:
        plugins.check_unchanged(cfg.plugins, manifest["plugins"])
    plan, data, weights = _prepare(cfg, search, resume, say, out)
    base = plan.config
    sources = len(data.domains) - 1
    run_id = manifest["run_id"] if manifest else None
    address = cluster_address(base)
    say(f"raydg: {'joining the Ray cluster at ' + address if address else 'starting Ray'}")
    with session(base, plan, run_id, say) as (local, tracker, on_stop):
        directory = resume or experiment_dir(plan, tracker.run_id)
        on_stop.append(lambda: say_stopped(directory))
        tell_parent("running", {"tracking_uri": base.tracking_uri, "run_id": tracker.run_id,
                                "experiment_dir": directory})
        if manifest is None:
            write_manifest(directory, {"run_id": tracker.run_id, "config": to_dict(cfg),
                                       "search": dataclasses.asdict(plan.search),
                                       "plugins": [p.origin for p in plan.plugins]})
            tracker.set_tag("raydg.experiment_dir", directory)
            for key, value in data.provenance.items():
                tracker.set_tag(f"raydg.data.{key}", value)
        for key, value in plugins.tags(plan.plugins).items():
            tracker.set_tag(key, value)
        feds = fit_actors(plan, lambda c: c.clients or sources, local, say)
        say(_headline(plan, tracker.run_id))
        runs = run_federations(plan, feds, data, weights, tracker, out, directory,
                               resume=manifest is not None, progress=progress)
        summary, selection, printed = _tables(plan, runs, tracker)
        out(printed)
        out(f"\nraydg: done in {duration(time.perf_counter() - start)}. MLflow run "
            f"{tracker.run_id} in {base.tracking_uri} (browse: {command('mlflow')} ui "
            f"--backend-store-uri {base.tracking_uri}, then {ui_link(tracker.experiment_id)}); "
            f"trial files in {directory}")
        return ExperimentResult(plan, runs, summary, selection, printed, tracker.run_id)


def _prepare(cfg: RunConfig, search: Search | None, resume: str | None,
             say: Callable[[str], None], out: Callable[[str], None]
             ) -> tuple[Plan, MultiDomainDataset, dict[str, dict[str, np.ndarray]]]:
    """Everything checked before Ray starts: the plan (planned apart, :mod:`raydg.forked`),
    the data and its partitions, the initial weights, the storage and, for ``resume``, the
    checkpoints to continue from."""
    plugins.load(cfg.plugins)  # here too: a plugin's dataset is loaded here
    plan, data = apart(lambda log: _plan(cfg, search, log), say)
    base = plan.config
    if data is None:
        data = _load(base, say)
    for warning in check_federations(plan, data):
        out(f"raydg: warning: {warning}")
    weights = _starting_weights(plan, data, cache_root(base.cache_dir), say)
    check_storage(base.storage)
    if resume:
        verify_checkpoints(resume, plan.federations)
    return plan, data, weights


def _headline(plan: Plan, run_id: str) -> str:
    """The line that says what the experiment runs."""
    base = plan.config
    settings = f", {len(plan.settings)} settings" if len(plan.settings) > 1 else ""
    changed = f" ({plan.changed})" if plan.changed else ""
    return (f"raydg: {plan.rows} on {base.dataset}{changed}, targets {plan.targets}, seeds "
            f"{base.seeds}{settings}, {base.rounds} rounds x {base.local_steps} local steps; "
            f"MLflow run {run_id}")


def _tables(plan: Plan, runs: list[FederationResult], tracker: Tracker
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
    tracker.log_summary(_final_metrics(plan, summary, selection), tables, printed,
                        curves=curve_points(runs))
    return summary, selection, printed


def _plan(cfg: RunConfig, search: Search | None, say: Callable[[str], None]
          ) -> tuple[Plan, MultiDomainDataset | None]:
    """In :func:`~raydg.forked.apart`'s child, the planning step (its registries import torch)
    and, for a dataset that ships with raydg (small, resized with torch), its data; the data
    of a data root is loaded in the experiment's process (large, memory-mapped from its
    cache)."""
    from raydg.resolve import plan_experiment

    plan = plan_experiment(cfg, search)
    for plugin in plan.plugins:
        say(f"raydg: {plugin.origin}")
    ships = resolve_root(DATASETS.get(plan.config.dataset), plan.config.data_root) is None
    return plan, _load(plan.config, say) if ships else None


def _load(base: RunConfig, say: Callable[[str], None]) -> MultiDomainDataset:
    say(f"raydg: loading {base.dataset}")
    cache = cache_root(base.cache_dir) if base.cache else None
    data = load_dataset(base.dataset, base.data_root, base.image_size, base.skip_bad_images, say,
                        cache)
    for key, value in data.provenance.items():
        say(f"raydg: {data.name} {key}: {value}")
    return data


def _starting_weights(plan: Plan, data: MultiDomainDataset, cache: Path,
                      say: Callable[[str], None]) -> dict[str, dict[str, np.ndarray]]:
    """Every federation's initial backbone by :func:`~raydg.plan.weights_key`, loaded (or
    pretrained) in :func:`~raydg.forked.apart`'s child; none for random initialisations."""
    if all(init_weights(f.config) is None for f in plan.federations):
        return {}

    def work(log: Callable[[str], None]) -> dict[str, dict[str, np.ndarray]]:
        from raydg.pretrain import starting_weights

        return starting_weights(plan, data, cache, log)

    return apart(work, say)


def ui_link(experiment_id: str, ui: str = "http://127.0.0.1:5000") -> str:
    """The experiment's runs in the MLflow UI. MLflow 3.x opens an experiment in the view of
    its sidebar's workflow switch, kept in the browser (GenAI in a fresh one: an empty
    traces overview) unless the URL names the workflow."""
    return f"{ui}/#/experiments/{experiment_id}?workflowType=machine_learning"


def curve_points(runs: list[FederationResult]) -> list[dict[str, Any]]:
    """Every round's target and source-validation accuracy of every federation, for
    :func:`raydg.plots.plot_curves`."""
    return [{"method": " ".join([r.method, *([setting_label(r.setting)] if r.setting else [])]),
             "target": r.target, "seed": r.seed, "round": int(h["round"]),
             **in_percent({"target_acc": h["target_acc"],
                           "val_acc": h.get("val_acc", float("nan"))})}
            for r in runs for h in r.history]
