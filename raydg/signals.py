"""How an experiment stops on a signal, whoever sends it and to whom.

SIGTERM to raydg stops the experiment as Ctrl-C does: Tune stops every trial, the runs end
``KILLED``, the checkpoints stay, a resume hint is printed and the exit code is 143.

Two things stand in the way of that when a signal is not sent to raydg alone:

* ``timeout``, a shell's job control, ``docker stop`` and batch schedulers signal a whole
  process group, and the processes of the Ray that raydg starts are raydg's children, in its
  group: Ray's GCS and raylet would end the moment raydg begins to stop. :func:`detached` runs
  an experiment command in a session of its own, under a parent that stays in the caller's group
  and only passes signals on.
* A scheduler that signals every process of a job (a cgroup) ends Ray anyway, and Ray's
  driver may then end raydg before its Python code runs again (the store's connection
  broken: exit code 1, no handler run). :func:`stop_on_sigterm` records the stop (the runs
  ``KILLED``, the resume hint) the moment SIGTERM's handler runs, before it asks Tune to stop,
  and exits 143 if Tune has not stopped ``STOP_SECONDS`` later (the ``RAYDG_STOP_SECONDS``
  environment variable, default 8, within the 10 s that most schedulers give before SIGKILL);
  and the parent of :func:`detached`, which outlives it, records the stop when the child could
  not (the child tells it, :func:`tell_parent`, what it runs and when it has recorded), and
  exits 143. Checkpoints are on disk whenever a round ends; ``raydg resume`` continues from the
  last one Tune recorded.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

TERMINATED = threading.Event()  # the experiment was stopped by SIGTERM
_RECORDING: list[threading.Thread] = []  # what records that stop
_TO_PARENT: list[int] = []  # in the child of detached(): the pipe to its parent
STOP_SECONDS = float(os.environ.get("RAYDG_STOP_SECONDS", "8"))
PASSED_ON = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
             signal.SIGHUP: signal.SIGTERM}  # a closed terminal stops the run cleanly
_PR_SET_PDEATHSIG = 1


def detached(command: Callable[[], None],
             record_stop: Callable[[dict[str, str]], None] | None = None) -> NoReturn:
    """Run ``command`` in a child process in a new session and exit as it does (128 + N if a
    signal N ended it). This process passes SIGINT and SIGTERM (SIGHUP as SIGTERM) on to the
    child; if this process is killed, the child receives SIGTERM. A child that does not succeed
    after a SIGTERM was passed on exits 143, however it ended; if it had told this process that
    it runs an experiment (:func:`tell_parent`) but not that it recorded the stop,
    ``record_stop`` is called with what it told. Linux only (elsewhere ``command`` runs
    here)."""
    if not sys.platform.startswith("linux"):
        command()
        sys.exit(0)
    parent = os.getpid()
    reader, writer = os.pipe()
    received: list[int] = []  # what the handlers caught, to pass on
    signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_ON)  # this thread's: held until the fork
    previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
                for sig in PASSED_ON}
    wake = _wakeup_pipe()
    child = os.fork()  # before torch or Ray are imported: nothing to corrupt
    if child == 0:
        os.close(signal.set_wakeup_fd(-1))  # the pipe's write end, and its read end
        os.close(wake)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
        os.close(reader)
        _TO_PARENT.append(writer)
        os.setsid()
        terminate_when_gone(parent)
        command()
        sys.exit(0)
    os.close(writer)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
    status, sent = _pass_on_until_exit(child, wake, received)
    code = os.waitstatus_to_exitcode(status)
    code = code if code >= 0 else 128 - code
    if code != 0 and signal.SIGTERM in sent:
        told = _told(reader)
        if record_stop is not None and "running" in told and "recorded" not in told:
            record_stop(told["running"])
        code = 143
    sys.exit(code)


def _wakeup_pipe() -> int:
    """The read end of a pipe that Python's C signal handler writes to, in whichever thread
    the kernel hands a signal to (numpy's BLAS threads do not block signals: a signal they
    take interrupts no system call of the main thread)."""
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_w)
    return wake_r


def _pass_on_until_exit(child: int, wake: int, received: list[int]) -> tuple[int, set[int]]:
    """Pass each caught signal on (SIGHUP as SIGTERM) until ``child`` exits; its wait status
    and the signals passed on. Waits on the child's pidfd and the wakeup pipe, never on
    ``waitpid`` alone, which a signal taken by another thread would not interrupt."""
    pidfd = os.pidfd_open(child)
    sent: set[int] = set()
    while True:
        ready, _, _ = select.select([pidfd, wake], [], [])  # the handlers run as it returns
        with contextlib.suppress(BlockingIOError):
            while os.read(wake, 512):
                pass
        while received:
            sig = PASSED_ON[received.pop(0)]
            sent.add(sig)
            with contextlib.suppress(ProcessLookupError):  # it has just ended
                os.kill(child, sig)
        if pidfd in ready:
            os.close(pidfd)
            return os.waitpid(child, 0)[1], sent


def tell_parent(key: str, value: dict[str, str] | None = None) -> None:
    """Tell the parent of :func:`detached` ``key`` (``running``: what records a stop of the
    experiment; ``recorded``: it is recorded); nothing without such a parent, or once it has
    ended (killed: this process is stopping on the SIGTERM its end sent)."""
    for fd in _TO_PARENT:
        with contextlib.suppress(BrokenPipeError):
            os.write(fd, (json.dumps({key: value or {}}) + "\n").encode())


def command(name: str) -> str:
    """``name`` (raydg, mlflow) as the user can type it: the bare name where it is on PATH as
    this environment's, else its full path (a virtual environment not activated), else
    ``python -m name`` with this Python (no script installed: a source tree on PYTHONPATH)."""
    mine = Path(sys.executable).parent / name
    if not mine.is_file():
        return f"{shlex.quote(sys.executable)} -m {name}"
    found = shutil.which(name)
    return name if found and Path(found).resolve() == mine.resolve() else str(mine)


def say_stopped(directory: str) -> None:
    """The lines that end an experiment stopped by SIGTERM."""
    print(f"raydg: stopped (SIGTERM); the runs are marked KILLED\n"
          f"raydg: continue with: {command('raydg')} resume {directory}", file=sys.stderr,
          flush=True)


def _told(reader: int) -> dict[str, dict[str, str]]:
    """What the child told, read without waiting (a process it started may hold the pipe)."""
    os.set_blocking(reader, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(reader, 65536):
            data += chunk
    told: dict[str, dict[str, str]] = {}
    for line in data.decode().splitlines():
        told.update(json.loads(line))
    return told


def terminate_when_gone(parent: int) -> None:
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
    a list for what records the stop: those run in order, in a thread of their own, as soon as
    the handler runs; if Tune's stop has not ended ``STOP_SECONDS`` later, the process exits
    143. Installed after ``ray.init``, which sets its own handler; main thread only."""
    on_stop: list[Callable[[], None]] = []
    if threading.current_thread() is not threading.main_thread():
        yield on_stop
        return

    def record() -> None:
        for step in on_stop:
            step()
        sys.stdout.flush()
        sys.stderr.flush()
        tell_parent("recorded")

    def give_up() -> None:
        stop_recorded()
        os._exit(143)

    def stop(_signum: int, _frame: object) -> None:
        if TERMINATED.is_set():  # asked again (passed on, or the parent's end): stopping
            return
        TERMINATED.set()
        _RECORDING.append(threading.Thread(target=record, daemon=True))
        _RECORDING[-1].start()
        timer = threading.Timer(STOP_SECONDS, give_up)
        timer.daemon = True  # a stop that ends in time exits at once
        timer.start()
        os.kill(os.getpid(), signal.SIGINT)  # Tune's SIGINT handler, or KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield on_stop
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_recorded() -> bool:
    """Whether a SIGTERM's stop was recorded (:func:`stop_on_sigterm`), once its records have
    run (waiting at most ``STOP_SECONDS`` for them)."""
    for thread in _RECORDING:
        thread.join(STOP_SECONDS)
    return bool(_RECORDING)
