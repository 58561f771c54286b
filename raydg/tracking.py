"""MLflow tracking, driven only from the driver process.

One experiment per dataset; a parent run per command, a child run per (target domain, seed).
The default store is ``sqlite:///mlflow.db`` in the working directory (no server needed);
``--tracking-uri`` or ``MLFLOW_TRACKING_URI`` override it. Browse with
``mlflow ui --backend-store-uri sqlite:///mlflow.db``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from raydg.config import RunConfig, to_dict
from raydg.results import plot, write_table
from raydg.simulation import SimulationResult

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


def tracking_uri(cfg: RunConfig) -> str:
    return cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def flat_params(cfg: RunConfig) -> dict[str, str]:
    """The whole resolved config as MLflow params (``options.*`` for method settings)."""
    params = {k: v for k, v in to_dict(cfg).items() if k != "options"}
    params.update({f"options.{k}": v for k, v in cfg.options.items()})
    return {k: str(v) for k, v in params.items()}


class Tracker:
    """Opens the parent run on entry; :meth:`child` opens one nested run per simulation."""

    def __init__(self, cfg: RunConfig) -> None:
        import mlflow

        logging.getLogger("mlflow").setLevel(logging.WARNING)
        self.mlflow = mlflow
        self.cfg = cfg
        mlflow.set_tracking_uri(tracking_uri(cfg))
        mlflow.set_experiment(cfg.experiment or cfg.dataset)

    def __enter__(self) -> Tracker:
        self.parent = self.mlflow.start_run(run_name=f"{self.cfg.label} {self.cfg.dataset}")
        self.mlflow.log_params(flat_params(self.cfg))
        self.mlflow.set_tags(self.tags())
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.mlflow.end_run(status="FAILED" if exc_type else "FINISHED")

    def tags(self) -> dict[str, str]:
        return {"raydg.method": self.cfg.label, "raydg.dataset": self.cfg.dataset}

    @property
    def run_id(self) -> str:
        return self.parent.info.run_id

    @contextlib.contextmanager
    def child(self, target: str, seed: int) -> Iterator[None]:
        with self.mlflow.start_run(run_name=f"{target} seed={seed}", nested=True):
            self.mlflow.log_params({**flat_params(self.cfg), "target": target, "seed": seed})
            self.mlflow.set_tags({**self.tags(), "raydg.target": target, "raydg.seed": str(seed)})
            yield

    def log_round(self, row: dict[str, float]) -> None:
        step = int(row["round"])
        self.mlflow.log_metrics({k: float(v) for k, v in row.items() if k != "round"}, step=step)

    def log_result(self, result: SimulationResult) -> None:
        """Final metrics of a child run and its tables (history, ledger, method tables)."""
        metrics: dict[str, float] = {"selected_round": result.selected_round}
        for mode in result.selected:
            metrics[f"final/target_acc_selected/{mode}"] = result.selected[mode]
            metrics[f"final/target_acc_last/{mode}"] = result.last[mode]
            metrics[f"final/target_acc_oracle/{mode}"] = result.oracle[mode]
        self.mlflow.log_metrics(metrics)
        self.log_tables({"history": result.history, **result.tables}, plots=result.plots)

    def log_tables(self, tables: dict[str, list[dict[str, Any]]],
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
            self.mlflow.log_artifacts(tmp)

    def log_summary(self, metrics: dict[str, float], tables: dict[str, list[dict[str, Any]]],
                    printed: str) -> None:
        self.mlflow.log_metrics(metrics)
        config = yaml.safe_dump(to_dict(self.cfg), sort_keys=False)
        self.log_tables(tables, {"config.yaml": config, "results.txt": printed})
