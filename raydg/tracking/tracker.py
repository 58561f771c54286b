"""MLflow tracking: one writer, the process that runs the experiment.

One experiment per dataset; a parent run per command, a child run per federation (target
domain, seed and, in a search, setting). Federations run concurrently as Ray Tune trials, and
their reports reach this process through a Tune callback (:mod:`raydg.trials`), so runs are
addressed by id through ``MlflowClient`` rather than MLflow's one-active-run fluent API.
The default store is ``sqlite:///mlflow.db`` in the working directory (no server needed);
``--tracking-uri`` or ``MLFLOW_TRACKING_URI`` override it. Browse with
``mlflow ui --backend-store-uri sqlite:///mlflow.db``.

A tracking server that stops answering mid-run loses nothing: the calls that fail are kept, in
order, and retried before every later call and at the end; what still fails then is reported
as a :class:`TrackingError` (every result is in the experiment's Tune storage as well, and
``raydg resume`` logs what is missing).
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from raydg.config import RunConfig, Search, setting_label, to_dict
from raydg.errors import RaydgError, TrackingError
from raydg.plots import plot, plot_curves
from raydg.results import (
    MACHINE_TAG,
    UNIT_TAG,
    WARNINGS_TAG,
    FederationResult,
    duration,
    in_percent,
    steps_per_client,
    write_table,
)
from raydg.tracking.logged_model import log_model
from raydg.tracking.store import quiet_mlflow
from raydg.version import installed_version

# MLflow's run page draws a section per metric prefix (before the last '/'), sections in name
# order before the unprefixed "Model metrics": the curves are logged a second time under a
# prefix that sorts first, so that a child run's metrics tab opens on them
CURVES = "Accuracy and loss"
CURVE_METRICS = ("target_acc", "val_acc", "train_loss")
MAX_PARAMS = 100  # per MLflow log_batch call
RETRY_SECONDS = 10.0  # while MLflow fails, how often the calls kept are tried again
REMIND_SECONDS = 300.0  # while MLflow fails, how often a line says so again
WARNINGS_CHARS = 5000  # within MLflow's limit on a tag's value


def _first_line(err: Exception) -> str:
    """``Kind: the first line of its message`` (SQLAlchemy's run to a dozen lines)."""
    lines = [line for line in str(err).strip().splitlines()
             if not line.startswith(("[", "(raised as", "(Background"))]
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


def _version() -> dict[str, str]:
    """raydg's version, and the git commit of its source when it runs from a checkout
    (``+dirty`` with uncommitted changes)."""
    import subprocess

    out = {"raydg.version": installed_version()}
    source = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"],
                                capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return out
    if commit.returncode == 0:
        out["raydg.commit"] = commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    return out


VERSION = _version()


def metric_name(name: str) -> str:
    """``name`` in the characters MLflow allows (``fedbn+ccst-pixel`` -> ``fedbn_ccst-pixel``)."""
    return re.sub(r"[^\w\-. :/]", "_", name)


def flat_params(cfg: RunConfig) -> dict[str, str]:
    """The whole resolved config as MLflow params (``options.*`` for method settings)."""
    params = {k: v for k, v in to_dict(cfg).items() if k != "options"}
    params.update({f"options.{k}": v for k, v in cfg.options.items()})
    return {k: str(v) for k, v in params.items()}


EXPERIMENT_NOTE = """Runs of raydg: a parent run per `raydg run` (its description, `results.txt`
and `curves.png` hold the summary; its metric `avg/selected/<mode>`, the Avg over targets at
the training-domain-validated round, makes a useful column), a child run per federation
(target, seed, setting) with per-round metrics, its tables, the ledger and the global models
under `model/`. Paper tables over many runs: `raydg report`."""


class Tracker:
    """Opens the parent run on entry (or, resuming, takes up ``run_id`` and its children again)
    and ends it on exit (``FINISHED``, ``FAILED``, or ``KILLED`` after Ctrl-C, with any child
    run still open); one child run per federation, tagged ``raydg.key``."""

    def __init__(self, uri: str, cfg: RunConfig, label: str, search: Search | None = None,
                 run_id: str | None = None, name: str = "") -> None:
        """The parent run of ``cfg`` in the store ``uri``; ``label`` names its method(s) (tag
        ``raydg.method``), ``name`` the run (default: label and dataset)."""
        from mlflow import MlflowClient

        quiet_mlflow()
        self.cfg, self.search, self.label = cfg, search or Search(), label
        self.name = name or f"{label} {cfg.dataset}"
        self.client = MlflowClient(uri)
        name = cfg.experiment or cfg.dataset
        found = self.client.get_experiment_by_name(name)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        # the kind MLflow records for a model-training experiment (its UI's view comes from the
        # link's workflowType, experiment.ui_link, not from this tag); the note is the
        # experiment's description in the UI
        for tag, value in (("mlflow.experimentKind", "custom_model_development"),
                           ("mlflow.note.content", EXPERIMENT_NOTE)):
            self.client.set_experiment_tag(self.experiment_id, tag, value)
        self.run_id = run_id or ""
        self.children: dict[str, str] = {}  # federation key -> run id
        self.open: set[str] = set()  # children not yet ended
        self.done: set[str] = set()  # children FINISHED
        self.restarts: dict[str, int] = {}
        self.warnings: dict[str, list[str]] = {}  # said so far, by key
        self.steps: dict[str, int] = {}  # the last round logged, by key
        self.backlog: list[Callable[[], None]] = []  # calls that failed, to retry in order
        self.away = self.tried = self.reminded = 0.0  # when MLflow failed, was tried, said so
        self.ending, self.ended = threading.Lock(), False

    def __enter__(self) -> Tracker:
        if self.run_id:
            self._resume()
            return self
        run = self.client.create_run(self.experiment_id, tags=self.tags(),
                                     run_name=self.name)
        self.run_id = run.info.run_id
        params = flat_params(self.cfg)
        if self.search:
            params["search"] = yaml.safe_dump({"grid": self.search.grid,
                                               "random": self.search.space}, sort_keys=False)
        self._params(self.run_id, params)
        return self

    def _resume(self) -> None:
        """The parent run and its children again; a child left RUNNING by a process that was
        killed continues (it is the same federation)."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(self.run_id)
        except MlflowException:
            raise RaydgError(f"the MLflow store {self.client.tracking_uri} holds no run "
                             f"{self.run_id}, where this experiment logged: if the store has "
                             "moved, resume with --tracking-uri URI of where it is now") from None
        self.client.update_run(self.run_id, status="RUNNING")
        for run in self.client.search_runs(
                [self.experiment_id], f"tags.mlflow.parentRunId = '{self.run_id}'",
                max_results=10000):
            key = run.data.tags.get("raydg.key")
            if key is None:
                continue
            self.children[key] = run.info.run_id
            history = self.client.get_metric_history(run.info.run_id, "val_acc")
            self.steps[key] = max((m.step for m in history), default=0)
            self.restarts[key] = int(run.data.metrics.get("restarts", 0))
            if WARNINGS_TAG in run.data.tags:
                self.warnings[key] = run.data.tags[WARNINGS_TAG].splitlines()
            (self.done if run.info.status == "FINISHED" else self.open).add(key)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.end("KILLED" if exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
                 else "FAILED" if exc_type else "FINISHED")
        if self.backlog and exc_type is None:
            raise TrackingError(f"{len(self.backlog)} MLflow calls to {self.client.tracking_uri}"
                                " failed until the end; every result is in the experiment's "
                                "storage, and raydg resume logs what is missing")

    def end(self, status: str) -> None:
        """End the parent run with ``status``, and any child run still open ``KILLED`` (when
        the parent is) or ``FAILED``; once, from whichever thread comes first (SIGTERM ends
        the runs from a thread of its own, :mod:`raydg.signals`), but for ``FINISHED``: an
        experiment whose last federations finished while it stopped has finished."""
        with self.ending:
            if self.ended and status != "FINISHED":
                return
            for key in sorted(self.open):
                self.end_child(key, "KILLED" if status == "KILLED" else "FAILED")
            self._call(lambda: self.client.set_terminated(self.run_id, status))
            self._flush(now=True)
            self.ended = True

    def tags(self) -> dict[str, str]:
        return {"raydg.method": self.label, "raydg.dataset": self.cfg.dataset,
                UNIT_TAG: "percent", **VERSION}

    def _call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` after the kept calls. While MLflow is away, ``fn`` is kept in order with
        them, and they are tried again at most every ``RETRY_SECONDS``; one line says that it
        went away, one every ``REMIND_SECONDS`` how long it has been, one that it is back."""
        if self.backlog:
            self.backlog.append(fn)
            self._flush()
            return
        try:
            fn()
        except Exception as err:  # MLflow raises many kinds; each call is kept, not lost
            self.backlog.append(fn)
            self.away = self.tried = self.reminded = time.monotonic()
            self._say(f"MLflow at {self.client.tracking_uri} failed ({_first_line(err)}); "
                      "what it misses is kept and logged when it answers again")

    def _flush(self, now: bool = False) -> None:
        """Try the kept calls again, in order (``now``: whenever it was last tried)."""
        clock = time.monotonic()
        if not self.backlog or (not now and clock - self.tried < RETRY_SECONDS):
            return
        self.tried, kept = clock, len(self.backlog)
        while self.backlog:
            try:
                self.backlog[0]()
            except Exception as err:  # still away: kept for the next try
                if clock - self.reminded >= REMIND_SECONDS:
                    self.reminded = clock
                    self._say(f"MLflow at {self.client.tracking_uri} still fails after "
                              f"{duration(clock - self.away)} ({_first_line(err)}); "
                              f"{len(self.backlog)} calls kept")
                return
            self.backlog.pop(0)
        self._say(f"MLflow at {self.client.tracking_uri} answers again after "
                  f"{duration(clock - self.away)}: the {kept} calls kept are logged")

    @staticmethod
    def _say(line: str) -> None:
        logging.getLogger("raydg").warning("raydg: warning: %s", line)

    def _params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS):
            self.client.log_batch(run_id, params=items[i:i + MAX_PARAMS])

    def set_tag(self, key: str, value: str) -> None:
        self._call(lambda: self.client.set_tag(self.run_id, key, value))

    def start_child(self, key: str, cfg: RunConfig, setting: dict[str, Any],
                    label: str, not_paper: str = "") -> None:
        """Open the child run of federation ``key`` (once; a restarted or resumed trial keeps
        its run); ``label`` is its method as reported, ``not_paper`` the options that are not
        its paper's (tag ``raydg.not_paper``, which report rows show beside the name)."""
        if key in self.children:
            return
        searched = setting_label(setting)
        tags = {**self.tags(), "raydg.method": label, "mlflow.parentRunId": self.run_id,
                "raydg.target": cfg.target, "raydg.seed": str(cfg.seed), "raydg.key": key}
        if searched:
            tags["raydg.setting"] = searched
        if not_paper:
            tags["raydg.not_paper"] = not_paper
        name = f"{cfg.target} seed={cfg.seed}" + (f" {searched}" if searched else "")
        self.children[key] = ""
        self.open.add(key)

        def create() -> None:  # each kept call makes one MLflow request: a retry repeats none
            self.children[key] = self.client.create_run(self.experiment_id, run_name=name,
                                                        tags=tags).info.run_id

        self._call(create)
        self._call(lambda: self._params(self.children[key], {
            **flat_params(cfg), "target": cfg.target, "seed": str(cfg.seed)}))

    def warn(self, key: str, message: str) -> None:
        """Add a warning of federation ``key`` (divergence, collapse) to its child run's tag
        ``raydg.warnings`` (one per line, each once), which ``raydg report`` prints."""
        said = self.warnings.setdefault(key, [])
        if message in said:
            return
        said.append(message)
        text = "\n".join(said)[:WARNINGS_CHARS]
        self._call(lambda: self.client.set_tag(self.children[key], WARNINGS_TAG, text))

    def last_round(self, key: str) -> int:
        """The last round of federation ``key`` already logged (0: none)."""
        return self.steps.get(key, 0)

    def finished(self, key: str) -> bool:
        return key in self.done

    def _metrics(self, run_of: Callable[[], str], values: dict[str, float],
                 step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_name(k), float(v), now, step) for k, v in values.items()]
        self._call(lambda: self.client.log_batch(run_of(), metrics=metrics))

    def _child(self, key: str) -> Callable[[], str]:
        return lambda: self.children[key]

    def log_round(self, key: str, row: dict[str, float]) -> None:
        self.steps[key] = int(row["round"])
        values = in_percent({k: v for k, v in row.items() if k != "round"})
        values.update({f"{CURVES}/{k}": values[k] for k in CURVE_METRICS if k in values})
        self._metrics(self._child(key), values, int(row["round"]))

    def log_checkpoint(self, key: str, rnd: int, info: dict[str, float]) -> None:
        """The size of the checkpoint written after round ``rnd``."""
        self._metrics(self._child(key), {"checkpoint_bytes": info["bytes"]}, rnd)

    def restarted(self, key: str) -> int:
        """Count a restart of federation ``key`` (metric and tag ``restarts``); the count."""
        self.restarts[key] = self.restarts.get(key, 0) + 1
        count = self.restarts[key]
        self._metrics(self._child(key), {"restarts": count}, count)
        self._call(lambda: self.client.set_tag(self.children[key], "raydg.restarts",
                                               str(count)))
        return count

    def log_result(self, key: str, result: FederationResult) -> None:
        """Final metrics of a child run (``raydg.mode`` tags the mode it reports), its tables
        (history, ledger, placement, method tables, with their plots) and its global models
        (``model/final.npz``, ``model/selected.npz``: the selected round's); the child run
        ends ``FINISHED``."""
        metrics: dict[str, float] = {"selected_round": result.selected_round,
                                     "steps_per_client": steps_per_client(result)}
        for mode in result.selected:
            metrics[f"final/target_acc_selected/{mode}"] = result.selected[mode]
            metrics[f"final/target_acc_last/{mode}"] = result.last[mode]
            metrics[f"final/target_acc_oracle/{mode}"] = result.oracle[mode]
        metrics.update({f"final/{k}": v for k, v in result.final.items()})
        self._metrics(self._child(key), in_percent(metrics))
        self._call(lambda: self.client.set_tag(self.children[key], "raydg.mode", result.mode))
        driver = next((r for r in result.tables.get("placement", []) if r["role"] == "driver"),
                      {})
        if driver.get("machine"):  # what ran the federation's driver: its wall time's machine
            self._call(lambda: self.client.set_tag(self.children[key], MACHINE_TAG,
                                                   driver["machine"]))
        tables = {name: [in_percent(row) for row in rows]
                  for name, rows in {"history": result.history, **result.tables}.items()}
        self._call(lambda: self.log_tables(self.children[key], tables, plots=result.plots))
        models = {"final": result.global_state, "selected": result.selected_state}
        self._call(lambda: log_model(self.client, self.children[key], models, result.model,
                                     VERSION["raydg.version"]))
        self.end_child(key, "FINISHED")

    def end_child(self, key: str, status: str) -> None:
        self._call(lambda: self.client.set_terminated(self.children[key], status))
        self.open.discard(key)
        if status == "FINISHED":
            self.done.add(key)

    def log_tables(self, run_id: str, tables: dict[str, list[dict[str, Any]]],
                   text: dict[str, str] | None = None,
                   plots: dict[str, tuple[str, ...]] | None = None,
                   curves: list[dict[str, Any]] | None = None) -> None:
        """Tables as Parquet and CSV, plots (PNG) of those in ``plots``, text files, and the
        accuracy curves as ``curves.png``."""
        with tempfile.TemporaryDirectory() as tmp:
            if curves:
                plot_curves(curves, Path(tmp) / "curves.png", self.name)
            for name, rows in tables.items():
                if rows:
                    write_table(rows, Path(tmp) / name)
                if rows and name in (plots or {}):
                    plot(rows, plots[name], Path(tmp) / f"{name}.png")
            for name, content in (text or {}).items():
                (Path(tmp) / name).write_text(content)
            self.client.log_artifacts(run_id, tmp)

    def log_summary(self, metrics: dict[str, float], tables: dict[str, list[dict[str, Any]]],
                    printed: str, curves: list[dict[str, Any]]) -> None:
        """The parent run's headline metrics, tables, printed text, config and ``curves.png``
        (accuracy per round of its federations, :func:`raydg.plots.plot_curves`)."""
        self._metrics(lambda: self.run_id, metrics)
        self.set_tag("mlflow.note.content", f"```\n{printed}\n```")  # the run page's description
        config = yaml.safe_dump(to_dict(self.cfg), sort_keys=False)
        self._call(lambda: self.log_tables(self.run_id, tables,
                                           {"config.yaml": config, "results.txt": printed},
                                           curves=curves))
