"""The reaper: what raydg's local Ray leaves when raydg ends is ended, and a process that runs
many experiments keeps no reaper per experiment."""

from __future__ import annotations

import subprocess
import sys

import psutil

from raydg import reaper


def _reapers() -> list[psutil.Process]:
    return [p for p in psutil.Process().children()
            if "raydg.reaper" in " ".join(p.cmdline())]


def test_ending_a_watch_ends_what_is_left_and_the_reaper_itself():
    before = _reapers()
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        end = reaper.watch()  # watches ``left``, as it watches a Ray's processes
        (started,) = [p for p in _reapers() if p not in before]
        assert left.poll() is None and started.is_running()
        end()  # as after ray.shutdown(): what is left of it goes, and the reaper with it
        assert left.wait(timeout=30) == -9
        assert not started.is_running() and _reapers() == before
    finally:
        left.kill()
