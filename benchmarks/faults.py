"""The fault table: faults injected from outside into ``python -m raydg``, as a user meets them.

Each case runs the command line in a fresh temporary folder (its own storage and SQLite store),
injects one fault and prints one row: the command, its exit code, seconds from the fault to the
exit, lines of output, Python tracebacks in the output, the MLflow statuses of the runs, and the
rounds each federation's child run holds of ``target_acc`` (each round once: ``12/12``; a round
logged twice shows as more). Cases (``--cases`` picks some):

* ``sigterm-group``: SIGTERM to raydg's process group after round 2 (``timeout``, job control);
* ``sigterm-all``: SIGTERM to every process under raydg at once, Ray's too (a cgroup kill),
  then ``raydg resume``;
* ``sigterm-sigkill``: SIGTERM to the group, SIGKILL to it 1 s later (a short grace period);
* ``store-away-back``: the SQLite store moved away after round 3 and back after round 8;
* ``store-away-resume``: moved away after round 3, back after the run; then ``raydg resume``;
* ``resume-relative``: ``raydg resume`` of a folder by a relative path, after Ctrl-C;
* ``resume-lost-run``: ``raydg resume`` of a folder whose store no longer holds its run;
* ``checkpoint-object-array``: the checkpoint to continue from holds an object array, manifest
  re-hashed;
* ``checkpoint-outside``: its manifest names ``../../../../etc/passwd`` with that file's hash;
* ``report-unwritable``: ``raydg report -o`` into a folder that does not exist, and into one
  that cannot be made (under a file);
* ``kill-client-actor``: SIGKILL of a client actor mid-run;
* ``nan-options``: ``momentum: .nan``, ``options.mu: .nan``, ``weight_decay: .inf``;
* ``huge-population``: ``--clients 100000 --client-size 10``: the warning, then SIGTERM.

Run:  python benchmarks/faults.py [--cases NAME...]   (about 10 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

ROUNDS = 12
RUN = ["run", "digits-style", "--target", "sketch", "--rounds", str(ROUNDS), "--seed", "0",
       "--set", "checkpoint_every=1"]


@dataclass
class Case:
    """One command under a fault; its row of the table."""

    name: str
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="raydg-fault-")))
    shown: str = ""
    code: int | None = None
    seconds: float = 0.0
    output: str = ""
    note: str = ""

    @property
    def db(self) -> Path:
        return self.tmp / "mlflow.db"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "RAYDG_STORAGE": str(self.tmp / "results"),
                "MLFLOW_TRACKING_URI": f"sqlite:///{self.db}"}

    def start(self, *args: str) -> subprocess.Popen:
        self.shown = "raydg " + " ".join(args)
        return subprocess.Popen([sys.executable, "-m", "raydg", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=self.env,
                                cwd=self.tmp, start_new_session=True)

    def until(self, proc: subprocess.Popen, text: str) -> None:
        """Read the output until a line holds ``text``."""
        for line in proc.stdout:
            self.output += line
            if text in line:
                return
        raise RuntimeError(f"{self.name}: the command ended before printing {text!r}")

    def finish(self, proc: subprocess.Popen, since: float | None = None) -> None:
        since = time.monotonic() if since is None else since
        rest, _ = proc.communicate(timeout=600)
        self.output += rest
        self.code, self.seconds = proc.returncode, time.monotonic() - since

    def run(self, *args: str, then: str = "") -> None:
        """Run ``raydg ARGS`` to its end (``then``: the shown command's continuation)."""
        proc = self.start(*args)
        self.finish(proc)
        self.shown += then

    def folder(self) -> str:
        return next(str(p) for p in (self.tmp / "results").iterdir() if p.is_dir())

    def row(self) -> str:
        lines = self.output.splitlines()
        return (f"| {self.name} | `{self.shown}` | {self.code} | {self.seconds:.1f} | "
                f"{len(lines)} | {self.output.count('Traceback')} | {self.statuses()} | "
                f"{self.note} |")

    def statuses(self) -> str:
        if not self.db.exists():
            return "no store"
        from mlflow import MlflowClient

        client = MlflowClient(f"sqlite:///{self.db}")
        exps = [e.experiment_id for e in client.search_experiments()]
        runs = client.search_runs(exps) if exps else []
        shown = []
        for r in sorted(runs, key=lambda r: "mlflow.parentRunId" in r.data.tags):
            if "mlflow.parentRunId" not in r.data.tags:
                shown.append(f"parent {r.info.status}")
                continue
            steps = [m.step for m in client.get_metric_history(r.info.run_id, "target_acc")]
            repeats = "" if len(set(steps)) == len(steps) else " (repeats)"
            shown.append(f"child {r.info.status} {len(steps)}/{ROUNDS}{repeats}")
        return ", ".join(shown) or "no runs"


def _signal(proc: subprocess.Popen, sig: int, to: str) -> None:
    under = psutil.Process(proc.pid).children(recursive=True)
    if to == "group":
        os.killpg(proc.pid, sig)
        return
    for p in [psutil.Process(proc.pid), *under]:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def _terminated(case: Case, to: str) -> None:
    """The run, SIGTERM ``to`` its group or every process after round 2, to its end."""
    proc = case.start(*RUN)
    case.until(proc, "] round 2/")
    start = time.monotonic()
    _signal(proc, signal.SIGTERM, to)
    case.finish(proc, start)


def sigterm_group(case: Case) -> None:
    _terminated(case, "group")
    case.shown += "; SIGTERM to its process group after round 2"


def sigterm_all(case: Case) -> None:
    _terminated(case, "all")
    case.note = f"stopped: exit {case.code} in {case.seconds:.1f} s"
    case.run("resume", case.folder(), then="; after SIGTERM to every process under raydg")


def sigterm_sigkill(case: Case) -> None:
    proc = case.start(*RUN)
    case.until(proc, "] round 2/")
    under = psutil.Process(proc.pid).children(recursive=True)
    start = time.monotonic()
    _signal(proc, signal.SIGTERM, "group")
    time.sleep(1.0)  # the grace period
    _signal(proc, signal.SIGKILL, "group")
    case.finish(proc, start)
    _, alive = psutil.wait_procs(under, timeout=60)
    case.note = f"{len(alive)} processes left 60 s later"
    case.shown += "; SIGTERM to its group, SIGKILL 1 s later"


def _store_away(case: Case, back: str | None) -> subprocess.Popen:
    proc = case.start(*RUN)
    case.until(proc, "] round 3/")
    case.db.rename(case.tmp / "away.db")
    if back:
        case.until(proc, back)
        (case.tmp / "away.db").rename(case.db)
    return proc


def store_away_back(case: Case) -> None:
    case.finish(_store_away(case, "] round 8/"))
    case.shown += "; store moved away after round 3, back after round 8"


def store_away_resume(case: Case) -> None:
    case.finish(_store_away(case, None))
    (case.tmp / "away.db").rename(case.db)
    case.note = f"run: exit {case.code}, {len(case.output.splitlines())} lines"
    case.run("resume", case.folder(), then="; store away from round 3 to the end of the run")


def _stopped(case: Case) -> str:
    """A run stopped by SIGINT after round 2; its experiment folder."""
    proc = case.start(*RUN)
    case.until(proc, "] round 2/")
    proc.send_signal(signal.SIGINT)
    case.finish(proc)
    return case.folder()


def resume_relative(case: Case) -> None:
    folder = os.path.relpath(_stopped(case), case.tmp)
    case.output = ""
    case.run("resume", folder)


def resume_lost_run(case: Case) -> None:
    folder = _stopped(case)
    case.db.rename(case.tmp / "old.db")  # an empty store at the same URI
    case.output = ""
    case.run("resume", folder)


def _latest(folder: str) -> Path:
    from ray.tune import ExperimentAnalysis

    (trial,) = ExperimentAnalysis(folder).trials
    return Path(trial.run_metadata.checkpoint_manager.latest_checkpoint_result.checkpoint.path)


def _rehash(point: Path, extra: dict[str, str] | None = None) -> None:
    manifest = json.loads((point / "manifest.json").read_text())
    for name in manifest["files"]:
        manifest["files"][name] = hashlib.sha256((point / name).read_bytes()).hexdigest()
    manifest["files"].update(extra or {})
    (point / "manifest.json").write_text(json.dumps(manifest))


def checkpoint_object_array(case: Case) -> None:
    folder = _stopped(case)
    point = _latest(folder)
    np.savez(point / "arrays.npz", a0=np.array([object()], dtype=object), allow_pickle=True)
    _rehash(point)
    case.output = ""
    case.run("resume", folder, then="; its checkpoint holds an object array")


def checkpoint_outside(case: Case) -> None:
    folder = _stopped(case)
    point = _latest(folder)
    target = "../../../../etc/passwd"
    _rehash(point, {target: hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()})
    case.output = ""
    case.run("resume", folder, then=f"; its manifest names {target}")


def report_unwritable(case: Case) -> None:
    case.run(*RUN[:-2], "--rounds", "1")
    (case.tmp / "a-file").write_text("")
    case.output = ""
    case.run("report", "-o", str(case.tmp / "missing" / "table.csv"))
    case.note = f"into a missing folder: exit {case.code} (the folder is made)"
    case.output = ""
    case.run("report", "-o", str(case.tmp / "a-file" / "table.csv"))


def kill_client_actor(case: Case) -> None:
    proc = case.start(*RUN)
    case.until(proc, "] round 2/")
    (victim,) = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if " ".join(p.cmdline()).startswith("ray::ClientHost")][:1]
    victim.kill()
    case.finish(proc)
    case.note = f"{case.output.count('Trial task failed')} Tune 'Trial task failed' blocks"
    case.shown += "; SIGKILL of a client actor after round 2"


def nan_options(case: Case) -> None:
    codes = []
    for setting in ("momentum=.nan", "options.mu=.nan", "weight_decay=.inf"):
        method = ["--method", "fedprox"] if "mu" in setting else []
        case.run(*RUN, *method, "--set", setting)
        codes.append(case.code)
    case.shown = "raydg run ... --set momentum=.nan, options.mu=.nan or weight_decay=.inf"
    case.note = f"exit codes {codes}"


def huge_population(case: Case) -> None:
    proc = case.start("run", "digits-style", "--target", "sketch", "--clients", "100000",
                      "--client-size", "10", "--rounds", "1")
    case.until(proc, "--validate-clients sampled")
    proc.send_signal(signal.SIGTERM)
    case.finish(proc)
    case.note = "warning names --validate-clients sampled"


CASES: dict[str, Callable[[Case], None]] = {
    "sigterm-group": sigterm_group, "sigterm-all": sigterm_all,
    "sigterm-sigkill": sigterm_sigkill, "store-away-back": store_away_back,
    "store-away-resume": store_away_resume, "resume-relative": resume_relative,
    "resume-lost-run": resume_lost_run, "checkpoint-object-array": checkpoint_object_array,
    "checkpoint-outside": checkpoint_outside, "report-unwritable": report_unwritable,
    "kill-client-actor": kill_client_actor, "nan-options": nan_options,
    "huge-population": huge_population}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    args = p.parse_args(argv)
    print("| case | command | exit | s | lines | tracebacks | MLflow runs (child: rounds "
          "logged) | note |\n|---|---|---|---|---|---|---|---|", flush=True)
    for name in args.cases:
        case = Case(name)
        CASES[name](case)
        print(case.row(), flush=True)


if __name__ == "__main__":
    main()
