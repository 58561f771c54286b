"""How an experiment stops on a signal, whoever sends it and to whom.

SIGTERM to raydg stops the experiment as Ctrl-C does: Tune stops every trial, the runs end
``KILLED``, the checkpoints stay, a resume hint is printed and the exit code is 143.

Two things stand in the way of that when a signal is not sent to raydg alone:

* ``timeout``, a shell's job control, ``docker stop`` and batch schedulers signal a whole
  process group, and the processes of the Ray that raydg starts are raydg's children, in its
  group: Ray's GCS and raylet would end the moment raydg begins to stop. :func:`detached` runs
  an experiment command in a session of its own, under a parent that stays in the caller's group
  and only passes signals on.
* A scheduler that signals every process of a job (a cgroup) ends Ray anyway. Then Tune's stop
  can wait a minute for a GCS that is gone; :func:`stop_on_sigterm` gives it ``STOP_SECONDS``
  (the ``RAYDG_STOP_SECONDS`` environment variable, default 8, within the 10 s that most
  schedulers give before SIGKILL), then records the stop itself and exits 143. Checkpoints are
  on disk whenever a round ends; ``raydg resume`` continues from the last one Tune recorded.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import NoReturn

TERMINATED = threading.Event()  # the experiment was stopped by SIGTERM
STOP_SECONDS = float(os.environ.get("RAYDG_STOP_SECONDS", "8"))
PASSED_ON = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
             signal.SIGHUP: signal.SIGTERM}  # a closed terminal stops the run cleanly
_PR_SET_PDEATHSIG = 1


def detached(command: Callable[[], None]) -> NoReturn:
    """Run ``command`` in a child process in a new session and exit as it does (128 + N if a
    signal N ended it). This process passes SIGINT and SIGTERM (SIGHUP as SIGTERM) on to the
    child; if this process is killed, the child receives SIGTERM. Linux only (elsewhere
    ``command`` runs here)."""
    if not sys.platform.startswith("linux"):
        command()
        sys.exit(0)
    parent = os.getpid()
    child = os.fork()  # before torch or Ray are imported: one thread, nothing to corrupt
    if child == 0:
        os.setsid()
        _terminate_when_gone(parent)
        command()
        sys.exit(0)
    for sig, sent in PASSED_ON.items():
        signal.signal(sig, lambda _signum, _frame, sent=sent: _send(child, sent))
    _, status = os.waitpid(child, 0)  # resumed after each handler (PEP 475)
    code = os.waitstatus_to_exitcode(status)
    sys.exit(code if code >= 0 else 128 - code)


def _send(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it has just ended: waitpid returns
        os.kill(pid, sig)


def _terminate_when_gone(parent: int) -> None:
    """SIGTERM to this process when its parent ends (``PR_SET_PDEATHSIG``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it ended before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[list[Callable[[], None]]]:
    """SIGTERM stops the experiment as Ctrl-C does (Tune's SIGINT handler) instead of Ray's
    native abort, and sets ``TERMINATED``; a SIGTERM after the first changes nothing. Yields
    a list for what records the stop if Tune's stop has not ended after ``STOP_SECONDS``:
    those run in order, then the process exits 143. Installed after ``ray.init``, which sets
    its own handler; main thread only."""
    on_timeout: list[Callable[[], None]] = []
    if threading.current_thread() is not threading.main_thread():
        yield on_timeout
        return

    def give_up() -> None:
        for record in on_timeout:
            record()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(143)

    def stop(_signum: int, _frame: object) -> None:
        if TERMINATED.is_set():  # asked again (passed on, or the parent's end): stopping
            return
        TERMINATED.set()
        timer = threading.Timer(STOP_SECONDS, give_up)
        timer.daemon = True  # a stop that ends in time exits at once
        timer.start()
        os.kill(os.getpid(), signal.SIGINT)  # Tune's SIGINT handler, or KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield on_timeout
    finally:
        signal.signal(signal.SIGTERM, previous)
