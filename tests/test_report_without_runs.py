"""``raydg report`` where nothing runs: stores written here run by run (an older raydg's runs,
a run repeated by a later one), no store at all, the Holm correction, and a page's diagnostic
blocks. On a store written by real runs: test_report.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from mlflow import MlflowClient

from raydg.cli import cli
from raydg.errors import RaydgError
from raydg.reporting import pages
from raydg.results import UNIT_TAG, holm


def test_runs_of_an_older_raydg_that_lack_a_setting_are_a_table_of_their_own(tmp_path):
    """A param that older runs never logged separates their table and is shown as unset."""
    uri = f"sqlite:///{tmp_path}/old.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("old-and-new")
    new = {"client_size": "None"}
    for seed, extra in ((0, {}), (1, {}), (0, new), (1, new)):
        run = client.create_run(exp, tags={"raydg.target": "M0", "raydg.method": "fedavg",
                                           "raydg.seed": str(seed), "raydg.dataset": "digits-rot"})
        for key, value in {"dataset": "digits-rot", "lr": "0.05", **extra}.items():
            client.log_param(run.info.run_id, key, value)
        client.log_metric(run.info.run_id, "final/target_acc_selected/global", 0.5 + 0.1 * seed)
        client.set_terminated(run.info.run_id)
    result = CliRunner().invoke(cli, ["report", "--tracking-uri", uri, "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert sorted(r["client_size"] for r in rows) == ["(unset)", "None"]
    assert all(r["M0"] == pytest.approx(55.0) for r in rows)


def test_accuracies_an_older_raydg_logged_as_fractions_are_reported_in_percent(tmp_path):
    """Runs without the unit tag (raydg before accuracies were percent in MLflow) hold
    fractions; beside runs tagged ``percent`` the report shows both in percent."""
    uri = f"sqlite:///{tmp_path}/units.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("units")
    for seed, (unit, scale) in enumerate(((None, 0.01), ("percent", 1.0))):
        tags = {"raydg.target": "M0", "raydg.method": "fedavg", "raydg.seed": str(seed),
                "raydg.dataset": "digits-rot", **({UNIT_TAG: unit} if unit else {})}
        run_id = client.create_run(exp, tags=tags).info.run_id
        client.log_param(run_id, "dataset", "digits-rot")
        for step, acc in ((1, 40.0), (2, 60.0)):
            client.log_metric(run_id, "target_acc", scale * acc, step=step)
            client.log_metric(run_id, "round_seconds", 0.5, step=step)
        client.log_metric(run_id, "final/target_acc_selected/global", scale * 60.0)
        client.set_terminated(run_id)
    result = CliRunner().invoke(cli, ["report", "--tracking-uri", uri, "--format", "json",
                                      "--per-round", "target_acc", "--per-round",
                                      "round_seconds"])
    assert result.exit_code == 0, result.output
    table, *rounds = json.loads(result.stdout)
    assert table["M0"] == pytest.approx(60.0) and table["M0_std"] == pytest.approx(0.0)
    assert [(r["metric"], r["round 1"], r["round 2"]) for r in rounds] == [
        ("target_acc", pytest.approx(40.0), pytest.approx(60.0)),
        ("round_seconds", pytest.approx(0.5), pytest.approx(0.5))]  # not an accuracy


def test_a_run_repeated_by_a_later_one_counts_once_and_is_named(tmp_path):
    """Seed 0 run twice with the same settings (say, by a grid and by a sweep): the table
    counts it once, with its latest run's accuracy, and says which run it left out."""
    uri = f"sqlite:///{tmp_path}/twice.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("twice")
    ids = []
    for seed, acc in ((0, 50.0), (1, 70.0), (0, 60.0)):
        tags = {"raydg.target": "M0", "raydg.method": "fedavg", "raydg.seed": str(seed),
                "raydg.dataset": "digits-rot", UNIT_TAG: "percent"}
        ids.append(client.create_run(exp, tags=tags).info.run_id)
        client.log_param(ids[-1], "dataset", "digits-rot")
        client.log_metric(ids[-1], "final/target_acc_selected/global", acc)
        client.set_terminated(ids[-1])
    result = CliRunner().invoke(cli, ["report", "--tracking-uri", uri, "--format", "json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["seeds"] == 2 and row["M0"] == pytest.approx(65.0)  # (60 + 70) / 2
    assert row["M0_std"] == pytest.approx(np.std([60.0, 70.0], ddof=1))
    assert ("Counted once (the latest run of each): 1 run repeats another's method, settings, "
            f"target and seed: fedavg M0 seed=0 ({ids[0][:8]})") in result.stderr


def test_holm_matches_a_hand_computation():
    """Holm (1979) on p = (0.01, 0.04, 0.03, 0.5): sorted 0.01, 0.03, 0.04, 0.5 times 4, 3,
    2, 1 = 0.04, 0.09, 0.08 -> 0.09 (monotone), 0.5."""
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.3, 0.6]) == pytest.approx([0.6, 0.6])


def test_a_diagnostic_block_is_its_functions_table(tmp_path):
    diagnostics = {"d": lambda: ("Caption", [{"method": "a", "x": "1.5"},
                                             {"method": "b", "x": "2"}])}
    page = pages.render("```diagnostic\nid: q\nname: d\n```\nb has {{q | b | x}}.\n",
                        tmp_path, diagnostics=diagnostics)
    assert page == ("**Caption** (diagnostic `d`)\n\n|  | x |\n|---|---|\n| a | 1.5 |\n"
                    "| b | 2 |\nb has 2.\n")
    with pytest.raises(RaydgError, match="one of"):
        pages.render("```diagnostic\nid: q\nname: e\n```\n", tmp_path, diagnostics=diagnostics)


def test_report_creates_no_store_and_prints_a_papers_table_without_runs(tmp_path):
    """No store where the report looks: one line, exit 1, nothing created; with --paper, the
    published table alone (exit 0), its note on stderr."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    runner = CliRunner()
    none = runner.invoke(cli, ["report", "--tracking-uri", uri])
    assert none.exit_code == 1 and not (tmp_path / "mlflow.db").exists()
    assert none.stderr.strip() == (f"raydg: no MLflow store at {tmp_path}/mlflow.db (runs write "
                                   "one there; --tracking-uri or MLFLOW_TRACKING_URI names "
                                   "another)")
    paper = runner.invoke(cli, ["report", "--tracking-uri", uri, "--paper",
                                str(Path(__file__).resolve().parents[1] / "configs"
                                    / "csac-rotmnist.yaml")])
    assert paper.exit_code == 0, paper.output
    lines = paper.stdout.splitlines()
    assert lines[0] == "Accuracy (%) published in CSAC Table 3"
    fedavg, = (line.split() for line in lines if line.startswith("fedavg "))
    assert fedavg == ["fedavg", "82.60", "98.56", "98.97", "93.66", "95.78", "86.30", "92.65"]
    assert "no runs match: the published numbers alone" in paper.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_a_store_that_is_not_mlflows_is_one_line_and_never_written(tmp_path):
    """report only reads: a SQLite file of someone else's keeps its bytes (MLflow would add its
    tables), a file that is no database and a store of another MLflow schema are one line each,
    exit 2, the last saying how to upgrade."""
    import sqlite3

    plain = tmp_path / "plain.db"
    with sqlite3.connect(plain) as db:
        db.execute("CREATE TABLE mine (x)")
    before = plain.read_bytes()
    (tmp_path / "notes.txt").write_text("not a database\n" * 50)
    old = tmp_path / "old.db"
    subprocess.run([sys.executable, "-c", "import sys, mlflow; mlflow.MlflowClient(sys.argv[1])"
                    ".search_experiments()", f"sqlite:///{old}"], check=True)  # not cached here
    with sqlite3.connect(old) as db:
        db.execute("UPDATE alembic_version SET version_num = '0584bdc529eb'")
    cases = {plain: "not an MLflow SQLite store: it has no alembic_version or runs table",
             tmp_path / "notes.txt": "not an MLflow SQLite store: file is not a database",
             old: "has the schema of another MLflow version (0584bdc529eb"}
    for path, said in cases.items():
        result = CliRunner().invoke(cli, ["report", "--tracking-uri", f"sqlite:///{path}"])
        assert result.exit_code == 2 and said in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert "mlflow db upgrade sqlite:///" in result.output
    assert plain.read_bytes() == before


def test_several_stores_are_read_as_one(tmp_path):
    """A store per Slurm job: a report over two stores (two flags, or one SQLite glob) has the
    runs of both in one table, the seeds of one beside the other's; --ledger, which reads one
    store's artifacts, is refused."""
    stores = tmp_path / "mlflow-stores"
    for seed in (0, 1):
        client = MlflowClient(f"sqlite:///{stores}/mlflow-{seed}.db")
        exp = client.create_experiment("slurm")  # the same name, another id in each store
        run = client.create_run(exp, tags={"raydg.target": "M0", "raydg.method": "fedavg",
                                           "raydg.seed": str(seed), "raydg.dataset": "digits-rot",
                                           UNIT_TAG: "percent"})
        client.log_param(run.info.run_id, "dataset", "digits-rot")
        client.log_metric(run.info.run_id, "final/target_acc_selected/global", 50.0 + 10 * seed)
        client.log_metric(run.info.run_id, "val_acc", 40.0 + seed, step=1)
        client.set_terminated(run.info.run_id)
    both = [["--tracking-uri", f"sqlite:///{stores}/mlflow-{s}.db"] for s in (0, 1)]
    for args in ([*both[0], *both[1]], ["--tracking-uri", f"sqlite:///{stores}/*.db"]):
        result = CliRunner().invoke(cli, ["report", *args, "--experiment", "slurm",
                                          "--format", "json", "--per-round", "val_acc"])
        assert result.exit_code == 0, result.output
        rows = json.loads(result.stdout)
        assert rows[0]["seeds"] == 2 and rows[0]["M0"] == pytest.approx(55.0)
        assert rows[1]["round 1"] == pytest.approx(40.5)  # each run's history from its store
    ledger = CliRunner().invoke(cli, ["report", *both[0], *both[1], "--ledger"])
    assert ledger.exit_code == 2 and "--ledger reads one store's artifacts" in ledger.output
    none = CliRunner().invoke(cli, ["report", "--tracking-uri", f"sqlite:///{stores}/x*.db"])
    assert none.exit_code == 1 and "no MLflow store matches" in none.output


@pytest.mark.parametrize("many", [False, True])
def test_a_single_panel_figure_keeps_its_title_and_legend_whole(tmp_path, monkeypatch, many):
    """One target (``raydg report --dataset digits-rot --plot``'s shape with one domain), with
    three methods or with every training method: the title, its subtitle and every legend entry
    lie inside the saved image, the legend below the panel's axis label, and the layout fits
    (matplotlib warns when it cannot)."""
    import warnings

    import matplotlib.figure

    from raydg.plots import plot_curves

    kept = []
    save = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):
        fig.canvas.draw()  # the layout that savefig draws, before measuring it
        renderer = fig.canvas.get_renderer()
        area = (fig.get_tightbbox(renderer).padded(kwargs.get("pad_inches", 0.1))
                if kwargs.get("bbox_inches") == "tight" else fig.bbox_inches)  # saved, inches
        texts = [fig._suptitle, *fig.legends[0].get_texts()]
        kept.append([area.contains(*corner) for t in texts
                     for corner in t.get_window_extent(renderer).transformed(
                         fig.dpi_scale_trans.inverted()).corners()])
        below = fig.legends[0].get_window_extent(renderer).y1
        kept.append([below <= fig.axes[0].get_tightbbox(renderer).y0])
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    methods = ["fedfd-a [cafl_reduction=mean adapter_lr_scale=10.0]", "fedprox [mu=0.1]",
               "fedavg+ga [step_size=0.1 metric=acc]"]
    if many:
        methods += [f"method-{i} [option={i}]" for i in range(10)]
    points = [{"method": m, "target": "M0", "seed": 0, "round": r, "target_acc": 50.0 + r,
               "val_acc": 60.0} for m in methods for r in (1, 2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Tight layout not applied" included
        plot_curves(points, tmp_path / "one.png",
                    "digits-rot: " + ", ".join(methods) + " [lr=0.05]")
    assert kept and all(all(k) for k in kept)
