"""Run configuration: one dataclass, read from YAML and ``--set key=value`` overrides.

Fields left as ``None`` take the dataset's protocol defaults (:class:`raydg.datasets.TrainDefaults`)
when the config is resolved. Method-specific settings live in ``options`` and are checked against
the method's own ``Options`` dataclass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raydg.datasets import DATASETS
from raydg.errors import RaydgError
from raydg.models import IMAGENET, has_pretrained
from raydg.transforms import TRANSFORMS


@dataclass
class RunConfig:
    dataset: str = "digits-style"
    method: str = "fedavg"
    augment: str | None = None  # an augmentation method composed with ``method`` (e.g. ccst)
    target: str = "all"  # a domain name or "all" (one sub-run per held-out domain)
    seeds: list[int] = field(default_factory=lambda: [0])
    # clients and sampling
    clients: int | None = None  # None: one client per source domain
    dirichlet: float | None = None  # None: label-iid split of each domain
    sample: int | None = None  # clients per round; None: all when N <= 10, else 10
    agg_weights: str = "samples"  # "samples" (n_k, the papers' equations) or "uniform"
    # local training (None: the dataset's defaults)
    rounds: int | None = None
    local_steps: int | None = None
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float = 0.0
    batch_size: int | None = None
    # model selection and evaluation (FedFD-A §4.1 "Evaluation Protocols"; FedIG-A A.2)
    val_fraction: float = 0.1
    val_every: int = 20
    client_selection: bool = True  # upload each client's best-validation weights of the round
    eval_local: bool = False  # in-federation accuracy with local statistics (FedIG-A A.7)
    eval_batch_size: int = 256
    # model and data
    model: str | None = None
    pretrained: bool | None = None  # ImageNet weights; None: the dataset's default
    weights: str | None = None  # a state-dict file to start from instead of torchvision's
    image_size: int | None = None
    train_transform: str = "none"  # none | flip | flip-jitter | crop-flip | domainbed
    data_root: str | None = None
    skip_bad_images: bool = False  # skip (and count) unreadable images instead of failing
    cache: bool = True  # decode image files once into cache_dir, memory-map them afterwards
    cache_dir: str | None = None  # None: $RAYDG_CACHE or ~/.cache/raydg
    # resources
    actors: int | None = None  # None: one per client while resources allow
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    address: str | None = None  # Ray cluster address; None: a local Ray (or RAY_ADDRESS)
    # tracking
    tracking_uri: str | None = None
    experiment: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The method as reported: ``fedbn`` or, with an augmentation, ``fedbn+ccst``."""
        return f"{self.method}+{self.augment}" if self.augment else self.method

    @property
    def seed(self) -> int:
        """The seed of a single run (a simulation's config holds exactly one)."""
        return self.seeds[0]


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def _coerce(key: str, value: Any) -> Any:
    """Check a value's type against the field's annotation, converting where unambiguous."""
    kind = str(FIELDS[key].type)
    if value is None:
        if "None" not in kind:
            raise RaydgError(f"config key {key!r} cannot be empty")
        return None
    try:
        if kind.startswith("list[int]"):
            items = value if isinstance(value, list) else [value]
            return [int(v) for v in items]
        if kind.startswith("bool"):
            if not isinstance(value, bool):
                raise ValueError
            return value
        if kind.startswith("int"):
            if isinstance(value, bool) or float(value) != int(value):
                raise ValueError
            return int(value)
        if kind.startswith("float"):
            return float(value)
        if kind.startswith("str"):
            return str(value)
        if kind.startswith("dict"):
            if not isinstance(value, dict):
                raise ValueError
            return dict(value)
    except (TypeError, ValueError):
        raise RaydgError(f"config key {key!r}: cannot use {value!r} (expected {kind})") from None
    return value


def apply(cfg: RunConfig, values: dict[str, Any]) -> RunConfig:
    """Return ``cfg`` with ``values`` applied; ``options.x`` keys go into ``options``."""
    changes: dict[str, Any] = {}
    options = dict(cfg.options)
    for key, value in values.items():
        key = key.replace("-", "_")
        if key.startswith("options."):
            options[key.split(".", 1)[1]] = value
        elif key == "options":
            options.update(_coerce(key, value))
        elif key in FIELDS:
            changes[key] = _coerce(key, value)
        else:
            raise RaydgError(
                f"unknown config key {key!r}; valid keys: {', '.join(FIELDS)} "
                "(method settings: options.NAME)"
            )
    return dataclasses.replace(cfg, **changes, options=options)


def parse_sets(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``["rounds=5", "options.mu=0.1"]`` -> ``{"rounds": 5, "options.mu": 0.1}`` (YAML values)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise RaydgError(f"--set expects key=value, got {pair!r}")
        out[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
    return out


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise RaydgError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as err:
        raise RaydgError(f"config file {str(p)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise RaydgError(f"config file {str(p)!r} must hold a mapping of config keys")
    return data


def resolve(cfg: RunConfig) -> RunConfig:
    """Fill ``None`` training fields from the dataset's defaults and validate everything."""
    from raydg.methods import METHODS, method_class

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


def init_weights(cfg: RunConfig) -> str | None:
    """What the initial global model starts from: None (random), ``imagenet`` or a file."""
    if not cfg.pretrained:
        return None
    return cfg.weights or IMAGENET


def clients_per_round(cfg: RunConfig, num_clients: int) -> int:
    if cfg.sample is not None:
        return cfg.sample
    return num_clients if num_clients <= 10 else 10


def targets(cfg: RunConfig) -> list[str]:
    spec = DATASETS.get(cfg.dataset)
    return list(spec.domains) if cfg.target == "all" else [cfg.target]


def to_dict(cfg: RunConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
