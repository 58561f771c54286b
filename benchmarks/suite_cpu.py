"""Where the test suite's CPU goes: the CPU seconds of every test, its Ray workers and the
commands it starts included, summed by file.

A test's wall time on a shared 2-core machine says more about its neighbours than about the
test; its CPU time does not. Each pytest process (each xdist worker) moves itself into a
cgroup of its own (cgroup v1 ``cpuacct`` or v2 ``cpu``; Linux, with the right to make one,
e.g. root), so every process it starts is counted there, even one that leaves its session
(a Ray head started by ``ray start``); a test is charged what its worker's group used while
it ran (its module's fixtures count to the tests that set them up and tear them down).
Printed: the total CPU and the files by CPU, with their tests' wall time beside it; ``--out``
keeps one JSON line per test.

Run:  python benchmarks/suite_cpu.py [--top 30] [--out cpu.jsonl] [-- PYTEST ARGS]
e.g.  python benchmarks/suite_cpu.py -- -m "not slow"
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

V1, V2 = Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup")
OUT_ENV = "RAYDG_SUITE_CPU_OUT"


def _group(name: str) -> Path:
    """A new cgroup for this process (and what it starts): its folder."""
    folder = (V1 if V1.is_dir() else V2) / name
    try:
        folder.mkdir(exist_ok=True)
        (folder / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as err:
        raise pytest.UsageError(f"suite_cpu: cannot make the cgroup {folder} ({err}); it needs "
                                "the right to make one (root, or a delegated cgroup)") from None
    return folder


def _seconds(folder: Path) -> float:
    """The CPU seconds of every process the group has held."""
    if (folder / "cpuacct.usage").exists():
        return int((folder / "cpuacct.usage").read_text()) / 1e9
    stat = dict(line.split() for line in (folder / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"]) / 1e6


class Plugin:
    """Charges each test the CPU its process's group used while the test ran."""

    def __init__(self, out: Path) -> None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.group, self.out = _group(f"raydg-suite-{worker}-{os.getpid()}"), out

    def pytest_unconfigure(self) -> None:
        """Leave the group, and remove it unless a process it started lives on."""
        (self.group.parent / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):  # not empty: a process it started lives on
            self.group.rmdir()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        cpu, wall = _seconds(self.group), time.monotonic()
        yield
        row = {"test": item.nodeid, "cpu": round(_seconds(self.group) - cpu, 2),
               "wall": round(time.monotonic() - wall, 2)}
        with self.out.open("a") as f:
            f.write(json.dumps(row) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    """Loaded by ``-p suite_cpu`` (this script does it): each pytest process counts its own."""
    if OUT_ENV in os.environ:
        config.pluginmanager.register(Plugin(Path(os.environ[OUT_ENV])), "suite-cpu-counter")


def table(rows: list[dict], top: int) -> str:
    """The total, then the ``top`` files by CPU seconds."""
    cpu: collections.Counter[str] = collections.Counter()
    wall: collections.Counter[str] = collections.Counter()
    for r in rows:
        name = r["test"].split("::")[0]
        cpu[name] += r["cpu"]
        wall[name] += r["wall"]
    lines = [f"{len(rows)} tests: {sum(cpu.values()):.0f} s of CPU, their wall times add up "
             f"to {sum(wall.values()):.0f} s", f"{'CPU s':>8} {'wall s':>8}  file"]
    lines += [f"{c:8.1f} {wall[f]:8.1f}  {f}" for f, c in cpu.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, help="keep one JSON line per test here")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args()
    if not (V1.is_dir() or (V2 / "cgroup.controllers").exists()):
        sys.exit("suite_cpu: no cgroup file system here (Linux only)")
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp) / "cpu.jsonl"
        out.unlink(missing_ok=True)
        here = str(Path(__file__).resolve().parent)
        env = {**os.environ, OUT_ENV: str(out),
               "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "suite_cpu",
                                *args.pytest_args], env=env)
        print(table([json.loads(line) for line in out.open()], args.top))
    sys.exit(code)


if __name__ == "__main__":
    main()
