"""An experiment's plan: where it runs (:class:`Runtime`), its federations, each a frozen spec
that the engine runs as it is, and the checks of a plan against its data; plain data, no torch
(the process that runs an experiment holds no model).

A *federation* is one held-out target domain x one seed x one setting of the searched keys; each
becomes one Ray Tune trial (:mod:`raydg.trials`). The planning step that makes a plan
(:mod:`raydg.planning`) resolves names against the registries. Every value derived from the
config is computed there, once, and read from the plan afterwards.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydg.config import RunConfig, Search, setting_label
from raydg.datasets import DataSpec, MultiDomainDataset
from raydg.datasets.cache import cache_root
from raydg.partition import Partition, plan_clients
from raydg.plugins import Plugin
from raydg.tracking.store import tracking_uri

IMAGENET = "imagenet"  # torchvision's ImageNet weights (raydg.models)
GLYPHS = "glyphs"  # the named pretraining of raydg.pretrain
MIN_VALIDATION = 5  # a client's validation images below which selection is a coin toss
LARGE_POPULATION = 1000  # clients beyond which validating all of them each round dominates
STORAGE_ENV = "RAYDG_STORAGE"
DEFAULT_STORAGE = "raydg-results"


def storage_location(storage: str | None) -> str:
    """Where trials' results go: ``storage``, else ``$RAYDG_STORAGE``, else ./raydg-results;
    a folder as an absolute path, a URI as it is."""
    storage = storage or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE
    return storage if "://" in storage else str(Path(storage).expanduser().resolve())


@dataclass(frozen=True)
class Runtime:
    """Where an experiment runs and what it writes to, as :func:`runtime` found them once."""

    tracking_uri: str  # the MLflow store (raydg.tracking.store.tracking_uri)
    address: str | None  # the Ray cluster to join; None: a fresh local Ray
    dashboard: bool  # a local Ray with its dashboard
    storage: str  # trials' results: an absolute folder or a URI
    cache: str  # decoded images and pretrained backbones
    cache_images: bool  # whether image files are decoded once into ``cache``


def runtime(cfg: RunConfig) -> Runtime:
    """``cfg``'s runtime: each setting, else its environment variable, else its default
    (``address``: ``RAY_ADDRESS``; ``local`` asks for a fresh Ray even inside a Ray job)."""
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    storage = storage_location(cfg.storage)
    return Runtime(tracking_uri(cfg), None if address == "local" else address, cfg.dashboard,
                   storage, str(cache_root(cfg.cache_dir)), cfg.cache)


@dataclass(frozen=True)
class Federation:
    """One Tune trial, as the engine runs it: a resolved config with one target and one seed,
    its search setting, and what the planning step derived from them."""

    config: RunConfig
    setting: dict[str, Any]
    label: str  # the method as reported (:func:`raydg.labels.method_label`)
    not_paper: str  # every option off the paper's, searched ones included (the tag
    # ``raydg.not_paper``: a report names them even where a sweep holds them the same for all)
    row: str  # how its table rows name the method (:func:`raydg.labels.row_label`)
    init: str | None  # what its backbone starts from (:func:`raydg.planning.init_weights`)

    @property
    def target(self) -> str:
        return self.config.target

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def partition(self) -> Partition:
        """How its clients are drawn (:func:`raydg.partition.make_clients`)."""
        return Partition.of(self.config)

    @property
    def key(self) -> str:
        """A unique, path-safe name: ``sketch-s0`` or ``sketch-s0-lr=0.02``."""
        label = setting_label(self.setting).replace(" ", "-").replace("/", "_")
        return "-".join(p for p in (self.target, f"s{self.seed}", label) if p)

    def to_trial(self) -> dict[str, Any]:
        """As a Tune trial's config holds it: plain data (Tune keeps no objects there), with
        its :attr:`key`."""
        return {"key": self.key, **dataclasses.asdict(self)}

    @classmethod
    def from_trial(cls, spec: dict[str, Any]) -> Federation:
        """The federation that :meth:`to_trial` wrote."""
        fields = {f.name: spec[f.name] for f in dataclasses.fields(cls)}
        return cls(**{**fields, "config": RunConfig(**spec["config"])})

    @property
    def weights_key(self) -> str:
        """What its initial backbone depends on: model, source of its weights, image size."""
        return f"{self.config.model}:{self.init}:{self.config.image_size}"

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
    runtime: Runtime
    data: DataSpec  # the data every federation shares
    plugins: list[Plugin] = dataclasses.field(default_factory=list)

    @property
    def targets(self) -> list[str]:
        """The held-out domains, in the order of the federations."""
        return list(dict.fromkeys(f.target for f in self.federations))

    @property
    def label(self) -> str:
        """The method(s) as reported: ``fedbn``, or ``fedavg, fedprox`` for a search over
        methods."""
        return ", ".join(dict.fromkeys(f.label for f in self.federations))

    @property
    def rows(self) -> str:
        """The method(s) as table rows name them (:func:`raydg.labels.row_label`)."""
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

    def headline(self, run_id: str) -> str:
        """The line that says what the experiment runs."""
        base = self.config
        settings = f", {len(self.settings)} settings" if len(self.settings) > 1 else ""
        changed = f" ({self.changed})" if self.changed else ""
        return (f"raydg: {self.rows} on {base.dataset}{changed}, targets {self.targets}, seeds "
                f"{base.seeds}{settings}, {base.rounds} rounds x {base.local_steps} local "
                f"steps; MLflow run {run_id}")


def check_federations(plan: Plan, data: MultiDomainDataset) -> list[str]:
    """Refuse an impossible partition before Ray starts; warnings about the ones that are
    possible but weak (clients with too few validation images to select anything) or slow
    (a large population that validates every client every round)."""
    warnings = [f"{n} clients validate every round (--validate-clients all): with a population "
                "this large the rounds wait on validation; --validate-clients sampled validates "
                "the round's sampled clients, --validate-clients K a random K of them"
                for n in sorted({f.config.clients for f in plan.federations
                                 if f.config.validate_clients == "all"
                                 and (f.config.clients or 0) > LARGE_POPULATION})]
    small = [len(p.val) for part in sorted({f.partition for f in plan.federations}, key=str)
             for p in plan_clients(data, part) if len(p.val) < MIN_VALIDATION]
    if small:
        warnings.append(f"{len(small)} client(s) over the federations hold fewer than "
                        f"{MIN_VALIDATION} validation images (the fewest: {min(small)}): their "
                        "best-validation uploads and the round selection rest on almost "
                        "nothing; use fewer --clients or a larger val_fraction")
    return warnings
