"""The published-table page: statistics by hand, the goal's verdicts, protocol checks on
export, and the committed page against what the command prints from the committed rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raydg.errors import RaydgError
from raydg.reporting.reproduction import (
    Goal,
    cells,
    export_rows,
    merge,
    page,
    read_rows,
    to_run,
    verdict,
    write_rows,
)
from raydg.reporting.runs import Run
from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ["M0", "M15"]


def _row(method, target, seed, acc):
    return {"method": method, "variant": "", "target": target, "seed": seed, "selected": acc - 1,
            "last": acc - 2, "oracle": acc, "selected_round": 3, "steps_per_client": 70,
            "options": "", "fingerprint": "abc"}


def test_cells_are_means_and_sample_stds_and_avg_uses_complete_seeds_only():
    rows = [_row("fedavg", "M0", 0, 80.0), _row("fedavg", "M0", 1, 84.0),
            _row("fedavg", "M15", 0, 98.0), _row("fedavg", "M15", 1, 96.0),
            _row("fedavg", "M0", 2, 90.0), _row("csac", "M0", 0, 10.0)]  # seed 2 lacks M15
    got = cells(rows, "fedavg", TARGETS, "oracle")
    assert got["M0"] == pytest.approx((84.666666, np.std([80, 84, 90], ddof=1), 3))
    assert got["M15"] == pytest.approx((97.0, np.sqrt(2.0), 2))
    # Avg per seed over both targets: seed 0 89, seed 1 90 (seed 2 is incomplete)
    assert got["Avg"] == pytest.approx((89.5, np.sqrt(0.5), 2))
    assert cells(rows, "fedavg", TARGETS, "selected")["M15"][0] == pytest.approx(96.0)
    assert "Avg" not in cells(rows, "csac", TARGETS, "oracle")


def test_verdicts_wait_for_the_full_design_then_apply_both_tolerances():
    paper = {"M0": 80.0, "M15": 98.0, "Avg": 89.0}
    rows = [_row("fedavg", t, s, paper[t] + d) for s in range(2) for t, d in
            (("M0", 2.0), ("M15", -1.0))]
    got = cells(rows, "fedavg", TARGETS, "oracle")
    assert verdict(got, paper, TARGETS, 3, Goal(1.0, 2.5)).startswith(
        "not judged: 2 of 6 federations")
    assert verdict(got, paper, TARGETS, 2, Goal(1.0, 2.5)) == (
        "met: Avg +0.50 (within ±1); 0 of 2 cells beyond ±2.5, the worst M0 +2.00")
    assert verdict(got, paper, TARGETS, 2, Goal(0.4, 2.5)) == (
        "missed: Avg +0.50 (beyond ±0.4); 0 of 2 cells beyond ±2.5, the worst M0 +2.00")
    assert verdict(got, paper, TARGETS, 2, Goal(1.0, 1.5)) == (
        "missed: Avg +0.50 (within ±1); 1 of 2 cells beyond ±1.5, the worst M0 +2.00")


def _run(status="FINISHED", **params):
    base = {"dataset": "rotmnist", "rounds": "40", "model": "mnist-cnn", "options.mu": "0.1"}
    return Run("r1", status, "fedavg", "M0", 0, "global", {**base, **params},
               {"final/target_acc_oracle/global": 90.0, "final/target_acc_selected/global": 80.0,
                "final/target_acc_last/global": 85.0, "selected_round": 7,  # percent, as read
                "steps_per_client": 2800})


def test_export_keeps_finished_runs_of_the_protocol_and_refuses_others(tmp_path):
    protocol = {"dataset": "rotmnist", "rounds": "40", "model": "mnist-cnn",
                "options.mu": "0.1", "optimizer": "sgd"}
    expected, unlogged = (lambda composed: protocol), {"optimizer": "sgd"}
    rows = export_rows([_run(), _run("RUNNING")], expected, {"r1": "f00d"}, None, unlogged)
    assert rows == [{"method": "fedavg", "variant": "", "target": "M0", "seed": 0,
                     "selected": 80.0, "last": 85.0, "oracle": 90.0, "selected_round": 7,
                     "steps_per_client": 2800, "options": "mu=0.1", "fingerprint": "f00d"}]
    for changed, name in (({"model": "cnn"}, "model"), ({"options.mu": "1.0"}, "options.mu"),
                          ({"optimizer": "adam"}, "optimizer")):  # options and unset keys too
        with pytest.raises(RaydgError, match=rf"differs from the config in \['{name}'\]"):
            export_rows([_run(**changed)], expected, {}, None, unlogged)
    ablated = lambda composed: {**protocol, "model": "cnn"}  # noqa: E731
    ablation = export_rows([_run(model="cnn")], ablated, {}, {"model": "cnn"}, unlogged)
    assert ablation[0]["variant"] == "model=cnn"  # named as the ablation it is
    with pytest.raises(RaydgError, match=r"in \['model'\]"):  # the protocol's run is not one
        export_rows([_run()], ablated, {}, {"model": "cnn"}, unlogged)
    path = tmp_path / "rows.csv"
    write_rows(path, merge(rows, [{**rows[0], "oracle": 1.0}]))  # a row already there is kept
    assert read_rows(path) == rows


def test_the_page_labels_ablations_beside_the_protocols_row():
    paper = {"source": "T", "selection": "oracle",
             "accuracy": {"fedavg": {"M0": 80.0, "M15": 98.0, "Avg": 89.0}}}
    rows = [_row("fedavg", "M0", 0, 82.0), {**_row("fedavg", "M0", 0, 70.0),
                                            "variant": "model=cnn"}]
    text = page(rows, paper, {"fedavg": "FedAvg*"}, {"fedavg": Goal(1, 2.5)}, 5, "rows.csv",
                "cmd", "cfg.yaml")
    assert "| FedAvg*, raydg | 82.00 (1) | — | — |" in text  # the ablation stays out of it
    assert "| FedAvg* [model=cnn] | 70.00 (1) | — | — |" in text
    assert "| [model=cnn] - protocol | -12.00 | — | — |" in text
    assert "- FedAvg*: not judged: 9 of 10 federations still to run" in text


def test_the_page_names_the_data_of_each_images_fingerprint():
    paper = {"source": "T", "selection": "oracle",
             "accuracy": {"fedavg": {"M0": 80.0, "Avg": 80.0}}}
    rows = [_row("fedavg", "M0", 0, 82.0),
            {**_row("fedavg", "M0", 0, 81.0), "variant": "dataset=rotmnist-ccw"},
            {**_row("fedavg", "M0", 0, 79.0), "variant": "lr=0.1 dataset=rotmnist-redraw",
             "fingerprint": "0ff"}]
    text = page(rows, paper, {"fedavg": "FedAvg*"}, {"fedavg": Goal(1, 2.5)}, 5, "rows.csv",
                "cmd", "cfg.yaml")
    assert ("Images: fingerprint 0ff (dataset=rotmnist-redraw), abc (the protocol's, "
            "dataset=rotmnist-ccw).") in text


def test_the_committed_page_is_what_the_rows_give():
    module = load_benchmark("reproduce")
    assert (ROOT / module.PAGE).read_text() == module.render()


def test_the_runs_still_to_do_are_the_designs_cells_without_a_protocol_row(tmp_path):
    rows = [_row("fedavg", "M0", s, 90.0) for s in (0, 2)] + [_row("csac", "M15", 1, 90.0)]
    rows += [{**_row("csac", t, s, 90.0), "variant": "model=cnn"} for t in TARGETS
             for s in range(3)]  # an ablation completes nothing
    assert to_run(rows, ["fedavg", "csac"], TARGETS, [0, 1, 2]) == [
        ("fedavg", "M0", [1]), ("fedavg", "M15", [0, 1, 2]),
        ("csac", "M0", [0, 1, 2]), ("csac", "M15", [0, 2])]
    assert to_run(rows, ["fedavg"], ["M0"], [0, 2]) == []
    module = load_benchmark("reproduce")
    module.ROWS = tmp_path / "rows.csv"
    write_rows(module.ROWS, [_row(m, t, s, 90.0) for m in module.NAMES for t in
                             ("M0", "M15", "M30", "M45", "M60", "M75") for s in range(5)
                             if (m, t, s) not in {("elcfs", "M30", 1), ("elcfs", "M30", 4)}])
    assert module.todo() == ["raydg run --config configs/csac-rotmnist.yaml --method elcfs "
                             "--target M30 --seed 1 --seed 4 --experiment rotmnist-csac"]


def test_other_methods_are_pointed_to_and_a_bn_fedavg_is_an_ablation_row():
    paper = {"source": "T", "selection": "oracle",
             "accuracy": {"fedavg": {"M0": 80.0, "M15": 98.0, "Avg": 89.0}}}
    bn = "model=mnist-cnn-bn"
    rows = [_row("fedavg", t, 0, 90.0) for t in TARGETS]
    rows += [{**_row("fedavg", t, 0, acc), "variant": bn} for t, acc in (("M0", 71), ("M15", 81))]
    rows += [{**_row(m, t, 0, 75.0), "variant": v} for m, v in (("fedbn", bn), ("fedprox", ""))
             for t in TARGETS]
    text = page(rows, paper, {"fedavg": "FedAvg*"}, {"fedavg": Goal(1, 2.5)}, 5, "r.csv", "c",
                "p.yaml")
    assert "Other methods in the rows (fedbn, fedprox): [fidelity.md](fidelity.md)" in text
    assert "| fedbn" not in text and "| fedprox" not in text
    assert f"| FedAvg* [{bn}] | 71.00 (1) | 81.00 (1) | 76.00 (1) |" in text  # oracle


def test_the_papers_cited_rows_are_printed_as_published_and_checked():
    from raydg.reporting.reproduction import paper_numbers

    paper = {"source": "T", "selection": "oracle",
             "accuracy": {"fedavg": {"M0": 80.0, "M15": 98.0, "Avg": 89.0}},
             "cited": {"CrossGrad": {"M0": 86.03, "M15": 98.9, "Avg": 92.5}}}
    assert paper_numbers({"paper": paper}, "p.yaml") is paper
    text = page([_row("fedavg", "M0", 0, 82.0)], paper, {"fedavg": "FedAvg*"},
                {"fedavg": Goal(1, 2.5)}, 5, "r.csv", "c", "p.yaml")
    assert "| CrossGrad | 86.03 | 98.90 | 92.50 |" in text.split("## The paper's cited rows")[1]
    with pytest.raises(RaydgError, match="optionally cited"):
        paper_numbers({"paper": {**paper, "cited": {"CrossGrad": {"M0": "high"}}}}, "p.yaml")
    for empty in ({}, {"fedavg": {}}):  # nothing to print beside the runs: refused
        with pytest.raises(RaydgError, match="with at least one number"):
            paper_numbers({"paper": {**paper, "accuracy": empty}}, "p.yaml")
    with pytest.raises(RaydgError, match=r"p.yaml: the paper's columns \['M15', 'M99'\] are "
                                         r"not domains of digits-rot \(M0, M30\)"):
        paper_numbers({"dataset": "digits-rot", "paper": {
            **paper, "accuracy": {"fedavg": {"M0": 1.0, "M15": 2.0, "M99": 3.0}}}},
            "p.yaml", ("M0", "M30"))


def test_an_ablation_is_compared_with_the_protocol_on_its_own_seeds():
    paper = {"source": "T", "selection": "oracle",
             "accuracy": {"fedavg": {"M0": 80.0, "M15": 98.0, "Avg": 89.0}}}
    rows = [_row("fedavg", "M0", 0, 80.0), _row("fedavg", "M0", 1, 90.0),
            {**_row("fedavg", "M0", 0, 83.0), "variant": "local_steps=100"}]
    text = page(rows, paper, {"fedavg": "FedAvg*"}, {"fedavg": Goal(1, 2.5)}, 5, "r.csv", "c",
                "p.yaml")
    oracle = text.split("Oracle round:")[1].split("Selected round:")[0]
    assert "| FedAvg*, same seeds | 80.00 (1) | — | — |" in oracle  # seed 1's 90 left out
    assert "| [local_steps=100] - protocol | +3.00 | — | — |" in oracle  # not 83 - 85


def test_a_judged_rows_misses_are_listed_with_the_cited_range_and_the_ablations_on_them():
    paper = {"source": "T", "selection": "oracle",
             "accuracy": {"fedavg": {"M0": 80.0, "M15": 98.0, "Avg": 89.0},
                          "csac": {"M0": 70.0, "M15": 90.0, "Avg": 80.0}},
             "cited": {"A": {"M0": 85.0, "M15": 99.0, "Avg": 92.0},
                       "B": {"M0": 88.0, "M15": 97.5, "Avg": 92.75}}}
    # fedavg, 2 seeds: M0 83 and 85 (mean 84, +4: a miss), M15 98.5 (+0.5); Avg per seed
    # 90.75 and 91.75, so 91.25 ± 0.71 (+2.25: a miss of the Avg goal)
    rows = [_row("fedavg", "M0", s, acc) for s, acc in ((0, 83.0), (1, 85.0))]
    rows += [_row("fedavg", "M15", s, 98.5) for s in (0, 1)]
    rows += [{**_row("fedavg", "M0", 1, 80.0), "variant": "local_steps=14"}]  # 80 - 85
    rows += [_row("csac", "M0", 0, 60.0)]  # not judged (1 of 2 seeds on one target)
    goals = {"fedavg": Goal(1.0, 2.5), "csac": Goal(1.0, 2.5)}
    text = page(rows, paper, {"fedavg": "FedAvg*"}, goals, 2, "r.csv", "c", "p.yaml")
    missed = text.split("## Where the judged rows miss")[1].split("## ")[0]
    table = [line for line in missed.splitlines() if line.startswith("| FedAvg*")]
    assert table == [  # csac's M0, one run of 60 against the paper's 70: -10.00
        "| FedAvg* | M0 | 80.00 | 84.00 ± 1.41 (2) | +4.00 | csac -10.00 (1) | 85.00 to 88.00 | "
        "[local_steps=14] -5.00 (1) |",
        "| FedAvg* | Avg | 89.00 | 91.25 ± 0.71 (2) | +2.25 | — | 92.00 to 92.75 | none yet |"]
    assert not [line for line in missed.splitlines() if line.startswith("| csac")]
    met = [r for r in rows if r["target"] == "M15" or r["variant"]]
    assert "## Where" not in page(met + [_row("fedavg", "M0", s, 80.5) for s in (0, 1)], paper,
                                  {}, goals, 2, "r.csv", "c", "p.yaml")
