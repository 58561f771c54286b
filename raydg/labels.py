"""How a run is named, from its resolved config: its method as MLflow tags it, its options off
its paper's, its table row (part of the planning step, :mod:`raydg.planning`)."""

from __future__ import annotations

import json
from typing import Any

from raydg.config import RunConfig, apply
from raydg.methods import METHODS, Method, build


def _method(cfg: RunConfig, method: Method | None) -> tuple[type[Method], Any]:
    """The run's method class and options (``method``'s for an unregistered instance)."""
    method = method or build(cfg.method, cfg.augment, cfg.aggregation, cfg.options)
    return type(method), method.options


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
