"""Everything an experiment does before Ray starts: find its runtime, check the cluster, plan it
(in a child process: the planning step imports torch), load its data, check every partition
and the storage, load its initial weights; refuse bad input on the way, each in one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from raydg import plugins
from raydg.cluster import check_cluster
from raydg.config import RunConfig, Search
from raydg.datasets import MultiDomainDataset
from raydg.errors import RaydgError
from raydg.forked import apart
from raydg.plan import Plan, Runtime, check_federations, runtime
from raydg.trials.storage import check_storage, verify_checkpoints

Weights = dict[str, dict[str, np.ndarray]]  # initial backbones by Federation.weights_key


def prepare(cfg: RunConfig, search: Search | None, manifest: dict[str, Any] | None,
            resume: str | None, say: Callable[[str], None], out: Callable[[str], None]
            ) -> tuple[Plan, MultiDomainDataset, Weights]:
    """The plan (planned apart, :mod:`raydg.forked`), the data and its partitions checked, the
    initial weights (none for random initialisations), the storage checked and, resuming the
    experiment in ``resume`` (whose ``manifest`` names its plugins), the checkpoints to
    continue from."""
    where = runtime(cfg)
    try:  # first: a cluster that cannot be joined ends it at once
        check_cluster(where.address)
    except RaydgError as err:
        if resume is None:
            raise
        raise RaydgError(f"{err} (raydg resume --address names the cluster to continue "
                         "on)") from None
    if manifest is not None:
        plugins.check_unchanged(cfg.plugins, manifest["plugins"])
    plugins.load(cfg.plugins)  # here too: a plugin's dataset is loaded here
    plan, data = apart(lambda log: _plan(cfg, search, where, log), say)
    data = data if data is not None else plan.data.load(say)
    for warning in check_federations(plan, data):
        out(f"raydg: warning: {warning}")
    weights = apart(lambda log: _starting_weights(plan, data, log), say) if any(
        f.init is not None for f in plan.federations) else {}
    check_storage(where.storage)
    if resume:
        verify_checkpoints(resume, plan.federations)
    return plan, data, weights


def _plan(cfg: RunConfig, search: Search | None, where: Runtime, say: Callable[[str], None]
          ) -> tuple[Plan, MultiDomainDataset | None]:
    """In :func:`~raydg.forked.apart`'s child, the planning step (its registries import torch)
    and, for a dataset that ships with raydg (small, resized with torch), its data; the data
    of a data root is loaded in the experiment's process (large, memory-mapped from its
    cache)."""
    from raydg.planning import plan_experiment

    plan = plan_experiment(cfg, search, where)
    for plugin in plan.plugins:
        say(f"raydg: {plugin.origin}")
    return plan, plan.data.load(say) if plan.data.shipped else None


def _starting_weights(plan: Plan, data: MultiDomainDataset, log: Callable[[str], None]
                      ) -> Weights:
    """In :func:`~raydg.forked.apart`'s child, every federation's initial backbone by
    :attr:`~raydg.plan.Federation.weights_key`, loaded (or pretrained)."""
    from raydg.pretrain import starting_weights

    return starting_weights(plan, data, Path(plan.runtime.cache), log)
