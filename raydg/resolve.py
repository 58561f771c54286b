"""A config resolved against the registries (datasets, methods, models), part of the planning
step (:mod:`raydg.planning`).

Resolution fills ``None`` training fields from the dataset's defaults, canonicalises method and
dataset names and validates every value, so that bad input is refused before Ray starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import psutil

from raydg.config import NOT_RESULTS, RunConfig, check, to_dict
from raydg.datasets import DATASETS
from raydg.errors import RaydgError
from raydg.labels import method_label
from raydg.methods import METHODS, Method, method_class
from raydg.models import MODELS, has_batchnorm, has_pretrained
from raydg.partition import MIN_CLIENT_SAMPLES
from raydg.plan import GLYPHS, IMAGENET

CLIENT_BYTES = 2048  # a client's plan, shard and state without its images (measured: 1.4 KB)


def _method_options(cfg: RunConfig, dataset: Mapping[str, Mapping[str, Any]]
                    ) -> dict[str, Any]:
    """The run's options: what its method (and composed ones) starts from in the run's regime
    (:meth:`~raydg.methods.Method.regime_options`, from its model and start), then the
    dataset's own, then ``method_options``, then ``options``; every entry of
    ``method_options`` is checked against its own method."""
    for name, values in cfg.method_options.items():
        _check(isinstance(values, dict), f"method_options.{name} must map option names to "
                                         f"values, got {values!r}")
        METHODS.get(name).parse_options(values)
    names = [METHODS.get(n).name for n in (cfg.method, cfg.augment, cfg.aggregation) if n]
    imagenet = bool(cfg.pretrained) and (cfg.weights or IMAGENET) == IMAGENET
    regime = {n: METHODS.get(n).regime_options(cfg.model, imagenet) for n in names}
    layers = [regime, dataset, {METHODS.get(k).name: v for k, v in cfg.method_options.items()}]
    return {**{k: v for by_name in layers for n in names for k, v in by_name.get(n, {}).items()},
            **cfg.options}


def resolve(cfg: RunConfig) -> RunConfig:
    """Fill ``None`` fields from the dataset's defaults (training) and the method's paper
    (``client_selection``), merge ``method_options`` into ``options``, validate everything:
    refused in one line if a value is of the wrong type, out of range or names no known
    domain, or the population does not fit this machine."""
    cfg, cls = _filled(cfg)
    if cls.needs_batchnorm and not has_batchnorm(cfg.model):  # the others built on error only
        raise RaydgError(f"{method_label(cfg)} acts on BatchNorm layers and model {cfg.model} "
                         "has none; choose a model with BatchNorm "
                         f"({', '.join(filter(has_batchnorm, MODELS.names()))})")
    check(cfg)  # every value's type and range
    _check_federation(cfg)
    return cfg


def _filled(cfg: RunConfig) -> tuple[RunConfig, type[Method]]:
    """:func:`resolve`'s filling (and the checks it needs: the weights against
    ``pretrained``), without checking the method against the model or the values' ranges;
    with the run's method class."""
    spec = DATASETS.get(cfg.dataset)
    cls = method_class(cfg.method, cfg.augment, cfg.aggregation)
    defaults = dataclasses.asdict(spec.defaults)
    filled = {k: v for k, v in defaults.items() if getattr(cfg, k) is None}
    augment, aggregation = (METHODS.get(n).name if n else None
                            for n in (cfg.augment, cfg.aggregation))
    _check(cfg.weights is None or cfg.pretrained is not False,
           "--weights and --no-pretrained contradict each other")
    selection = cls.client_selection if cfg.client_selection is None else cfg.client_selection
    cfg = dataclasses.replace(cfg, dataset=spec.name, method=METHODS.get(cfg.method).name,
                              augment=augment, aggregation=aggregation,
                              client_selection=selection, **filled)
    if cfg.weights is not None:
        cfg = dataclasses.replace(cfg, pretrained=True)
    elif not has_pretrained(cfg.model):
        _check(cfg.pretrained is not True or "pretrained" in filled,
               f"model {cfg.model} has no ImageNet weights; drop --pretrained, or pass "
               f"--weights FILE or --weights {GLYPHS}")
        cfg = dataclasses.replace(cfg, pretrained=False)  # the dataset default does not apply
    options = _method_options(cfg, spec.method_options)
    cls.parse_options(options)
    return dataclasses.replace(cfg, options=options), cls


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RaydgError(message)


def _check_federation(cfg: RunConfig) -> None:
    """Refuse a held-out domain that is not the dataset's, clients that cannot be drawn and a
    population this machine cannot hold."""
    spec = DATASETS.get(cfg.dataset)
    _check(cfg.target == "all" or cfg.target in spec.domains,
           f"unknown target domain {cfg.target!r} for {spec.name}; "
           f"choose one of {', '.join(spec.domains)} or 'all'")
    _check(cfg.client_size is None or cfg.client_size >= MIN_CLIENT_SAMPLES,
           f"client_size must be at least {MIN_CLIENT_SAMPLES}, got {cfg.client_size}")
    _check(cfg.client_size is None or cfg.clients is not None,
           "--client-size needs --clients: the number of clients that draw samples")
    _check_population(cfg)
    sources = len(spec.domains) - 1
    _check(cfg.clients is None or cfg.clients >= sources,
           f"--clients {cfg.clients} is fewer than the {sources} source domains")
    n = cfg.clients or sources
    _check(cfg.sample is None or cfg.sample <= n,
           f"--sample {cfg.sample} is more than the {n} clients (K must be <= N)")


def population_bytes(cfg: RunConfig) -> int:
    """About the memory that planning and holding ``cfg``'s clients takes: each client's plan
    and state, and the samples it draws (an index and an image each, 3 channels at most; a
    split of the data among clients adds nothing to the data's own size)."""
    per_sample = 8 + 3 * cfg.image_size**2
    return (cfg.clients or 0) * (CLIENT_BYTES + (cfg.client_size or 0) * per_sample)


def _check_population(cfg: RunConfig) -> None:
    """Refuse a population whose clients this machine's available memory cannot hold,
    before any of them is planned."""
    need, have = population_bytes(cfg), psutil.virtual_memory().available
    if need <= have:
        return
    size = f" x --client-size {cfg.client_size}" if cfg.client_size else ""
    fit = have * cfg.clients // need
    fewer = [f"at most {fit:,} clients"] if fit else []
    smaller = ["a smaller --client-size"] if size else []
    raise RaydgError(f"--clients {cfg.clients}{size} needs about {_gib(need)} of memory, more "
                     f"than the {_gib(have)} available here: use {' or '.join(fewer + smaller)}")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


# named apart from the settings a run changes: by the method's row label, the targets, the seeds
NAMED_APART = ("dataset", "method", "augment", "aggregation", "options", "method_options",
               "target", "seeds", "seed")


def changed_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings of the resolved ``cfg`` that change its result and differ from what its
    dataset gives its method by default (``{"clients": 12, "dirichlet": 0.5}``); the method's
    options are its row label's (:func:`row_label`). The defaults need not make a run of their
    own: a dataset's default model may lack what the method needs (fedbn on rotmnist)."""
    default = to_dict(_filled(RunConfig(dataset=cfg.dataset, method=cfg.method,
                                        augment=cfg.augment, aggregation=cfg.aggregation))[0])
    return {k: v for k, v in to_dict(cfg).items()
            if k not in NOT_RESULTS and k not in NAMED_APART and v != default[k]}


