"""The published-table page: statistics by hand, the goal's verdicts, protocol checks on
export, a design's paired comparisons against numpy and scipy's t quantile, and the committed
page against what the command prints from the committed rows."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest

from raydg.errors import RaydgError
from raydg.reporting.design import Comparison, Design, compare
from raydg.reporting.reproduction import Goal, cells, page, to_run, verdict
from raydg.reporting.reproduction_rows import (
    export_rows,
    merge,
    on_machine,
    read_rows,
    repeats,
    write_rows,
)
from raydg.reporting.runs import Run
from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ["M0", "M15"]


def _row(method, target, seed, acc):
    return {"method": method, "variant": "", "target": target, "seed": seed, "selected": acc - 1,
            "last": acc - 2, "oracle": acc, "selected_round": 3, "steps_per_client": 70,
            "options": "", "fingerprint": "abc", "machine": "", "wall_s": ""}


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
                "steps_per_client": 2800}, machine="Xeon x2 CPUs", wall_s=612.4)


def test_export_keeps_finished_runs_of_the_protocol_and_refuses_others(tmp_path):
    protocol = {"dataset": "rotmnist", "rounds": "40", "model": "mnist-cnn",
                "options.mu": "0.1", "optimizer": "sgd"}
    expected, unlogged = (lambda composed: protocol), {"optimizer": "sgd"}
    rows = export_rows([_run(), _run("RUNNING")], expected, {"r1": "f00d"}, None, unlogged)
    assert rows == [{"method": "fedavg", "variant": "", "target": "M0", "seed": 0,
                     "selected": 80.0, "last": 85.0, "oracle": 90.0, "selected_round": 7,
                     "steps_per_client": 2800, "options": "mu=0.1", "fingerprint": "f00d",
                     "machine": "Xeon x2 CPUs", "wall_s": 612}]
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
    text = page(rows, paper, {"fedavg": "FedAvg*"}, {"fedavg": Goal(1, 2.5)}, range(5), "rows.csv",
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
    text = page(rows, paper, {"fedavg": "FedAvg*"}, {"fedavg": Goal(1, 2.5)}, range(5), "rows.csv",
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
    text = page(rows, paper, {"fedavg": "FedAvg*"}, {"fedavg": Goal(1, 2.5)}, range(5), "r.csv",
                "c", "p.yaml")
    assert "Other methods in the rows (fedbn, fedprox): [fidelity.md](fidelity.md)" in text
    tables = text.split("## Machines and wall time")[0]  # which lists every row's machines
    assert "| fedbn" not in tables and "| fedprox" not in tables
    assert f"| FedAvg* [{bn}] | 71.00 (1) | 81.00 (1) | 76.00 (1) |" in text  # oracle


def test_the_papers_cited_rows_are_printed_as_published_and_checked():
    from raydg.reporting.paper import paper_numbers

    paper = {"source": "T", "selection": "oracle",
             "accuracy": {"fedavg": {"M0": 80.0, "M15": 98.0, "Avg": 89.0}},
             "cited": {"CrossGrad": {"M0": 86.03, "M15": 98.9, "Avg": 92.5}}}
    assert paper_numbers({"paper": paper}, "p.yaml") is paper
    text = page([_row("fedavg", "M0", 0, 82.0)], paper, {"fedavg": "FedAvg*"},
                {"fedavg": Goal(1, 2.5)}, range(5), "r.csv", "c", "p.yaml")
    assert "| CrossGrad | 86.03 | 98.90 | 92.50 |" in text.split("## The paper's cited rows")[1]
    with pytest.raises(RaydgError, match=r"cited: \{row: \{domain: percent\}\}"):
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
    text = page(rows, paper, {"fedavg": "FedAvg*"}, {"fedavg": Goal(1, 2.5)}, range(5), "r.csv",
                "c", "p.yaml")
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
    # 90.75 and 91.75, so 91.25, standard error 0.50 (+2.25: a miss of the Avg goal)
    rows = [_row("fedavg", "M0", s, acc) for s, acc in ((0, 83.0), (1, 85.0))]
    rows += [_row("fedavg", "M15", s, 98.5) for s in (0, 1)]
    rows += [{**_row("fedavg", "M0", 1, 80.0), "variant": "local_steps=14"}]  # 80 - 85
    rows += [_row("csac", "M0", 0, 60.0)]  # not judged (1 of 2 seeds on one target)
    goals = {"fedavg": Goal(1.0, 2.5), "csac": Goal(1.0, 2.5)}
    text = page(rows, paper, {"fedavg": "FedAvg*"}, goals, [0, 1], "r.csv", "c", "p.yaml")
    missed = text.split("## Where the judged rows miss")[1].split("## ")[0]
    table = [line for line in missed.splitlines() if line.startswith("| FedAvg*")]
    assert table == [  # csac's M0, one run of 60 against the paper's 70: -10.00
        "| FedAvg* | M0 | 80.00 | 84.00 ± 1.00 (2) | +4.00 | csac -10.00 (1) | 85.00 to 88.00 | "
        "[local_steps=14] -5.00 (1) |",  # ± the standard error: 1.41 / sqrt(2)
        "| FedAvg* | Avg | 89.00 | 91.25 ± 0.50 (2) | +2.25 | — | 92.00 to 92.75 | none yet |"]
    assert not [line for line in missed.splitlines() if line.startswith("| csac")]
    met = [r for r in rows if r["target"] == "M15" or r["variant"]]
    assert "## Where" not in page(met + [_row("fedavg", "M0", s, 80.5) for s in (0, 1)], paper,
                                  {}, goals, [0, 1], "r.csv", "c", "p.yaml")


PAPER = {"source": "T", "selection": "oracle", "accuracy": {"fedavg": {"M0": 80.0, "Avg": 80.0}},
         "errors": {"fedavg": {"M0": 0.44, "Avg": 0.08}}, "error": "standard error",
         "selection_note": "the selection of the authors' code; the paper states none",
         "deviations": ["another draw of the digits"]}


def test_the_page_says_what_it_compares_and_judges_only_the_configs_seeds():
    rows = [_row("fedavg", "M0", s, acc) for s, acc in ((0, 81.0), (1, 83.0), (7, 10.0))]
    rows[0] = {**rows[0], "machine": "Xeon x2 CPUs", "wall_s": "600"}
    rows[1] = {**rows[1], "machine": "Xeon x2 CPUs", "wall_s": "700"}
    text = page(rows, PAPER, {"fedavg": "FedAvg*"}, {"fedavg": Goal(1, 2.5)}, [0, 1], "r.csv",
                "c", "p.yaml")
    assert "## Oracle round (the selection of the authors' code; the paper states none)" in text
    assert "paper's selection" not in text
    assert "- another draw of the digits" in text.split("departs from the paper's")[1]
    assert "| FedAvg*, paper | 80.00 ± 0.44 | 80.00 ± 0.08 |" in text
    assert "| FedAvg*, raydg | 82.00 ± 1.00 (2) |" in text  # seed 7 is not the config's
    assert "| fedavg | Xeon x2 CPUs | 2 | 650 |" in text  # per row and machine
    assert "| fedavg | unrecorded | 1 | — |" in text


def test_a_designs_comparison_is_the_paired_difference_with_its_t_interval():
    """Per seed the mean of the design's targets; d = method - baseline over the seeds both
    have; mean ± t(0.975, n-1) * sd / sqrt(n); t(0.975, 2) = 4.302653 (tables)."""
    acc = {("fedprox", 0): (80, 90), ("fedprox", 1): (82, 90), ("fedprox", 2): (81, 93),
           ("fedavg", 0): (79, 89), ("fedavg", 1): (80, 88), ("fedavg", 2): (80, 90),
           ("fedavg", 3): (99, 99)}  # seed 3: not the design's
    rows = [_row(m, t, s, a) for (m, s), pair in acc.items() for t, a in zip(
        ("M0", "M75"), pair, strict=True)]
    d = np.array([85 - 84, 86 - 84, 87 - 85])
    half = 4.302653 * d.std(ddof=1) / np.sqrt(3)
    got = compare(rows, Comparison("fedprox", "", "fedavg", "", ">=", "S"), ("M0", "M75"),
                  (0, 1, 2), "oracle")
    assert got["seeds"] == [0, 1, 2] and got["mean"] == pytest.approx(d.mean())
    assert got["half"] == pytest.approx(half, rel=1e-5)
    assert got["verdict"] == "holds"  # 1.67 ± 1.43: above 0
    same = compare(rows, Comparison("fedprox", "", "fedavg", "", "=", "S"), ("M0", "M75"),
                   (0, 1, 2), "oracle")
    assert same["verdict"] == "does not hold"
    back = compare(rows, Comparison("fedavg", "", "fedprox", "", ">=", "S"), ("M0", "M75"),
                   (0, 1, 2), "oracle")
    assert back["verdict"] == "reversed"
    waits = compare(rows[:2] + rows[6:8], Comparison("fedprox", "", "fedavg", "", ">=", "S"),
                    ("M0", "M75"), (0, 1, 2), "oracle")
    assert waits["verdict"] == "waits (1 and 1 of 3 seeds)"
    two = [r for r in rows if r["seed"] < 2]  # an interim interval: shown, not judged
    interim = compare(two, Comparison("fedprox", "", "fedavg", "", ">=", "S"), ("M0", "M75"),
                      (0, 1, 2), "oracle")
    assert interim["seeds"] == [0, 1] and interim["mean"] == pytest.approx(d[:2].mean())
    assert interim["half"] == pytest.approx(12.706205 * d[:2].std(ddof=1) / np.sqrt(2),
                                            rel=1e-5)  # t(0.975, 1), from tables
    assert interim["verdict"] == "waits (2 and 2 of 3 seeds)"
    design = Design("D", "fixed before its runs", ("M0", "M75"), (0, 1, 2),
                    (Comparison("fedprox", "", "fedavg", "", ">=", "S"),))
    text = page(rows, PAPER, {}, {"fedavg": Goal(1, 2.5)}, [0, 1, 2], "r.csv", "c", "p.yaml",
                designs=[design])
    assert (f"| fedprox | fedavg | 0, 1, 2 | 86.00 | 84.33 | +1.67 [{1.667 - half:+.2f}, "
            f"{1.667 + half:+.2f}] | fedprox >= fedavg (S) | holds |") in text


def test_a_design_names_a_row_with_the_options_its_runs_set(tmp_path, monkeypatch):
    """``fedfd [cafl_reduction=mean]`` is the rows of fedfd whose options are that: a design
    row so named pairs them with its baseline, the plain name finds none, and design R's list
    of runs still to do leaves out the federations they cover."""
    rows = [{**_row("fedfd", t, s, a), "options": "cafl_reduction=mean"} for t, s, a in (
        ("M0", 0, 82.0), ("M75", 0, 86.0), ("M0", 1, 80.0), ("M75", 1, 84.0))]
    rows += [_row("fedavg", t, s, 81.0) for t in ("M0", "M75") for s in (0, 1)]
    got = compare(rows, Comparison("fedfd [cafl_reduction=mean]", "", "fedavg", "", ">=", "S"),
                  ("M0", "M75"), (0, 1), "oracle")
    assert got["seeds"] == [0, 1] and got["mean"] == pytest.approx(((84 - 81) + (82 - 81)) / 2)
    plain = compare(rows, Comparison("fedfd", "", "fedavg", "", ">=", "S"), ("M0", "M75"),
                    (0, 1), "oracle")
    assert plain["verdict"] == "waits (0 and 2 of 2 seeds)"
    module = load_benchmark("reproduce")
    m75 = {**rows[1], "variant": module.BN}  # fedfd [cafl_reduction=mean] on M75
    write_rows(tmp_path / module.ROWS, [{**m75, "seed": s} for s in (0, 1, 2)])
    monkeypatch.setattr(module, "ROOT", tmp_path)
    fedfd = [line for line in module.todo_design_r(2) if "--method fedfd " in line]
    assert len(fedfd) == 3 and all("--target M0" in line for line in fedfd)  # M75: all in


def test_a_federation_run_again_on_another_machine_is_kept_apart_and_compared():
    """A repeat (same federation, another recorded machine) leaves the rows as they are; the
    page shows both machines' accuracies, the differences, their mean with the t-interval
    (t(0.975, 1) = 12.706205, tables) and the pairs of a design that span machines."""
    cpu = [{**_row(m, t, s, a), "machine": "cpu"} for m, t, s, a in (
        ("fedavg", "M0", 0, 80.0), ("fedavg", "M75", 0, 84.0), ("fedprox", "M0", 0, 81.0),
        ("fedavg", "M0", 1, 82.0), ("fedavg", "M75", 1, 86.0))]
    gpu = [{**_row(m, t, s, a), "machine": "gpu"} for m, t, s, a in (
        ("fedavg", "M0", 0, 81.0), ("fedavg", "M75", 0, 83.0), ("fedprox", "M75", 0, 85.0),
        ("fedprox", "M0", 1, 80.0), ("fedprox", "M75", 1, 90.0))]
    again = repeats(cpu, [*gpu, {**cpu[0], "machine": ""}, cpu[1]])  # unrecorded, same machine
    assert again == gpu[:2]
    assert merge(cpu, gpu) == sorted(cpu + gpu[2:], key=lambda r: (
        r["method"], r["target"], r["seed"]))  # the rows keep one per federation
    assert merge(again, [{**gpu[0], "oracle": 1.0}, cpu[0]], key=on_machine) == [
        cpu[0], *again]  # the repeats file: one per federation and machine
    with pytest.raises(RaydgError, match="ran on other images"):
        repeats(cpu, [{**gpu[0], "fingerprint": "other"}])
    rows = merge(cpu, gpu)
    design = Design("D", "fixed", ("M0", "M75"), (0, 1),
                    (Comparison("fedprox", "", "fedavg", "", ">=", "S"),))
    text = page(rows, PAPER, {}, {"fedavg": Goal(1, 2.5)}, [0, 1], "r.csv", "c", "p.yaml",
                designs=[design], repeats=(again, "again.csv"))
    assert "Machines: A = cpu; B = gpu." in text
    assert "| fedavg | M0 | 0 | A | 79.0 | 80.0 | B | 80.0 | 81.0 | +1.0 | +1.0 |" in text
    assert "| fedavg | M75 | 0 | A | 83.0 | 84.0 | B | 82.0 | 83.0 | -1.0 | -1.0 |" in text
    d = np.array([1.0, -1.0])
    half = 12.706205 * d.std(ddof=1) / np.sqrt(2)
    assert (f"- Oracle round, second machine minus first over 2 federations: mean +0.00 "
            f"[{-half:+.2f}, {half:+.2f}] (95 % t-interval), mean absolute difference 1.00."
            ) in text
    # seed 0: fedprox on both machines, fedavg on cpu; seed 1: fedprox gpu, fedavg cpu
    assert "Of its 2 pairs (a row and its baseline on one seed), 2 hold federations from " \
        "two machines and 0 one whose machine is unrecorded" in text


def test_design_r_runs_at_once_merge_seeds_and_keep_one_writer_per_sqlite_file():
    module = load_benchmark("reproduce")
    lines = ["raydg run --method a --target M0 --seed 1 --experiment e",
             "raydg run --method a --target M75 --seed 1 --experiment e",
             "raydg run --method a --target M0 --seed 2 --experiment e"]
    assert [shlex.join(c) for c in module.merged(lines)] == [
        "raydg run --method a --target M0 --experiment e --seed 1 --seed 2",
        "raydg run --method a --target M75 --experiment e --seed 1"]
    assert module.store_for("sqlite:////x/mlflow.db", 3) == "sqlite:////x/mlflow-3.db"
    assert module.store_for("http://host:5000", 3) == "http://host:5000"
