"""An experiment's plan: its federations, each a resolved config, and the checks of a plan
against its data; plain data, no torch (the process that runs an experiment holds no model).

A *federation* is one held-out target domain x one seed x one setting of the searched keys; each
becomes one Ray Tune trial (:mod:`raydg.trials`). The planning step that makes a plan resolves
names against the registries: :mod:`raydg.resolve`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from raydg.config import RunConfig, Search, setting_label
from raydg.datasets import DATASETS, MultiDomainDataset
from raydg.partition import plan_clients
from raydg.plugins import Plugin

IMAGENET = "imagenet"  # torchvision's ImageNet weights (raydg.models)
GLYPHS = "glyphs"  # the named pretraining of raydg.pretrain
MIN_VALIDATION = 5  # a client's validation images below which selection is a coin toss
LARGE_POPULATION = 1000  # clients beyond which validating all of them each round dominates


def init_weights(cfg: RunConfig) -> str | None:
    """What the initial global model's backbone starts from: None (random), ``imagenet``, the
    named pretraining ``glyphs`` (:mod:`raydg.pretrain`) or a state-dict file."""
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
    label: str  # the method as reported (:func:`raydg.resolve.method_label`)
    not_paper: str  # every option off the paper's, searched ones included (the tag
    # ``raydg.not_paper``: a report names them even where a sweep holds them the same for all)
    row: str  # how its table rows name the method (:func:`raydg.resolve.row_label`)

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
    changed: str  # the settings off the defaults: ``clients=12 dirichlet=0.5``
    plugins: list[Plugin] = dataclasses.field(default_factory=list)

    @property
    def targets(self) -> list[str]:
        return targets(self.config)

    @property
    def label(self) -> str:
        """The method(s) as reported: ``fedbn``, or ``fedavg, fedprox`` for a search over
        methods."""
        return ", ".join(dict.fromkeys(f.label for f in self.federations))

    @property
    def rows(self) -> str:
        """The method(s) as table rows name them (:func:`raydg.resolve.row_label`)."""
        return ", ".join(dict.fromkeys(f.row for f in self.federations))

    @property
    def name(self) -> str:
        """The parent run's name, what tells runs apart first (MLflow's runs table cuts
        names): the search (``grid lr``, ``random lr`` with its settings), the rows, the
        settings off the defaults, then the dataset, ``grid lr (3 settings): fedprox
        [mu=0.1] clients=12 digits-style``."""
        search = self.search
        kinds = [("grid", list(search.grid)), ("random", list(search.space))] if search else []
        searched = " ".join(f"{kind} {', '.join(keys)}" for kind, keys in kinds if keys)
        prefix = f"{searched} ({len(self.settings)} settings): " if searched else ""
        return prefix + " ".join(p for p in (self.rows, self.changed, self.config.dataset) if p)


def weights_key(cfg: RunConfig) -> str:
    """What a run's initial backbone depends on: model, source of its weights, image size."""
    return f"{cfg.model}:{init_weights(cfg)}:{cfg.image_size}"


def check_federations(plan: Plan, data: MultiDomainDataset) -> list[str]:
    """Refuse an impossible partition before Ray starts; warnings about the ones that are
    possible but weak (clients with too few validation images to select anything) or slow
    (a large population that validates every client every round)."""
    partitions = {(f.target, f.seed, f.config.clients, f.config.dirichlet,
                   f.config.val_fraction, f.config.client_size) for f in plan.federations}
    warnings = [f"{n} clients validate every round (--validate-clients all): with a population "
                "this large the rounds wait on validation; --validate-clients sampled validates "
                "the round's sampled clients, --validate-clients K a random K of them"
                for n in sorted({f.config.clients for f in plan.federations
                                 if f.config.validate_clients == "all"
                                 and (f.config.clients or 0) > LARGE_POPULATION})]
    small = []
    for target, seed, clients, dirichlet, val_fraction, size in sorted(partitions, key=str):
        sizes = [len(p.val) for p in plan_clients(data, target, clients, dirichlet,
                                                  val_fraction, seed, size)]
        small += [n for n in sizes if n < MIN_VALIDATION]
    if small:
        warnings.append(f"{len(small)} client(s) over the federations hold fewer than "
                        f"{MIN_VALIDATION} validation images (the fewest: {min(small)}): their "
                        "best-validation uploads and the round selection rest on almost "
                        "nothing; use fewer --clients or a larger val_fraction")
    return warnings
