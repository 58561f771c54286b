"""Plugins: methods and datasets from outside raydg (examples/), one-line refusals of broken
ones, their origins in ``raydg list`` and MLflow, entry points of an installed package, and the
example method on a two-node cluster whose worker node cannot import it by itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from click.testing import CliRunner
from mlflow import MlflowClient
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raydg import plugins
from raydg.cli import cli
from raydg.datasets import DATASETS
from raydg.errors import RaydgError
from raydg.methods import METHODS
from raydg.models import MODELS
from raydg.registry import BUILT_IN

ROOT = Path(__file__).resolve().parents[1]
L2R = ROOT / "examples" / "l2r" / "raydg_example_l2r.py"
DIGITS_PNG = ROOT / "examples" / "folder_dataset" / "digits_png.py"
PLUGIN_MODULES = ("bad", "other_l2r", "raydg_example_l2r", "digits_png")
CLASH = """
from raydg.methods import Method, register

@register()
class Early(Method):
    name = "early-clash"

@register()
class Clash(Method):
    name = "{name}"
"""


@pytest.fixture
def forget():
    """What the plugins of a test registered, and their modules, are gone after it."""
    before = set(sys.modules)
    yield
    for registry in (METHODS, DATASETS, MODELS):
        for origin in {registry.origin(name) for name, _ in registry} - {BUILT_IN}:
            registry.remove(origin)
    for name in set(sys.modules) - before:
        if name in PLUGIN_MODULES:
            del sys.modules[name]


@pytest.mark.parametrize(("text", "message"), [
    ("x = (\n", "fails to import: SyntaxError: '(' was never closed (bad.py, line 1)"),
    ("import no_such_dependency_abc\n", "it imports a missing module 'no_such_dependency_abc'"),
    ("import math\nmath.sqrt(-1)\n", "fails to import: ValueError: math domain error (bad.py, "
                                     "line 2)"),
    (CLASH.format(name="fedavg"), "method 'fedavg' is already registered (built-in)"),
    ("import sys\nsys.exit(0)\n", "calls sys.exit(0) while it is imported: a plugin only "
                                  "registers entries"),
])
def test_a_broken_plugin_is_one_line_exit_2_and_leaves_nothing(tmp_path, text, message, forget):
    bad = tmp_path / "bad.py"
    bad.write_text(text)
    result = CliRunner().invoke(cli, ["run", "digits-style", "--plugin", str(bad)])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"raydg: error: plugin {str(bad)!r}") and line.endswith(message), line
    assert "bad" not in sys.modules and "early-clash" not in METHODS.names()


def test_a_missing_module_a_missing_file_and_a_clash_between_plugins(tmp_path, forget):
    runner = CliRunner()
    missing = runner.invoke(cli, ["run", "digits-style", "--plugin", "no_such_plugin_xyz"])
    assert missing.exit_code == 2
    assert missing.stderr.strip() == ("raydg: error: plugin 'no_such_plugin_xyz': no module "
                                      "named 'no_such_plugin_xyz'")
    gone = runner.invoke(cli, ["run", "digits-style", "--plugin", str(tmp_path / "gone.py")])
    assert gone.exit_code == 2 and "no such file" in gone.stderr
    other = tmp_path / "other_l2r.py"
    other.write_text(CLASH.format(name="l2r"))
    clash = runner.invoke(cli, ["run", "digits-style", "--plugin", str(L2R),
                                "--plugin", str(other)])
    assert clash.exit_code == 2
    (line,) = clash.stderr.strip().splitlines()
    assert line.startswith(f"raydg: error: plugin {str(other)!r}: method 'l2r' is already "
                           f"registered (plugin {L2R} (sha256 ")


def test_list_shows_each_entrys_origin(forget):
    out = CliRunner().invoke(cli, ["list", "methods", "--plugin", str(L2R)]).stdout
    lines = {line.split(" ")[0]: line for line in out.splitlines()}
    assert "[built-in]" in lines["fedavg"]
    assert f"[plugin {L2R} (sha256 " in lines["l2r"] and "options.weight=0.01" in lines["l2r"]
    datasets = CliRunner().invoke(cli, ["list", "datasets", "--plugin", str(DIGITS_PNG)])
    assert f"digits-png [plugin {DIGITS_PNG} (sha256 " in datasets.stdout


def test_an_installed_packages_entry_point_is_loaded_with_its_version(tmp_path, monkeypatch,
                                                                         forget):
    """A distribution on sys.path (as pip would install examples/l2r) with its entry point."""
    (tmp_path / "raydg_example_l2r.py").write_text(L2R.read_text())
    info = tmp_path / "raydg_example_l2r-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: raydg-example-l2r\n"
                                   "Version: 0.1.0\n")
    (info / "entry_points.txt").write_text("[raydg.methods]\nl2r = raydg_example_l2r\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = plugins.load()
    assert [p.module for p in loaded] == ["raydg_example_l2r"]
    assert METHODS.origin("l2r") == ("plugin raydg-example-l2r 0.1.0 (entry point "
                                     "raydg.methods:l2r)")
    assert plugins.runtime_env(loaded)["py_modules"] == [str(tmp_path / "raydg_example_l2r.py")]
    assert plugins.tags(loaded) == {"raydg.plugin.raydg_example_l2r": (
        "raydg-example-l2r 0.1.0 (entry point raydg.methods:l2r)")}
    with pytest.raises(RaydgError, match="a module named 'raydg_example_l2r' is already "
                                         "imported"):  # a file of that name is another module
        plugins.load([str(L2R)])


def _importable_on(address: str, node_id: str, module: str) -> bool:
    """Whether a Ray worker on node ``node_id`` of the cluster at ``address`` finds ``module``."""
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        here = NodeAffinitySchedulingStrategy(node_id, soft=False)
        def importable(name: str) -> bool:  # local: pickled by value, not by module
            import importlib.util

            return importlib.util.find_spec(name) is not None

        return ray.get(ray.remote(importable).options(scheduling_strategy=here).remote(module))
    finally:
        ray.shutdown()


def _check_the_l2r_run(uri: str, worker_id: str, tmp_path: Path) -> None:
    """The "plugin" experiment's l2r run in ``uri``: its parent names the plugin file, it logs
    its L2R term and trains, and a client actor of it ran on the node ``worker_id``."""
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("plugin").experiment_id])
    l2r, = (r for r in runs if r.data.params.get("method") == "l2r"
            and "mlflow.parentRunId" in r.data.tags)
    parent, = (r for r in runs if r.info.run_id == l2r.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["raydg.plugin.raydg_example_l2r"].startswith(f"{L2R} (sha256 ")
    norm = [m.value for m in client.get_metric_history(l2r.info.run_id, "l2r/norm")]
    loss = [m.value for m in client.get_metric_history(l2r.info.run_id, "train_loss")]
    assert len(norm) == 3 and all(v > 0 for v in norm) and loss[-1] < loss[0]  # it trains
    placement = client.download_artifacts(l2r.info.run_id, "placement.csv", str(tmp_path))
    assert worker_id[:8] in Path(placement).read_text()  # a client actor ran there


@pytest.mark.slow
def test_the_example_method_trains_on_a_two_node_cluster_and_reports_beside_fedavg(
        tmp_path, monkeypatch, forget):
    """The worker node's processes cannot import the example (checked); raydg ships it. One of
    the federation's client actors runs there, its L2R term is logged, and ``raydg report``
    prints its row in the same table as FedAvg's."""
    monkeypatch.chdir(tmp_path)  # nothing of the repository on the workers' paths by accident
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # 2 client actors in a federation: the head's one CPU cannot hold both, so one runs on the
    # worker whatever node Ray chooses first (with 1 actor, either node may take it)
    common = ["digits-style", "--target", "sketch", "--rounds", "3", "--local-steps", "8",
              "--seed", "0", "--batch-size", "16", "--clients", "3", "--actors", "2",
              "--placement", "spread",
              "--tracking-uri", uri, "--storage", str(tmp_path / "results"),
              "--experiment", "plugin", "--address"]
    try:
        worker = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        assert _importable_on(cluster.address, worker.node_id, "raydg_example_l2r") is False
        runner = CliRunner()
        done = runner.invoke(cli, ["run", *common, cluster.address, "--plugin", str(L2R),
                                   "--grid", "method=l2r,fedavg"])
        assert done.exit_code == 0, done.output
    finally:
        cluster.shutdown()
    _check_the_l2r_run(uri, worker.node_id, tmp_path)
    report = runner.invoke(cli, ["report", "--tracking-uri", uri, "--experiment", "plugin"])
    assert report.exit_code == 0, report.output
    table = report.stdout.split("\n\n")[0].splitlines()
    assert {line.split()[0] for line in table[3:]} == {"fedavg", "l2r"}


def test_a_plugin_file_is_refused_where_ray_was_started_without_it(ray_session, forget):
    """In a process that started Ray itself (a notebook's ray.init), raydg cannot give the
    workers a plugin file: one line, not a worker's ImportError later."""
    result = CliRunner().invoke(cli, ["run", "digits-style", "--plugin", str(L2R), "--method",
                                      "l2r", "--rounds", "1"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        "raydg: error: plugin files need a Ray that raydg starts or joins, to ship them to its "
        "workers; this process started Ray itself: ray.shutdown() first")


def test_the_example_folder_dataset_holds_the_digits_it_was_made_from(tmp_path, forget):
    """examples/folder_dataset: the script's PNG folders, loaded through the plugin's
    DomainBed-layout dataset, are digits-style's first images of each class, pixel for pixel
    (in each of the three channels)."""
    import subprocess

    import numpy as np

    from raydg.datasets import load_dataset

    subprocess.run([sys.executable, str(ROOT / "examples/folder_dataset/make_dataset.py"),
                    str(tmp_path), "--per-class", "3"], check=True, capture_output=True)
    plugins.load([str(DIGITS_PNG)])
    assert DATASETS.origin("digits-png").startswith(f"plugin {DIGITS_PNG}")
    png = load_dataset("digits-png", str(tmp_path), None, log=lambda _: None)
    digits = load_dataset("digits-style", None, None, log=lambda _: None)
    assert png.domain_names == digits.domain_names and png.classes == digits.classes
    for a, b in zip(png.domains, digits.domains, strict=True):
        for label in range(len(digits.classes)):
            made = a.x[a.y == label]
            source = b.x[b.y == label][:3, 0]
            assert len(made) == 3 and all((made[:, c] == source).all() for c in range(3))
    assert np.bincount(png.domains[0].y).tolist() == [3] * len(digits.classes)


FAILING = """
from raydg.methods import Method, register

@register()
class Failing(Method):
    name = "failing"

    def train_step(self, ctx, x, y):
        raise ValueError("this method always fails")
"""


@pytest.mark.slow
def test_a_method_that_fails_shows_its_traceback_once_and_no_ray_log(tmp_path):
    """A plugin method whose training raises (a researcher's bug): exit 1, the traceback that
    reaches the failing line once, raydg's lines naming the federation and the error, and
    not Tune's "Trials did not complete" in Ray's log format (it was all three: the remote
    traceback twice, 144 lines in all)."""
    (tmp_path / "failing.py").write_text(FAILING)
    done = subprocess.run(
        [sys.executable, "-m", "raydg", "run", "digits-style", "--plugin",
         str(tmp_path / "failing.py"), "--method", "failing", "--target", "sketch", "--rounds",
         "2", "--set", "max_failures=0", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
         "--storage", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.count('raise ValueError("this method always fails")') == 1
    assert done.stderr.rstrip().splitlines()[-1] == (
        "RuntimeError: a federation failed: ValueError: this method always fails")
    assert ("[sketch seed=0] failed (ValueError: this method always fails); no restart left: "
            "the experiment stops") in done.stdout.splitlines()
    assert not re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(INFO|WARNING|ERROR)",
                         done.stdout + done.stderr, re.MULTILINE)


def test_a_plugin_file_edited_before_resume_is_refused(tmp_path, forget):
    """The experiment records its plugins' origins (file and hash) in its manifest; resuming
    it with the file changed is one line, before the file is imported or Ray started."""
    from raydg.config import RunConfig, to_dict
    from raydg.experiment import run_experiment
    from raydg.trials.storage import write_manifest

    plugin = tmp_path / "other_l2r.py"
    plugin.write_text(L2R.read_text().replace('"l2r"', '"other-l2r"'))
    cfg = RunConfig(dataset="digits-rot", method="other-l2r", plugins=[str(plugin)])
    (loaded,) = plugins.load(cfg.plugins)
    write_manifest(str(tmp_path / "exp"), {"run_id": "0" * 32, "config": to_dict(cfg),
                                           "search": {}, "plugins": [loaded.origin]})
    plugin.write_text(plugin.read_text() + "\nraise SystemExit('the new code ran')\n")
    with pytest.raises(RaydgError, match=r"the experiment started with plugin .*other_l2r.py "
                                         r"\(sha256 \w+\), which is not here now"):
        run_experiment(RunConfig(), out=lambda _: None, progress="none",
                       resume=str(tmp_path / "exp"))
