"""Nothing of a local Ray outlives raydg, even when raydg is killed (SIGKILL, OOM).

``ray.shutdown()`` ends the Ray that raydg starts; a killed raydg cannot call it, and Ray then
leaves its dashboard and runtime-env agents running. :func:`watch` starts a small process that
holds a pipe from raydg and the processes of its Ray (pid and start time, so that a reused pid
is never touched); when the pipe closes, i.e. when raydg has ended in any way, it kills those
still running and exits.

Run as ``python -m raydg.reaper``; it reads the processes as one JSON line on stdin.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import psutil


def watch() -> Callable[[], None]:
    """Watch every process this one has started so far (its local Ray); the function returned
    ends the watch once that Ray has been shut down (the reaper ends what is left of it and
    exits: a process that runs many experiments keeps no reaper per experiment)."""
    procs = [[p.pid, p.create_time()] for p in psutil.Process().children(recursive=True)]
    reaper = subprocess.Popen([sys.executable, "-m", "raydg.reaper"], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    assert reaper.stdin is not None
    reaper.stdin.write((json.dumps(procs) + "\n").encode())
    reaper.stdin.flush()

    def end() -> None:
        reaper.stdin.close()
        reaper.wait()

    return end


def main() -> None:
    procs = json.loads(sys.stdin.readline())
    sys.stdin.read()  # returns when every writer has closed the pipe: raydg has ended
    for pid, started in procs:
        try:
            process = psutil.Process(pid)
            if process.create_time() == started:
                process.kill()
        except psutil.Error:  # gone already, or not ours to end
            continue


if __name__ == "__main__":
    main()
