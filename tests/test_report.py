"""``raydg report`` on a store written by real runs (tests/report_runs.py): its numbers against
ones computed here from the runs' per-round metrics, runs that differ in a setting kept apart,
every output format, the curves figure, bad input, and what the MLflow UI server shows of a raydg
store. The same store's runs files: test_report_rows.py; stores written run by run, and none:
test_report_without_runs.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import matplotlib.figure
import numpy as np
import pyarrow.parquet as pq
import pytest
import requests
from click.testing import CliRunner
from mlflow import MlflowClient
from mlflow.artifacts import download_artifacts
from PIL import Image

from raydg.cli import cli
from raydg.config import RunConfig
from raydg.errors import RaydgError
from raydg.experiment import run_experiment
from tests.conftest import free_ports
from tests.report_runs import (
    EXPERIMENT,
    METHODS,
    SEEDS,
    TARGETS,
    child_runs,
    expected_table,
    paired_interval,
    report,
    report_csv,
)

pytestmark = pytest.mark.slow  # the quick loop (-m "not slow") leaves it out


@pytest.fixture
def store(report_store: str) -> str:
    """The runs of ``write_runs``, written once for the test session (tests/conftest.py)."""
    return report_store


@pytest.mark.parametrize("selection", ["selected", "last", "oracle"])
def test_report_numbers_match_the_runs_metrics(store, selection):
    rows = report_csv(store, "--selection", selection, "--filter", "params.lr = '0.05'")
    expected = expected_table(store, selection, "0.05")
    assert [r["method"] for r in rows] == list(METHODS)
    for r in rows:
        assert r["seeds"] == "2"
        for col in (*TARGETS, "Avg"):
            assert float(r[col]) == pytest.approx(expected[r["method"]][col], abs=1e-9)
            assert float(r[col + "_std"]) == pytest.approx(expected[r["method"]][col + "_std"],
                                                           abs=1e-9)


def test_runs_with_another_lr_are_a_table_of_their_own(store):
    result = report(store)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("2 tables: the runs differ in lr, which are never averaged")
    rows = report_csv(store)
    assert sorted((r["lr"], r["method"]) for r in rows) == [
        ("0.05", "fedavg"), ("0.05", "fedbn"), ("0.5", "fedavg")]
    other = next(r for r in rows if r["lr"] == "0.5")
    run = child_runs(store, "0.5")
    assert len(run) == 2 and other["seeds"] == "2" and other["M45"] == ""  # M0 only
    mine = [r.data.metrics["final/target_acc_selected/global"] for r in run]
    assert float(other["M0"]) == pytest.approx(np.mean(mine), abs=1e-9)
    default = next(r for r in rows if (r["lr"], r["method"]) == ("0.05", "fedavg"))
    assert float(default["M0"]) == pytest.approx(
        expected_table(store, "selected", "0.05")["fedavg"]["M0"], abs=1e-9)


def test_versus_is_the_paired_difference_with_a_t_interval(store):
    result = report(store, "--filter", "params.lr = '0.05'", "--versus", "fedavg",
                    "--format", "json")
    assert result.exit_code == 0, result.output
    fedbn = next(r for r in json.loads(result.stdout) if r["method"] == "fedbn")
    mean, half = paired_interval(expected_table(store, "selected", "0.05"), "fedbn", "fedavg")
    shown, _, width = fedbn["vs fedavg (95% CI)"].partition(" ± ")
    assert float(shown) == pytest.approx(mean, abs=0.005)
    assert float(width) == pytest.approx(half, abs=0.005)


def test_ledger_and_timing_columns(store):
    rows = {r["method"]: r for r in report_csv(store, "--filter", "params.lr = '0.05'",
                                               "--ledger", "--timing")}
    client = MlflowClient(store)
    for method in METHODS:
        runs = child_runs(store, "0.05", method)
        ledger = pq.read_table(download_artifacts(
            run_id=runs[0].info.run_id, artifact_path="ledger.parquet",
            tracking_uri=store)).to_pylist()
        up = sum(e["bytes"] for e in ledger if e["direction"] == "up") / 2  # 2 rounds
        assert float(rows[method]["MB up/round"]) == pytest.approx(up / 1e6, abs=0.0006)
        assert rows[method]["shared"].split() == sorted({e["kind"] for e in ledger})
        seconds = [m.value for r in runs
                   for m in client.get_metric_history(r.info.run_id, "round_seconds")]
        assert float(rows[method]["s/round"]) == pytest.approx(np.mean(seconds), abs=0.006)


def test_paper_numbers_beside_the_measured(store, tmp_path):
    config = tmp_path / "paper.yaml"
    config.write_text("dataset: digits-rot\npaper:\n  source: Test et al.\n  selection: last\n"
                      "  accuracy:\n    fedbn: {M0: 50.0, M45: 40.0, Avg: 45.0}\n")
    result = report(store, "--filter", "params.lr = '0.05'", "--paper", str(config))
    assert result.exit_code == 0, result.output
    assert "last round" in result.output.splitlines()[0]  # the paper's selection by default
    expected = expected_table(store, "last", "0.05")["fedbn"]
    lines = result.output.splitlines()
    paper = next(i for i, line in enumerate(lines) if line.strip().startswith("Test et al."))
    assert lines[paper].split()[-3:] == ["50.00", "40.00", "45.00"]
    diffs = [float(x) for x in lines[paper + 1].split()[-3:]]
    assert diffs == pytest.approx([expected["M0"] - 50, expected["M45"] - 40,
                                   expected["Avg"] - 45], abs=0.006)


def test_markdown_and_latex_shapes(store):
    md = report(store, "--format", "markdown").stdout.strip().split("\n\n")
    assert len(md) == 4 and md[0].startswith("**Accuracy") and md[2].startswith("**Accuracy")
    headers = []
    for table in md[1::2]:
        lines = table.splitlines()
        cells = len(lines[0].split("|")) - 2
        assert lines[1] == "|" + "---|" * cells
        assert all(line.startswith("| ") and line.count("|") == cells + 1 for line in lines[2:])
        headers.append([c.strip() for c in lines[0].split("|")[1:-1]])
    assert headers == [["Method", "M0", "M45", "Avg"], ["Method", "M0", "Avg"]]
    tex = report(store, "--format", "latex").stdout
    assert tex.count(r"\begin{tabular}") == tex.count(r"\end{tabular}") == 2
    blocks = re.findall(r"\\begin\{tabular\}\{(lr*)\}(.*?)\\end\{tabular\}", tex, re.S)
    assert [spec for spec, _ in blocks] == ["lrrr", "lrr"]
    for spec, body in blocks:
        rows = [line for line in body.strip().splitlines() if line.endswith(r"\\")]
        assert len(rows) == 1 + (2 if spec == "lrrr" else 1)  # header and the methods
        assert all(line.count("&") == len(spec) - 1 for line in rows)
        assert all(re.search(r"(?<!\\)[%_#&]", line.replace(" & ", "")) is None
                   for line in rows)
        assert r"$\pm$" in body


def test_plot_is_one_titled_figure_per_table_with_a_panel_per_target(store, tmp_path,
                                                                     monkeypatch):
    figures = []
    save = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):
        panels = [ax.get_title() for ax in fig.axes if ax.axison]
        figures.append((fig.get_suptitle(), panels, len({ax.get_ylim() for ax in fig.axes})))
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    path = tmp_path / "curves.png"
    result = report(store, "--filter", "params.lr = '0.05'", "--plot", str(path))
    assert result.exit_code == 0, result.output
    with Image.open(path) as image:  # panels in rows of three: no strip MLflow cannot show
        assert image.format == "PNG" and image.size[0] < 2 * image.size[1]
    title, panels, y_axes = figures[0]
    assert title.startswith("digits-rot: fedavg, fedbn\n") and y_axes == 1
    assert panels == [f"held out: {t}" for t in TARGETS]
    assert f"figure of table 1 written to {path}" in result.stderr
    figures.clear()
    result = report(store, "--plot", str(path))  # two tables (lr): a figure each, named so
    assert result.exit_code == 0, result.output
    paths = [tmp_path / f"curves-lr={lr}.png" for lr in ("0.05", "0.5")]
    assert all(p.exists() for p in paths) and [f[0].split("\n")[0] for f in figures] == [
        "digits-rot: fedavg, fedbn [lr=0.05]", "digits-rot: fedavg [lr=0.5]"]
    assert all(f"figure of table {i + 1} [lr={lr}] written to {p}" in result.stderr
               for i, (lr, p) in enumerate(zip(("0.05", "0.5"), paths, strict=True)))


def test_per_round_is_the_mean_of_the_runs_histories(store):
    rows = report(store, "--filter", "params.lr = '0.05'", "--per-round", "train_loss",
                  "--format", "json")
    assert rows.exit_code == 0, rows.output
    curves = [r for r in json.loads(rows.stdout) if r.get("metric") == "train_loss"]
    client = MlflowClient(store)
    assert [r["method"] for r in curves] == list(METHODS)
    for row in curves:
        runs = child_runs(store, "0.05", row["method"])
        per_run = [sorted(client.get_metric_history(r.info.run_id, "train_loss"),
                          key=lambda m: m.step) for r in runs]
        assert len(runs) == len(TARGETS) * len(SEEDS) and all(len(h) == 2 for h in per_run)
        for rnd in (1, 2):
            assert row[f"round {rnd}"] == pytest.approx(
                np.mean([h[rnd - 1].value for h in per_run]), abs=1e-12)
    console = report(store, "--filter", "params.lr = '0.05'", "--per-round", "val_acc").stdout
    assert "val_acc per round (%), mean over held-out domains and seeds" in console


@pytest.mark.parametrize(("args", "message"), [
    (("--per-round", "no/such_metric"), "--per-round no/such_metric: no matching run logged"),
    (("--experiment", "no-such-experiment"), "no MLflow experiment 'no-such-experiment'"),
    (("--filter", "params.lr === 'x'"), "--filter \"params.lr === 'x'\""),
    (("--versus", "fedprox"), "--versus fedprox: no such method"),
    (("--paper", "{tmp}/no-paper.yaml"), "no-paper.yaml has no valid 'paper' section"),
    (("-o", "/proc/raydg/table.md"), "cannot write --output /proc/raydg/table.md"),
    (("--export", "{tmp}"), "cannot write --export"),
    (("--plot", "/proc/curves.png"), "cannot write --plot /proc/curves.png"),
])
def test_bad_input_is_one_line(store, tmp_path, args, message):
    (tmp_path / "no-paper.yaml").write_text("dataset: digits-rot\n")
    args = [a.format(tmp=tmp_path) for a in args]
    result = CliRunner().invoke(cli, ["report", "--tracking-uri", store, *args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("raydg: error: ") and message in lines[0]


def test_an_empty_result_says_so_and_exits_1(store):
    result = report(store, "--method", "gperxan")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.strip().startswith("raydg: no raydg runs match")


def test_the_mlflow_ui_shows_a_model_training_experiment_with_its_summary(store):
    [port] = free_ports()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store, "--host",
         "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(120, server.kill)  # a server that never listens fails the test
    guard.start()
    try:
        for line in server.stderr:  # blocks until the server says it listens
            if "running on" in line.lower() or "listening at" in line.lower():
                break
        assert server.poll() is None, "the MLflow server ended"
        api = f"http://127.0.0.1:{port}/api/2.0/mlflow"
        exp = requests.get(f"{api}/experiments/get-by-name",
                           params={"experiment_name": EXPERIMENT}, timeout=30).json()
        tags = {t["key"]: t["value"] for t in exp["experiment"]["tags"]}
        assert tags["mlflow.experimentKind"] == "custom_model_development"
        runs = requests.post(f"{api}/runs/search", json={
            "experiment_ids": [exp["experiment"]["experiment_id"]],
            "filter": "tags.mlflow.parentRunId IS NULL"}, timeout=30).json()["runs"]
        assert len(runs) == 5
        for run in runs:
            metrics = {m["key"] for m in run["data"]["metrics"]}
            assert {"avg/selected/global", "avg/last/global", "avg/oracle/global"} <= metrics
            run_tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
            assert "Accuracy (%) on the held-out domain" in run_tags["mlflow.note.content"]
            assert run_tags["raydg.version"] and "raydg.commit" in run_tags
        page = requests.get(f"http://127.0.0.1:{port}/", timeout=30)
        assert page.status_code == 200 and "<html" in page.text.lower()
    finally:
        guard.cancel()
        server.terminate()
        server.wait(timeout=60)


def test_logged_models_load_in_two_lines_and_score_the_logged_accuracies(store):
    """``raydg.load_model`` rebuilds the evaluated models from what the run logged: on the
    target domain they score the run's logged last-round and selected-round accuracies."""
    import raydg
    from raydg.datasets import load_dataset

    run = child_runs(store, "0.05", "fedavg")[0]
    test = load_dataset("digits-rot", None, None).domain(run.data.tags["raydg.target"])
    metrics = run.data.metrics
    for which, selection in (("final", "last"), ("selected", "selected")):
        model = raydg.load_model(run.info.run_id, tracking_uri=store, which=which)
        accuracy = 100 * float(np.mean(model.predict(test.x) == test.y))
        assert accuracy == pytest.approx(metrics[f"final/target_acc_{selection}/global"],
                                         abs=1e-10)
    assert model.classes == [str(c) for c in range(10)] and not model.module.training
    with pytest.raises(RaydgError, match=r"has no logged model: .*\(a child run"):  # parent
        raydg.load_model(run.data.tags["mlflow.parentRunId"], tracking_uri=store)


def test_the_logged_model_is_an_mlflow_model_that_predicts_as_raydg_load_model(store):
    """``mlflow.pyfunc.load_model`` on a child run's ``model`` (an MLflow model from code, no
    pickle): the same predictions as ``raydg.load_model``, with a uint8 image signature."""
    import mlflow

    import raydg
    from raydg.datasets import load_dataset

    run = child_runs(store, "0.05", "fedbn")[0]
    test = load_dataset("digits-rot", None, None).domain(run.data.tags["raydg.target"])
    mlflow.set_tracking_uri(store)
    served = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    ours = raydg.load_model(run.info.run_id, tracking_uri=store)
    np.testing.assert_array_equal(served.predict(test.x[:64]), ours.predict(test.x[:64]))
    (inputs,) = served.metadata.get_input_schema().inputs
    assert inputs.type == np.dtype("uint8") and inputs.shape == (-1, *test.x.shape[1:])
    assert "python_model.pkl" not in {a.path.split("/")[-1] for a in MlflowClient(
        store).list_artifacts(run.info.run_id, "model")}


def test_rows_name_the_options_that_are_not_the_papers(tmp_path, ray_session):
    """A run off its method's paper values is tagged so, and the report labels its row even
    when it is the method's only run; a run at the paper's values keeps the plain name."""
    uri = f"sqlite:///{tmp_path}/np.db"
    for options in ({"mu": 0.1}, {}):
        run_experiment(RunConfig(dataset="digits-rot", method="fedprox", target="M0", seeds=[0],
                                 rounds=1, local_steps=2, batch_size=16, tracking_uri=uri,
                                 experiment=f"np{len(options)}", options=options),
                       out=lambda _: None, progress="none")
    tags = [r.data.tags for r in MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("np1").experiment_id])]
    assert [t.get("raydg.not_paper") for t in tags if "raydg.target" in t] == ["mu=0.1"]
    for experiment, name in (("np1", "fedprox [mu=0.1]"), ("np0", "fedprox")):
        result = CliRunner().invoke(cli, ["report", "--tracking-uri", uri, "--experiment",
                                          experiment, "--format", "json"])
        assert result.exit_code == 0, result.output
        assert [r["method"] for r in json.loads(result.stdout)] == [name]


def test_a_diverging_runs_warning_is_logged_to_mlflow_and_reported(tmp_path, ray_session):
    """The divergence guard's line, printed once, is the child run's tag raydg.warnings and a
    line of the report under its run; the console report says where no run warned."""
    uri = f"sqlite:///{tmp_path}/warn.db"
    lines: list[str] = []
    run_experiment(RunConfig(dataset="digits-rot", target="M0", seeds=[0], rounds=2,
                             local_steps=3, batch_size=16, lr=1e6, tracking_uri=uri,
                             experiment="warn"), out=lines.append, progress="lines")
    said = [line.split("] ", 1)[1] for line in lines if "] warning:" in line]
    assert len(said) == 1 and "fedavg diverged in round 1: client" in said[0]
    (child,) = [r for r in MlflowClient(uri).search_runs(
        [MlflowClient(uri).get_experiment_by_name("warn").experiment_id])
        if "raydg.target" in r.data.tags]
    assert child.data.tags["raydg.warnings"] == said[0]
    result = CliRunner().invoke(cli, ["report", "--tracking-uri", uri, "--experiment", "warn"])
    assert result.exit_code == 0, result.output
    assert (f"Warnings (1):\n  fedavg M0 seed=0 ({child.info.run_id[:8]}): "
            f"{said[0].removeprefix('warning: ')}") in result.output


def test_metric_is_the_mean_of_a_final_metric_over_each_methods_runs(store):
    rows = report_csv(store, "--metric", "steps_per_client", "--filter", "params.lr != '0.5'")
    for row in rows:
        runs = child_runs(store, "0.05", row["method"])
        expected = np.mean([r.data.metrics["steps_per_client"] for r in runs])
        assert float(row["steps_per_client"]) == pytest.approx(expected, rel=1e-3)
    result = report(store, "--metric", "final/nothing")
    assert result.exit_code == 2 and "no matching finished run logged it" in result.output
