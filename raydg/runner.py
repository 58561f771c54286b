"""Federations as Ray Tune trials: Tune gives concurrency, placement and storage.

Every federation (one target x one seed x one setting) is one trial, and the trial's function,
:func:`federation`, is the federation's *driver actor*: it builds the
:class:`~raydg.simulation.Simulation` and runs its rounds inside the trial's actor. The trial's
placement group (:func:`trial_resources`) has a head bundle for the driver, which also evaluates
the global model on the target domain (empty on CPUs: the driver reserves nothing and runs beside
its first client actor; a GPU share otherwise), then one bundle per client actor. So a trial starts
only when all of its resources are free, and its actors never starve another trial.

Each round is one ``tune.report``; the last report carries the federation's result as a
checkpoint. :class:`Collector`, a Tune callback, runs in the process that calls ``Tuner.fit``:
it is the one writer to MLflow, prints raydg's progress in place of Tune's tables, and loads each
finished federation's result from its checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import tune

from raydg import checkpoint
from raydg.config import RunConfig
from raydg.datasets import MultiDomainDataset
from raydg.errors import RaydgError
from raydg.plan import Federation, Plan, weights_key
from raydg.results import FederationResult
from raydg.tracking import Tracker

FEDERATION = "federation"  # the trainable's name and its key in each trial's config


class Cadence:
    """When a federation writes a checkpoint: every ``every`` rounds, or, by default, as soon
    as the time since the last one is ``1 / BUDGET`` times what the last one cost, so that
    checkpoints take at most ``BUDGET`` of the run (the first after round 1)."""

    BUDGET = 0.02

    def __init__(self, every: int | None) -> None:
        self.every, self.cost, self.last = every, 0.0, time.perf_counter()

    def due(self, rnd: int) -> bool:
        if self.every is not None:
            return rnd % self.every == 0
        return time.perf_counter() - self.last >= self.cost / self.BUDGET

    def done(self, seconds: float) -> None:
        self.cost, self.last = seconds, time.perf_counter()


def federation(config: dict[str, Any], data: MultiDomainDataset,
               weights: dict[str, dict[str, np.ndarray]]) -> None:
    """The Tune trainable: the driver of one federation, running in the trial's actor.

    Continues from the trial's last checkpoint when Tune restarts it (a lost actor or node, a
    resumed experiment), its first report then carrying the rounds before (``history``: those
    that MLflow missed are logged from it). Reports each progress message as it is logged
    (``messages``: a phase's start, e.g. CSAC's acquisition, is said as it begins) and each
    round's metrics (``row``); at the :class:`Cadence`'s rounds the report carries a
    checkpoint (:mod:`raydg.checkpoint`). The last report has no row: its checkpoint is the
    result, written by :meth:`FederationResult.save`. ``weights`` are the experiment's initial
    backbones (:func:`~raydg.pretrain.starting_weights`)."""
    from raydg.simulation import Simulation

    logging.getLogger("ray.train").setLevel(logging.WARNING)  # no line per checkpoint
    spec = config[FEDERATION]
    cfg = RunConfig(**spec["config"])
    missed: list[dict[str, float]] = []  # rounds sent with the next report

    def report(row: dict[str, float] | None = None, said: tuple[str, ...] = (),
               **extra: Any) -> None:
        payload = {"row": row, "messages": list(said), "history": list(missed)}
        missed.clear()
        payload.update(extra.pop("info", {}))
        tune.report({"raydg": payload}, **extra)

    def log(message: str) -> None:
        report(said=(message,))

    last = tune.get_checkpoint()
    if last is not None and _is_result(last):  # finished, then lost before Tune knew
        report(checkpoint=last)
        return
    restore = _restored(last, spec)
    if restore is not None:
        log(f"continues from its checkpoint after round {restore['round']}")
    sim = Simulation(cfg, data, cfg.target, cfg.seed, log=log,
                     weights=weights.get(weights_key(cfg)), restore=restore,
                     label=spec.get("label"))  # absent in a trial of an older raydg
    missed.extend(sim.history)  # restored: its rounds, for those MLflow missed
    cadence = Cadence(cfg.checkpoint_every)

    def on_round(row: dict[str, float]) -> None:
        if not (sim.resumable and cadence.due(int(row["round"]))):
            report(row)
            return
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint.write(Path(tmp), sim.snapshot(), spec["config"])
            size = sum(f.stat().st_size for f in Path(tmp).iterdir())
            report(row, checkpoint=tune.Checkpoint.from_directory(tmp),
                   info={"checkpoint": {"bytes": size}})
        cadence.done(time.perf_counter() - start)

    result = sim.run(on_round)
    result.setting = spec["setting"]
    with tempfile.TemporaryDirectory() as tmp:
        result.save(Path(tmp))
        report(checkpoint=tune.Checkpoint.from_directory(tmp))


def _is_result(last: tune.Checkpoint) -> bool:
    with last.as_directory() as folder:
        return not checkpoint.is_checkpoint(Path(folder))


def _restored(last: tune.Checkpoint | None, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The state of the trial's last checkpoint, if Tune restarted it from one."""
    if last is None:
        return None
    with last.as_directory() as folder:
        return checkpoint.read(Path(folder), spec["config"])


def trial_resources(config: dict[str, Any]) -> tune.PlacementGroupFactory:
    """Bundles of a federation's placement group: the driver's (a GPU share for its target
    evaluation, else empty), then one per client actor; strategy PACK or SPREAD."""
    cfg = RunConfig(**config[FEDERATION]["config"])
    actor = {"CPU": cfg.cpus_per_actor, "GPU": cfg.gpus_per_actor}
    return tune.PlacementGroupFactory([{"GPU": cfg.gpus_per_actor}, *[actor] * cfg.actors],
                                      strategy=cfg.placement.upper())


def _node_sizes() -> list[tuple[float, float]]:
    return [(n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0))
            for n in ray.nodes() if n["Alive"]]


def fit_actors(plan: Plan, num_clients: Callable[[RunConfig], int], started_here: bool,
               out: Callable[[str], None]) -> list[Federation]:
    """The federations with their number of client actors set.

    ``--actors`` if given, else an equal share of the cluster's CPUs (and GPUs, less the
    driver's share for target evaluation) among the federations that run at once, at least
    one, at most one per client. Where no node can host one client actor, or the cluster
    cannot hold one whole federation, a Ray that raydg started is refused; an existing cluster
    may yet scale up, so it only says what is missing."""
    cfg = plan.config
    total = ray.cluster_resources()
    cpus, gpus = total.get("CPU", 0.0), total.get("GPU", 0.0)
    at_once = min(len(plan.federations), cfg.max_concurrent or len(plan.federations))
    share = math.floor(cpus / at_once / cfg.cpus_per_actor + 1e-9)
    if cfg.gpus_per_actor:
        share = min(share, math.floor(gpus / at_once / cfg.gpus_per_actor + 1e-9) - 1)
    feds = []
    for fed in plan.federations:
        n = min(num_clients(fed.config), fed.config.actors or max(1, share))
        feds.append(dataclasses.replace(fed, config=dataclasses.replace(fed.config, actors=n)))
    largest = max(feds, key=lambda f: f.config.actors).config
    sizes = _node_sizes()
    problem = None
    if not any(c >= cfg.cpus_per_actor and g >= cfg.gpus_per_actor for c, g in sizes):
        problem = (f"no node can host a client actor of {cfg.cpus_per_actor:g} CPU and "
                   f"{cfg.gpus_per_actor:g} GPU")
    elif (largest.actors * cfg.cpus_per_actor > cpus + 1e-9
          or (largest.actors + 1) * cfg.gpus_per_actor > gpus + 1e-9):
        problem = (f"a federation of {largest.actors} actors needs "
                   f"{largest.actors * cfg.cpus_per_actor:g} CPU and "
                   f"{(largest.actors + 1) * cfg.gpus_per_actor:g} GPU")
    if problem:
        have = "; ".join(f"{c:g} CPU, {g:g} GPU" for c, g in sizes)
        message = f"{problem}; the cluster's nodes have {have}"
        if started_here:
            raise RaydgError(f"{message} (see --cpus-per-actor, --gpus-per-actor, --actors)")
        out(f"raydg: waiting for the cluster to scale up: {message}")
    return feds


def check_storage(storage: str) -> None:
    """Refuse a storage location (local folder or pyarrow filesystem URI) that cannot be
    written, before anything starts."""
    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(storage if "://" in storage else
                                            Path(storage).as_uri())
        probe = f"{path.rstrip('/')}/.raydg-write-test-{uuid.uuid4().hex}"
        fs.create_dir(path.rstrip("/") or "/", recursive=True)
        with fs.open_output_stream(probe) as f:
            f.write(b"ok")
        fs.delete_file(probe)
    except (OSError, ValueError, RuntimeError) as err:  # pyarrow raises OSError subclasses
        raise RaydgError(f"cannot write to --storage {storage}: {err}") from None


class Progress:
    """Each finished round of a federation (training loss, source validation, held-out
    accuracy, the round's seconds) and the experiment's status (federations done and running,
    the time left for all of them): one line per round and a status line every
    ``status_every`` rounds and as a federation ends (``lines``), a board of one updating line
    per running federation under the status on a terminal (``live``), or nothing (``none``:
    only messages marked important, e.g. warnings). A round's line fits 80 columns for the
    embedded datasets' domain names.

    The time left is the work left over the federations running: each running federation's
    rounds left at the mean steady round time (rounds after the first), and each federation not
    started yet at the mean start-up (trial start to first round, actors and round 1 included)
    plus its other rounds, shared by as many federations as have run at once so far."""

    def __init__(self, feds: list[Federation], out: Callable[[str], None],
                 mode: str = "lines", done: dict[str, int] | None = None,
                 status_every: int = 10) -> None:
        self.rounds = {f.key: f.config.rounds for f in feds}
        self.done = {k: (done or {}).get(k, 0) for k in self.rounds}
        self.started: dict[str, float] = {}  # key -> when its trial started
        self.startup: list[float] = []
        self.steady: list[float] = []
        self.out, self.mode, self.status_every = out, mode, status_every
        self.board: dict[str, str] = {}  # live: the line of each running federation
        self.status = ""  # live: the board's last line
        self.drawn = self.reported = self.width = 0

    def say(self, text: str, important: bool = False) -> None:
        """A message (placement, restart, warning), above the live board."""
        if self.mode != "none" or important:
            self._clear()
            self.out(text)
            self._draw()

    def _clear(self) -> None:
        if self.drawn:
            sys.stdout.write(f"\x1b[{self.drawn}F\x1b[J")  # up to the board's start, erase
            self.drawn = 0

    def _draw(self) -> None:
        if self.mode == "live" and self.board:
            width = shutil.get_terminal_size().columns - 1
            lines = [*self.board.values(), self.status]
            sys.stdout.write("".join(line[:width] + "\n" for line in lines))
            sys.stdout.flush()
            self.drawn = len(lines)

    def start(self, key: str) -> None:
        self.started.setdefault(key, time.perf_counter())

    def running(self) -> list[str]:
        return [k for k in self.started if self.done[k] < self.rounds[k]]

    def left(self, steady: float) -> float:
        """Seconds until every federation is done (see the class)."""
        running = self.running()
        pending = [k for k in self.rounds if k not in self.started]
        startup = float(np.mean(self.startup)) if self.startup else steady  # none yet: resumed
        work = sum((self.rounds[k] - self.done[k]) * steady for k in running) + sum(
            startup + (self.rounds[k] - 1) * steady for k in pending)
        self.width = max(self.width, len(running))
        return work / max(1, self.width)

    def __call__(self, fed: Federation, row: dict[str, float]) -> None:
        key = fed.key
        self.done[key] += 1
        self.reported += 1
        if self.done[key] == 1:
            now = time.perf_counter()
            self.startup.append(now - self.started.get(key, now))
        else:
            self.steady.append(row["round_seconds"])
        left = self.left(float(np.mean(self.steady or [row["round_seconds"]])))
        finished = sum(self.done[k] >= r for k, r in self.rounds.items())
        self.status = (f"raydg: {finished} of {len(self.rounds)} federations done, "
                       f"{len(self.running())} running; about {int(left // 3600)}:"
                       f"{int(left % 3600 // 60):02d}:{int(left % 60):02d} left in all")
        val = f"{100 * row['val_acc']:.1f}%" if "val_acc" in row else "-"  # not validated
        local = f" (local {100 * row['val_acc_local']:.1f}%)" if "val_acc_local" in row else ""
        line = (f"[{fed.title()}] round {int(row['round'])}/{self.rounds[key]} "
                f"loss {row['train_loss']:.3f} val {val}{local} "
                f"target {100 * row['target_acc']:.1f}% {row['round_seconds']:.1f}s")
        ended = self.done[key] >= self.rounds[key]
        if self.mode == "lines":
            self.out(line)
            if ended or self.reported % self.status_every == 1 % self.status_every:
                self.out(self.status)
        elif self.mode == "live" and not ended:
            self._clear()
            self.board[key] = line
            self._draw()
        elif self.mode == "live":  # finished: its last line stays above the board
            self.board.pop(key, None)
            self.say(line)


class Collector(tune.Callback):
    """Runs where ``Tuner.fit`` runs: logs every report to MLflow (each round once, also when a
    restarted or resumed trial reports it again), prints progress and restarts, and loads each
    finished federation's result from its last checkpoint. A federation that fails for good
    (its restarts spent) stops the experiment (:class:`StopOnError`).

    Tune saves its callbacks with the experiment; a Collector is saved as a reference to the
    collector of whichever process resumes the experiment (:data:`ACTIVE`)."""

    def __init__(self, feds: list[Federation], tracker: Tracker, out: Callable[[str], None],
                 progress: str = "lines") -> None:
        self.feds = {f.key: f for f in feds}
        self.tracker = tracker
        self.results: dict[str, FederationResult] = {}
        self.logged = {f.key: tracker.last_round(f.key) for f in feds}
        self.progress = Progress(feds, out, progress, self.logged)
        self.placement = ""  # the last placement line printed
        self.failed = False

    def __reduce__(self) -> tuple:
        return _active, ("collector",)

    def _fed(self, trial: Any) -> Federation:
        return self.feds[trial.config[FEDERATION]["key"]]

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        fed = self._fed(trial)
        self.tracker.start_child(fed.key, fed.config, fed.setting, fed.label, fed.not_paper)
        self.progress.start(fed.key)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        fed, report = self._fed(trial), result["raydg"]
        for message in report["messages"]:
            if message.startswith("placement:"):  # said once while it stays the same
                if message == self.placement:
                    continue
                self.placement = message
            self.progress.say(f"[{fed.title()}] {message}", message.startswith("warning"))
        for row in report.get("history", []):  # restored: rounds that MLflow may have missed
            self._log(fed.key, row)
        row = report["row"]
        if row is not None and self._log(fed.key, row):
            if "checkpoint" in report:
                self.tracker.log_checkpoint(fed.key, int(row["round"]), report["checkpoint"])
            self.progress(fed, row)

    def _log(self, key: str, row: dict[str, float]) -> bool:
        """Log round ``row`` of federation ``key`` unless it is logged already (rounds are
        logged in order: each once); whether it was."""
        if row["round"] <= self.logged[key]:
            return False
        self.logged[key] = int(row["round"])
        self.tracker.log_round(key, row)
        return True

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        fed = self._fed(trial)
        restarts = self.tracker.restarted(fed.key)
        self.progress.say(f"[{fed.title()}] failed ({_last_line(trial.error_file)}); restart "
                          f"{restarts} of at most {fed.config.max_failures}, from its last "
                          "checkpoint", important=True)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.collect(self._fed(trial).key, trial.checkpoint)

    def collect(self, key: str, last: tune.Checkpoint | None) -> None:
        """The federation's result from its final checkpoint, logged to MLflow unless its
        child run already holds it (finished in an earlier run of a resumed experiment)."""
        if key in self.results or last is None:
            return
        with last.as_directory() as folder:
            if checkpoint.is_checkpoint(Path(folder)):
                return  # stopped (Ctrl-C, another federation failed) before it finished
            result = FederationResult.load(Path(folder))
        if not self.tracker.finished(key):
            for row in result.history:  # rounds that MLflow missed (it was away), from storage
                self._log(key, row)
            self.tracker.log_result(key, result)
        self.results[key] = result

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.tracker.end_child(self._fed(trial).key, "FAILED")
        self.failed = True


def _last_line(path: str | None) -> str:
    """The last line of a trial's error file: the exception, without its traceback."""
    try:
        with open(path or "") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "a lost actor or node"
    return lines[-1][:200] if lines else "a lost actor or node"


class StopOnError(tune.Stopper):
    """Stops every trial once a federation failed for good."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector

    def __reduce__(self) -> tuple:
        return _active, ("stopper",)

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.collector.failed


ACTIVE: dict[str, Any] = {}  # this process's collector and stopper (see Collector)


def _active(name: str) -> Any:
    """This process's ``name``; ``None`` where no experiment runs (Tune's state read by
    another process, e.g. ``tune.ExperimentAnalysis``, has no use for them)."""
    return ACTIVE.get(name)


def _spec(fed: Federation) -> dict[str, Any]:
    return {"key": fed.key, "config": dataclasses.asdict(fed.config), "setting": fed.setting,
            "label": fed.row}


MANIFEST = "raydg.json"  # in the experiment's folder: what `raydg resume` needs


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the experiment; ``raydg resume EXPERIMENT_DIR`` continues."""

    def __init__(self, message: str, experiment_dir: str) -> None:
        super().__init__(message)
        self.experiment_dir = experiment_dir


def experiment_dir(plan: Plan, run_id: str) -> str:
    """A new experiment's folder (or URI) under ``storage``, named after the dataset, the
    method(s), the time and the MLflow run."""
    label = re.sub(r"[^\w.+=-]+", "_", plan.label)
    name = f"{plan.config.dataset}-{label}-{time.strftime('%Y%m%d-%H%M%S')}-{run_id[:8]}"
    return f"{plan.config.storage.rstrip('/')}/{name}"


def _filesystem(path: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(path if "://" in path else Path(path).absolute().as_uri())


def write_manifest(directory: str, manifest: dict[str, Any]) -> None:
    fs, path = _filesystem(directory)
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/{MANIFEST}") as f:
        f.write(json.dumps(manifest, indent=1).encode())


def read_manifest(directory: str) -> dict[str, Any]:
    """What an experiment was started with (its config, search and MLflow run); a one-line
    error naming the file if it is missing or unreadable."""
    where = f"{directory.rstrip('/')}/{MANIFEST}"
    try:
        fs, path = _filesystem(where)
        with fs.open_input_stream(path) as f:
            manifest = json.loads(f.read())
        if not {"run_id", "config", "search"} <= set(manifest):
            raise ValueError("keys run_id, config and search are missing")
    except (OSError, ValueError) as err:
        raise RaydgError(f"{where} is not a raydg experiment's manifest: {err}") from None
    return manifest


def verify_checkpoints(directory: str, feds: list[Federation]) -> None:
    """Before a resume, for each unfinished federation of the experiment in ``directory``: the
    checkpoint that Tune's experiment state will restore it from exists, is whole and belongs
    to it (a one-line error naming the folder or file otherwise, before Ray starts or MLflow
    is written to).

    Tune deletes a trial's older checkpoint when it registers a newer one but saves its
    experiment state only every few checkpoints, so a kill in between leaves the state naming a
    deleted folder; restored, Tune deletes it again at the trial's next checkpoint and logs a
    ``FileNotFoundError`` traceback. Such folders are recreated empty, for Tune to delete."""
    import pyarrow.fs as pafs
    from ray.tune import ExperimentAnalysis

    fs, path = _filesystem(directory)
    if not any(i.base_name.startswith("experiment_state-")
               for i in fs.get_file_info(pafs.FileSelector(path))):
        raise RaydgError(f"{directory} holds no Tune experiment state (experiment_state-*.json):"
                         " the experiment stopped before its federations started; run it again")
    configs = {f.key: dataclasses.asdict(f.config) for f in feds}
    for trial in ExperimentAnalysis(directory).trials:
        manager = trial.run_metadata.checkpoint_manager
        latest = manager.latest_checkpoint_result
        if trial.status == "TERMINATED" or latest is None:
            continue
        for older in manager.best_checkpoint_results:
            point = older.checkpoint
            if point.path != latest.checkpoint.path and not _exists(point):
                point.filesystem.create_dir(point.path)
        point = latest.checkpoint
        if not _exists(point):
            raise RaydgError(f"checkpoint {point.path}, which the experiment's state names as "
                             f"the last of {trial.config[FEDERATION]['key']}, is gone: that "
                             "federation cannot continue")
        with point.as_directory() as local:
            try:
                if checkpoint.is_checkpoint(Path(local)):
                    checkpoint.check(Path(local), configs[trial.config[FEDERATION]["key"]])
            except RaydgError as err:
                raise RaydgError(str(err).replace(local, point.path)) from None


def _exists(point: tune.Checkpoint) -> bool:
    import pyarrow.fs as pafs

    return point.filesystem.get_file_info(point.path).type != pafs.FileType.NotFound


def run_federations(plan: Plan, feds: list[Federation], data: MultiDomainDataset,
                    weights: dict[str, dict[str, np.ndarray]], tracker: Tracker,
                    out: Callable[[str], None], directory: str, resume: bool = False,
                    progress: str = "lines") -> list[FederationResult]:
    """Run every federation as a Tune trial in the experiment folder ``directory`` (as many
    at once as the cluster holds, at most ``max_concurrent``), or, with ``resume``, continue
    an interrupted experiment there: finished federations are not run again, unfinished ones
    continue from their checkpoints. Their results, in the order of ``feds``.

    A lost actor or node restarts a federation from its last checkpoint, up to
    ``max_failures`` times. A failure that outlasts them stops the experiment: a user error
    (:class:`RaydgError`) is raised as such, anything else as a ``RuntimeError`` carrying the
    trial's error. Ctrl-C stops every trial (Tune's handler) and is raised as
    :class:`Interrupted`."""
    cfg = plan.config
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's old console path is silent at verbose=0
    # a trial's failure is raydg's one line (Collector.on_trial_recover), or the error raised
    # once its restarts are spent, not Tune's traceback of each attempt (its error file keeps it)
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
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
        storage, _, name = directory.rpartition("/")
        tuner = tune.Tuner(
            trainable, param_space={FEDERATION: tune.grid_search([_spec(f) for f in feds])},
            tune_config=tune.TuneConfig(
                max_concurrent_trials=cfg.max_concurrent, reuse_actors=cfg.reuse_actors,
                trial_name_creator=lambda t: t.config[FEDERATION]["key"],
                trial_dirname_creator=lambda t: f"{t.config[FEDERATION]['key']}-{t.trial_id}"),
            run_config=tune.RunConfig(
                name=name, storage_path=storage, verbose=0, callbacks=[collector],
                stop=ACTIVE["stopper"],
                failure_config=tune.FailureConfig(max_failures=cfg.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2)))
        collector.progress.say(f"raydg: {len(feds)} federations as Tune trials, results in "
                               f"{directory}")
    grid = tuner.fit()
    for result in grid:
        if isinstance(result.error, str):  # Tune's text of an error it could not unpickle
            raise RuntimeError(f"a federation failed: {result.error}")
        if result.error is not None:
            cause = _root_cause(result.error)
            if isinstance(cause, RaydgError):
                raise RaydgError(str(cause))
            raise RuntimeError(f"a federation failed: {result.error}") from result.error
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

