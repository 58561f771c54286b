"""A whole experiment: every held-out target domain x every seed, tracked and summarised."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import ray

from raydg.config import RunConfig, init_weights, resolve, targets
from raydg.datasets import load_dataset
from raydg.datasets.cache import cache_root
from raydg.models import ModelSpec, build_model
from raydg.partition import plan_clients
from raydg.results import format_summary, long_rows, summary_rows
from raydg.simulation import Simulation, SimulationResult
from raydg.tracking import Tracker


@dataclass
class ExperimentResult:
    config: RunConfig
    runs: list[SimulationResult]
    summary: list[dict[str, Any]]
    printed: str
    run_id: str


@contextlib.contextmanager
def ray_session(cfg: RunConfig) -> Iterator[None]:
    """Use the running Ray session if there is one, else start (and finally stop) one."""
    if ray.is_initialized():
        yield
        return
    ray.init(address=cfg.address, include_dashboard=False, logging_level="ERROR",
             log_to_driver=True)
    try:
        yield
    finally:
        ray.shutdown()


class Progress:
    """Prints one line per round with the latest accuracies and the time left."""

    def __init__(self, total_rounds: int, out: Callable[[str], None]) -> None:
        self.total, self.done, self.seconds, self.out = total_rounds, 0, 0.0, out
        self.label = ""

    def __call__(self, row: dict[str, float], rounds: int) -> None:
        self.done += 1
        self.seconds += row["round_seconds"]
        eta = self.seconds / self.done * (self.total - self.done)
        local = f" (local {100 * row['val_acc_local']:.1f}%)" if "val_acc_local" in row else ""
        self.out(f"[{self.label}] round {int(row['round'])}/{rounds}  "
                 f"loss {row['train_loss']:.3f}  val {100 * row['val_acc']:.1f}%{local}  "
                 f"target {100 * row['target_acc']:.1f}%  {row['round_seconds']:.1f}s/round  "
                 f"left {int(eta // 3600)}:{int(eta % 3600 // 60):02d}:{int(eta % 60):02d}")


def run_experiment(cfg: RunConfig, out: Callable[[str], None] = print) -> ExperimentResult:
    """Resolve ``cfg``, run one simulation per (target, seed), log everything to MLflow."""
    cfg = resolve(cfg)
    cache = cache_root(cfg.cache_dir) if cfg.cache else None
    data = load_dataset(cfg.dataset, cfg.data_root, cfg.image_size, cfg.skip_bad_images, out,
                        cache)
    held_out = targets(cfg)
    for target in held_out:  # refuse an impossible partition before anything starts
        for seed in cfg.seeds:
            plan_clients(data, target, cfg.clients, cfg.dirichlet, cfg.val_fraction, seed)
    weights = init_weights(cfg)
    if weights is not None:  # ... and missing pretrained weights (fetched once here)
        build_model(ModelSpec(cfg.model, data.channels, len(data.classes), cfg.image_size,
                              weights))
    progress = Progress(len(held_out) * len(cfg.seeds) * cfg.rounds, out)
    runs: list[SimulationResult] = []
    with ray_session(cfg), Tracker(cfg) as tracker:
        out(f"raydg: {cfg.label} on {cfg.dataset}, targets {held_out}, seeds {cfg.seeds}, "
            f"{cfg.rounds} rounds x {cfg.local_steps} local steps; MLflow run {tracker.run_id}")
        for target in held_out:
            for seed in cfg.seeds:
                progress.label = f"{target} seed={seed}"
                with tracker.child(target, seed):
                    sim = Simulation(cfg, data, target, seed, log=out)

                    def on_round(row: dict[str, float]) -> None:
                        tracker.log_round(row)
                        progress(row, cfg.rounds)

                    result = sim.run(on_round)
                    tracker.log_result(result)
                runs.append(result)
        rows = long_rows(cfg.label, runs)
        summary = summary_rows(rows, held_out)
        printed = format_summary(summary, held_out, len(cfg.seeds))
        final = {f"avg/{r['selection']}/{r['mode']}": r["Avg"] for r in summary}
        tracker.log_summary(final, {"results": rows, "summary": summary}, printed)
        out(printed)
        return ExperimentResult(cfg, runs, summary, printed, tracker.run_id)
