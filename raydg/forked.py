"""Work that needs torch, done apart from the process that runs an experiment.

That process (Tune's side: planning's results, progress, MLflow, the trials' reports) holds no
model, but importing torch costs it about 265 MB of private memory for the whole run, a
run's largest single share on a laptop (``benchmarks/memory.py``). The steps that need torch
(the planning step, whose method and model registries import it, and the initial weights) run
in a child forked for them, which returns plain data (pickled through a pipe) and exits. Where
torch is already imported (a script that uses the Python API, a plugin, the tests) they run in
the calling process: a child would save nothing.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Callable
from typing import TypeVar

from raydg.errors import RaydgError
from raydg.signals import terminate_when_gone

T = TypeVar("T")
Log = Callable[[str], None]


def apart(work: Callable[[Log], T], log: Log) -> T:
    """``work(log)``, in a forked child unless torch is imported here. The child's lines are
    said by ``log`` here once it has answered; its exception is raised here (with the child's
    traceback as a note where it is not a :class:`RaydgError`); its result must pickle."""
    if "torch" in sys.modules or not sys.platform.startswith("linux"):
        return work(log)
    parent = os.getpid()
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(reader)
        _answer(work, writer, parent)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        answer = pipe.read()
    _, status = os.waitpid(child, 0)
    if not answer:
        raise RaydgError(f"raydg's planning process ended (exit status "
                         f"{os.waitstatus_to_exitcode(status)}) before it answered")
    ok, value, lines = pickle.loads(answer)  # what our own child wrote
    for line in lines:
        log(line)
    if not ok:
        raise value
    return value


def _answer(work: Callable[[Log], T], writer: int, parent: int) -> None:
    """In the child: run ``work``, write (ok, result or exception, lines) and exit at once
    (no atexit handler of the parent's runs twice)."""
    code = 0
    try:
        terminate_when_gone(parent)
        lines: list[str] = []
        try:
            answer = (True, work(lines.append), lines)
        except BaseException as err:  # raised in the parent, where it is handled
            if not isinstance(err, RaydgError):
                err.add_note("in raydg's planning process:\n" + traceback.format_exc().rstrip())
            answer = (False, err, lines)
        with os.fdopen(writer, "wb") as pipe:
            try:
                pipe.write(pickle.dumps(answer))
            except Exception as err:  # a result or exception that does not pickle: as text
                failed = RaydgError(f"{type(answer[1]).__name__}: {answer[1]} (and it could "
                                    f"not be passed on: {err})")
                pipe.write(pickle.dumps((False, failed, lines)))
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
