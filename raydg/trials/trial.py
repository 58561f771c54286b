"""The Tune trainable: one federation's driver, running in its trial's actor.

:func:`federation` builds the :class:`~raydg.engine.simulation.Simulation` and runs its rounds;
each round is one ``tune.report``, some carry a checkpoint (:class:`Cadence`), and the last
carries the federation's result.
"""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from ray import tune

from raydg import checkpoint
from raydg.datasets import MultiDomainDataset
from raydg.plan import Federation
from raydg.startup import heavy_imports

FEDERATION = "federation"  # the trainable's name and its key in each trial's config


class Cadence:
    """When a federation writes a checkpoint: every ``every`` rounds, or, by default, as soon
    as the time since the last one is ``1 / BUDGET`` times what the last one cost, so that
    checkpoints take at most ``BUDGET`` of the run (the first after round 1)."""

    BUDGET = 0.02

    def __init__(self, every: int | None) -> None:
        self.every, self.cost, self.last = every, 0.0, time.perf_counter()

    def due(self, rnd: int) -> bool:
        if self.every is not None:
            return rnd % self.every == 0
        return time.perf_counter() - self.last >= self.cost / self.BUDGET

    def done(self, seconds: float) -> None:
        self.cost, self.last = seconds, time.perf_counter()


class Reporter:
    """A trial's reports to Tune: progress messages (``messages``), a round's metrics
    (``row``), a checkpoint; the rounds of a restored federation go with the next report
    (``history``: those that MLflow missed are logged from it)."""

    def __init__(self) -> None:
        self.missed: list[dict[str, float]] = []

    def __call__(self, row: dict[str, float] | None = None, said: tuple[str, ...] = (),
                 **extra: Any) -> None:
        payload = {"row": row, "messages": list(said), "history": list(self.missed)}
        self.missed.clear()
        payload.update(extra.pop("info", {}))
        tune.report({"raydg": payload}, **extra)

    def log(self, message: str) -> None:
        self(said=(message,))

    def checkpoint(self, write: Callable[[Path], None],
                   row: dict[str, float] | None = None) -> None:
        """Report ``row`` (none: the result) with a checkpoint that ``write`` fills; a round's
        report also carries the checkpoint's size."""
        with tempfile.TemporaryDirectory() as tmp:
            write(Path(tmp))
            size = sum(f.stat().st_size for f in Path(tmp).iterdir())
            info = {} if row is None else {"checkpoint": {"bytes": size}}
            self(row, checkpoint=tune.Checkpoint.from_directory(tmp), info=info)


def federation(config: dict[str, Any], data: MultiDomainDataset,
               weights: dict[str, dict[str, np.ndarray]]) -> None:
    """The Tune trainable: the driver of one federation, running in the trial's actor.

    Continues from the trial's last checkpoint when Tune restarts it (a lost actor or node, a
    resumed experiment), its first report then carrying the rounds before. Reports each
    progress message as it is logged (a phase's start, e.g. CSAC's acquisition, is said as it
    begins) and each round's metrics; at the :class:`Cadence`'s rounds the report carries a
    checkpoint (:mod:`raydg.checkpoint`). The last report has no row: its checkpoint is the
    result, written by :meth:`FederationResult.save`. ``weights`` are the experiment's initial
    backbones (:func:`~raydg.pretrain.starting_weights`)."""
    with heavy_imports():  # the trial actor's torch and engine (raydg.startup)
        from raydg.engine.simulation import Simulation
        from raydg.methods import build

    logging.getLogger("ray.train").setLevel(logging.WARNING)  # no line per checkpoint
    fed = Federation.from_trial(config[FEDERATION])
    cfg, recorded = fed.config, dataclasses.asdict(fed.config)
    report = Reporter()
    last = tune.get_checkpoint()
    if last is not None and _is_result(last):  # finished, then lost before Tune knew
        report(checkpoint=last)
        return
    restore = _restored(last, recorded)
    if restore is not None:
        report.log(f"continues from its checkpoint after round {restore['round']}")
    sim = Simulation(fed, data, build(cfg.method, cfg.augment, cfg.aggregation, cfg.options),
                     log=report.log, weights=weights.get(fed.weights_key), restore=restore)
    report.missed.extend(sim.history)  # restored: its rounds, for those MLflow missed
    cadence = Cadence(cfg.checkpoint_every)

    def on_round(row: dict[str, float]) -> None:
        if not (sim.resumable and cadence.due(int(row["round"]))):
            report(row)
            return
        start = time.perf_counter()
        report.checkpoint(lambda folder: checkpoint.write(folder, sim.snapshot(), recorded),
                          row)
        cadence.done(time.perf_counter() - start)

    result = sim.run(on_round)
    result.setting = fed.setting
    report.checkpoint(result.save)


def _is_result(last: tune.Checkpoint) -> bool:
    with last.as_directory() as folder:
        return not checkpoint.is_checkpoint(Path(folder))


def _restored(last: tune.Checkpoint | None, recorded: dict[str, Any]
              ) -> dict[str, Any] | None:
    """The state of the trial's last checkpoint, if Tune restarted it from one (written for
    the config ``recorded``)."""
    if last is None:
        return None
    with last.as_directory() as folder:
        return checkpoint.read(Path(folder), recorded)
