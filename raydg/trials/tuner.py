"""Every federation of an experiment as a Tune trial, and their results."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
from ray import tune

from raydg.datasets import MultiDomainDataset
from raydg.engine import parking
from raydg.errors import RaydgError
from raydg.plan import Federation, Plan
from raydg.results import FederationResult
from raydg.tracking.tracker import Tracker
from raydg.trials import logs
from raydg.trials.callbacks import ACTIVE, Collector, StopOnError
from raydg.trials.resources import fit_actors, trial_resources
from raydg.trials.trial import FEDERATION, federation


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the experiment; ``raydg resume EXPERIMENT_DIR`` continues."""

    def __init__(self, message: str, experiment_dir: str) -> None:
        super().__init__(message)
        self.experiment_dir = experiment_dir


def run_federations(plan: Plan, data: MultiDomainDataset,
                    weights: dict[str, dict[str, np.ndarray]], tracker: Tracker,
                    out: Callable[[str], None], say: Callable[[str], None], directory: str,
                    started_here: bool, resume: bool = False, progress: str = "lines"
                    ) -> list[FederationResult]:
    """Run every federation of ``plan`` as a Tune trial in the experiment folder ``directory``
    (as many at once as the cluster holds, at most ``max_concurrent``; each with the client
    actors that :func:`~raydg.trials.resources.fit_actors` gives it on a Ray that raydg
    ``started_here`` or on a cluster; ``say`` takes the progress lines that ``out`` prints
    unless ``progress`` is ``none``), or, with ``resume``, continue an interrupted
    experiment there: finished federations are not run again, unfinished ones continue from
    their checkpoints. Their results, in the plan's order.

    A lost actor or node restarts a federation from its last checkpoint, up to
    ``max_failures`` times. A failure that outlasts them stops the experiment: a user error
    (:class:`RaydgError`) is raised as such, anything else as a ``RuntimeError`` carrying the
    trial's error. Ctrl-C stops every trial (Tune's handler) and is raised as
    :class:`Interrupted`."""
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's old console path is silent at verbose=0
    # a trial's failure is raydg's one line (Collector.on_trial_recover), or the error raised
    # once its restarts are spent, not Tune's traceback of each attempt (its error file keeps it)
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    # MLflow is the one record: no CSV, JSON or TensorBoard copy per trial (tensorboardX, which
    # ray[tune] installs, would also import torch into the experiment's process)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    parking.release_free()  # the trials reserve what simulations before them kept warm
    feds = fit_actors(plan, len(data.domains) - 1, started_here, say)
    say(plan.headline(tracker.run_id))
    collector = Collector(feds, tracker, out, progress)
    ACTIVE.update(collector=collector, stopper=StopOnError(collector))
    trainable = tune.with_resources(tune.with_parameters(federation, data=data,
                                                         weights=weights), trial_resources)
    if resume:
        left = [f.key for f in feds if not tracker.finished(f.key)]
        collector.progress.say(
            f"raydg: resuming the experiment in {directory}: {len(left)} of {len(feds)} "
            "federations to finish" if left else f"raydg: nothing to resume in {directory}: "
            f"every federation finished ({len(feds)} of {len(feds)}); their results")
        tuner = tune.Tuner.restore(directory, trainable, resume_unfinished=True,
                                   resume_errored=True)
    else:
        tuner = _tuner(plan, feds, trainable, directory, collector)
        n = len(feds)
        collector.progress.say(f"raydg: {n} federation{'s' * (n != 1)} as Tune trials, results "
                               f"in {directory}")
    with logs.without("ray.tune.tune", "Trials did not complete"):  # raydg says which, why
        grid = tuner.fit()
    return _results(grid, collector, feds, directory)


def _tuner(plan: Plan, feds: list[Federation], trainable: Any, directory: str,
           collector: Collector) -> tune.Tuner:
    """A new experiment's tuner: one trial per federation, named by its key."""
    cfg = plan.config
    storage, _, name = directory.rpartition("/")
    return tune.Tuner(
        trainable, param_space={FEDERATION: tune.grid_search([f.to_trial() for f in feds])},
        tune_config=tune.TuneConfig(
            max_concurrent_trials=cfg.max_concurrent, reuse_actors=cfg.reuse_actors,
            trial_name_creator=lambda t: t.config[FEDERATION]["key"],
            trial_dirname_creator=lambda t: f"{t.config[FEDERATION]['key']}-{t.trial_id}"),
        run_config=tune.RunConfig(
            name=name, storage_path=storage, verbose=0, callbacks=[collector],
            stop=ACTIVE["stopper"],
            failure_config=tune.FailureConfig(max_failures=cfg.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2)))


def _results(grid: tune.ResultGrid, collector: Collector, feds: list[Federation],
             directory: str) -> list[FederationResult]:
    """The federations' results, in the order of ``feds``; a failed trial's error raised."""
    for result in grid:
        if isinstance(result.error, str):  # Tune's text of an error it could not unpickle
            raise RuntimeError(f"a federation failed: {result.error}")
        if result.error is not None:
            cause = _root_cause(result.error)
            if isinstance(cause, RaydgError):
                raise RaydgError(str(cause))
            # the traceback (Ray's text of the trial's, and a client actor's) once, as the cause;
            # the progress line "[target seed=s] failed (...)" named the federation
            raise RuntimeError(f"a federation failed: {type(cause).__name__}: {cause}"
                               ) from result.error
        if result.checkpoint is not None:  # a trial stopped before it reported has no config
            collector.collect(result.config[FEDERATION]["key"], result.checkpoint)
    missing = [f.key for f in feds if f.key not in collector.results]
    if missing:  # no error, yet unfinished: Tune's SIGINT handler stopped the trials
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        raise Interrupted(f"stopped with {len(missing)} of {len(feds)} federations unfinished "
                          f"({shown})", directory)
    return [collector.results[f.key] for f in feds]


def _root_cause(err: BaseException) -> BaseException:
    """The exception a trial's function raised, out of Tune's and Ray's wrappers."""
    seen = set()
    while id(err) not in seen:
        seen.add(id(err))
        inner = getattr(err, "cause", None) or err.__cause__
        if not isinstance(inner, BaseException):
            break
        err = inner
    return err
