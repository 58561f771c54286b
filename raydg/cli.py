"""Command line: ``raydg run``, ``raydg data download|check``, ``raydg list``.

Precedence of settings: built-in defaults < dataset defaults < ``--config`` YAML
< command-line options < ``--set``.
Bad input prints one ``raydg: error: ...`` line and exits with code 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from raydg import config as config_mod
from raydg.datasets import DATA_ROOT_ENV, DATASETS
from raydg.errors import RaydgError
from raydg.methods import METHODS
from raydg.tracking import TrackingError
from raydg.transforms import TRANSFORMS


class Cli(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RaydgError as err:
            click.echo(f"raydg: error: {err}", err=True)
            ctx.exit(2)
        except TrackingError as err:
            click.echo(f"raydg: error: {err}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt as err:
            from raydg.experiment import TERMINATED

            click.echo(f"raydg: interrupted{f' ({err})' if str(err) else ''}", err=True)
            directory = getattr(err, "experiment_dir", None)
            if directory:
                click.echo(f"raydg: continue with: raydg resume {directory}", err=True)
            ctx.exit(143 if TERMINATED.is_set() else 130)


@click.group(cls=Cli)
@click.version_option(package_name="raydg")
def cli() -> None:
    """raydg: parallel simulation of federated domain generalization on Ray."""


RUN_OPTIONS = [
    click.option("--method", "-m", help="Method name (raydg list methods)."),
    click.option("--augment", help="Add an augmentation method to any method, e.g. ccst."),
    click.option("--target", help="Held-out domain, or 'all' (default): one run per domain."),
    click.option("--clients", type=int, help="Split the source domains into N clients."),
    click.option("--dirichlet", type=float,
                 help="Dirichlet alpha of the label split (default iid)."),
    click.option("--sample", type=int,
                 help="Clients per round (default all if N<=10, else 10)."),
    click.option("--rounds", type=int, help="Communication rounds."),
    click.option("--local-steps", type=int, help="Local SGD steps per round."),
    click.option("--lr", type=float, help="Learning rate."),
    click.option("--lr-schedule", type=click.Choice(["constant", "cosine"]),
                 help="Learning rate over the rounds (default constant)."),
    click.option("--equal-compute", metavar="METHOD",
                 help="Add rounds that give this method's clients the local steps METHOD's "
                      "setup takes (e.g. csac's acquisition)."),
    click.option("--batch-size", type=int, help="Local batch size."),
    click.option("--seed", "seeds", type=int, multiple=True,
                 help="Seed; repeat for several runs."),
    click.option("--model", help="Backbone: cnn, resnet18, resnet50."),
    click.option("--image-size", type=int, help="Side of the (square) images fed to the model."),
    click.option("--pretrained/--no-pretrained", default=None,
                 help="Start the ResNet from ImageNet weights (default: the dataset's protocol)."),
    click.option("--weights",
                 help="Start the backbone from a state-dict file (torchvision format for the "
                      "ResNets) or from 'glyphs', raydg's offline pretraining."),
    click.option("--actors", type=int,
                 help="Client actors per federation (default: a share of the cluster)."),
    click.option("--cpus-per-actor", type=float, help="CPUs per client actor (default 1)."),
    click.option("--gpus-per-actor", type=float,
                 help="GPUs per client actor, fractional (e.g. 0.25)."),
    click.option("--max-concurrent", type=int,
                 help="Federations at once (default: as many as the cluster holds)."),
    click.option("--placement", type=click.Choice(["pack", "spread"]),
                 help="Place a federation's actors on few nodes (pack, default) or many."),
    click.option("--data-root", help="Root folder of image datasets (or RAYDG_DATA_ROOT)."),
    click.option("--train-transform", type=click.Choice(list(TRANSFORMS)),
                 help="Training augmentation per image (default none; domainbed = DomainBed's)."),
    click.option("--skip-bad-images", is_flag=True, default=None,
                 help="Skip (and count) unreadable images instead of stopping."),
    click.option("--cache/--no-cache", default=None,
                 help="Decode image files once into the cache (default) or every run."),
    click.option("--cache-dir",
                 help="Decoded-image cache (default $RAYDG_CACHE or ~/.cache/raydg)."),
    click.option("--eval-local/--no-eval-local", default=None,
                 help="Also report in-federation accuracy with local statistics."),
    click.option("--tracking-uri", help="MLflow tracking URI (default sqlite:///mlflow.db)."),
    click.option("--experiment", help="MLflow experiment name (default: the dataset)."),
    click.option("--storage", help="Trial results and checkpoints: a folder or a URI such as "
                                   "s3://bucket/path (default $RAYDG_STORAGE or ./raydg-results)."),
    click.option("--address", help="Ray cluster to join: HOST:PORT or auto (default: a local "
                                   "Ray, or RAY_ADDRESS)."),
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                 help="Override any config key, e.g. --set options.mu=0.1 (repeatable)."),
    click.option("--grid", "grid", multiple=True, metavar="KEY=V1,V2",
                 help="Search a config key over values, e.g. --grid lr=0.01,0.02 (repeatable: "
                      "every combination)."),
]


def run_options(command: Any) -> Any:
    for option in reversed(RUN_OPTIONS):
        command = option(command)
    return command


def _experiment(config_file: str | None, given: dict[str, Any], sets: tuple[str, ...],
                grid: tuple[str, ...], need_search: bool) -> None:
    """Config file < command-line options < ``--set``; the file's search and ``--grid``."""
    from raydg.experiment import run_experiment

    cfg, search = config_mod.RunConfig(), config_mod.Search()
    if config_file:
        values, search = config_mod.split_search(config_mod.load_yaml(config_file))
        cfg = config_mod.apply(cfg, values)
    cfg = config_mod.apply(cfg, {k: v for k, v in given.items() if v is not None and v != []})
    cfg = config_mod.apply(cfg, config_mod.parse_sets(sets))
    clash = sorted(set(search.grid) & set(config_mod.parse_grid(grid)))
    if clash:
        raise RaydgError(f"--grid repeats keys of the config file's grid: {clash}")
    search.grid.update(config_mod.parse_grid(grid))
    if need_search and not search:
        raise RaydgError(f"sweep file {config_file!r} defines no grid and no random search "
                         "(keys 'grid' and 'random'); use raydg run for a single setting")
    run_experiment(cfg, search, out=click.echo)


@cli.command()
@click.argument("dataset", required=False)
@click.option("--config", "config_file", type=click.Path(), help="YAML file of config keys.")
@run_options
def run(dataset: str | None, config_file: str | None, sets: tuple[str, ...],
        grid: tuple[str, ...], seeds: tuple[int, ...], **options: Any) -> None:
    """Train on the source domains of DATASET and evaluate on the held-out domain(s)."""
    _experiment(config_file, {**options, "dataset": dataset, "seeds": list(seeds)}, sets, grid,
                need_search=False)


@cli.command()
@click.argument("sweep_file", type=click.Path())
@run_options
def sweep(sweep_file: str, sets: tuple[str, ...], grid: tuple[str, ...],
          seeds: tuple[int, ...], **options: Any) -> None:
    """Run the search of SWEEP_FILE (config keys plus 'grid' and/or 'random') over every target
    and seed; select hyper-parameters per target by training-domain validation."""
    _experiment(sweep_file, {**options, "seeds": list(seeds)}, sets, grid, need_search=True)


@cli.command()
@click.argument("target")
@click.option("--tracking-uri", help="MLflow store of the run, when TARGET is a run id.")
def resume(target: str, tracking_uri: str | None) -> None:
    """Continue an interrupted experiment: TARGET is its folder (printed at its start and when
    it stops) or its MLflow parent run id. Finished federations are kept, the others continue
    from their last checkpoints, into the same MLflow run."""
    from raydg.experiment import resume_target, run_experiment

    run_experiment(config_mod.RunConfig(), out=click.echo,
                   resume=resume_target(target, tracking_uri))


@cli.group()
def data() -> None:
    """Download and check the datasets that live under a data root."""


def _root(data_root: str | None) -> Path:
    root = data_root or os.environ.get(DATA_ROOT_ENV)
    if not root:
        raise RaydgError(f"pass --data-root DIR or set {DATA_ROOT_ENV}")
    return Path(root).expanduser()


@data.command("download")
@click.argument("name")
@click.option("--data-root", help="Root folder of the datasets (or RAYDG_DATA_ROOT).")
def data_download(name: str, data_root: str | None) -> None:
    """Fetch NAME from its canonical source (resumable), verify, extract and check it."""
    from raydg.datasets.manage import download

    root = _root(data_root)
    download(name, root, click.echo)
    click.echo(f"{name}: ready under {root}")


@data.command("check")
@click.argument("name")
@click.option("--data-root", help="Root folder of the datasets (or RAYDG_DATA_ROOT).")
@click.pass_context
def data_check(ctx: click.Context, name: str, data_root: str | None) -> None:
    """Verify an existing copy of NAME: layout, every image readable, per-domain counts.
    Exits with 1 and lists every problem if anything is wrong."""
    from raydg.datasets.manage import check

    root = _root(data_root)
    if not root.is_dir():
        raise RaydgError(f"data root {str(root)!r} does not exist")
    problems = check(name, root, click.echo)
    for p in problems:
        click.echo(f"problem: {p}", err=True)
    if problems:
        ctx.exit(1)
    click.echo(f"{name}: OK")


@cli.command("list")
@click.argument("what", type=click.Choice(["methods", "datasets", "models"]))
def list_cmd(what: str) -> None:
    """List the registered methods, datasets or models."""
    if what == "methods":
        for name, cls in METHODS:
            aliases = METHODS.aliases(name)
            also = f" (also {', '.join(aliases)})" if aliases else ""
            opts = ", ".join(f"options.{k}={v!r}" for k, v in vars(cls.Options()).items())
            click.echo(f"{name}{also}: {cls.paper}" + (f"; {opts}" if opts else ""))
    elif what == "datasets":
        for name, spec in DATASETS:
            click.echo(f"{name}: {spec.description}; domains: {', '.join(spec.domains)}")
    else:
        from raydg.models import MODELS

        for name, build in MODELS:
            click.echo(f"{name}: {(build.__doc__ or '').strip().splitlines()[0]}")


def main() -> None:
    cli(prog_name="raydg")
