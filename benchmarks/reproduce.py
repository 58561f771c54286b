"""Reproduce CSAC Table 3 (Rotated MNIST): its four rows under configs/csac-rotmnist.yaml.

Three steps, each a command:

1. Run the rows (any machine, any number of times; raydg's own concurrency):
     raydg run --config configs/csac-rotmnist.yaml --method M --experiment rotmnist-csac
   for M in deepall, fedavg, elcfs, csac (``--seed S`` / ``--target T`` for a part); any
   other method (``jobs/csac-tables.sh --others``) goes into the same rows file, and
   ``benchmarks/fidelity.py page`` prints it in docs/fidelity.md (the real-data regime).
2. ``export``: the finished federations of that MLflow experiment -> per-run rows, merged into
   the committed rows file (rows already there are kept; a federation already there that ran
   on another machine goes to the repeats file, which the page compares with its row; a run
   of another protocol is refused, unless it is named as a variant, ``--variant model=cnn``:
   the protocol with that key changed, labelled so on the page; the BN methods' runs on
   ``model=mnist-cnn-bn`` are exported so, FedAvg's on that model too;
   ``--variant dataset=rotmnist-ccw``: the digits turned the other way;
   ``--variant dataset=rotmnist-redraw``: another 1,000 digits).
3. ``page``: the rows file -> docs/reproduction.md (regenerated, never edited by hand; a test
   checks that the committed page is what this prints from the committed rows). The same rows
   are docs/fidelity.md's real-data regime: ``python benchmarks/fidelity.py page`` after it.

``todo`` prints the ``raydg run`` commands of the paper's rows, targets and seeds that the rows
file still lacks (one per method and target), to finish the table over several machines or
sessions; ``todo --design-r TIER`` those of design R (below). ``run --design-r TIER`` runs
design R's missing federations one after the other, each exported into the rows file as it
finishes (so a stopped run loses one federation at most, and starting it again continues).
With ``--at-once N --address A`` it runs one ``raydg run`` per method and target, N at a time,
on the Ray cluster at A: on one GPU machine, ``ray start --head --num-gpus 1``, then
``--at-once 24 --address auto --gpus-per-actor 0.03`` (a federation's client actor and its
driver take 0.06 of the GPU: 16 federations at a time, Ray queues the others).

Run:  python benchmarks/reproduce.py export --tracking-uri URI [--experiment rotmnist-csac]
          [--variant KEY=VALUE ...]
      python benchmarks/reproduce.py page [--check]
      python benchmarks/reproduce.py todo [--design-r 1|2]
      python benchmarks/reproduce.py run --design-r 1|2 --tracking-uri URI
          [--at-once N --address A [--gpus-per-actor G]]
"""

from __future__ import annotations

import argparse
import functools
import shlex
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from raydg import config as config_mod
from raydg.config_files import load_yaml
from raydg.reporting.design import Comparison, Design
from raydg.reporting.paper import paper_numbers, paper_targets
from raydg.reporting.reproduction import Goal, page, to_run
from raydg.reporting.reproduction_rows import (
    COMPOSED,
    export_rows,
    federation,
    merge,
    on_machine,
    read_rows,
    repeats,
    row_label,
    write_rows,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = Path("configs/csac-rotmnist.yaml")
ROWS = Path("docs/reproduction-rows/csac-rotmnist.csv")
REPEATS = Path("docs/reproduction-rows/csac-rotmnist-repeats.csv")  # federations run again
PAGE = Path("docs/reproduction.md")
NAMES = {"deepall": "DeepAll*", "fedavg": "FedAvg*", "elcfs": "FedDG* (elcfs)", "csac": "CSAC*"}
# the goals: every row's Avg within 1.0 point (FedDG* 2.0), every cell within 2.5
GOALS = {m: Goal(2.0 if m == "elcfs" else 1.0, 2.5) for m in NAMES}
EXPERIMENT = "rotmnist-csac"  # the MLflow experiment the rows are run into and exported from
BN = "model=mnist-cnn-bn"  # the variant that the methods acting on BN layers run under
# Design R (issue 57), written down before any of its runs: raydg's other methods on Table 3's
# protocol unchanged (40 rounds of 70 steps), on the two targets that carry 82-88 % of every
# row's Avg difference to FedAvg (M0, M75; M15-M60 sit at 98.3-99.6 % for every row), seeds
# 0-2. The methods acting on BN layers run on mnist-cnn-bn beside FedAvg on that model (a
# variant, labelled so); the others on the paper's mnist-cnn beside the FedAvg* rows. Per
# method, the analysis fixed in advance: its paired difference to its FedAvg over seeds on the
# mean of M0 and M75 with a 95 % t-interval, at the selected round (training-domain
# validation; the oracle round beside it), and the seed papers' claim that it tests
# (DESIGN_R_CLAIMS). Tier 1 first (every method but fedfd and fedfd-a), cheapest first.
DESIGN_R_TARGETS, DESIGN_R_SEEDS = ("M0", "M75"), (0, 1, 2)
DESIGN_R = (  # (row label, its raydg run options, variant), in the order they run
    ("fedprox", "--method fedprox", ""),
    ("fedgma", "--method fedgma", ""),
    ("fedavg+ga", "--method fedavg --aggregation ga", ""),
    ("fedsr", "--method fedsr", ""),
    ("ccst-pixel", "--method ccst", ""),
    ("fedavg", "--method fedavg --model mnist-cnn-bn", BN),
    ("fedbn", "--method fedbn --model mnist-cnn-bn", BN),
    ("silobn", "--method silobn --model mnist-cnn-bn", BN),
    ("gperxan", "--method gperxan --model mnist-cnn-bn", BN),
    ("fedfd [cafl_reduction=mean]", "--method fedfd --model mnist-cnn-bn", BN),  # tier 2
    ("fedfd-a [cafl_reduction=mean]", "--method fedfd-a --model mnist-cnn-bn", BN),
)
FD, FDA = "fedfd [cafl_reduction=mean]", "fedfd-a [cafl_reduction=mean]"
DESIGN_R_CLAIMS = (  # each row against its baseline (same variant), the claim it tests
    Comparison("fedprox", "", "fedavg", "", ">=", "FedFD-A Table 3a, CCST Table 1 baselines"),
    Comparison("fedgma", "", "fedavg", "", ">=", "FedGMA"),
    Comparison("fedavg+ga", "", "fedavg", "", ">=", "FedDG-GA Table 1"),
    Comparison("fedsr", "", "fedavg", "", ">=", "FedSR Tables 1-2"),
    Comparison("ccst-pixel", "", "fedavg", "", ">=",
               "CCST Table 1; the pixel coder, not the paper's VGG"),
    Comparison("fedbn", BN, "fedavg", BN, ">=", "FedBN; gPerXAN Table 2 baseline"),
    Comparison("silobn", BN, "fedavg", BN, "=",
               "SiloBN: running statistics unused on unseen domains"),
    Comparison("gperxan", BN, "fedbn", BN, ">=", "gPerXAN Tables 2-3"),
    Comparison(FD, BN, "fedavg", BN, ">=", "FedFD-A Table 5"),
    Comparison(FDA, BN, FD, BN, ">=", "FedFD-A Tables 1, 3c"),
)
DESIGN = Design(
    "Design R: raydg's other methods on Table 3's protocol",
    "Fixed before any of its runs (`benchmarks/reproduce.py`, `DESIGN_R`): the protocol "
    "unchanged, on the two targets that carry most of every row's difference to FedAvg (M0, "
    "M75), seeds 0-2; the methods acting on BatchNorm on `mnist-cnn-bn` (not the paper's "
    f"model, labelled `{BN}`) beside FedAvg on that model, the others on the paper's "
    "`mnist-cnn` beside FedAvg*. Each row: its paired difference to its baseline over the "
    "seeds both have, on the mean of M0 and M75, with a 95 % t-interval; a claim holds where "
    "the interval is above 0 (for SiloBN's `=`, where it holds 0). Judged once every seed is "
    "in (added after 20 of its tier-1 runs: two seeds can give an interval of width 0); "
    "before that the interval of the seeds so far is shown, not judged.",
    DESIGN_R_TARGETS, DESIGN_R_SEEDS, DESIGN_R_CLAIMS)


def render() -> str:
    """docs/reproduction.md from the committed rows and the paper config."""
    values = load_yaml(str(ROOT / CONFIG))
    paper = paper_numbers(values, str(CONFIG))
    return page(read_rows(ROOT / ROWS), paper, NAMES, GOALS, values["seeds"], str(ROWS),
                "python benchmarks/reproduce.py page", str(CONFIG), designs=[DESIGN],
                repeats=(_stored(REPEATS), str(REPEATS)))


def protocol(values: dict[str, object], variant: dict[str, str]
             ) -> Callable[[tuple[str | None, ...]], dict[str, str]]:
    """(method, augment, aggregation) -> every result-relevant MLflow param of the config
    with ``variant``'s settings applied, resolved for them."""
    from raydg.config import NOT_RESULTS, RunConfig
    from raydg.reporting.runs import ROW_KEYS
    from raydg.resolve import resolve
    from raydg.tracking.tracker import flat_params

    keys = {k: v for k, v in values.items() if k not in config_mod.FILE_SECTIONS}

    @functools.cache
    def expected(composed: tuple[str | None, ...]) -> dict[str, str]:
        named = dict(zip(COMPOSED, composed, strict=True))
        cfg = config_mod.apply(RunConfig(**{**keys, **named}),
                               config_mod.parse_sets([f"{k}={v}" for k, v in variant.items()]))
        params = flat_params(resolve(cfg))
        return {k: v for k, v in params.items() if k not in ROW_KEYS and k not in NOT_RESULTS
                and k != "method_options"}  # compared as the resolved options.* instead

    return expected


def todo() -> list[str]:
    """The ``raydg run`` commands that complete the paper's rows in the rows file."""
    values = load_yaml(str(ROOT / CONFIG))
    targets = paper_targets(paper_numbers(values, str(CONFIG)))
    return [f"raydg run --config {CONFIG} --method {method} --target {target} "
            + " ".join(f"--seed {s}" for s in lacking) + f" --experiment {EXPERIMENT}"
            for method, target, lacking in to_run(read_rows(ROOT / ROWS), list(NAMES),
                                                   targets, values["seeds"])]


def todo_design_r(tier: int) -> list[str]:
    """The ``raydg run`` commands of design R that the rows file lacks, one per federation,
    seed by seed in DESIGN_R's order (tier 1: every row but fedfd and fedfd-a; tier 2: all)."""
    have = {(row_label(r), *federation(r)[1:]) for r in read_rows(ROOT / ROWS)}
    design = DESIGN_R if tier == 2 else DESIGN_R[:-2]
    out = []
    for seed in DESIGN_R_SEEDS:
        for label, options, variant in design:
            experiment = EXPERIMENT + ("-bn" if variant else "")
            out += [f"raydg run --config {CONFIG} {options} --target {t} --seed {seed} "
                    f"--experiment {experiment}" for t in DESIGN_R_TARGETS
                    if (label, variant, t, seed) not in have]
    return out


def run_design_r(tier: int, tracking_uri: str) -> None:
    """Run design R's missing federations one by one, exporting each as it finishes."""
    while lines := todo_design_r(tier):
        command = shlex.split(lines[0])
        print(f"[{len(lines)} to run] {lines[0]}", flush=True)
        subprocess.run([sys.executable, "-m", "raydg", *command[1:], "--tracking-uri",
                        tracking_uri, "--quiet"], check=True)
        export(tracking_uri, *_experiment(command))


def merged(lines: list[str]) -> list[list[str]]:
    """``raydg run`` commands of one federation each, merged per method and target: one
    command with all their seeds, in the order the first of each comes."""
    seeds: dict[tuple[str, ...], list[str]] = {}
    for line in lines:
        words = shlex.split(line)
        at = words.index("--seed")
        seeds.setdefault((*words[:at], *words[at + 2:]), []).extend(words[at:at + 2])
    return [[*words, *more] for words, more in seeds.items()]


def store_for(tracking_uri: str, k: int) -> str:
    """The store of the ``k``-th run of several at once: a tracking server takes them all, a
    SQLite file is kept to one writer (a sibling file per run, ``mlflow-3.db``)."""
    if not tracking_uri.startswith("sqlite:///"):
        return tracking_uri
    path = Path(tracking_uri[len("sqlite:///"):])
    return "sqlite:///" + str(path.with_name(f"{path.stem}-{k}{path.suffix}"))


def run_at_once(tier: int, tracking_uri: str, at_once: int, address: str,
                gpus_per_actor: float) -> None:
    """Design R's missing federations on the Ray cluster at ``address`` (e.g. ``ray start
    --head`` on one GPU machine): one ``raydg run`` per method and target with its missing
    seeds, ``at_once`` of them at a time, one client actor per federation (any number gives
    the same result) with ``gpus_per_actor``; each run exported as it ends. Exits 1 after the
    others if a run failed."""
    def run(k: int, command: list[str]) -> str:
        print(f"[{k}] {shlex.join(command)}\n", end="", flush=True)  # one write per line
        store = store_for(tracking_uri, k)
        subprocess.run([sys.executable, "-m", "raydg", *command[1:], "--address", address,
                        "--actors", "1", "--gpus-per-actor", str(gpus_per_actor),
                        "--tracking-uri", store, "--quiet"], check=True)
        return store

    failed = []
    with ThreadPoolExecutor(at_once) as pool:
        runs = {pool.submit(run, k, c): c for k, c in enumerate(merged(todo_design_r(tier)))}
        for done in as_completed(runs):
            if done.exception():
                failed.append(f"{shlex.join(runs[done])}: {done.exception()}")
            else:
                export(done.result(), *_experiment(runs[done]))
    if failed:
        sys.exit("failed:\n" + "\n".join(failed))


def _experiment(command: list[str]) -> tuple[str, dict[str, str]]:
    """A design-R command's MLflow experiment and the variant its rows are exported as."""
    variant = dict([BN.split("=", 1)]) if "--model" in command else {}
    return command[command.index("--experiment") + 1], variant


def _stored(path: Path) -> list[dict[str, Any]]:
    """The committed rows file ``path`` (under the repository's root); none before its first
    export."""
    return read_rows(ROOT / path) if (ROOT / path).is_file() else []


def export(tracking_uri: str, experiment: str, variant: dict[str, str]) -> None:
    import dataclasses

    from mlflow import MlflowClient

    from raydg.config import RunConfig
    from raydg.reporting.runs import find_runs

    client = MlflowClient(tracking_uri)
    values = load_yaml(str(ROOT / CONFIG))
    runs = find_runs(client, [experiment], variant.get("dataset", values["dataset"]), [], "")
    parents: dict[str, str] = {}
    prints = {}
    for r in runs:
        parent = client.get_run(r.run_id).data.tags["mlflow.parentRunId"]
        if parent not in parents:
            parents[parent] = client.get_run(parent).data.tags.get("raydg.data.fingerprint", "")
        prints[r.run_id] = parents[parent]
    unlogged = {f.name: str(f.default) for f in dataclasses.fields(RunConfig)
                if f.default is not dataclasses.MISSING}
    new = export_rows(runs, protocol(values, variant), prints, variant, unlogged)
    old = _stored(ROWS)
    rows, again = merge(old, new), repeats(old, new)  # a repeat on other images: nothing written
    write_rows(ROOT / ROWS, rows)
    print(f"{ROWS}: {len(rows)} rows ({len(rows) - len(old)} new); regenerate the pages that "
          "show them: python benchmarks/reproduce.py page && python benchmarks/fidelity.py page")
    if again:
        write_rows(ROOT / REPEATS, merge(_stored(REPEATS), again, key=on_machine))
        print(f"{REPEATS}: {len(again)} federation{'s' * (len(again) > 1)} of the rows run "
              "again on another machine")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="MLflow runs -> the rows file")
    ex.add_argument("--tracking-uri", required=True)
    ex.add_argument("--experiment", default=EXPERIMENT)
    ex.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                    help="the runs are an ablation: the protocol with KEY set to VALUE")
    pg = sub.add_parser("page", help="the rows file -> docs/reproduction.md")
    pg.add_argument("--check", action="store_true",
                    help="exit 1 if the committed page differs from the regenerated one")
    td = sub.add_parser("todo", help="the runs that the paper's rows still lack, as commands")
    td.add_argument("--design-r", type=int, choices=(1, 2), metavar="TIER",
                    help="design R's runs instead (tier 1: all but fedfd, fedfd-a; 2: all)")
    rn = sub.add_parser("run", help="run design R's missing federations, exporting each")
    rn.add_argument("--design-r", type=int, choices=(1, 2), required=True, metavar="TIER")
    rn.add_argument("--tracking-uri", required=True)
    rn.add_argument("--at-once", type=int, default=1, metavar="N",
                    help="N runs at once on the Ray cluster at --address (default: one "
                         "federation after the other on a local Ray)")
    rn.add_argument("--address", help="the Ray cluster for --at-once, e.g. auto")
    rn.add_argument("--gpus-per-actor", type=float, default=0.0)
    args = parser.parse_args()
    if args.command == "run" and args.at_once > 1:
        if not args.address:
            parser.error("--at-once needs --address: a Ray cluster that every run joins")
        run_at_once(args.design_r, args.tracking_uri, args.at_once, args.address,
                    args.gpus_per_actor)
        return
    if args.command == "run":
        run_design_r(args.design_r, args.tracking_uri)
        return
    if args.command == "todo":
        lines = todo_design_r(args.design_r) if args.design_r else todo()
        print("\n".join(lines) or "the rows file holds the whole design")
        return
    if args.command == "export":
        export(args.tracking_uri, args.experiment,
               dict(v.split("=", 1) for v in args.variant))
        return
    text = render()
    if args.check:
        sys.exit(0 if (ROOT / PAGE).read_text() == text else 1)
    (ROOT / PAGE).write_text(text)
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
