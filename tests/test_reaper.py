"""The reaper: what raydg's local Ray leaves when raydg ends is ended, and a process that runs
many experiments keeps no reaper per experiment."""

from __future__ import annotations

import subprocess
import sys

import psutil

from raydg import reaper


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


def test_ending_a_watch_ends_what_is_left_and_the_reaper_itself():
    before = _children()
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        end = reaper.watch()  # watches ``left``, as it watches a Ray's processes
        # known by its pid: until it has exec'd, a new child's command line is still ours
        (started,) = [psutil.Process(pid) for pid in _children() - before - {left.pid}]
        assert left.poll() is None and started.is_running()
        end()  # as after ray.shutdown(): what is left of it goes, and the reaper with it
        assert left.wait(timeout=30) == -9
        assert not started.is_running() and _children() == before
    finally:
        left.kill()
