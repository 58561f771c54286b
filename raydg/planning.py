"""The planning step: an experiment expanded into federations (:class:`~raydg.plan.Plan`), each
resolved (:mod:`raydg.resolve`) and named (:mod:`raydg.labels`) once, here.

The method and model registries import torch: an experiment's own process runs this step in a
child (:func:`raydg.forked.apart`) and keeps only the plan, which is plain data.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from raydg.config import RunConfig, Search, apply, setting_label
from raydg.datasets import DATASETS, DataSpec
from raydg.errors import RaydgError
from raydg.labels import labels
from raydg.methods import METHODS, Method
from raydg.plan import IMAGENET, Federation, Plan, Runtime, runtime
from raydg.plugins import load
from raydg.resolve import changed_settings, resolve


def init_weights(cfg: RunConfig) -> str | None:
    """What the initial global model's backbone starts from: None (random), ``imagenet``, the
    named pretraining ``glyphs`` (:mod:`raydg.pretrain`) or a state-dict file."""
    if not cfg.pretrained:
        return None
    return cfg.weights or IMAGENET


def targets(cfg: RunConfig) -> list[str]:
    """The domains that ``cfg``'s federations hold out: all of them for ``all``."""
    spec = DATASETS.get(cfg.dataset)
    return list(spec.domains) if cfg.target == "all" else [cfg.target]


def _equal_compute(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the rounds that give its clients as many local steps as ``equal_compute``'s
    setup phases add (e.g. CSAC's acquisition), on top of its own rounds."""
    if cfg.equal_compute is None:
        return cfg
    other = METHODS.get(cfg.equal_compute)
    options = other.parse_options(
        {**cfg.method_options.get(other.name, {}),
         **(cfg.options if other.name == cfg.method else {})})
    extra = math.ceil(other.setup_steps(options, cfg) / cfg.local_steps)
    return dataclasses.replace(cfg, equal_compute=other.name, rounds=cfg.rounds + extra)


def plan_experiment(cfg: RunConfig, search: Search | None = None,
                    where: Runtime | None = None, method: Method | None = None) -> Plan:
    """Resolve ``cfg`` and each setting of ``search``; one federation per (setting, target,
    seed), in that order. Every setting is resolved here, so a bad value in any of them is
    refused before anything starts. The plugins are loaded first: their names resolve too.
    ``where``: the experiment's :func:`~raydg.plan.runtime`, if its caller found it already;
    ``method``: an instance that runs instead of ``cfg.method`` (:func:`federation`)."""
    search = search or Search()
    plugins = load(cfg.plugins)
    settings = search.settings()
    base = resolve(cfg)
    changed = setting_label(changed_settings(base))
    configs = [resolve(apply(cfg, setting)) if setting else base for setting in settings]
    federations = []
    for setting, resolved in zip(settings, map(_equal_compute, configs), strict=True):
        federations += [
            _federation(dataclasses.replace(resolved, target=t, seeds=[s]), setting, method)
            for t in targets(base) for s in base.seeds]
    keys = [f.key for f in federations]
    if len(set(keys)) < len(keys):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise RaydgError(f"the search repeats a setting: {', '.join(twice[:3])}")
    where = where or runtime(cfg)
    data = DataSpec(base.dataset, base.data_root, base.image_size, base.skip_bad_images,
                    where.cache if where.cache_images else None)
    return Plan(base, search, settings, federations, changed, where, data, plugins)


def _federation(cfg: RunConfig, setting: dict[str, Any], method: Method | None) -> Federation:
    return Federation(cfg, setting, *labels(cfg, method, setting), init_weights(cfg))


def federation(cfg: RunConfig, target: str | None = None, seed: int | None = None,
               method: Method | None = None) -> Federation:
    """One federation of ``cfg`` (its ``target`` and first seed unless given), planned by
    :func:`plan_experiment`; ``method``: an instance that runs instead of ``cfg.method`` (one
    not registered, e.g. defined in a notebook)."""
    one = dataclasses.replace(cfg, target=target or cfg.target,
                              seeds=cfg.seeds[:1] if seed is None else [seed])
    if one.target == "all":
        raise RaydgError("a federation holds out one domain: name its target")
    (fed,) = plan_experiment(one, method=method).federations
    return fed
