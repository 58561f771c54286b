"""Shared fixtures. A local Ray is started for a test module that needs it, kept for the next
module that needs it too, and always shut down."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import ray
import torch
from filelock import FileLock

from raydg.cluster import lean
from raydg.config import RunConfig
from raydg.engine.parking import keep_warm
from raydg.resolve import resolve

# Two xdist workers, their Ray actors and the commands they start share the cores: torch's
# intra-op threads there only contend (measured: the backbone tests took 3x the CPU time with
# two threads as with one). Ray's workers and every command a test starts inherit the setting.
torch.set_num_threads(int(os.environ.setdefault("OMP_NUM_THREADS", "1")))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Exit with the tests' status once pytest has reported, without the interpreter's
    finalization: twice in about forty full runs (2026-11-26, 2026-11-27) the process
    segfaulted there, after every test had passed (torch, Ray's and MLflow's threads and
    extensions torn down in an order none of them controls). Not in any test or in raydg's own
    processes, which are checked by the tests that run them."""
    if EXIT_STATUS in config.stash:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash[EXIT_STATUS])


EXIT_STATUS = pytest.StashKey[int]()

# The suite's workers (pytest-xdist, ``--dist loadfile``) take one file at a time, in the order
# collected (``--no-loadscope-reorder``: xdist would otherwise put the files of most tests
# first, and the two tests of test_stress.py, the longest file, last). The longest files
# (measured 2026-11-30 on 2 cores) go first, so that the workers finish together rather than one
# waiting on the last long file; the order changes no result.
LONGEST_FIRST = ("test_stress.py", "test_faults.py", "test_cluster.py", "test_report.py",
                 "test_conformance.py", "test_api.py", "test_models.py", "test_trials.py",
                 "test_docs.py", "test_cli.py", "test_wheel.py", "test_plugins.py",
                 "test_forked.py", "test_conformance_checkpoints.py", "test_slurm.py",
                 "test_autoscaling.py", "test_conformance_compositions.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (:data:`LONGEST_FIRST`); then the files that use
    :func:`ray_session`, which each worker's next such file takes over; the rest as
    collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    on_ray = {item.path for item in items if "ray_session" in item.fixturenames}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), item.path not in on_ray))


def load_benchmark(name: str) -> ModuleType:
    """The script ``benchmarks/NAME.py`` as a module (benchmarks are not a package; a script
    imports its siblings from its folder, as ``python benchmarks/NAME.py`` finds them)."""
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now, between Ray's worker ports (10002-19999
    by default) and the kernel's ephemeral range: a port that ``bind(0)`` hands out is from that
    range, and any outgoing connection (Ray opens many) can take it before the server it was
    meant for binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = []
    for port in random.Random().sample(range(20000, low), low - 20000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"fewer than {n} free ports in 20000-{low - 1}")


def wait_for_head(head: subprocess.Popen) -> None:
    """Block until a ``ray start --head --block`` process with piped text output says it is
    up; fail with what it printed if it ended instead."""
    started = []
    for line in head.stdout:
        started.append(line)
        if "Ray runtime started" in line:
            break
    assert head.poll() is None, "".join(started)[-3000:]


def stop_ray_start(node: subprocess.Popen, timeout: float = 60) -> None:
    """End a ``ray start --block`` process that a test started: SIGTERM to it alone, so that it
    drains its node while the GCS still answers (SIGTERM to its whole process group ends a
    head's GCS too, and the head then waits out Ray's 30 s drain timeout), then SIGKILL to what
    is left of its group if it leads one (never ``ray stop``: other Rays run here)."""
    node.terminate()
    try:
        node.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        node.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.pid, signal.SIGKILL)


@pytest.fixture(scope="session", autouse=True)
def _storage(tmp_path_factory):
    """Tune's storage and the MLflow store in a temporary folder, never in the checkout."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAYDG_STORAGE", str(tmp_path_factory.mktemp("raydg-results")))
        mp.setenv("MLFLOW_TRACKING_URI",
                  f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}")
        yield


def start_local_ray(num_gpus: int = 0) -> None:
    """A fresh 2-CPU Ray of this machine (with ``num_gpus`` GPUs for Ray to schedule) with only
    the processes raydg uses (:func:`raydg.cluster.lean`: seconds less to start and to stop
    than Ray's own set)."""
    with lean():
        ray.init(address="local", num_cpus=2, num_gpus=num_gpus, include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False)


class SuiteRay:
    """The Ray that :func:`ray_session` started in this test process (its GCS address) and the
    module now using it."""

    address: str | None = None
    module: str | None = None


def end_suite_ray() -> None:
    if SuiteRay.address is not None and ray.is_initialized():
        ray.shutdown()
    SuiteRay.address = SuiteRay.module = None


@pytest.fixture(scope="module")
def ray_session(request):
    """The test process's local Ray (:func:`start_local_ray`): started for the first module
    that asks for it and handed on to the next module that asks (starting and stopping one
    costs seconds of CPU); ended before the first test of a module that has not asked for it
    (:func:`pytest_runtest_setup`), and with the session."""
    if ray.is_initialized() and ray.get_runtime_context().gcs_address != SuiteRay.address:
        pytest.fail("a test left a Ray of its own running")
    if not ray.is_initialized():
        start_local_ray()
        SuiteRay.address = ray.get_runtime_context().gcs_address
    SuiteRay.module = request.module.__name__
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before a test of a module that has not asked for :func:`ray_session` (yet): no Ray in
    this process, as before any module's first use of it."""
    if "ray_session" not in item.fixturenames and SuiteRay.module != item.module.__name__:
        end_suite_ray()


@pytest.fixture(scope="session", autouse=True)
def _end_suite_ray():
    yield
    end_suite_ray()


@pytest.fixture(scope="module")
def warm_actors(ray_session):
    """A module of simulations on one Ray whose client actors a finished simulation leaves to
    the next (:func:`raydg.engine.parking.keep_warm`): a few actors started, not two a test."""
    with keep_warm():
        yield


@pytest.fixture(autouse=True, scope="session")
def mlflow_tables_from_a_template():
    """A new MLflow SQLite store gets its tables by replaying MLflow's migrations: 1.5 s of CPU
    each, and the tests make well over a hundred. An experiment's new store gets them from the
    cache's template (:func:`raydg.tracking.store.check_store`); in the test processes every
    other new store does too: its empty file receives a copy of that template
    (:func:`raydg.tracking.store.copy_tables`)."""
    from mlflow.store.db import utils

    from raydg.datasets.cache import cache_root
    from raydg.tracking.store import copy_tables, tables_template

    template = tables_template(cache_root(None))
    made = utils._initialize_tables

    def initialize(engine) -> None:
        path = engine.url.database
        if engine.url.get_backend_name() != "sqlite" or not path or path == ":memory:":
            return made(engine)
        copy_tables(template, Path(path))

    utils._initialize_tables = initialize
    yield
    utils._initialize_tables = made


@pytest.fixture(scope="session")
def report_store(tmp_path_factory) -> str:
    """The runs of :func:`tests.report_runs.write_runs` in a store, written once for the whole
    run (:func:`made_once`; test_report.py and test_report_rows.py read it, never write): on
    the Ray of the module that first asks, else on one of its own."""
    from tests.report_runs import write_runs

    def write(folder: Path) -> None:
        started = not ray.is_initialized()
        if started:
            start_local_ray()
        try:
            write_runs(f"sqlite:///{folder}/mlflow.db")
        finally:
            if started:
                ray.shutdown()

    return f"sqlite:///{made_once(tmp_path_factory, 'report-store', write)}/mlflow.db"


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder ``name`` as ``make`` filled it once for the whole test run, by whichever
    xdist worker asks first while the others wait: a session fixture is otherwise made once
    per worker."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / name
    with FileLock(f"{folder}.lock"):
        if not (folder / "made").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / "made").touch()
    return folder


def stopped_and_restored(cfg: RunConfig, data, after_round: int, folder):
    """The federation run whole, and run again but stopped after ``after_round``'s evaluation
    with a checkpoint in ``folder`` and restored from it: (whole, restored, the checkpoint)."""
    from raydg import checkpoint
    from raydg.api import simulation

    whole = simulation(cfg, data, log=lambda _: None).run()
    sim = simulation(cfg, data, log=lambda _: None)

    class Stop(Exception):
        pass

    def stop(row):
        if row["round"] == after_round:
            checkpoint.write(folder, sim.snapshot(), dataclasses.asdict(cfg))
            raise Stop  # the federation is lost here, after the next round's aggregation

    with pytest.raises(Stop):
        sim.run(stop)
    again = simulation(cfg, data, log=lambda _: None,
                       restore=checkpoint.read(folder, dataclasses.asdict(cfg))).run()
    return whole, again, checkpoint.read(folder, dataclasses.asdict(cfg))


def tiny_config(**overrides) -> RunConfig:
    """A resolved digits-style config small enough for a test to run in seconds."""
    base = RunConfig(dataset="digits-style", method="fedavg", target="sketch", rounds=2,
                     local_steps=4, batch_size=16, val_every=2)
    return resolve(dataclasses.replace(base, **overrides))


def assert_same_as_on_a_local_ray(cfg: RunConfig, *others) -> None:
    """Run ``cfg`` on a fresh 2-CPU Ray of this machine alone and check that every experiment
    result in ``others`` has its results bit for bit: global weights, validation curves and the
    summary."""
    import numpy as np

    from raydg.experiment import run_experiment

    start_local_ray()
    try:
        local = run_experiment(dataclasses.replace(cfg, address=None), out=lambda _: None)
    finally:
        ray.shutdown()
    for other in others:
        for a, b in zip(other.runs, local.runs, strict=True):
            for k in a.global_state:
                np.testing.assert_array_equal(a.global_state[k], b.global_state[k], err_msg=k)
            assert [r["val_acc"] for r in a.history] == [r["val_acc"] for r in b.history]
        assert other.summary == local.summary
