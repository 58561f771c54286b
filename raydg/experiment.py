"""A whole experiment: every held-out target x every seed (x every searched setting), run as
concurrent Ray Tune trials (:mod:`raydg.trials`), tracked and summarised. It reads as its
phases: the input (or a resumed experiment's), everything before Ray (:mod:`raydg.prepare`),
Ray and MLflow (:mod:`raydg.session`), the trials, the summary."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raydg.config import RunConfig, Search, to_dict
from raydg.errors import RaydgError
from raydg.plan import Plan
from raydg.prepare import prepare
from raydg.results import FederationResult, duration
from raydg.session import session
from raydg.signals import command, say_stopped, tell_parent
from raydg.summary import summarise, ui_link
from raydg.trials.storage import experiment_dir, resumed, write_manifest
from raydg.trials.tuner import run_federations

if TYPE_CHECKING:
    from raydg.tracking.tracker import Tracker

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
    manifest = None
    if resume:
        cfg, search, manifest = resumed(resume, cfg.tracking_uri, cfg.address)
    plan, data, weights = prepare(cfg, search, manifest, resume, say, out)
    with session(plan, manifest["run_id"] if manifest else None, say) as (local, tracker,
                                                                          on_stop):
        directory = resume or experiment_dir(plan, tracker.run_id)
        on_stop.append(lambda: say_stopped(directory))
        _record(cfg, plan, data.provenance, tracker, directory, new=manifest is None)
        runs = run_federations(plan, data, weights, tracker, out, say, directory, local,
                               resume=manifest is not None, progress=progress)
        summary, selection, printed = summarise(plan, runs, tracker)
        out(printed)
        out(f"\nraydg: done in {duration(time.perf_counter() - start)}. MLflow run "
            f"{tracker.run_id} in {plan.runtime.tracking_uri} (browse: {command('mlflow')} ui "
            f"--backend-store-uri {plan.runtime.tracking_uri}, then "
            f"{ui_link(tracker.experiment_id)}); trial files in {directory}")
        return ExperimentResult(plan, runs, summary, selection, printed, tracker.run_id)


def _record(cfg: RunConfig, plan: Plan, provenance: dict[str, str], tracker: Tracker,
            directory: str, new: bool) -> None:
    """Tell a parent process (``raydg run``'s) where the experiment is recorded; for a ``new``
    one, write its manifest (the config as given, with its store) and its folder and the
    data's ``provenance`` as tags of the parent run."""
    uri = plan.runtime.tracking_uri
    tell_parent("running", {"tracking_uri": uri, "run_id": tracker.run_id,
                            "experiment_dir": directory})
    if not new:
        return
    write_manifest(directory, {"run_id": tracker.run_id,
                               "config": to_dict(dataclasses.replace(cfg, tracking_uri=uri)),
                               "search": dataclasses.asdict(plan.search),
                               "plugins": [p.origin for p in plan.plugins]})
    tracker.set_tag("raydg.experiment_dir", directory)
    for key, value in provenance.items():
        tracker.set_tag(f"raydg.data.{key}", value)
