"""The commands that run an experiment: ``raydg run``, ``sweep`` and ``resume``."""

from __future__ import annotations

import sys
from typing import Any

import click

from raydg import config as config_mod
from raydg.cli.options import CONTEXT, EXAMPLES, GroupedCommand, run_options
from raydg.config_files import load_yaml
from raydg.errors import EmptyResult, RaydgError
from raydg.startup import preload

EXPERIMENT_MODULES = ("raydg.experiment", "mlflow")  # what an experiment's process runs on


def _progress(quiet: bool) -> str:
    """How progress is shown: a live board of running federations on a terminal, plain lines
    elsewhere (CI, log files), nothing with --quiet."""
    return "none" if quiet else "live" if sys.stdout.isatty() else "lines"


def _experiment(config_file: str | None, given: dict[str, Any], sets: tuple[str, ...],
                grid: tuple[str, ...], need_search: bool, quiet: bool) -> None:
    """Config file < command-line options < ``--set``; the file's search and ``--grid``."""
    cfg, search = config_mod.RunConfig(), config_mod.Search()
    if config_file:
        values, search = config_mod.split_search(load_yaml(config_file))
        cfg = config_mod.apply(cfg, values)
    cfg = config_mod.apply(cfg, {k: list(v) if isinstance(v, tuple) else v
                                 for k, v in given.items() if v not in (None, [], ())})
    cfg = config_mod.apply(cfg, config_mod.parse_sets(sets))
    search = config_mod.extend_search(search, config_mod.parse_grid(grid), "--grid")
    if need_search and not search:
        raise RaydgError(f"sweep file {config_file!r} defines no grid and no random search "
                         "(keys 'grid' and 'random'); use raydg run for a single setting")
    preload(*EXPERIMENT_MODULES)
    from raydg import api

    api.run(config=cfg, search=search, out=click.echo, progress=_progress(quiet))


@click.command(cls=GroupedCommand, context_settings=CONTEXT, epilog=EXAMPLES)
@click.argument("dataset", required=False)
@click.option("--config", "config_file", type=click.Path(),
              help="YAML file of config keys (raydg list configs).")
@run_options
@click.pass_context
def run(ctx: click.Context, dataset: str | None, config_file: str | None,
        sets: tuple[str, ...], grid: tuple[str, ...], seeds: tuple[int, ...], quiet: bool,
        **options: Any) -> None:
    """Train on the source domains of DATASET (raydg list datasets) and evaluate on the
    held-out domain(s); every federation is a Ray Tune trial, tracked in MLflow."""
    if dataset is None and config_file is None and not any(
            s.split("=", 1)[0] == "dataset" for s in sets):
        click.echo(ctx.get_usage(), err=True)
        raise RaydgError("name a DATASET (raydg list datasets) or a --config FILE "
                         "(raydg list configs)")
    _experiment(config_file, {**options, "dataset": dataset, "seeds": list(seeds)}, sets, grid,
                need_search=False, quiet=quiet)


@click.command(cls=GroupedCommand, context_settings=CONTEXT)
@click.argument("sweep_file", type=click.Path())
@run_options
def sweep(sweep_file: str, sets: tuple[str, ...], grid: tuple[str, ...],
          seeds: tuple[int, ...], quiet: bool, **options: Any) -> None:
    """Run the search of SWEEP_FILE (config keys plus 'grid' and/or 'random') over every target
    and seed; select hyper-parameters per target by training-domain validation."""
    _experiment(sweep_file, {**options, "seeds": list(seeds)}, sets, grid, need_search=True,
                quiet=quiet)


@click.command(context_settings=CONTEXT)
@click.argument("target", required=False)
@click.option("--tracking-uri", help="MLflow store of the run: where to look up TARGET when it "
                                     "is a run id, and where the experiment's runs are now "
                                     "when the store has moved. [default: the experiment's]")
@click.option("--address", help="Ray cluster to continue on, where the experiment's is gone or "
                               "was started again elsewhere: HOST:PORT, auto, or local (a "
                               "fresh Ray on this machine). [default: the experiment's]")
@click.option("--quiet", "-q", is_flag=True, help="Print only the tables, no progress.")
def resume(target: str | None, tracking_uri: str | None, address: str | None,
           quiet: bool) -> None:
    """Continue an interrupted experiment: TARGET is its folder (printed at its start and when
    it stops) or its MLflow parent run id. Finished federations are kept, the others continue
    from their last checkpoints, into the same MLflow run. Without TARGET: list the
    experiments under the storage ($RAYDG_STORAGE or ./raydg-results) that can continue."""
    if target is None:
        _list_unfinished()
        return
    preload(*EXPERIMENT_MODULES)
    from raydg import api

    api.resume(target, tracking_uri=tracking_uri, address=address, out=click.echo,
               progress=_progress(quiet))


def _list_unfinished() -> None:
    """``raydg resume`` alone: the unfinished experiments, newest first, each with its
    command."""
    from raydg.plan import STORAGE_ENV, storage_location
    from raydg.signals import command
    from raydg.trials.storage import unfinished

    storage = storage_location(None)
    found = unfinished(storage)
    if not found:
        raise EmptyResult(f"no unfinished experiment under {storage} (--storage of the run, or "
                          f"{STORAGE_ENV}): name its folder or MLflow run id")
    click.echo(f"raydg: {len(found)} unfinished experiment(s) under {storage}, newest first:")
    for folder, status in found:
        click.echo(f"  {status}: {command('raydg')} resume {folder}")

