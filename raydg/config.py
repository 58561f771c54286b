"""Run configuration: plain data, each key strictly typed (:mod:`raydg.config_types`), set by
config files (:mod:`raydg.config_files`), ``--set key=value`` and ``--grid`` options.

Fields left as ``None`` take the dataset's protocol defaults (:class:`raydg.datasets.TrainDefaults`)
when the config is resolved by :mod:`raydg.resolve`, which also checks names against the registries;
this module imports no dataset, model or method. Method-specific settings live in ``options`` and
are checked against the method's own ``Options`` dataclass.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_type_hints

import numpy as np
from pydantic import Field

from raydg.config_files import FILE_SCHEMA, load_text
from raydg.config_types import (
    Count,
    LrSchedule,
    NonNegative,
    Optimizer,
    Placement,
    Positive,
    Seed,
    Text,
    TrainTransform,
    ValidateClients,
    adapter,
    checked,
)
from raydg.errors import RaydgError, cut, quoted


@dataclass(frozen=True)
class RunConfig:
    dataset: Text = "digits-style"
    method: Text = "fedavg"
    augment: Text | None = None  # an augmentation method composed with ``method`` (e.g. ccst)
    aggregation: Text | None = None  # an aggregation rule composed with ``method`` (e.g. ga)
    target: Text = "all"  # a domain name or "all" (one sub-run per held-out domain)
    seeds: Annotated[list[Seed], Field(min_length=1)] = field(default_factory=lambda: [0])
    # clients and sampling
    clients: Count | None = None  # None: one client per source domain
    dirichlet: Positive | None = None  # None: label-iid split of each domain
    # each client draws this many samples of its domain (a cross-device population, which may
    # exceed the data); None: the domain's samples are split among its clients
    client_size: Count | None = None
    sample: Count | None = None  # clients per round; None: all when N <= 10, else 10
    # "samples" (n_k, the papers' equations) or "uniform"
    agg_weights: Literal["samples", "uniform"] = "samples"
    # local training (None: the dataset's defaults)
    rounds: Count | None = None
    local_steps: Count | None = None
    lr: Positive | None = None
    lr_schedule: LrSchedule = "constant"
    optimizer: Optimizer = "sgd"  # sgd (momentum, weight_decay) | adam (default betas)
    momentum: Annotated[float, Field(ge=0, lt=1)] | None = None
    weight_decay: NonNegative = 0.0
    batch_size: Count | None = None
    equal_compute: Text | None = None  # a method: add rounds to match its setup steps
    # model selection and evaluation (FedFD-A §4.1 "Evaluation Protocols"; FedIG-A A.2)
    val_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    val_every: Count | None = None  # local steps between client-side validations; None: dataset's
    # who validates each round's global model: all clients (the papers' protocol), the round's
    # sampled clients, or K clients drawn per round ("100"), every validate_every rounds and
    # the last: the cross-device settings, where validating N clients a round costs O(N)
    validate_clients: ValidateClients = "all"
    validate_every: Count = 1
    # upload each client's best-validation weights of the round; None: the method's paper
    client_selection: bool | None = None
    eval_local: bool = False  # in-federation accuracy with local statistics (FedIG-A A.7)
    eval_batch_size: Count = 256
    # model and data
    model: Text | None = None
    pretrained: bool | None = None  # ImageNet weights; None: the dataset's default
    weights: Text | None = None  # a state-dict file to start from instead of torchvision's
    image_size: Count | None = None
    train_transform: TrainTransform = "none"
    data_root: Text | None = None
    skip_bad_images: bool = False  # skip (and count) unreadable images instead of failing
    cache: bool = True  # decode image files once into cache_dir, memory-map them afterwards
    cache_dir: Text | None = None  # None: $RAYDG_CACHE or ~/.cache/raydg
    # resources
    actors: Count | None = None  # None: one per client while resources allow
    cpus_per_actor: Positive = 1.0
    gpus_per_actor: NonNegative = 0.0
    deterministic: bool = True  # on a GPU: reproducible kernels; false: torch's defaults
    address: Text | None = None  # Ray cluster address; None: a local Ray (or RAY_ADDRESS)
    dashboard: bool = False  # a local Ray with Ray's own processes and its dashboard
    checkpoint_every: Count | None = None  # rounds; None: as often as costs < 2 % of the time
    # restarts of a federation from its checkpoint (lost actor or node)
    max_failures: Annotated[int, Field(ge=0)] = 2
    max_concurrent: Count | None = None  # federations at once; None: as many as the cluster holds
    placement: Placement = "pack"  # how a federation's actors spread over nodes
    # run federations one after another on warm trial and client actors (Tune's reuse_actors)
    reuse_actors: bool = True
    storage: Text | None = None  # trials' results: folder or URI; None: $RAYDG_STORAGE or here
    # tracking
    tracking_uri: Text | None = None
    experiment: Text | None = None
    # modules or .py files that register methods, datasets or models (raydg.plugins), besides
    # the installed packages' entry points
    plugins: list[Text] = field(default_factory=list)
    options: dict[Text, Any] = field(default_factory=dict)
    # options for whichever method runs, by method name, e.g. {fedprox: {mu: 0.1}}: what lets
    # one config serve a table's baselines; ``options`` override them
    method_options: dict[Text, dict[Text, Any]] = field(default_factory=dict)
    # the options that a paper config (a file with a ``paper`` section) gives, by method:
    # that paper's values, so table rows do not flag them as not the paper's
    paper_options: dict[Text, dict[Text, Any]] = field(default_factory=dict)

    @property
    def seed(self) -> int:
        """The seed of a single run (a simulation's config holds exactly one)."""
        return self.seeds[0]


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


TYPES = get_type_hints(RunConfig, include_extras=True)  # each key's type, checked strictly


def schema() -> dict[str, Any]:
    """The JSON Schema of a config file (``raydg schema``; ``docs/config.schema.json``, for
    editors): every key's type and default, and the file's own sections."""
    defaults = RunConfig()
    keys = {f.name: {**adapter(TYPES[f.name]).json_schema(),
                     "default": getattr(defaults, f.name)} for f in dataclasses.fields(defaults)}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "raydg config file", "type": "object", "additionalProperties": False,
            "properties": {**keys, **FILE_SCHEMA}}


def _coerce(key: str, value: Any) -> Any:
    """``value`` checked against config key ``key``'s type (:data:`TYPES`); refused in one
    line that names the key, the expected type and the value."""
    return checked(key, TYPES[key], value)


def check(cfg: RunConfig) -> None:
    """Refuse a config (however made: a file, options, Python) with a value of the wrong type
    or out of its range, as :func:`apply` does."""
    for f in dataclasses.fields(cfg):
        _coerce(f.name, getattr(cfg, f.name))


def apply(cfg: RunConfig, values: dict[str, Any]) -> RunConfig:
    """Return ``cfg`` with ``values`` applied; ``options.x`` keys go into ``options`` and
    ``method_options.METHOD.x`` into that method's entry; mappings of either merge key by
    key."""
    changes: dict[str, Any] = {}
    options = dict(cfg.options)
    by_method = {m: dict(o) for m, o in cfg.method_options.items()}
    for raw, value in values.items():
        field_name, dot, rest = raw.partition(".")
        key = field_name.replace("-", "_")
        if key == "options":
            options.update({rest: value} if dot else _coerce(key, value))
        elif key == "method_options":
            method, _, option = rest.partition(".")
            items = ({method: {option: value}} if option else {method: value} if dot
                     else _coerce(key, value))
            for m, o in items.items():
                if not isinstance(o, dict):
                    raise RaydgError(f"method_options.{m} must map option names to values")
                by_method.setdefault(m, {}).update(o)
        elif key in FIELDS and not dot:
            changes[key] = _coerce(key, value)
        else:
            raise RaydgError(f"unknown config key {quoted(raw)}; {_key_hint(key, dot, rest)}")
    return dataclasses.replace(cfg, **changes, options=options, method_options=by_method)


def _key_hint(key: str, dot: str, rest: str) -> str:
    """``did you mean options.mu?`` for a key that is close to one, else the valid keys."""
    heads = [*FIELDS, "method_options"] if not dot else ["options", "method_options"]
    close = difflib.get_close_matches(key, heads, n=1, cutoff=0.7)
    if close:
        return f"did you mean {close[0]}{dot}{rest}?"
    return (f"valid keys: {', '.join(FIELDS)} (method settings: options.NAME, "
            "method_options.METHOD.NAME)")


def parse_sets(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``["rounds=5", "options.mu=0.1"]`` -> ``{"rounds": 5, "options.mu": 0.1}``: each value
    parsed as a config file is (:func:`load_text`)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise RaydgError(f"--set expects key=value, got {quoted(pair)}")
        out[key.strip()] = load_text(raw, f"--set {cut(key.strip())}") if raw.strip() else None
    return out


# config keys that place or track a run without changing its result
NOT_RESULTS = ("actors", "cpus_per_actor", "gpus_per_actor", "max_concurrent", "placement",
               "address", "dashboard", "storage", "tracking_uri", "experiment", "data_root",
               "cache", "cache_dir", "checkpoint_every", "max_failures", "skip_bad_images",
               "reuse_actors", "paper_options", "plugins")
# Keys a search may not vary: they name the experiment's data, targets, seeds, resources or store.
EXPERIMENT_KEYS = ("dataset", "target", "seeds", "data_root", "image_size", "skip_bad_images",
                   "cache", "cache_dir", "address", "dashboard", "max_concurrent", "placement",
                   "storage", "tracking_uri", "experiment", "reuse_actors", "plugins")
DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")


@dataclass
class Search:
    """A hyper-parameter search: every combination of the ``grid`` values, crossed with
    ``samples`` random draws from ``space`` (``{key: {distribution: [args]}}``, seeded by
    ``seed``; distributions: uniform [a, b], loguniform [a, b], randint [a, b] inclusive,
    choice [values]). A grid value that is a mapping sets several keys together, e.g.
    ``method: [fedavg, {method: fedprox, options.mu: 0.1}]``.

    The draws are made here, once, not by Tune's samplers: DomainBed's selection compares a
    setting across seeds, so every (target, seed) federation of one setting must see the same
    drawn values, whereas Tune would draw afresh for each grid point.
    """

    grid: dict[str, list[Any]] = field(default_factory=dict)
    space: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    samples: int = 0
    seed: int = 0

    def __bool__(self) -> bool:
        return bool(self.grid or self.samples)

    def settings(self) -> list[dict[str, Any]]:
        """Every setting of the searched keys, grid order first (``[{}]`` for no search)."""
        grid = [{k: v for key, value in zip(self.grid, values, strict=True)
                 for k, v in (value.items() if isinstance(value, dict) else [(key, value)])}
                for values in itertools.product(*self.grid.values())]
        if not self.samples:
            return grid
        rng = np.random.default_rng(self.seed)
        draws = [{k: _draw(rng, spec) for k, spec in self.space.items()}
                 for _ in range(self.samples)]
        return [{**g, **d} for g in grid for d in draws]


def _draw(rng: np.random.Generator, spec: dict[str, list[Any]]) -> Any:
    (kind, args), = spec.items()
    if kind == "choice":
        return args[int(rng.integers(len(args)))]
    low, high = args
    if kind == "uniform":
        return float(rng.uniform(low, high))
    if kind == "loguniform":
        return float(np.exp(rng.uniform(np.log(low), np.log(high))))
    return int(rng.integers(low, high + 1))


def _search_key(key: str) -> str:
    key = key.replace("-", "_")
    if key.startswith("options.") and len(key) > len("options."):
        return key
    if key not in FIELDS or key == "options":
        raise RaydgError(f"unknown config key {quoted(key)} in the search; valid keys: "
                         f"{', '.join(k for k in FIELDS if k not in EXPERIMENT_KEYS)} "
                         "and options.NAME")
    if key in EXPERIMENT_KEYS:
        raise RaydgError(f"a search cannot vary {quoted(key)}: it is fixed for the whole "
                         "experiment")
    return key


def _values(key: str, values: Any) -> list[Any]:
    if not isinstance(values, list) or not values:
        raise RaydgError(f"search key {quoted(key)} needs a non-empty list of values, got "
                         f"{quoted(values)}")
    return values


def _grid_values(key: str, values: Any) -> list[Any]:
    """A grid key's values; a mapping among them sets several keys and must set ``key``."""
    for value in _values(key, values):
        if isinstance(value, dict):
            if key not in value:
                raise RaydgError(f"grid value {quoted(value)} of {quoted(key)} must set "
                                 f"{quoted(key)} itself")
            for k in value:
                _search_key(k)
    return values


def _distribution(key: str, spec: Any) -> dict[str, list[Any]]:
    if not isinstance(spec, dict) or len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
        raise RaydgError(f"random search key {quoted(key)} needs one of "
                         f"{', '.join(DISTRIBUTIONS)}, e.g. {{loguniform: [0.001, 0.1]}}; got "
                         f"{quoted(spec)}")
    (kind, args), = spec.items()
    args = _values(key, args)
    if kind != "choice":
        numeric = all(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
        if len(args) != 2 or not numeric or args[0] > args[1] or (
                kind == "loguniform" and args[0] <= 0):
            raise RaydgError(f"random search key {quoted(key)}: {kind} needs [low, high] with "
                             f"low <= high{' and low > 0' if kind == 'loguniform' else ''}, "
                             f"got {quoted(args)}")
    return {kind: args}


def parse_search(grid: Any = None, random: Any = None) -> Search:
    """A :class:`Search` from a config file's ``grid:`` and ``random:`` sections, checked."""
    if grid is not None and not isinstance(grid, dict):
        raise RaydgError(f"'grid' must map config keys to lists of values, got {quoted(grid)}")
    search = Search(grid={_search_key(k): _grid_values(k, v) for k, v in (grid or {}).items()})
    if random is None:
        return search
    if not isinstance(random, dict) or set(random) - {"samples", "seed", "space"}:
        raise RaydgError("'random' takes the keys samples, seed and space, got "
                         f"{quoted(random)}")
    samples = checked("random.samples", Count, random.get("samples"), "search key")
    seed = checked("random.seed", Seed, random.get("seed", 0), "search key")
    space = random.get("space")
    if not isinstance(space, dict) or not space:
        raise RaydgError("random.space must map config keys to distributions, e.g. "
                         "{lr: {loguniform: [0.001, 0.1]}}")
    search.space = {_search_key(k): _distribution(k, v) for k, v in space.items()}
    both = sorted(set(search.grid) & set(search.space))
    if both:
        raise RaydgError(f"search keys {both} are both in the grid and in the random space")
    search.samples, search.seed = samples, seed
    return search


FILE_SECTIONS = ("grid", "random", "paper")  # sections of a config file that are not keys


def extend_search(search: Search, grid: dict[str, list[Any]], what: str) -> Search:
    """``search`` with ``grid``'s keys added; ``what`` (``--grid``) names the added grid in the
    error for a key that both have."""
    clash = sorted(set(search.grid) & set(grid))
    if clash:
        raise RaydgError(f"{what} repeats keys of the config file's grid: {clash}")
    return dataclasses.replace(search, grid={**search.grid, **grid})


def split_search(values: dict[str, Any]) -> tuple[dict[str, Any], Search]:
    """A config file's keys without its ``grid``/``random``/``paper`` sections, and its
    search. A paper config's method settings (``method_options``, and ``options`` for its
    ``method``) become ``paper_options``: the paper's values."""
    rest = {k: v for k, v in values.items() if k not in FILE_SECTIONS}
    if "paper" in values:
        own = {str(rest.get("method", "fedavg")): rest.get("options") or {}}
        rest["paper_options"] = {m: {**(rest.get("method_options") or {}).get(m, {}),
                                     **own.get(m, {})}
                                 for m in {*(rest.get("method_options") or {}), *own}}
    return rest, parse_search(values.get("grid"), values.get("random"))


def parse_grid(pairs: tuple[str, ...] | list[str]) -> dict[str, list[Any]]:
    """``["lr=0.01,0.02", "options.mu=[0.1]"]`` -> ``{"lr": [0.01, 0.02], "options.mu": [0.1]}``
    (each value parsed as YAML)."""
    grid: dict[str, list[Any]] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise RaydgError(f"--grid expects key=value1,value2,..., got {quoted(pair)}")
        raw = raw.strip()
        grid[key.strip()] = load_text(raw if raw.startswith("[") else f"[{raw}]",
                                      f"--grid {cut(key.strip())}")
    return parse_search(grid).grid


def setting_label(setting: dict[str, Any]) -> str:
    """``{"lr": 0.02, "options.mu": 0.1}`` -> ``"lr=0.02 options.mu=0.1"`` (floats to 4
    significant digits)."""
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in setting.items())


def clients_per_round(cfg: RunConfig, num_clients: int) -> int:
    if cfg.sample is not None:
        return cfg.sample
    return num_clients if num_clients <= 10 else 10


def to_dict(cfg: RunConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
