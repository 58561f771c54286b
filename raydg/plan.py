"""The planning step: resolve a config against the registries and expand an experiment into
federations.

A *federation* is one held-out target domain x one seed x one setting of the searched keys; each
becomes one Ray Tune trial (:mod:`raydg.runner`). Resolution fills ``None`` training fields from
the dataset's defaults, canonicalises method and dataset names and validates every value, so that
bad input is refused before Ray starts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydg.config import RunConfig, Search, apply, setting_label
from raydg.datasets import DATASETS, MultiDomainDataset
from raydg.errors import RaydgError
from raydg.methods import METHODS, method_class
from raydg.models import IMAGENET, ModelSpec, build_model, has_pretrained
from raydg.partition import plan_clients
from raydg.transforms import TRANSFORMS

STORAGE_ENV = "RAYDG_STORAGE"
DEFAULT_STORAGE = "raydg-results"
PLACEMENTS = ("pack", "spread")


def resolve(cfg: RunConfig) -> RunConfig:
    """Fill ``None`` training fields from the dataset's defaults and validate everything."""
    spec = DATASETS.get(cfg.dataset)
    method_class(cfg.method, cfg.augment).parse_options(cfg.options)
    defaults = dataclasses.asdict(spec.defaults)
    filled = {k: v for k, v in defaults.items() if getattr(cfg, k) is None}
    augment = METHODS.get(cfg.augment).name if cfg.augment else None
    _check(cfg.weights is None or cfg.pretrained is not False,
           "--weights and --no-pretrained contradict each other")
    asked = cfg.pretrained is True or cfg.weights is not None
    cfg = dataclasses.replace(cfg, dataset=spec.name, method=METHODS.get(cfg.method).name,
                              augment=augment, **filled)
    if not has_pretrained(cfg.model):
        _check(not asked, f"model {cfg.model} has no pretrained weights; drop --pretrained "
                          "and --weights")
        cfg = dataclasses.replace(cfg, pretrained=False)  # the dataset default does not apply
    elif cfg.weights is not None:
        cfg = dataclasses.replace(cfg, pretrained=True)
    storage = cfg.storage or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE
    if "://" not in storage:
        storage = str(Path(storage).expanduser().resolve())
    cfg = dataclasses.replace(cfg, storage=storage)
    validate(cfg)
    return cfg


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RaydgError(message)


def validate(cfg: RunConfig) -> None:
    spec = DATASETS.get(cfg.dataset)
    _check(cfg.target == "all" or cfg.target in spec.domains,
           f"unknown target domain {cfg.target!r} for {spec.name}; "
           f"choose one of {', '.join(spec.domains)} or 'all'")
    _check(len(cfg.seeds) > 0, "at least one seed is needed")
    for key in ("rounds", "local_steps", "batch_size", "val_every", "eval_batch_size",
                "image_size"):
        _check(getattr(cfg, key) > 0, f"{key} must be positive, got {getattr(cfg, key)}")
    _check(cfg.lr > 0, f"lr must be positive, got {cfg.lr}")
    _check(cfg.clients is None or cfg.clients > 0, f"clients must be positive, got {cfg.clients}")
    _check(cfg.dirichlet is None or cfg.dirichlet > 0,
           f"--dirichlet alpha must be positive, got {cfg.dirichlet}")
    _check(cfg.sample is None or cfg.sample > 0, f"sample must be positive, got {cfg.sample}")
    sources = len(spec.domains) - 1
    _check(cfg.clients is None or cfg.clients >= sources,
           f"--clients {cfg.clients} is fewer than the {sources} source domains")
    n = cfg.clients or sources
    _check(cfg.sample is None or cfg.sample <= n,
           f"--sample {cfg.sample} is more than the {n} clients (K must be <= N)")
    _check(0 <= cfg.val_fraction < 1, f"val_fraction must be in [0, 1), got {cfg.val_fraction}")
    _check(cfg.agg_weights in ("samples", "uniform"),
           f"agg_weights must be 'samples' or 'uniform', got {cfg.agg_weights!r}")
    _check(cfg.actors is None or cfg.actors > 0, f"actors must be positive, got {cfg.actors}")
    _check(cfg.train_transform in TRANSFORMS,
           f"train_transform must be one of {', '.join(TRANSFORMS)}, got {cfg.train_transform!r}")
    _check(cfg.cpus_per_actor > 0, "cpus_per_actor must be positive")
    _check(cfg.gpus_per_actor >= 0, "gpus_per_actor must be >= 0")
    _check(cfg.max_concurrent is None or cfg.max_concurrent > 0,
           f"max_concurrent must be positive, got {cfg.max_concurrent}")
    _check(cfg.placement in PLACEMENTS,
           f"placement must be one of {', '.join(PLACEMENTS)}, got {cfg.placement!r}")


def init_weights(cfg: RunConfig) -> str | None:
    """What the initial global model starts from: None (random), ``imagenet`` or a file."""
    if not cfg.pretrained:
        return None
    return cfg.weights or IMAGENET


def targets(cfg: RunConfig) -> list[str]:
    spec = DATASETS.get(cfg.dataset)
    return list(spec.domains) if cfg.target == "all" else [cfg.target]


@dataclass(frozen=True)
class Federation:
    """One Tune trial: a resolved config with one target and one seed, and its search setting."""

    config: RunConfig
    setting: dict[str, Any]

    @property
    def target(self) -> str:
        return self.config.target

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def key(self) -> str:
        """A unique, path-safe name: ``sketch-s0`` or ``sketch-s0-lr=0.02``."""
        label = setting_label(self.setting).replace(" ", "-").replace("/", "_")
        return "-".join(p for p in (self.target, f"s{self.seed}", label) if p)

    def title(self) -> str:
        """How progress lines name it: ``sketch seed=0`` (``[lr=0.02]`` in a search)."""
        setting = setting_label(self.setting)
        return f"{self.target} seed={self.seed}" + (f" [{setting}]" if setting else "")


@dataclass(frozen=True)
class Plan:
    """An experiment: the resolved base config, the searched settings and every federation."""

    config: RunConfig
    search: Search
    settings: list[dict[str, Any]]
    federations: list[Federation]

    @property
    def targets(self) -> list[str]:
        return targets(self.config)

    @property
    def label(self) -> str:
        """The method(s) as reported: ``fedbn``, or ``fedavg, fedprox`` for a search over
        methods."""
        return ", ".join(dict.fromkeys(f.config.label for f in self.federations))


def plan_experiment(cfg: RunConfig, search: Search | None = None) -> Plan:
    """Resolve ``cfg`` and each setting of ``search``; one federation per (setting, target,
    seed), in that order. Every setting is resolved here, so a bad value in any of them is
    refused before anything starts."""
    search = search or Search()
    base = resolve(cfg)
    settings = search.settings()
    federations = []
    for setting in settings:
        resolved = resolve(apply(cfg, setting)) if setting else base
        federations += [
            Federation(dataclasses.replace(resolved, target=t, seeds=[s]), setting)
            for t in targets(base) for s in base.seeds]
    keys = [f.key for f in federations]
    if len(set(keys)) < len(keys):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise RaydgError(f"the search repeats a setting: {', '.join(twice[:3])}")
    return Plan(base, search, settings, federations)


def check_federations(plan: Plan, data: MultiDomainDataset) -> None:
    """Refuse an impossible partition, or missing pretrained weights, before Ray starts."""
    partitions = {(f.target, f.seed, f.config.clients, f.config.dirichlet,
                   f.config.val_fraction) for f in plan.federations}
    for target, seed, clients, dirichlet, val_fraction in sorted(partitions, key=str):
        plan_clients(data, target, clients, dirichlet, val_fraction, seed)
    starts = {(f.config.model, init_weights(f.config)): f.config for f in plan.federations}
    for c in starts.values():
        if init_weights(c) is not None:  # fetched (or found in the cache) once here
            build_model(ModelSpec(c.model, data.channels, len(data.classes), c.image_size,
                                  init_weights(c)))
