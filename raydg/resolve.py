"""The planning step: a config resolved against the registries (datasets, methods, models),
an experiment expanded into federations (:class:`~raydg.plan.Plan`).

Resolution fills ``None`` training fields from the dataset's defaults, canonicalises method and
dataset names and validates every value, so that bad input is refused before Ray starts. The
method and model registries import torch: an experiment's own process runs this step in a child
(:func:`raydg.forked.apart`) and keeps only the plan, which is plain data.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from raydg.config import NOT_RESULTS, RunConfig, Search, apply, check, setting_label, to_dict
from raydg.datasets import DATASETS
from raydg.errors import RaydgError
from raydg.methods import METHODS, Method, method_class
from raydg.models import MODELS, has_batchnorm, has_pretrained
from raydg.partition import MIN_CLIENT_SAMPLES
from raydg.plan import GLYPHS, IMAGENET, Federation, Plan, init_weights, targets
from raydg.plugins import load

STORAGE_ENV = "RAYDG_STORAGE"
DEFAULT_STORAGE = "raydg-results"
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
    imagenet = init_weights(cfg) == IMAGENET
    regime = {n: METHODS.get(n).regime_options(cfg.model, imagenet) for n in names}
    layers = [regime, dataset, {METHODS.get(k).name: v for k, v in cfg.method_options.items()}]
    return {**{k: v for by_name in layers for n in names for k, v in by_name.get(n, {}).items()},
            **cfg.options}


def resolve(cfg: RunConfig) -> RunConfig:
    """Fill ``None`` fields from the dataset's defaults (training) and the method's paper
    (``client_selection``), merge ``method_options`` into ``options``, validate everything."""
    cfg = _filled(cfg)
    cls = method_class(cfg.method, cfg.augment, cfg.aggregation)
    if cls.needs_batchnorm and not has_batchnorm(cfg.model):  # the others built on error only
        raise RaydgError(f"{method_label(cfg)} acts on BatchNorm layers and model {cfg.model} "
                         "has none; choose a model with BatchNorm "
                         f"({', '.join(filter(has_batchnorm, MODELS.names()))})")
    validate(cfg)
    return cfg


def _filled(cfg: RunConfig) -> RunConfig:
    """:func:`resolve`'s filling (and the checks it needs: the weights against
    ``pretrained``), without checking the method against the model or the values' ranges."""
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
    cfg = dataclasses.replace(cfg, options=options)
    return dataclasses.replace(cfg, storage=storage_location(cfg.storage))


def storage_location(storage: str | None) -> str:
    """Where trials' results go: ``storage``, else ``$RAYDG_STORAGE``, else ./raydg-results;
    a folder as an absolute path, a URI as it is."""
    storage = storage or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE
    return storage if "://" in storage else str(Path(storage).expanduser().resolve())


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RaydgError(message)


def validate(cfg: RunConfig) -> None:
    """Refuse a config whose values are of the wrong type, out of range or name no known
    domain; a population this machine cannot hold."""
    check(cfg)
    _check_federation(cfg)


def _check_federation(cfg: RunConfig) -> None:
    """The held-out domain, the seeds, the clients and their validation split."""
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


def _method(cfg: RunConfig, method: Method | None) -> tuple[type[Method], Any]:
    """The run's method class and options (``method``'s for an unregistered instance)."""
    if method is not None:
        return type(method), method.options
    cls = method_class(cfg.method, cfg.augment, cfg.aggregation)
    return cls, cls.parse_options(cfg.options)


def labels(cfg: RunConfig, method: Method | None = None,
           searched: dict[str, Any] | None = None) -> tuple[str, str, str]:
    """How a run is named, from one look-up of its method: its method as MLflow tags it
    (``raydg.method``, what ``raydg report --method`` filters: ``fedbn+ccst-pixel``, or
    ``fedavg (steps of csac)`` with ``equal_compute``); its options that are neither its paper
    config's (``paper_options``) nor, where that is silent, its method's defaults
    (``Method.not_paper``), one word each (``raydg report`` splits them); and its table row,
    the method then those options in brackets, ``fedfd [cafl_reduction=mean]``, less the
    options that a search varies (``searched``, a federation's setting: its label says them)."""
    cls, options = _method(cfg, method)
    label = cls.label(options) + (f" (steps of {cfg.equal_compute})" if cfg.equal_compute
                                  else "")
    names = {cls.name} if method is not None else {
        METHODS.get(n).name for n in (cfg.method, cfg.augment, cfg.aggregation) if n}
    paper = {k: v for m, values in cfg.paper_options.items() if METHODS.get(m).name in names
             for k, v in values.items()}
    off = cls.not_paper(options, cls.parse_options(paper))
    probe = apply(RunConfig(), searched or {})
    varied = {*probe.options, *(k for values in probe.method_options.values() for k in values)}
    extra = _words({k: v for k, v in off.items() if k not in varied})
    return label, _words(off), label + (f" [{extra}]" if extra else "")


def _words(options: dict[str, Any]) -> str:
    return " ".join(f"{k}={json.dumps(v, separators=(',', ':')) if isinstance(v, list) else v}"
                    for k, v in options.items())


def method_label(cfg: RunConfig, method: Method | None = None) -> str:
    """The method as MLflow tags it (:func:`labels`)."""
    return labels(cfg, method)[0]


def not_paper(cfg: RunConfig, method: Method | None = None) -> str:
    """The run's options that are not its paper's (:func:`labels`)."""
    return labels(cfg, method)[1]


def row_label(cfg: RunConfig, method: Method | None = None,
              searched: dict[str, Any] | None = None) -> str:
    """The method as a table row prints it (:func:`labels`)."""
    return labels(cfg, method, searched)[2]


# named apart from the settings a run changes: by the method's row label, the targets, the seeds
NAMED_APART = ("dataset", "method", "augment", "aggregation", "options", "method_options",
               "target", "seeds", "seed")


def changed_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings of the resolved ``cfg`` that change its result and differ from what its
    dataset gives its method by default (``{"clients": 12, "dirichlet": 0.5}``); the method's
    options are its row label's (:func:`row_label`). The defaults need not make a run of their
    own: a dataset's default model may lack what the method needs (fedbn on rotmnist)."""
    default = to_dict(_filled(RunConfig(dataset=cfg.dataset, method=cfg.method,
                                        augment=cfg.augment, aggregation=cfg.aggregation)))
    return {k: v for k, v in to_dict(cfg).items()
            if k not in NOT_RESULTS and k not in NAMED_APART and v != default[k]}


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


def plan_experiment(cfg: RunConfig, search: Search | None = None) -> Plan:
    """Resolve ``cfg`` and each setting of ``search``; one federation per (setting, target,
    seed), in that order. Every setting is resolved here, so a bad value in any of them is
    refused before anything starts. The plugins are loaded first: their names resolve too."""
    search = search or Search()
    plugins = load(cfg.plugins)
    base = resolve(cfg)
    settings = search.settings()
    federations = []
    for setting in settings:
        resolved = _equal_compute(resolve(apply(cfg, setting)) if setting else base)
        federations += [
            _federation(dataclasses.replace(resolved, target=t, seeds=[s]), setting)
            for t in targets(base) for s in base.seeds]
    keys = [f.key for f in federations]
    if len(set(keys)) < len(keys):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise RaydgError(f"the search repeats a setting: {', '.join(twice[:3])}")
    return Plan(base, search, settings, federations,
                setting_label(changed_settings(base)), plugins)


def _federation(cfg: RunConfig, setting: dict[str, Any]) -> Federation:
    return Federation(cfg, setting, *labels(cfg, searched=setting))
