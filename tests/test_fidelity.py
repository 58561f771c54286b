"""``benchmarks/fidelity.py`` and its ``fidelity_page.py``: the page made from runs files.
Selection by source validation, names that carry off-paper choices, claims with their t-test and
Holm's adjustment, all against numbers computed here from a runs file written by hand; and the
committed page against what its committed runs files give."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from raydg.reporting import rows
from raydg.reporting.reproduction_rows import write_rows
from raydg.results import holm
from tests.conftest import load_benchmark

fidelity = load_benchmark("fidelity")
fidelity_page = load_benchmark("fidelity_page")
ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("plain", "sketch")
SEEDS = (0, 1, 2)


def _run(method: str, target: str, seed: int, accuracy: float, val: float,
         setting: dict[str, str] | None = None, modes: dict[str, float] | None = None) -> dict:
    """One finished federation as a runs file holds it: selected at round 2 of 2."""
    setting = setting or {}
    label = " ".join(f"{k}={v}" for k, v in {"method": method, **setting}.items())
    finals = {f"final/target_acc_selected/{m}": a
              for m, a in {"global": accuracy, **(modes or {})}.items()}
    return {"experiment": "fidelity-digits-style", "run_id": f"{label}-{target}-{seed}",
            "status": "FINISHED", "start_time": 1000 * seed, "end_time": 1000 * seed + 3600_000,
            "tags": {"raydg.method": method, "raydg.target": target, "raydg.seed": str(seed),
                     "raydg.mode": "global", "raydg.dataset": "digits-style",
                     "raydg.setting": label},
            "params": {"method": method, **setting},
            "metrics": {"selected_round": 2.0, "steps_per_client": 200.0, **finals},
            "history": {"val_acc": [[1, 0.1], [2, val]]}}


@pytest.fixture(scope="module")
def accuracies() -> dict:
    """fedavg, and fedfd in two settings: CAFL ``mean`` has the better source validation on
    plain, the paper's ``sum`` on sketch (so each is selected on one domain), whatever their
    target accuracies; fedfd also reports a ``fixed`` inference mode."""
    rng = np.random.default_rng(0)
    return {(m, t, s): float(rng.uniform(20, 80)) for m in ("fedavg", "sum", "mean", "fixed")
            for t in TARGETS for s in SEEDS}


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory, accuracies) -> Path:
    runs = []
    for t in TARGETS:
        for s in SEEDS:
            runs.append(_run("fedavg", t, s, accuracies["fedavg", t, s] / 100, 0.5))
            for reduction in ("sum", "mean"):
                val = 0.9 if (reduction == "mean") == (t == "plain") else 0.6
                runs.append(_run("fedfd", t, s, accuracies[reduction, t, s] / 100, val,
                                 {"options.cafl_reduction": reduction},
                                 {"fixed": accuracies["fixed", t, s] / 100}))
    folder = tmp_path_factory.mktemp("rows")
    about = {"dataset": "digits-style", "regime": "scratch", "protocol": "fedfd-a",
             "seeds": list(SEEDS), "machine": "test-vm", "command": "by hand"}
    with gzip.open(folder / "digits-style-scratch-fedfd-a.json.gz", "wt") as f:
        json.dump({"format": rows.FORMAT, "about": about, "runs": runs}, f)
    return folder


def test_each_domain_keeps_the_setting_of_best_source_validation(rows_dir):
    about, got = fidelity_page.group_rows(rows_dir / "digits-style-scratch-fedfd-a.json.gz")
    chosen = {(r["target"], r["setting"]) for r in got if r["chosen"] and r["method"] == "fedfd"}
    assert chosen == {("plain", "options.cafl_reduction=mean"),
                      ("sketch", "options.cafl_reduction=sum")}
    assert about["seconds"] == pytest.approx(3600 + 2)  # first start to last end
    fixed = [r for r in got if r["method"] == "fedfd [fixed]" and r["chosen"]]
    assert {(r["target"], r["setting"]) for r in fixed} == chosen  # the same runs' other mode


def test_the_page_names_off_paper_choices_and_tests_the_claims(rows_dir, accuracies):
    """The fedfd row says where CAFL's mean was chosen; its claims against fedavg and of
    fedfd against its fixed mode are the paired t-tests computed here, Holm-adjusted."""
    text = fidelity_page.page(rows_dir)
    assert "| fedfd-a | fedfd [cafl_reduction=mean in 1 of 2 domains] |" in text

    def chosen(t: str, s: int) -> float:
        return accuracies["mean" if t == "plain" else "sum", t, s]

    versus_fedavg = np.array([np.mean([chosen(t, s) - accuracies["fedavg", t, s]
                                       for t in TARGETS]) for s in SEEDS])
    claims = {c["claim"].baseline: c for c in fidelity_page.claim_rows(
        fidelity_page.group_rows(rows_dir / "digits-style-scratch-fedfd-a.json.gz")[1])
        if c["claim"].method == "fedfd"}
    assert set(claims) == {"fedavg"}  # no silobn runs: that claim has no row
    got = claims["fedavg"]
    t_stat = versus_fedavg.mean() / (versus_fedavg.std(ddof=1) / np.sqrt(len(SEEDS)))
    p = 2 * stats.t.sf(abs(t_stat), len(SEEDS) - 1)
    assert got["mean"] == pytest.approx(versus_fedavg.mean())
    assert got["p"] == pytest.approx(p)
    assert got["holm"] == pytest.approx(min(1.0, p))  # a family of one
    line = next(x for x in text.splitlines() if x.startswith("| fedfd ≥ fedavg |"))
    assert f"{versus_fedavg.mean():+.1f}" in line and f"| {p:.3f} |" in line


def test_a_claim_outside_its_papers_shift_is_labelled_and_left_out_of_the_family():
    rows_ = [{"method": m, "target": t, "seed": s, "accuracy": a + s * (m == "ampmix"),
              "dataset": d, "regime": "scratch", "protocol": "feddg", "chosen": True}
             for d in ("digits-style", "digits-rot") for m in ("fedavg", "ampmix")
             for t in TARGETS for s, a in zip(SEEDS, (50.0, 52.0, 57.0), strict=True)]
    claims = [c for c in fidelity_page.claim_rows(rows_) if c["claim"].method == "ampmix"]
    assert [(c["dataset"], c["in_scope"]) for c in claims] == [
        ("digits-style", True), ("digits-rot", False)]
    assert "holm" not in claims[1]
    assert "out of scope" in fidelity_page.claims_table(claims)[3]


@pytest.mark.slow
def test_the_committed_pages_are_what_their_runs_files_give(capsys):
    """docs/fidelity.md and docs/fidelity-ablations.md, byte for byte (`page --check`)."""
    assert fidelity.main(["page", "--check"]) == 0, capsys.readouterr().err


def test_verdicts_from_glyphs_and_neutral_sit_side_by_side_and_changes_are_named():
    """fedgma gains steadily over FedAvg from glyphs (holds) and not from neutral (noise)."""
    gains = {"glyphs": (2.0, 2.1, 1.9, 2.0, 2.2), "neutral": (3.0, -2.0, 1.0, -1.5, 0.5)}
    rows_ = [{"method": m, "target": t, "seed": s, "accuracy": 50.0 + (g if m == "fedgma" else 0),
              "dataset": "digits-style", "regime": regime, "protocol": "feddg", "chosen": True}
             for regime, gain in gains.items() for m in ("fedavg", "fedgma")
             for t in TARGETS for s, g in enumerate(gain)]
    lines = fidelity_page.by_regime([c for c in fidelity_page.claim_rows(rows_)
                                if c["claim"].method == "fedgma"])
    assert lines[0] == "| claim | digits-style, glyphs | digits-style, neutral |"
    assert lines[2].startswith("| fedgma ≥ fedavg | +2.0 holds | +0.2 not significant |")
    assert lines[-1] == ("Glyphs against neutral pretraining: 1 claim(s) have both; the verdict "
                         "changes for 1: fedgma ≥ fedavg on digits-style (+2.0 holds from "
                         "glyphs, +0.2 not significant from neutral).")


def _real(method: str, target: str, seed: int, selected: float, variant: str = "") -> dict:
    """A row of the reproduction's rows file (docs/reproduction-rows/)."""
    return {"method": method, "variant": variant, "target": target, "seed": seed,
            "selected": selected, "last": 0.0, "oracle": 0.0, "selected_round": 40,
            "steps_per_client": 2800, "options": "", "fingerprint": "abc"}


def test_the_real_data_regime_pairs_each_method_with_fedavg_on_its_model(rows_dir, tmp_path):
    """fedprox against FedAvg over the seeds that have every target (seed 2's half is left
    out), fedbn against FedAvg on the BN model in a section of its own, ablations left out."""
    bn = "model=mnist-cnn-bn"
    base = {(0, "M0"): 80.0, (0, "M15"): 94.0, (1, "M0"): 82.0, (1, "M15"): 96.0}
    gain = {0: 1.0, 1: 3.0}  # fedprox's per-seed gain, the same on both targets
    real = [_real("fedavg", t, s, a) for (s, t), a in base.items()]
    real += [_real("fedprox", t, s, a + gain[s]) for (s, t), a in base.items()]
    real += [_real("fedprox", "M0", 2, 10.0), _real("fedavg", "M0", 0, 5.0, "local_steps=100")]
    real += [_real(m, t, 0, a, bn) for m, a in (("fedavg", 70.0), ("fedbn", 74.0))
             for t in ("M0", "M15")]
    real = [{**r, "machine": "gpu" if r["method"] == "fedprox" else "cpu"} for r in real]
    write_rows(tmp_path / "real.csv", real)
    text = fidelity_page.page(rows_dir, real_file=tmp_path / "real.csv")
    assert ("its rows come from 2 machines (cpu; gpu), so its claims can pair rows across "
            "machines") in text  # the runs files come from one machine each; these do not
    plain = text.split("## rotmnist, scratch\n")[1].split("## ")[0]
    half = stats.t.ppf(0.975, 1) * np.std([1.0, 3.0], ddof=1) / np.sqrt(2)
    # fedprox: M0 81, 85; M15 95, 99; Avg per seed 88, 92
    assert (f"| csac-rotmnist | fedprox (2 of 5 seeds) | 83.0 ± 2.8 | 97.0 ± 2.8 | "
            f"**90.0 ± 2.8** | 2800 | +2.0 ± {half:.1f} |") in plain
    assert ("| csac-rotmnist | fedavg (2 of 5 seeds) | 81.0 ± 1.4 | 95.0 ± 1.4 | **88.0 ± 1.4** "
            "| 2800 |  |") in plain  # the ablation's 5.0 on M0 left out
    assert "fedbn" not in plain and "local_steps" not in text
    with_bn = text.split(f"## rotmnist, scratch [{bn}]\n")[1]
    assert "| csac-rotmnist | fedbn (1 of 5 seeds) | 74.0 | 74.0 | **74.0** | 2800 | +4.0 |" \
        in with_bn


def test_a_real_data_claim_is_tested_once_both_sides_have_every_seed(rows_dir, tmp_path):
    """csac >= fedavg (CSAC Table 3) waits while csac has 4 seeds, then is the paired t-test
    computed here, in the Holm family with the embedded claims."""
    gain = [1.0, 2.0, 0.5, 1.5, 3.0]
    real = [_real(m, t, s, 90.0 + (g if m == "csac" else 0) + (t == "M15"))
            for m in ("fedavg", "csac") for t in ("M0", "M15") for s, g in enumerate(gain)]
    write_rows(tmp_path / "four.csv", [r for r in real if r["method"] == "fedavg"
                                       or r["seed"] < 4])
    text = fidelity_page.page(rows_dir, real_file=tmp_path / "four.csv")
    assert ("waiting for 5 seeds on both sides: csac ≥ fedavg (scratch: 4 and 5 seeds)."
            in text)
    assert "| csac ≥ fedavg |" not in text and "unlike a runs file" not in text  # one machine
    write_rows(tmp_path / "five.csv", real)
    text = fidelity_page.page(rows_dir, real_file=tmp_path / "five.csv")
    p = stats.ttest_1samp(gain, 0).pvalue
    family = [c["p"] for c in fidelity_page.claim_rows(
        fidelity_page.group_rows(rows_dir / "digits-style-scratch-fedfd-a.json.gz")[1])
        if c["in_scope"]] + [p]
    line = next(x for x in text.splitlines() if x.startswith("| csac ≥ fedavg |"))
    assert line.startswith(f"| csac ≥ fedavg | CSAC Table 3 (csac-rotmnist) | rotmnist | "
                           f"scratch | +{np.mean(gain):.1f} ± ")
    assert f"| {p:.3f} | {holm(family)[-1]:.3f} |" in line
    assert "waiting" not in text
