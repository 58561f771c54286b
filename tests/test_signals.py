"""raydg.signals.detached: the parent that records a SIGTERM's stop when its child could not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from mlflow import MlflowClient

from raydg.signals import command as on_path

# The child ends as Ray's driver ends raydg when every process of a job is signalled: at once,
# before any Python code of raydg records the stop (``os._exit`` from the SIGTERM handler).
CHILD = textwrap.dedent("""
    import json, os, signal, sys, threading
    from raydg.cli.app import _record_stop
    from raydg.signals import detached, tell_parent

    told, code = json.loads(sys.argv[1]), int(sys.argv[2])

    def take_sigterm_here():  # a thread that does not block signals, as numpy's BLAS threads
        if sys.stdin.readline() == "signal a thread\\n":
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=take_sigterm_here, daemon=True).start()

    def command():
        signal.signal(signal.SIGTERM, lambda *_: os._exit(code))
        for key, value in told.items():
            tell_parent(key, value)
        print("ready", flush=True)
        signal.pause()

    detached(command, _record_stop)
""")


def _stopped(told: dict, code: int, by_thread: bool = False) -> tuple[int, str]:
    """Run CHILD under detached(), SIGTERM its parent once the child has told ``told``
    (``by_thread``: to a thread of the parent other than its main thread); the exit code and
    what it printed."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(told), str(code)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    if not by_thread:
        proc.send_signal(signal.SIGTERM)
    printed, _ = proc.communicate("signal a thread\n" if by_thread else "", timeout=60)
    return proc.returncode, printed


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('signals')}/mlflow.db"


def _runs(uri: str) -> tuple[str, dict[str, str]]:
    """A parent run RUNNING with three children: RUNNING, RUNNING, FINISHED."""
    client = MlflowClient(uri)
    experiment = client.create_experiment(f"e{os.urandom(4).hex()}")
    parent = client.create_run(experiment).info.run_id
    children = {}
    for name in ("a", "b", "done"):
        run = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
        children[name] = run
    client.set_terminated(children["done"], "FINISHED")
    return parent, children


def test_a_child_ended_before_it_recorded_the_stop_is_recorded_by_the_parent(store):
    parent, children = _runs(store)
    running = {"tracking_uri": store, "run_id": parent, "experiment_dir": "/x/exp-1"}
    code, printed = _stopped({"running": running}, 1)
    assert code == 143, printed
    assert printed.splitlines()[-1] == f"raydg: continue with: {on_path('raydg')} resume /x/exp-1"
    client = MlflowClient(store)
    assert client.get_run(parent).info.status == "KILLED"
    assert {k: client.get_run(r).info.status for k, r in children.items()} == {
        "a": "KILLED", "b": "KILLED", "done": "FINISHED"}


def test_a_stop_the_child_recorded_is_not_recorded_again(store):
    parent, _ = _runs(store)
    running = {"tracking_uri": store, "run_id": parent, "experiment_dir": "/x/exp-2"}
    code, printed = _stopped({"running": running, "recorded": {}}, 1)
    assert code == 143 and "continue with" not in printed, printed
    assert MlflowClient(store).get_run(parent).info.status == "RUNNING"


def test_a_child_that_finished_as_sigterm_came_is_left_alone(store):
    parent, _ = _runs(store)
    running = {"tracking_uri": store, "run_id": parent, "experiment_dir": "/x/exp-3"}
    assert _stopped({"running": running}, 0) == (0, "")
    assert MlflowClient(store).get_run(parent).info.status == "RUNNING"


def test_a_signal_another_thread_takes_is_passed_on(store):
    """The kernel hands a process-wide signal to any thread that does not block it: the
    parent passes it on although its main thread, waiting for the child, was not interrupted
    (before: the parent waited forever, a hang seen once in CI)."""
    parent, _ = _runs(store)
    running = {"tracking_uri": store, "run_id": parent, "experiment_dir": "/x/exp-5"}
    code, printed = _stopped({"running": running}, 1, by_thread=True)
    assert code == 143
    assert printed.splitlines()[-1] == f"raydg: continue with: {on_path('raydg')} resume /x/exp-5"
    assert MlflowClient(store).get_run(parent).info.status == "KILLED"


def test_a_run_the_store_does_not_hold_is_said(store):
    running = {"tracking_uri": store, "run_id": "0" * 32, "experiment_dir": "/x/exp-4"}
    code, printed = _stopped({"running": running}, 1)
    lines = printed.splitlines()
    assert code == 143 and len(lines) == 3, printed
    assert lines[0].startswith(f"raydg: error: the runs of MLflow run {'0' * 32} could not be "
                               "marked KILLED: ")
    assert lines[-1] == f"raydg: continue with: {on_path('raydg')} resume /x/exp-4"


def test_telling_a_parent_that_has_ended_is_no_error(monkeypatch):
    """A killed parent closed its end of the pipe: the child, stopping, tells nobody."""
    from raydg import signals

    reader, writer = os.pipe()
    os.close(reader)
    monkeypatch.setattr(signals, "_TO_PARENT", [writer])
    try:
        signals.tell_parent("recorded")
    finally:
        os.close(writer)


def test_a_command_is_named_as_the_user_can_type_it(tmp_path, monkeypatch):
    """The bare name where PATH finds this environment's script, else the script's full path,
    else ``python -m`` with this Python (raydg from a source tree: no script installed)."""
    bin_dir = tmp_path / "my env" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "raydg").write_text("#!/bin/sh\n")
    (bin_dir / "raydg").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", str(bin_dir))
    assert on_path("raydg") == "raydg"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert on_path("raydg") == str(bin_dir / "raydg")
    assert on_path("mlflow") == f"'{bin_dir / 'python'}' -m mlflow"
