"""raydg from Python: what ``raydg run``, ``resume`` and ``report`` do, with their results as
tables.

    import raydg

    fedavg = raydg.run("digits-style", method="fedavg", seeds=[0, 1, 2], rounds=5)
    print(fedavg.summary.to_pandas())             # the printed table, as numbers
    rows = raydg.read_report(experiment="digits-style")  # the finished runs in the store

This module's names (``run``, ``resume``, ``read_report``, ``Results``, re-exported by
``raydg``) are the stable surface; the command line is a thin layer over the same functions.
A Ray that ``run`` (or ``resume``) starts is stopped before it returns or raises (Ctrl-C
included: the experiment stops, its runs end ``KILLED`` with their checkpoints, and
:class:`raydg.Interrupted`'s ``experiment_dir`` is the folder that ``resume`` continues).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from raydg.config import (
    RunConfig,
    Search,
    apply,
    extend_search,
    parse_search,
    split_search,
)
from raydg.config_files import load_yaml
from raydg.errors import RaydgError

if TYPE_CHECKING:
    from torch import Tensor

    from raydg.datasets import MultiDomainDataset
    from raydg.engine.simulation import Simulation
    from raydg.experiment import ExperimentResult
    from raydg.methods import Method


@dataclass(frozen=True)
class Results:
    """An experiment's results.

    ``rows``: one row per federation, inference mode and model selection (``selected``:
    training-domain validation, ``last``, ``oracle``), with ``method``, ``setting`` (the
    searched values), ``target``, ``seed``, ``mode``, ``primary`` (the mode the method reports),
    ``selection``, ``round``, ``val_acc`` and ``accuracy`` (percent) and ``steps`` (local steps
    per client). ``summary``: the printed table as numbers, one row per method, setting, mode
    and selection: the mean and standard deviation over seeds per target and of ``Avg``.
    Both are ``pyarrow.Table`` s (``.to_pandas()``, ``.to_pylist()``)."""

    run_id: str  # the MLflow parent run
    tracking_uri: str
    config: RunConfig  # resolved: the dataset's defaults filled in
    rows: pa.Table
    summary: pa.Table
    printed: str  # the tables as raydg prints them


def run(dataset: str | None = None, *, config: str | Path | RunConfig | None = None,
        search: Search | Mapping[str, Any] | None = None, out: Callable[[str], None] | None
        = None, progress: str = "none", **settings: Any) -> Results:
    """Run an experiment, as ``raydg run`` (or ``raydg sweep`` with a search).

    ``config``: a YAML file (its ``grid``/``random`` keys are the search) or a
    :class:`RunConfig`; ``settings``: config keys over it (``method="fedprox"``,
    ``seeds=[0, 1]``, ``options={"mu": 0.1}`` or ``**{"options.mu": 0.1}``, ``plugins=[...]``);
    ``search``: a :class:`Search` or its mapping (``{"grid": {"lr": [0.01, 0.05]}}``), added
    to the file's. ``progress``: ``none``, ``lines`` (a line per round of each federation) or
    ``live``; ``out`` receives raydg's lines (default: printed, only its warnings with
    ``progress="none"``)."""
    from raydg.experiment import run_experiment

    cfg, found = _config(config)
    if dataset is not None:
        settings = {"dataset": dataset, **settings}
    cfg = apply(cfg, settings)
    search = _search(found, search)
    return _results(run_experiment(cfg, search, out=out or _printer(progress),
                                   progress=progress))


def resume(target: str | Path, *, tracking_uri: str | None = None, address: str | None = None,
           out: Callable[[str], None] | None = None, progress: str = "none") -> Results:
    """Continue an interrupted experiment, as ``raydg resume``: ``target`` is its folder
    (:class:`raydg.Interrupted`'s ``experiment_dir``) or its MLflow parent run id;
    ``tracking_uri``: the store where that run id is, and where the experiment's runs are now
    if the store has moved; ``address``: the Ray cluster to continue on, if not the
    experiment's. Finished federations are kept, the others continue from their last
    checkpoints, into the same MLflow run; the results are the whole experiment's. ``out`` and
    ``progress`` as for :func:`run`."""
    from raydg.experiment import run_experiment
    from raydg.trials.storage import resume_target

    folder = resume_target(str(target), tracking_uri)
    return _results(run_experiment(RunConfig(tracking_uri=tracking_uri, address=address),
                                   out=out or _printer(progress), progress=progress,
                                   resume=folder))


def simulation(cfg: RunConfig, data: MultiDomainDataset, target: str | None = None,
               seed: int | None = None, *, method: Method | None = None,
               log: Callable[[str], None] = print, weights: dict[str, Tensor] | None = None,
               restore: dict[str, Any] | None = None) -> Simulation:
    """One federation of ``cfg`` on ``data`` (its ``target`` and first seed unless given), on
    the Ray of this process, without Tune or MLflow: planned as ``run`` plans each
    (:func:`raydg.planning.federation`), ready to ``.run()`` or to drive round by round (a
    notebook's, a test's, a benchmark's). ``method``: an instance to run instead of
    ``cfg.method`` (one not registered); ``weights``, ``restore``: as
    :class:`~raydg.engine.simulation.Simulation` takes them."""
    from raydg.engine.simulation import Simulation
    from raydg.methods import build
    from raydg.planning import federation

    fed = federation(cfg, target, seed, method)
    spec = fed.config
    method = method or build(spec.method, spec.augment, spec.aggregation, spec.options)
    return Simulation(fed, data, method, log=log, weights=weights, restore=restore)


def _results(result: ExperimentResult) -> Results:
    """The :class:`Results` of an experiment's result."""
    return Results(result.run_id, result.plan.runtime.tracking_uri, result.config,
                   _table(rows(result.runs)), _table(result.summary), result.printed)


def rows(runs: Sequence[Any]) -> list[dict[str, Any]]:
    """:func:`raydg.results.long_rows` with ``primary``: whether the row's mode is the one the
    method reports."""
    from raydg.results import long_rows

    return [{**row, "primary": row["mode"] == r.mode} for r in runs for row in long_rows([r])]


def read_report(*, tracking_uri: str | None = None, experiment: str | Sequence[str] = (),
           dataset: str | None = None, methods: Sequence[str] = (), filter_string: str = "",
           selection: str = "selected") -> pa.Table:
    """The runs of an MLflow store (default: ``$MLFLOW_TRACKING_URI`` or ``mlflow.db`` here)
    as ``raydg report`` tables them: one row per finished run, with ``table`` (runs that
    differ in other settings are in different tables, never averaged together), ``method``
    (as the report names it: ``fedprox [mu=0.1]``), ``target``, ``seed``, ``mode`` (the
    reported one), ``selection``, ``accuracy`` (percent, at the ``selection``'s round) and
    ``steps`` (local steps per client). Reads the store only: no Ray, no engine."""
    from raydg.reporting import runs as runs_mod
    from raydg.tracking.store import reading_client
    from raydg.tracking.store import tracking_uri as store_uri

    experiments = [experiment] if isinstance(experiment, str) else list(experiment)
    client = reading_client(store_uri(RunConfig(tracking_uri=tracking_uri)))
    runs = runs_mod.find_runs(client, experiments, dataset, methods, filter_string)
    out = [{"table": i + 1, **row} for i, t in enumerate(runs_mod.tables(runs, selection))
           for row in runs_mod.long_rows(t.runs, selection)]
    if not out:
        raise RaydgError(f"no finished raydg runs match in {client.tracking_uri}")
    return _table(out)


def _config(config: str | Path | RunConfig | None) -> tuple[RunConfig, Search]:
    if config is None:
        return RunConfig(), Search()
    if isinstance(config, RunConfig):
        return config, Search()
    values, search = split_search(load_yaml(str(config)))
    return apply(RunConfig(), values), search


SEARCH_KEYS = ("grid", "random", "space", "samples", "seed")


def _search(found: Search, given: Search | Mapping[str, Any] | None) -> Search:
    """The file's search extended by ``given``, checked as a sweep file's is: a
    :class:`Search`, or a mapping of a file's sections (``grid``, ``random``) or of its
    fields (``grid``, ``space``, ``samples``, ``seed``)."""
    if given is None:
        return found
    values = dataclasses.asdict(given) if isinstance(given, Search) else dict(given)
    unknown = sorted(set(values) - set(SEARCH_KEYS))
    if unknown:
        raise RaydgError(f"search takes the keys {', '.join(SEARCH_KEYS)}, not {unknown}")
    random = values.get("random") or {k: values[k] for k in ("space", "samples", "seed")
                                      if values.get(k)}
    extra = parse_search(values.get("grid"), random or None)
    return dataclasses.replace(extend_search(found, extra.grid, "search"),
                               space={**found.space, **extra.space},
                               samples=found.samples + extra.samples)


def _printer(progress: str) -> Callable[[str], None]:
    """What prints raydg's lines by default: all of them with progress, else its warnings."""
    return _warnings if progress == "none" else print


def _warnings(line: str) -> None:
    if line.startswith("raydg: warning"):
        print(line)


def _table(records: list[dict[str, Any]]) -> pa.Table:
    columns = dict.fromkeys(k for r in records for k in r)
    return pa.table({k: [r.get(k) for r in records] for k in columns})
