"""MLflow tracking: one writer, the process that runs the experiment.

One experiment per dataset; a parent run per command, a child run per federation (target
domain, seed and, in a search, setting). Federations run concurrently as Ray Tune trials, and
their reports reach this process through a Tune callback (:mod:`raydg.runner`), so runs are
addressed by id through ``MlflowClient`` rather than MLflow's one-active-run fluent API.
The default store is ``sqlite:///mlflow.db`` in the working directory (no server needed);
``--tracking-uri`` or ``MLFLOW_TRACKING_URI`` override it. Browse with
``mlflow ui --backend-store-uri sqlite:///mlflow.db``.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from raydg.config import RunConfig, Search, setting_label, to_dict
from raydg.results import FederationResult, plot, write_table

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
MAX_PARAMS = 100  # per MLflow log_batch call


def tracking_uri(cfg: RunConfig) -> str:
    return cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def metric_name(name: str) -> str:
    """``name`` in the characters MLflow allows (``fedbn+ccst-pixel`` -> ``fedbn_ccst-pixel``)."""
    return re.sub(r"[^\w\-. :/]", "_", name)


def flat_params(cfg: RunConfig) -> dict[str, str]:
    """The whole resolved config as MLflow params (``options.*`` for method settings)."""
    params = {k: v for k, v in to_dict(cfg).items() if k != "options"}
    params.update({f"options.{k}": v for k, v in cfg.options.items()})
    return {k: str(v) for k, v in params.items()}


class Tracker:
    """Opens the parent run on entry and ends it on exit (``FINISHED``, ``FAILED``, or
    ``KILLED`` after Ctrl-C, with any child run still open); one child run per federation."""

    def __init__(self, cfg: RunConfig, label: str, search: Search | None = None) -> None:
        """``label`` names the method(s) of the parent run."""
        from mlflow import MlflowClient

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.cfg, self.search, self.label = cfg, search or Search(), label
        self.client = MlflowClient(tracking_uri(cfg))
        name = cfg.experiment or cfg.dataset
        found = self.client.get_experiment_by_name(name)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        self.children: dict[str, str] = {}  # federation key -> run id
        self.open: set[str] = set()  # children not yet ended

    def __enter__(self) -> Tracker:
        run = self.client.create_run(self.experiment_id, tags=self.tags(),
                                     run_name=f"{self.label} {self.cfg.dataset}")
        self.run_id = run.info.run_id
        params = flat_params(self.cfg)
        if self.search:
            params["search"] = yaml.safe_dump({"grid": self.search.grid,
                                               "random": self.search.space}, sort_keys=False)
        self._params(self.run_id, params)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        status = ("KILLED" if exc_type is KeyboardInterrupt
                  else "FAILED" if exc_type else "FINISHED")
        for key in sorted(self.open):
            self.end_child(key, "KILLED" if status == "KILLED" else "FAILED")
        self.client.set_terminated(self.run_id, status)

    def tags(self) -> dict[str, str]:
        return {"raydg.method": self.label, "raydg.dataset": self.cfg.dataset}

    def _params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), MAX_PARAMS):
            self.client.log_batch(run_id, params=items[i:i + MAX_PARAMS])

    def start_child(self, key: str, cfg: RunConfig, setting: dict[str, Any],
                    label: str) -> None:
        """Open the child run of federation ``key`` (once; a restarted trial keeps its run);
        ``label`` is its method as reported."""
        if key in self.children:
            return
        searched = setting_label(setting)
        tags = {**self.tags(), "raydg.method": label, "mlflow.parentRunId": self.run_id,
                "raydg.target": cfg.target, "raydg.seed": str(cfg.seed)}
        if searched:
            tags["raydg.setting"] = searched
        name = f"{cfg.target} seed={cfg.seed}" + (f" {searched}" if searched else "")
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        self.children[key] = run.info.run_id
        self.open.add(key)
        self._params(run.info.run_id, {**flat_params(cfg), "target": cfg.target,
                                       "seed": str(cfg.seed)})

    def _metrics(self, run_id: str, values: dict[str, float], step: int = 0) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(run_id, metrics=[Metric(metric_name(k), float(v), now, step)
                                               for k, v in values.items()])

    def log_round(self, key: str, row: dict[str, float]) -> None:
        self._metrics(self.children[key], {k: v for k, v in row.items() if k != "round"},
                      int(row["round"]))

    def log_result(self, key: str, result: FederationResult) -> None:
        """Final metrics of a child run and its tables (history, ledger, placement, method
        tables, with their plots); the child run ends ``FINISHED``."""
        metrics: dict[str, float] = {"selected_round": result.selected_round}
        for mode in result.selected:
            metrics[f"final/target_acc_selected/{mode}"] = result.selected[mode]
            metrics[f"final/target_acc_last/{mode}"] = result.last[mode]
            metrics[f"final/target_acc_oracle/{mode}"] = result.oracle[mode]
        self._metrics(self.children[key], metrics)
        self.log_tables(self.children[key], {"history": result.history, **result.tables},
                        plots=result.plots)
        self.end_child(key, "FINISHED")

    def end_child(self, key: str, status: str) -> None:
        self.client.set_terminated(self.children[key], status)
        self.open.discard(key)

    def log_tables(self, run_id: str, tables: dict[str, list[dict[str, Any]]],
                   text: dict[str, str] | None = None,
                   plots: dict[str, tuple[str, ...]] | None = None) -> None:
        """Tables as Parquet and CSV, plots (PNG) of those in ``plots``, text files."""
        with tempfile.TemporaryDirectory() as tmp:
            for name, rows in tables.items():
                if rows:
                    write_table(rows, Path(tmp) / name)
                if rows and name in (plots or {}):
                    plot(rows, plots[name], Path(tmp) / f"{name}.png")
            for name, content in (text or {}).items():
                (Path(tmp) / name).write_text(content)
            self.client.log_artifacts(run_id, tmp)

    def log_summary(self, metrics: dict[str, float], tables: dict[str, list[dict[str, Any]]],
                    printed: str) -> None:
        self._metrics(self.run_id, metrics)
        config = yaml.safe_dump(to_dict(self.cfg), sort_keys=False)
        self.log_tables(self.run_id, tables, {"config.yaml": config, "results.txt": printed})
