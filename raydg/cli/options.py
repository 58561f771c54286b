"""The options of ``raydg run`` and ``raydg sweep``, grouped under headings in ``--help``."""

from __future__ import annotations

from typing import Any, get_args

import click

from raydg.config_types import LrSchedule, Placement, TrainTransform

DATA_ROOT_ENV = "RAYDG_DATA_ROOT"  # as raydg.datasets, which the help need not import
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


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
    click.option("--lr-schedule", type=click.Choice(get_args(LrSchedule)),
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
    click.option("--placement", type=click.Choice(get_args(Placement)),
                 help="A federation's actors on few nodes or many. [default: pack]"),
    click.option("--data-root", help="Root folder of the image datasets. [default: "
                                     "$RAYDG_DATA_ROOT]"),
    click.option("--train-transform", type=click.Choice(get_args(TrainTransform)),
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

