"""What the console shows while an experiment runs."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable

import numpy as np

from raydg.plan import Federation


class Progress:
    """Each finished round of a federation (training loss, source validation, held-out
    accuracy, the round's seconds) and the experiment's status (federations done and running,
    the time left for all of them): one line per round and a status line every
    ``status_every`` rounds and as a federation ends (``lines``), a board of one updating line
    per running federation under the status on a terminal (``live``), or nothing (``none``:
    only messages marked important, e.g. warnings). A round's line fits 80 columns for the
    embedded datasets' domain names.

    The time left is the work left over the federations running: each running federation's
    rounds left at the mean steady round time (rounds after the first), and each unfinished
    federation not started yet (resumed: not finished before) at the mean start-up (trial start
    to first round, actors and round 1 included) plus its other rounds left, shared by as many
    federations as have run at once so far."""

    def __init__(self, feds: list[Federation], out: Callable[[str], None],
                 mode: str = "lines", done: dict[str, int] | None = None,
                 status_every: int = 10) -> None:
        self.rounds = {f.key: f.config.rounds for f in feds}
        self.done = {k: (done or {}).get(k, 0) for k in self.rounds}
        self.started: dict[str, float] = {}  # key -> when its trial started
        self.startup: list[float] = []
        self.steady: list[float] = []
        self.out, self.mode, self.status_every = out, mode, status_every
        self.board: dict[str, str] = {}  # live: the line of each running federation
        self.status = ""  # live: the board's last line
        self.drawn = self.reported = self.width = 0
        self.placed_once = False

    def say(self, text: str, important: bool = False) -> None:
        """A message (placement, restart, warning), above the live board."""
        if self.mode != "none" or important:
            self._clear()
            self.out(text)
            self._draw()

    def _clear(self) -> None:
        if self.drawn:
            sys.stdout.write(f"\x1b[{self.drawn}F\x1b[J")  # up to the board's start, erase
            self.drawn = 0

    def _draw(self) -> None:
        if self.mode == "live" and self.board:
            width = shutil.get_terminal_size().columns - 1
            lines = [*self.board.values(), self.status]
            sys.stdout.write("".join(line[:width] + "\n" for line in lines))
            sys.stdout.flush()
            self.drawn = len(lines)

    def start(self, key: str) -> None:
        """A federation's trial started (the first one says so: its driver and client actors
        take seconds to start before round 1)."""
        if not self.started:
            self.say("raydg: starting the federations' drivers and client actors")
        self.started.setdefault(key, time.perf_counter())

    def placed(self, fed: Federation, line: str) -> None:
        """A federation's client actors are placed: say where and, for the first one, that
        round 1 is under way (its line comes when it ends)."""
        first = not self.placed_once
        self.placed_once = True
        self.say(line)
        if first:
            self.say(f"[{fed.title()}] round {self.done[fed.key] + 1}/{self.rounds[fed.key]} "
                     "under way")

    def running(self) -> list[str]:
        return [k for k in self.started if self.done[k] < self.rounds[k]]

    def left(self, steady: float) -> float:
        """Seconds until every federation is done (see the class)."""
        running = self.running()
        pending = [k for k in self.rounds  # resumed: some ended before
                   if k not in self.started and self.done[k] < self.rounds[k]]
        startup = float(np.mean(self.startup)) if self.startup else steady  # none yet: resumed
        work = sum((self.rounds[k] - self.done[k]) * steady for k in running) + sum(
            startup + (self.rounds[k] - self.done[k] - 1) * steady for k in pending)
        self.width = max(self.width, len(running))
        return work / max(1, self.width)

    def _status(self, rounds: list[float]) -> str:
        """Federations done and running, and the time left from the mean of ``rounds`` (the
        seconds of steady rounds; none known yet: no estimate)."""
        finished = sum(self.done[k] >= r for k, r in self.rounds.items())
        status = (f"raydg: {finished} of {len(self.rounds)} federations done, "
                  f"{len(self.running())} running")
        if not rounds:
            return status
        left = self.left(float(np.mean(rounds)))
        return (f"{status}; about {int(left // 3600)}:{int(left % 3600 // 60):02d}:"
                f"{int(left % 60):02d} left in all")

    def __call__(self, fed: Federation, row: dict[str, float]) -> None:
        key = fed.key
        self.done[key] += 1
        self.reported += 1
        seconds = row.get("round_seconds")  # none: a restored round, timed before the stop
        if self.done[key] == 1:
            now = time.perf_counter()
            self.startup.append(now - self.started.get(key, now))
        elif seconds is not None:
            self.steady.append(seconds)
        self.status = self._status(self.steady or ([seconds] if seconds is not None else []))
        val = f"{100 * row['val_acc']:.1f}%" if "val_acc" in row else "-"  # not validated
        local = f" (local {100 * row['val_acc_local']:.1f}%)" if "val_acc_local" in row else ""
        line = (f"[{fed.title()}] round {int(row['round'])}/{self.rounds[key]} "
                f"loss {row['train_loss']:.3f} val {val}{local} "
                f"target {100 * row['target_acc']:.1f}% "
                + (f"{seconds:.1f}s" if seconds is not None else "restored"))
        ended = self.done[key] >= self.rounds[key]
        if self.mode == "lines":
            self.out(line)
            if ended or self.reported % self.status_every == 1 % self.status_every:
                self.out(self.status)
        elif self.mode == "live" and not ended:
            self._clear()
            self.board[key] = line
            self._draw()
        elif self.mode == "live":  # finished: its last line stays above the board
            self.board.pop(key, None)
            self.say(line)
