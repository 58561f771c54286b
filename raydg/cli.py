"""Command line: ``raydg run``, ``sweep``, ``resume``, ``report``, ``data download|check`` and
``list``. Importing it imports neither torch nor Ray: ``--help`` and ``list`` answer at once.

Precedence of settings: built-in defaults < dataset defaults < ``--config`` YAML
< command-line options < ``--set``.
Bad input prints one ``raydg: error: ...`` line and exits with code 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from raydg import config as config_mod
from raydg.errors import EmptyResult, RaydgError, TrackingError

DATA_ROOT_ENV = "RAYDG_DATA_ROOT"  # as raydg.datasets, which the help need not import


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # in a checkout of raydg


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
        except EmptyResult as err:
            click.echo(f"raydg: {err}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt as err:
            from raydg.signals import TERMINATED, stop_recorded

            recorded = stop_recorded()  # the hint is printed already
            click.echo(f"raydg: interrupted{f' ({err})' if str(err) else ''}", err=True)
            directory = getattr(err, "experiment_dir", None)
            if directory and not recorded:
                click.echo(f"raydg: continue with: raydg resume {directory}", err=True)
            ctx.exit(143 if TERMINATED.is_set() else 130)


class GroupedCommand(click.Command):
    """A command whose options are listed under headings (``OPTION_GROUPS``)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                group = next((g for g, names in OPTION_GROUPS.items() if param.name in names),
                             "Other")
                rows.setdefault(group, []).append(record)
        for group in [*OPTION_GROUPS, "Other"]:
            if group in rows:
                with formatter.section(group):
                    formatter.write_dl(rows[group])


OPTION_GROUPS = {
    "Protocol": ("method", "augment", "aggregation", "plugins", "target", "clients", "dirichlet",
                 "client_size", "sample", "seeds", "config_file", "sets", "grid"),
    "Training": ("rounds", "local_steps", "lr", "lr_schedule", "batch_size", "equal_compute",
                 "model", "image_size", "pretrained", "weights", "train_transform",
                 "eval_local", "validate_clients", "validate_every"),
    "Resources": ("actors", "cpus_per_actor", "gpus_per_actor", "max_concurrent", "placement",
                  "address", "dashboard", "storage"),
    "Data": ("data_root", "skip_bad_images", "cache", "cache_dir"),
    "Tracking and output": ("tracking_uri", "experiment", "quiet"),
}
DATASET_DEFAULT = "the dataset's: {digits} for the digits, {images} for the image datasets"


@click.group(cls=Cli, context_settings=CONTEXT)
@click.version_option(package_name="raydg")
def cli() -> None:
    """raydg: parallel simulation of federated domain generalization on Ray."""


RUN_OPTIONS = [
    click.option("--method", "-m", help="Method (raydg list methods). [default: the config "
                                        "file's, else fedavg]"),
    click.option("--augment", help="Add an augmentation method to the method, e.g. ccst."),
    click.option("--aggregation", help="Replace the method's aggregation weights by an "
                                       "aggregation rule, e.g. ga (FedDG-GA)."),
    click.option("--plugin", "plugins", multiple=True, metavar="MODULE_OR_FILE",
                 help="Load methods, datasets or models from this module or .py file "
                      "(repeatable; installed packages' raydg entry points load by "
                      "themselves)."),
    click.option("--target", help="Held-out domain, or all: one federation per domain. "
                                  "[default: all]"),
    click.option("--clients", type=int, help="Split the source domains into N clients. "
                                             "[default: one per source domain]"),
    click.option("--dirichlet", type=float, help="Dirichlet alpha of each domain's label "
                                                 "split. [default: label-iid]"),
    click.option("--client-size", type=int, metavar="S",
                 help="Each client draws S samples of its domain (clients may share samples: "
                      "a cross-device population). [default: the domain split among clients]"),
    click.option("--sample", type=int, help="Clients per round. [default: all if N <= 10, "
                                            "else 10]"),
    click.option("--rounds", type=int, help="Communication rounds. [default: "
                 + DATASET_DEFAULT.format(digits=10, images=40) + "]"),
    click.option("--local-steps", type=int, help="Local SGD steps per round. [default: "
                 + DATASET_DEFAULT.format(digits=20, images=200) + "]"),
    click.option("--lr", type=float, help="Learning rate. [default: "
                 + DATASET_DEFAULT.format(digits=0.05, images=0.01) + "]"),
    click.option("--lr-schedule", type=click.Choice(["constant", "cosine"]),
                 help="Learning rate over the rounds. [default: constant]"),
    click.option("--equal-compute", metavar="METHOD",
                 help="Add rounds that give the method's clients the local steps that "
                      "METHOD's setup takes (e.g. csac's acquisition)."),
    click.option("--batch-size", type=int, help="Local batch size. [default: "
                 + DATASET_DEFAULT.format(digits=32, images=64) + "]"),
    click.option("--seed", "seeds", type=int, multiple=True,
                 help="Seed; repeat for several. [default: 0]"),
    click.option("--model", help="Backbone (raydg list models). [default: "
                 + DATASET_DEFAULT.format(digits="cnn", images="resnet18") + "]"),
    click.option("--image-size", type=int, help="Side of the square images. [default: "
                 + DATASET_DEFAULT.format(digits=16, images=224) + "]"),
    click.option("--pretrained/--no-pretrained", default=None,
                 help="Start the ResNet from ImageNet weights. [default: on for the image "
                      "datasets, off for the digits]"),
    click.option("--weights", metavar="FILE|glyphs|glyphs-neutral",
                 help="Start the backbone from a state-dict file (torchvision format for the "
                      "ResNets) or from raydg's offline pretraining: glyphs, or "
                      "glyphs-neutral (no inverted ink, stripes, noise or rotations)."),
    click.option("--validate-clients", metavar="all|sampled|K",
                 help="Who validates each round's model for model selection: every client, "
                      "the round's sampled ones, or K drawn per round. [default: all]"),
    click.option("--validate-every", type=int, metavar="R",
                 help="Validate every R rounds (and the last). [default: 1]"),
    click.option("--actors", type=int, help="Client actors per federation. [default: the "
                                            "cluster's CPUs shared among running federations]"),
    click.option("--cpus-per-actor", type=float, help="CPUs per client actor. [default: 1]"),
    click.option("--gpus-per-actor", type=float,
                 help="GPUs per client actor, fractional, e.g. 0.25. [default: 0]"),
    click.option("--max-concurrent", type=int,
                 help="Federations at once. [default: as many as the cluster holds]"),
    click.option("--placement", type=click.Choice(["pack", "spread"]),
                 help="A federation's actors on few nodes or many. [default: pack]"),
    click.option("--data-root", help="Root folder of the image datasets. [default: "
                                     "$RAYDG_DATA_ROOT]"),
    click.option("--train-transform", type=click.Choice(
        ["none", "flip", "flip-jitter", "crop-flip", "domainbed"]),
        help="Training augmentation per image; domainbed is DomainBed's. [default: none]"),
    click.option("--skip-bad-images", is_flag=True, default=None,
                 help="Skip (and count) unreadable images instead of stopping."),
    click.option("--cache/--no-cache", default=None,
                 help="Decode image files once into the cache. [default: on]"),
    click.option("--cache-dir",
                 help="Decoded-image cache. [default: $RAYDG_CACHE or ~/.cache/raydg]"),
    click.option("--eval-local/--no-eval-local", default=None,
                 help="Also report in-federation accuracy with local statistics."),
    click.option("--tracking-uri", help="MLflow store. [default: $MLFLOW_TRACKING_URI or "
                                        "sqlite:///mlflow.db]"),
    click.option("--experiment", help="MLflow experiment. [default: the dataset]"),
    click.option("--storage", help="Trials' results and checkpoints: a folder or a URI such as "
                                   "s3://bucket/path. [default: $RAYDG_STORAGE or "
                                   "./raydg-results]"),
    click.option("--address", help="Ray cluster to join: HOST:PORT or auto; or local: a fresh "
                                   "Ray on this machine even where RAY_ADDRESS is set. "
                                   "[default: a local Ray, or $RAY_ADDRESS]"),
    click.option("--dashboard", is_flag=True, default=None,
                 help="Start the local Ray with all its processes and its dashboard (a web UI "
                      "of the trials and actors), which a local run leaves out."),
    click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                 help="Any config key, e.g. --set options.mu=0.1 (repeatable)."),
    click.option("--grid", "grid", multiple=True, metavar="KEY=V1,V2",
                 help="Search a config key over values, e.g. --grid lr=0.01,0.02 (repeatable: "
                      "every combination)."),
    click.option("--quiet", "-q", is_flag=True,
                 help="Print only the tables (and warnings), no progress."),
]

EXAMPLES = """Examples:

\b
  raydg run digits-style --method fedbn --seed 0 --seed 1 --seed 2
  raydg run --config configs/fedfd-a-pacs.yaml --data-root ~/data --gpus-per-actor 0.25
  raydg run digits-rot --method fedprox --grid options.mu=0.01,0.1 --target M30
  raydg run digits-style --method fedfd-a --weights glyphs
  raydg sweep configs/sweeps/fedprox-digits-style.yaml
  raydg resume raydg-results/digits-style-fedavg-20261123-101500-1a2b3c4d
  raydg report --dataset digits-style --versus fedavg --format markdown
"""


def run_options(command: Any) -> Any:
    for option in reversed(RUN_OPTIONS):
        command = option(command)
    return command


def _progress(quiet: bool) -> str:
    """How progress is shown: a live board of running federations on a terminal, plain lines
    elsewhere (CI, log files), nothing with --quiet."""
    import sys

    return "none" if quiet else "live" if sys.stdout.isatty() else "lines"


def _experiment(config_file: str | None, given: dict[str, Any], sets: tuple[str, ...],
                grid: tuple[str, ...], need_search: bool, quiet: bool) -> None:
    """Config file < command-line options < ``--set``; the file's search and ``--grid``."""
    from raydg import api

    cfg, search = config_mod.RunConfig(), config_mod.Search()
    if config_file:
        values, search = config_mod.split_search(config_mod.load_yaml(config_file))
        cfg = config_mod.apply(cfg, values)
    cfg = config_mod.apply(cfg, {k: list(v) if isinstance(v, tuple) else v
                                 for k, v in given.items() if v not in (None, [], ())})
    cfg = config_mod.apply(cfg, config_mod.parse_sets(sets))
    search = config_mod.extend_search(search, config_mod.parse_grid(grid), "--grid")
    if need_search and not search:
        raise RaydgError(f"sweep file {config_file!r} defines no grid and no random search "
                         "(keys 'grid' and 'random'); use raydg run for a single setting")
    api.run(config=cfg, search=search, out=click.echo, progress=_progress(quiet))


@cli.command(cls=GroupedCommand, context_settings=CONTEXT, epilog=EXAMPLES)
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


@cli.command(cls=GroupedCommand, context_settings=CONTEXT)
@click.argument("sweep_file", type=click.Path())
@run_options
def sweep(sweep_file: str, sets: tuple[str, ...], grid: tuple[str, ...],
          seeds: tuple[int, ...], quiet: bool, **options: Any) -> None:
    """Run the search of SWEEP_FILE (config keys plus 'grid' and/or 'random') over every target
    and seed; select hyper-parameters per target by training-domain validation."""
    _experiment(sweep_file, {**options, "seeds": list(seeds)}, sets, grid, need_search=True,
                quiet=quiet)


@cli.command(context_settings=CONTEXT)
@click.argument("target")
@click.option("--tracking-uri", help="MLflow store of the run: where to look up TARGET when it "
                                     "is a run id, and where the experiment's runs are now "
                                     "when the store has moved. [default: the experiment's]")
@click.option("--quiet", "-q", is_flag=True, help="Print only the tables, no progress.")
def resume(target: str, tracking_uri: str | None, quiet: bool) -> None:
    """Continue an interrupted experiment: TARGET is its folder (printed at its start and when
    it stops) or its MLflow parent run id. Finished federations are kept, the others continue
    from their last checkpoints, into the same MLflow run."""
    from raydg.experiment import resume_target, run_experiment

    run_experiment(config_mod.RunConfig(tracking_uri=tracking_uri), out=click.echo,
                   progress=_progress(quiet), resume=resume_target(target, tracking_uri))


@cli.command(context_settings=CONTEXT)
@click.option("--experiment", "experiments", multiple=True,
              help="MLflow experiment (repeatable). [default: all]")
@click.option("--dataset", help="Only runs on this dataset.")
@click.option("--method", "methods", multiple=True,
              help="Only this method, as reported, e.g. fedbn+ccst-pixel (repeatable).")
@click.option("--filter", "filter_string", default="",
              help="MLflow search filter on the runs, e.g. \"params.rounds = '40'\".")
@click.option("--selection", type=click.Choice(["selected", "last", "oracle"]),
              help="Model selection. [default: selected (training-domain validation), or the "
                   "paper's with --paper]")
@click.option("--format", "fmt", type=click.Choice(["console", "markdown", "latex", "csv",
                                                    "json"]), default="console",
              show_default=True, help="Text tables (console, markdown, latex), or their records "
                                      "as data (csv, json).")
@click.option("--output", "-o", type=click.Path(), help="Write the report to this file.")
@click.option("--versus", metavar="METHOD",
              help="Add the paired difference to METHOD with its 95% interval over seeds.")
@click.option("--ledger", is_flag=True, help="Add bytes per round and what is shared.")
@click.option("--timing", is_flag=True, help="Add the wall time per round.")
@click.option("--paper", type=click.Path(), metavar="CONFIG",
              help="Print the published numbers of this paper config beside the measured.")
@click.option("--plot", type=click.Path(), metavar="FILE.png",
              help="Draw accuracy per round: one panel per target, one line per method.")
@click.option("--per-round", "per_round", multiple=True, metavar="METRIC",
              help="Add METRIC per round (e.g. val_acc, csac/alignment), mean over domains "
                   "and seeds (repeatable).")
@click.option("--metric", "metrics", multiple=True, metavar="METRIC",
              help="Add a column: the mean over each method's runs of this final metric, e.g. "
                   "final/fedfd-a/target_alpha/features.1 (repeatable).")
@click.option("--tracking-uri", help="MLflow store. [default: $MLFLOW_TRACKING_URI or "
                                     "sqlite:///mlflow.db]")
@click.option("--rows", "rows_files", multiple=True, type=click.Path(exists=True,
              dir_okay=False), metavar="FILE.json.gz",
              help="Read the runs from this file written by --export, not from a store "
                   "(repeatable).")
@click.option("--export", "export_to", metavar="FILE.json.gz",
              help="Also write the matching runs (params, metrics, histories) to this file, "
                   "which --rows reads back.")
def report(experiments: tuple[str, ...], dataset: str | None, methods: tuple[str, ...],
           filter_string: str, selection: str | None, fmt: str, output: str | None,
           versus: str | None, ledger: bool, timing: bool, paper: str | None,
           plot: str | None, per_round: tuple[str, ...], metrics: tuple[str, ...],
           tracking_uri: str | None, rows_files: tuple[str, ...], export_to: str | None) -> None:
    """Print a paper's table from the runs in the MLflow store (or runs files): methods x
    held-out domains, mean +- std over seeds. Runs that differ in other settings are never
    averaged together."""
    from raydg import report as report_mod

    for flag, path in (("--output", output), ("--export", export_to), ("--plot", plot)):
        _writable(flag, path)  # before any work
    published = None
    if paper:  # the paper's dataset and model selection unless others are asked for
        values = config_mod.load_yaml(paper)
        published = config_mod.paper_numbers(values, paper)
        dataset = dataset or values.get("dataset")
        selection = selection or published["selection"]
    try:
        client = _runs_source(tracking_uri, rows_files, ledger)
    except EmptyResult:
        if published is None:
            raise
        client = None
    if published is not None and (client is None or not report_mod.find_runs(
            client, experiments, dataset, methods, filter_string)):
        click.echo(report_mod.published_table(published, fmt))
        click.echo("raydg: no runs match: the published numbers alone", err=True)
        return
    if export_to:
        count = report_mod.export(client, Path(export_to), _about(), experiments=experiments,
                                  dataset=dataset, methods=methods, filter_string=filter_string)
        click.echo(f"raydg: {count} runs written to {export_to}", err=True)
    text, notes = report_mod.report(
        client, experiments=experiments, dataset=dataset, methods=methods,
        filter_string=filter_string, selection=selection or "selected", fmt=fmt, baseline=versus,
        ledger=ledger, seconds=timing, paper=published, plot=Path(plot) if plot else None,
        per_round=per_round, metrics=metrics)
    for note in notes:  # on stderr, apart from the data
        click.echo(f"raydg: {note}", err=True)
    if output:
        Path(output).write_text(text + "\n")
        click.echo(f"raydg: report written to {output}")
    else:
        click.echo(text)


def _writable(flag: str, value: str | None) -> None:
    """Refuse an output file that cannot be written (its folder is made if missing)."""
    if value is None:
        return
    import tempfile

    path = Path(value).expanduser()
    if path.is_dir():
        raise RaydgError(f"cannot write {flag} {value}: it is a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):  # a probe: permissions alone can lie
            pass
    except OSError as err:
        raise RaydgError(f"cannot write {flag} {value}: {err.strerror}") from None


def _runs_source(tracking_uri: str | None, rows_files: tuple[str, ...], ledger: bool) -> Any:
    """The MLflow store, or the runs files that stand for one."""
    if not rows_files:
        from mlflow import MlflowClient

        from raydg.tracking import tracking_uri as store_uri

        uri = store_uri(config_mod.RunConfig(tracking_uri=tracking_uri))
        path = Path(uri.removeprefix("sqlite:///"))
        if uri.startswith("sqlite:///") and not path.is_file():  # MLflow would create one
            raise EmptyResult(f"no MLflow store at {path} (runs write one there; "
                              "--tracking-uri or MLFLOW_TRACKING_URI names another)")
        return MlflowClient(uri)
    if tracking_uri:
        raise RaydgError("--rows reads runs files instead of a store: drop --tracking-uri")
    if ledger:
        raise RaydgError("--ledger reads the runs' artifacts, which a runs file does not hold")
    from raydg.rows import StoredRuns

    return StoredRuns([Path(f) for f in rows_files])


def _about() -> dict[str, str]:
    """What an exported runs file records of its making."""
    import datetime
    import platform
    import sys

    return {"command": " ".join(["raydg", *sys.argv[1:]]),
            "exported": datetime.date.today().isoformat(), "machine": platform.node()}


@cli.group(context_settings=CONTEXT)
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


@cli.command(context_settings=CONTEXT)
@click.option("--gpus", default=0, show_default=True,
              help="GPUs torch must see here; with any, the round's client actors use them.")
def doctor(gpus: int) -> None:
    """Print what this node offers raydg (Python, glibc, torch and its CUDA, the GPUs torch
    sees, the NVIDIA driver, Ray) and run one round of FedAvg on the embedded digits on a
    fresh Ray of this node alone. jobs/smoke.sh runs it on each node type of a cluster."""
    from raydg.doctor import doctor as check

    check(gpus, click.echo)


@cli.group(context_settings=CONTEXT)
def store() -> None:
    """Back up an MLflow SQLite store to a folder or bucket, and restore it (a cluster's
    tracking store outlives the cluster this way)."""


@store.command("backup")
@click.argument("db", type=click.Path(path_type=Path))
@click.argument("destination")
@click.option("--keep", default=10, show_default=True, help="Backups to keep in DESTINATION.")
def store_backup(db: Path, destination: str, keep: int) -> None:
    """Write a consistent snapshot of the SQLite store DB (safe while a server writes it) to
    DESTINATION, a folder or a URI such as s3://bucket/mlflow-backups."""
    from raydg.store_backup import backup

    click.echo(f"backed up {db} to {backup(db, destination, keep)}")


@store.command("restore")
@click.argument("source")
@click.argument("db", type=click.Path(path_type=Path))
def store_restore(source: str, db: Path) -> None:
    """Put the newest backup in SOURCE at DB (which must not exist); nothing to do when
    SOURCE holds no backup yet."""
    from raydg.store_backup import restore

    found = restore(source, db)
    click.echo(f"restored {db} from {found}" if found else f"no backup in {source}: {db} "
               "starts empty")


@cli.command("list", context_settings=CONTEXT)
@click.argument("what", type=click.Choice(["methods", "datasets", "models", "configs"]))
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE_OR_FILE",
              help="Also list what this module or .py file registers (repeatable).")
def list_cmd(what: str, plugins: tuple[str, ...]) -> None:
    """List the registered methods, datasets or models (each with its origin: built-in, or
    the plugin that registered it), or the ready-made configs."""
    from raydg.plugins import load

    load(plugins)
    if what == "configs":
        for path in sorted([*CONFIGS.glob("*.yaml"), *CONFIGS.glob("sweeps/*.yaml")]):
            first = next((line.lstrip("# ").strip() for line in path.read_text().splitlines()
                          if line.startswith("#")), "")
            click.echo(f"{path.relative_to(CONFIGS.parent)}: {first}")
    elif what == "methods":
        from raydg.methods import METHODS

        for name, cls in METHODS:
            aliases = METHODS.aliases(name)
            also = f" (also {', '.join(aliases)})" if aliases else ""
            opts = ", ".join(f"options.{k}={v!r}" for k, v in vars(cls.Options()).items())
            role = (" [composes: --augment]" if cls.augmentation else
                    " [composes: --aggregation]" if cls.aggregation else "")
            click.echo(f"{name}{also}{role} [{METHODS.origin(name)}]: {cls.paper}"
                       + (f"; {opts}" if opts else ""))
    elif what == "datasets":
        from raydg.datasets import DATASETS

        for name, spec in DATASETS:
            click.echo(f"{name} [{DATASETS.origin(name)}]: {spec.description}; domains: "
                       f"{', '.join(spec.domains)}")
    else:
        from raydg.models import MODELS

        for name, build in MODELS:
            click.echo(f"{name} [{MODELS.origin(name)}]: "
                       f"{(build.__doc__ or '').strip().splitlines()[0]}")


EXPERIMENTS = ("run", "sweep", "resume", "doctor")  # the commands that start Ray


def _record_stop(running: dict[str, str]) -> None:
    """Record the stop of an experiment whose process ended on SIGTERM before it could (Ray's
    driver ended it): ``running`` is what it told :func:`raydg.signals.detached`'s parent.
    Imports no more than MLflow: a scheduler's SIGKILL comes a few seconds after SIGTERM."""
    from raydg.signals import say_stopped
    from raydg.tracking import end_stopped

    try:
        end_stopped(running["tracking_uri"], running["run_id"])
    except Exception as err:  # said, not swallowed: the runs stay as the store has them
        click.echo(f"raydg: error: the runs of MLflow run {running['run_id']} could not be "
                   f"marked KILLED: {type(err).__name__}: {err}", err=True)
    say_stopped(running["experiment_dir"])


def main() -> None:
    """The ``raydg`` command; one that runs an experiment does so in a session of its own
    (:func:`raydg.signals.detached`), so that a signal to the caller's process group reaches
    raydg but not its Ray."""
    if len(sys.argv) > 1 and sys.argv[1] in EXPERIMENTS:
        from raydg.signals import detached

        detached(lambda: cli(prog_name="raydg"), _record_stop)
    cli(prog_name="raydg")
