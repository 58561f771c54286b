"""Tune's callbacks, run where ``Tuner.fit`` runs: the one writer to MLflow and the stopper."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray import tune

from raydg import checkpoint
from raydg.plan import Federation
from raydg.results import FederationResult
from raydg.tracking.tracker import Tracker
from raydg.trials.progress import Progress
from raydg.trials.trial import FEDERATION


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
                if message != self.placement:
                    self.placement = message
                    self.progress.placed(fed, f"[{fed.title()}] {message}")
                continue
            warning = message.startswith("warning")
            if warning:
                self.tracker.warn(fed.key, message)
            self.progress.say(f"[{fed.title()}] {message}", warning)
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
        fed = self._fed(trial)
        self.progress.say(f"[{fed.title()}] failed ({_last_line(trial.error_file)}); no restart "
                          "left: the experiment stops", important=True)
        self.tracker.end_child(fed.key, "FAILED")
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


# an experiment that raydg started before this package existed (2026-11-27) saved its collector
# and stopper as ``raydg.runner._active``: the name resolves here, so it resumes
sys.modules.setdefault("raydg.runner", sys.modules[__name__])
