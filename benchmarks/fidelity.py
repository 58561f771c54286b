"""Fidelity: does each seed method beat its baseline where its paper says it does?

Every method runs on every held-out domain of digits-style and digits-rot, with 5 seeds, in three
regimes: from scratch, from the offline ``glyphs`` pretraining (:mod:`raydg.pretrain`, the
analogue of the papers' ImageNet start), and from ``glyphs-neutral`` (``neutral``: the same
letters without the inverted ink, stripes, noise and rotations that resemble held-out domains'
styles), which tells whether a glyphs verdict rests on those styles. Each comparison uses the
protocol of the paper that claims it, one shared training setting (the digits defaults:
10 rounds x 20 local steps, lr 0.05, batch 32, the small CNN) and FedAvg run under the same
protocol:

* ``fedfd-a`` protocol (FedFD-A §4.1: client-side best-validation upload): fedavg, fedprox,
  fedbn, silobn, fedfd, fedfd-a; claims FedFD >= FedAvg and SiloBN, FedFD-A >= FedFD.
* ``last-upload`` protocol (CSAC, CCST, gPerXAN: clients upload their last weights): fedavg,
  FedAvg given CSAC's acquisition steps as extra rounds (``--equal-compute csac``), csac,
  ccst-pixel, elcfs (FedDG) alone and with ccst-pixel, gfedavg and gperxan; claims CSAC >=
  FedAvg at equal compute, CCST and FedDG >= FedAvg (CCST Table 1), CCST on top of FedDG
  (CCST Fig. 4b), gPerXAN >= FedAvg (its Tables 2-3) and >= gFedAvg with BN (its Table 4).
  The learning rate is constant for all (gPerXAN's paper gives no schedule; its code's cosine
  one is ``lr_schedule: cosine``, not used here so that every method shares one setting).
* ``feddg`` protocol (the FedDG baselines the seeds compare against; last upload, as FedDG-GA's
  and FedSR's code): fedavg, fedprox (mu 0.1, FedDG-GA's code), FedDG-GA's weights on both
  (``--aggregation ga``), fedsr, fedgma, amplitude mixing (ampmix), and the bounds deepall
  (centralized) and local (each client alone, evaluated as an ensemble); claims GA >= its base
  (FedDG-GA Table 1), FedSR, FedGMA and amplitude mixing >= FedAvg (their papers), and
  deepall >= FedAvg >= local (what a bound means).

FedFD-A's adapter is also tested against the fixed and random alpha of FedFD-A Table 3(c2): the
same fedfd-a runs evaluated in those inference modes (``fedfd-a [fixed]``, identical weights).
The claims of methods that exchange or mix styles (CCST, FedDG, amplitude mixing) are out of
scope on digits-rot, whose domains differ by rotation, not style: printed, labelled so, and
left out of the multiplicity family.

A method's own hyper-parameters are a small grid where the regime changes what they mean
(FedFD's CAFL reduction and warm-up, FedProx's mu, CSAC's frozen local projections); the
others keep their papers' values (CCST K = 3, gPerXAN lambda = 0.5). Per held-out domain, the
setting with the best mean source-validation accuracy over the seeds is kept (training-domain
validation), never the target accuracy. Each (dataset, regime, protocol) is one raydg
experiment, its federations concurrent Tune trials, tracked in MLflow and exported to a runs
file (:mod:`raydg.reporting.rows`) in ``docs/fidelity-rows/``.

A real-data regime sits beside them: ``rotmnist`` (real MNIST digits) under CSAC Table 3's
protocol (``configs/csac-rotmnist.yaml``), whose runs are the rows of docs/reproduction.md
(``docs/reproduction-rows/csac-rotmnist.csv``, written by ``benchmarks/reproduce.py export``):
the paper's four rows and raydg's other methods (``jobs/csac-tables.sh --others``; those acting
on BN layers, with a FedAvg beside them, on ``mnist-cnn-bn``, a regime of its own). Its claims
are those of the papers whose methods it runs (``csac-rotmnist`` among a claim's protocols),
tested once both sides have all the seeds; until then the page says what they wait for.

Statistics: 5 seeds for every method and claim, fixed before any run (the page refuses runs
files with different seeds: extend all or none). Per claim, the paired difference over seeds
(domain average per seed) with its 95 % t-interval is the headline; then the two-sided paired
t-test's p, Holm's adjustment over every in-scope claim on the page, and the verdicts at 0.05.

Run:  python benchmarks/fidelity.py run [--datasets ...] [--regimes ...] [--protocols ...]
          [--tracking-uri URI] [--resume FOLDER]
      python benchmarks/fidelity.py ablation NAME...   (configs/sweeps/NAME.yaml)
      python benchmarks/fidelity.py page [--check]
``page`` writes docs/fidelity.md and docs/fidelity-ablations.md (from its template) from the
runs files alone; ``run`` and ``ablation`` end with it. The protocols and claims are in
``fidelity_protocols.py``, the page's making in ``fidelity_page.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
from fidelity_page import page
from fidelity_protocols import (
    ABLATIONS,
    DATASETS,
    PAGE,
    PROTOCOLS,
    REAL_ROWS,
    REGIMES,
    ROOT,
    ROWS,
    SEEDS,
    SWEEPS,
    TEMPLATE,
    Protocol,
    protocols,
)

from raydg.config import RunConfig, Search, apply, split_search
from raydg.config_files import load_yaml


def rows_file(rows_dir: Path, dataset: str, regime: str, protocol: str) -> Path:
    return rows_dir / f"{dataset}-{regime}-{protocol}.json.gz"


def run_group(dataset: str, regime: str, protocol: Protocol, seeds: list[int],
              tracking_uri: str | None, path: Path, resume: str | None = None) -> None:
    """One experiment: every method of ``protocol`` x domains x seeds (or the rest of the
    interrupted experiment ``resume``), its runs exported to the runs file ``path``."""
    cfg = RunConfig(dataset=dataset, seeds=seeds, weights=REGIMES[regime],
                    tracking_uri=tracking_uri, experiment=f"fidelity-{dataset}")
    cfg = dataclasses.replace(cfg, **protocol.settings)
    run_and_export(cfg, Search(grid={"method": protocol.methods}), path,
                   {"dataset": dataset, "regime": regime, "protocol": protocol.name,
                    "seeds": seeds}, resume)


def run_ablation(name: str, tracking_uri: str | None, path: Path) -> None:
    """The sweep ``configs/sweeps/NAME.yaml`` as the experiment ``ablation-NAME``, its runs
    exported to ``path``."""
    values, search = split_search(load_yaml(str(ROOT / SWEEPS / f"{name}.yaml")))
    cfg = dataclasses.replace(apply(RunConfig(), values), tracking_uri=tracking_uri,
                              experiment=f"ablation-{name}")
    run_and_export(cfg, search, path, {"sweep": str(SWEEPS / f"{name}.yaml")})


def run_and_export(cfg: RunConfig, search: Search, path: Path, about: dict[str, Any],
                   resume: str | None = None) -> None:
    """Run the experiment, tracked in MLflow, then write its federations' runs to the runs
    file ``path`` (:mod:`raydg.reporting.rows`) with ``about`` and the machine."""
    from mlflow import MlflowClient

    from raydg.experiment import run_experiment
    from raydg.reporting.rows import export
    from raydg.tracking.store import tracking_uri as store_uri

    result = run_experiment(cfg, search, out=lambda line: print(line) if not line.startswith(
        "[") or "warning" in line else None, resume=resume)
    client = MlflowClient(store_uri(cfg))
    runs = client.search_runs([client.get_experiment_by_name(cfg.experiment).experiment_id],
                              f"tags.`mlflow.parentRunId` = '{result.run_id}'",
                              max_results=50000, order_by=["attributes.start_time ASC"])
    about = {**about, "machine": machine(),
             "command": "python benchmarks/fidelity.py " + " ".join(sys.argv[1:])}
    print(f"{export(client, runs, path, about)} runs written to {path}")


def machine() -> str:
    """This machine as a runs file records it: the CPU (model, family and model numbers) and
    the instruction set torch's kernels use. On one machine a run is bit-identical whatever
    its actors; on another CPU, the kernels' rounding differs and runs drift after round 1."""
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in lines if ":" in line)}
    cpu = info.get("model name") or platform.processor() or platform.machine()
    family = f" family {info['cpu family']} model {info['model']}" if "cpu family" in info else ""
    return (f"{platform.node()} ({cpu}{family}, {torch.backends.cpu.get_cpu_capability()}, "
            f"{os.cpu_count()} cores)")


def domain_styles() -> tuple[str, list[dict[str, Any]]]:
    """What CCST-pixel exchanges (Eq. 8 with the identity encoder): each domain's style, the
    mean and std of its pixels (first channel, x 255), and how far re-styling 100 images per
    domain with another domain's style moves a pixel (mean |x' - x|, x 255)."""
    import torch

    from raydg.datasets import load_dataset
    from raydg.methods.ccst import PixelCoder, StyleTransfer

    rng, st = np.random.default_rng(0), StyleTransfer(PixelCoder(), torch.device("cpu"), None)
    rows = []
    for name in DATASETS:
        data = load_dataset(name, None, None, log=lambda _: None)
        styles = {d.name: st.style(d.x) for d in data.domains}
        change = []
        for d in data.domains:
            others = [s for n, s in styles.items() if n != d.name]
            for i in rng.choice(len(d.x), 100, replace=False):
                out = st(d.x[i], [others[rng.integers(len(others))]])[0]
                change.append(np.abs(out.astype(float) - d.x[i]).mean())
        rows.append({"method": name, "styles": ", ".join(
            f"{n} {255 * s[0, 0]:.1f} / {255 * s[1, 0]:.1f}" for n, s in styles.items()),
            "re-styling moves a pixel by": f"{np.mean(change):.1f}"})
    return ("Domain styles, mean / std of the pixels (x 255, first channel), and the mean "
            "change of a re-styled pixel (/ 255)", rows)


def amplitude_change() -> tuple[str, list[dict[str, Any]]]:
    """What amplitude mixing exchanges (ELCFS Eq. 1-3, beta 0.1): how far mixing 200 images
    per domain (lambda ~ U(0, 1)) moves a pixel (mean |x' - x|, x 255) when the amplitudes come
    from another domain's image, and from another image of the same domain."""
    import torch

    from raydg.datasets import load_dataset
    from raydg.methods.ampmix import low_freq_amplitude, mix_amplitude

    rng, rows = np.random.default_rng(0), []
    for name in DATASETS:
        data = load_dataset(name, None, None, log=lambda _: None)
        x = {d.name: torch.from_numpy(d.x.astype(np.float32) / 255) for d in data.domains}
        change: dict[str, list[float]] = {"another domain": [], "the same domain": []}
        for d in data.domains:
            own = x[d.name][rng.choice(len(x[d.name]), 200, replace=False)]
            others = [n for n in x if n != d.name]
            for kind, pool in (("another domain", [x[others[i]] for i in rng.integers(
                    len(others), size=200)]), ("the same domain", [x[d.name]] * 200)):
                src = torch.stack([p[rng.integers(len(p))] for p in pool])
                lam = torch.from_numpy(rng.uniform(0, 1, 200).astype(np.float32))
                out = mix_amplitude(own, low_freq_amplitude(src, 0.1), lam, 0.1)
                change[kind].append(float((out - own).abs().mean()) * 255)
        rows.append({"method": name, **{f"from {k}": f"{np.mean(v):.1f}"
                                        for k, v in change.items()}})
    return "Mean change of a pixel by amplitude mixing (/ 255)", rows


DIAGNOSTICS = {"domain-styles": domain_styles, "amplitude-change": amplitude_change}


def pages() -> dict[Path, str]:
    """Both pages, from the runs files in ROWS (ablations in ROWS/ablations) and the
    diagnostics of the data."""
    from raydg.reporting.pages import render

    return {PAGE: page(ROOT / ROWS, real_file=ROOT / REAL_ROWS), ABLATIONS: render(
        (ROOT / TEMPLATE).read_text(), ROOT / ROWS, ROWS, DIAGNOSTICS)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the experiments whose runs file is missing")
    run.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    run.add_argument("--datasets", nargs="+", default=list(DATASETS))
    run.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    run.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    run.add_argument("--resume", metavar="FOLDER",
                     help="continue this interrupted experiment as the first one to run")
    ablation = sub.add_parser("ablation", help="run sweeps of configs/sweeps as ablations")
    ablation.add_argument("names", nargs="+", metavar="NAME", help="configs/sweeps/NAME.yaml")
    for sp in (run, ablation):
        sp.add_argument("--tracking-uri", default=None)
    show = sub.add_parser("page", help=f"write {PAGE} and {ABLATIONS} from the runs files")
    show.add_argument("--check", action="store_true",
                      help="fail if a committed page differs from what the runs files give")
    args = p.parse_args(argv)
    absent = [n for n in getattr(args, "names", []) if not (ROOT / SWEEPS / f"{n}.yaml").exists()]
    if absent:
        p.error(f"no sweep {SWEEPS}/{absent[0]}.yaml")
    if args.command == "run":
        for dataset in args.datasets:
            for regime in args.regimes:
                for protocol in protocols(5 if dataset == "digits-rot" else 10):
                    path = ROOT / rows_file(ROWS, dataset, regime, protocol.name)
                    if protocol.name in args.protocols and not path.exists():
                        run_group(dataset, regime, protocol, args.seeds, args.tracking_uri,
                                  path, args.resume)
                        args.resume = None
    if args.command == "ablation":
        for name in args.names:
            run_ablation(name, args.tracking_uri, ROOT / ROWS / "ablations" / f"{name}.json.gz")
    stale = []
    for path, text in pages().items():
        if getattr(args, "check", False):
            stale += [path] if (ROOT / path).read_text() != text else []
        else:
            (ROOT / path).write_text(text)
            print(f"{path} written")
    for path in stale:
        print(f"{path} differs from what `python benchmarks/fidelity.py page` makes from "
              f"{ROWS}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
