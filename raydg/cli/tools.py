"""The commands around experiments: ``raydg report``, ``data``, ``doctor``, ``store``,
``list`` and ``schema``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from raydg import config as config_mod
from raydg.cli.options import CONTEXT, DATA_ROOT_ENV
from raydg.config_files import load_yaml, ready_made
from raydg.errors import EmptyResult, RaydgError


@click.command(context_settings=CONTEXT)
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
@click.option("--error", type=click.Choice(["std", "se"]), default="std", show_default=True,
              help="What ± is over seeds: the standard deviation, or the standard error "
                   "(std / sqrt(n), as DomainBed reports).")
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
@click.option("--tracking-uri", "tracking_uris", multiple=True,
              help="MLflow store (repeatable: several are read as one; a SQLite path may be a "
                   "glob, 'sqlite:///stores/*.db'). [default: $MLFLOW_TRACKING_URI or "
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
           error: str, versus: str | None, ledger: bool, timing: bool, paper: str | None,
           plot: str | None, per_round: tuple[str, ...], metrics: tuple[str, ...],
           tracking_uris: tuple[str, ...], rows_files: tuple[str, ...],
           export_to: str | None) -> None:
    """Print a paper's table from the runs in the MLflow store (or runs files): methods x
    held-out domains, mean +- std over seeds. Runs that differ in other settings are never
    averaged together."""
    from raydg.reporting import report as report_mod
    from raydg.reporting.paper import paper_numbers
    from raydg.reporting.runs import find_runs

    for flag, path in (("--output", output), ("--export", export_to), ("--plot", plot)):
        _writable(flag, path)  # before any work
    published = None
    if paper:  # the paper's dataset and model selection unless others are asked for
        values = load_yaml(paper)
        published = paper_numbers(values, paper, _domains(values.get("dataset")))
        dataset = dataset or values.get("dataset")
        selection = selection or published["selection"]
    try:
        client = _runs_source(tracking_uris, rows_files, ledger)
    except EmptyResult:
        if published is None:
            raise
        client = None
    if published is not None and (client is None or not find_runs(
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
        per_round=per_round, metrics=metrics, error=error)
    for note in notes:  # on stderr, apart from the data
        click.echo(f"raydg: {note}", err=True)
    if output:
        Path(output).write_text(text + "\n")
        click.echo(f"raydg: report written to {output}")
    else:
        click.echo(text)


def _domains(dataset: Any) -> tuple[str, ...] | None:
    """The domains of a paper config's registered ``dataset`` (None: it names none)."""
    if not isinstance(dataset, str):
        return None
    from raydg.datasets import DATASETS

    return DATASETS.get(dataset).domains


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


def _runs_source(tracking_uris: tuple[str, ...], rows_files: tuple[str, ...],
                 ledger: bool) -> Any:
    """The MLflow store (or stores, read as one), or the runs files that stand for one."""
    if not rows_files:
        from raydg.reporting.stores import Stores, open_stores
        from raydg.tracking.store import reading_client
        from raydg.tracking.store import tracking_uri as store_uri

        uris = [store_uri(config_mod.RunConfig(tracking_uri=u)) for u in tracking_uris or [None]]
        client = open_stores(uris, reading_client)
        if ledger and isinstance(client, Stores):
            raise RaydgError("--ledger reads one store's artifacts: name one --tracking-uri")
        return client
    if tracking_uris:
        raise RaydgError("--rows reads runs files instead of a store: drop --tracking-uri")
    if ledger:
        raise RaydgError("--ledger reads the runs' artifacts, which a runs file does not hold")
    from raydg.reporting.rows import StoredRuns

    return StoredRuns([Path(f) for f in rows_files])


def _about() -> dict[str, str]:
    """What an exported runs file records of its making."""
    import datetime
    import platform

    return {"command": " ".join(["raydg", *sys.argv[1:]]),
            "exported": datetime.date.today().isoformat(), "machine": platform.node()}


@click.group(context_settings=CONTEXT)
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
@click.option("--source", type=click.Choice(["hub", "original"]),
              help="hub: the dataset's Parquet mirror on the Hugging Face Hub at a pinned "
                   "revision ($HF_ENDPOINT sets the Hub's address); original: its canonical "
                   "archive (DomainBed's). [default: hub where there is a mirror, the original "
                   "if the mirror fails]")
def data_download(name: str, data_root: str | None, source: str | None) -> None:
    """Fetch NAME (resumable), verify, extract and check it."""
    from raydg.datasets.manage import download

    root = _root(data_root)
    download(name, root, click.echo, source)
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


@click.command(context_settings=CONTEXT)
@click.option("--gpus", default=0, show_default=True,
              help="GPUs torch must see here; with any, the round's client actors use them.")
def doctor(gpus: int) -> None:
    """Print what this node offers raydg (Python, glibc, torch and its CUDA, the GPUs torch
    sees, the NVIDIA driver, Ray) and run one round of FedAvg on the embedded digits on a
    fresh Ray of this node alone. jobs/smoke.sh runs it on each node type of a cluster."""
    from raydg.doctor import doctor as check

    check(gpus, click.echo)


@click.group(context_settings=CONTEXT)
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
    from raydg.tracking.backup import backup

    click.echo(f"backed up {db} to {backup(db, destination, keep)}")


@store.command("restore")
@click.argument("source")
@click.argument("db", type=click.Path(path_type=Path))
def store_restore(source: str, db: Path) -> None:
    """Put the newest backup in SOURCE at DB (which must not exist); nothing to do when
    SOURCE holds no backup yet."""
    from raydg.tracking.backup import restore

    found, skipped = restore(source, db)
    for line in skipped:
        click.echo(f"raydg: warning: {line}", err=True)
    click.echo(f"restored {db} from {found}" if found else f"no backup in {source}: {db} "
               "starts empty")


@click.command("list", context_settings=CONTEXT)
@click.argument("what", type=click.Choice(["methods", "datasets", "models", "configs"]))
@click.option("--plugin", "plugins", multiple=True, metavar="MODULE_OR_FILE",
              help="Also list what this module or .py file registers (repeatable).")
def list_cmd(what: str, plugins: tuple[str, ...]) -> None:
    """List the registered methods, datasets or models (each with its origin: built-in, or
    the plugin that registered it), or the ready-made configs."""
    from raydg.plugins import load

    load(plugins)
    if what == "configs":  # by the name that --config and raydg sweep take
        for name, path in ready_made().items():
            first = next((line.lstrip("# ").strip() for line in path.read_text().splitlines()
                          if line.startswith("#")), "")
            click.echo(f"{name}: {first}")
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




@click.command(context_settings=CONTEXT)
def schema() -> None:
    """Print the JSON Schema of a config file (for an editor's completion and checks)."""
    click.echo(json.dumps(config_mod.schema(), indent=1))
