"""The method interface: one subclass of :class:`Method` per paper, registered by name.

The base class *is* FedAvg.

Its hooks, by where they run (a method overrides only what its paper changes):

======================  ======================================  ==============================
runs in                 hooks                                   used by (e.g.)
======================  ======================================  ==============================
planning (before Ray:   ``parse_options``, ``check_options``,   every method with options;
the planning step,      ``regime_options``, ``not_paper``,      CSAC (``setup_steps``),
no model)               ``label``, ``setup_steps``; class       FedFD (``regime_options``)
                        flags (``client_selection``,
                        ``needs_batchnorm``, ...)
driver, building the    ``arrange_clients``, ``build_model``,   DeepAll, local bound; XAN,
federation (and each    ``local_keys``, ``upload_kind``         mixed-statistics BN; FedBN,
client actor: model)                                            SiloBN, gPerXAN; ledger kinds
client actor, each      ``start_round``, ``train_step``,        FedProx, FedFD-A, gPerXAN;
round and phase         ``loss``, ``end_round``,                CSAC, CCST
                        ``client_phase`` (via ``Server``)
driver, the server      ``setup``, ``aggregate``,               CSAC, CCST, gPerXAN; FedDG-GA
                        ``aggregation_weights``,                (weights and selection)
                        ``validation_weights``,
                        ``on_round_end``, ``server_state``,
                        ``load_server_state``
client actor (its       ``eval_modes``, ``predict``             FedFD-A's statistics, FedSR's
validation) and the                                             sampling
driver's evaluator
driver's evaluator,     ``analyze``, ``plots``,                 FedFD-A, gPerXAN
after the last round    ``summarize``
======================  ======================================  ==============================

Two kinds of method compose with any other (``raydg.methods.method_class``): an
*augmentation* (``--augment``, e.g. CCST) and an *aggregation rule* (``--aggregation``, e.g.
FedDG-GA). Each calls ``super()`` in every hook it overrides, so it runs around the method's own.

Client-side hooks run inside the client's Ray actor and receive a :class:`ClientContext`;
server-side hooks run on the driver and receive a :class:`Server`. One method object serves every
client of an actor and clients may move between actors, so per-client state belongs in
``ctx.memory`` (or the model's local keys), never in attributes of the method.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydg import state as st
from raydg.errors import RaydgError
from raydg.models import ModelSpec, build_model
from raydg.optim import SGD

if TYPE_CHECKING:
    from raydg.config import RunConfig
    from raydg.partition import ClientData


@dataclass
class NoOptions:
    """Settings of a method that has none."""


@dataclass
class Upload:
    """What a client sends back after a round of local training."""

    client_id: int
    num_samples: int
    state: st.State
    metrics: dict[str, float] = field(default_factory=dict)
    blowup: str | None = None  # how its training loss diverged this round, if it did


@dataclass
class ClientContext:
    """Everything a client-side hook may use during one round (or one phase) of one client.

    ``memory`` persists across rounds inside the client's actor (e.g. CSAC's frozen local
    model); ``scratch`` is emptied at the start of every round. ``log`` records a value (e.g. a
    loss term) whose mean over the round's steps becomes a per-round metric; ``steps`` counts
    the minibatches drawn, i.e. the local compute of the round or phase.
    """

    client_id: int
    round: int
    data: ClientData
    model: nn.Module
    config: RunConfig
    device: torch.device
    global_state: st.State
    memory: dict[str, Any]
    generator: torch.Generator
    inputs: Any  # callable: uint8 numpy images -> normalised float tensor on ``device``
    train_inputs: Any  # the same after the run's training augmentation (``train_transform``)
    # callable: (model, uint8 images, labels) -> (mean cross-entropy, accuracy) in eval mode,
    # under the method's first inference mode
    evaluate: Any
    scratch: dict[str, Any] = field(default_factory=dict)
    optimizer: SGD | torch.optim.Optimizer | None = None
    metrics: dict[str, list[float | Tensor]] = field(default_factory=dict)
    terms: set[str] = field(default_factory=set)  # the metrics that are terms of the loss
    steps: int = 0

    def make_optimizer(self, params, scale: float = 1.0) -> SGD | torch.optim.Optimizer:
        """The run's ``optimizer``: SGD with its momentum and weight decay
        (:class:`raydg.optim.SGD`, ``torch.optim.SGD``'s update), or Adam with its default
        betas (ELCFS's code) and the weight decay; the learning rate follows ``lr_schedule`` by
        round, times ``scale``."""
        cfg, lr = self.config, scale * learning_rate(self.config, self.round)
        if cfg.optimizer == "adam":
            return torch.optim.Adam(list(params), lr=lr, weight_decay=cfg.weight_decay)
        return SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    def log(self, name: str, value: float | Tensor, term: bool = False) -> None:
        """Record ``value``; the round's metric ``name`` is its mean (over steps and clients).
        A tensor stays on its device until the round ends (no wait for the GPU at each step).
        ``term``: ``value`` is a term of the loss, logged once per step, which the divergence
        guard names when the loss explodes (:func:`raydg.engine.health.blowup`)."""
        self.metrics.setdefault(name, []).append(
            value.detach() if isinstance(value, Tensor) else float(value))
        if term:
            self.terms.add(name)

    def batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Endless seeded minibatches of the training shard, reshuffled every epoch, with the
        run's training augmentation."""
        n, bs = self.data.num_train, self.config.batch_size
        bs = min(bs, n)
        while True:
            perm = torch.randperm(n, generator=self.generator).numpy()
            for i in range(0, n - bs + 1, bs):
                idx = perm[i:i + bs]
                x = self.train_inputs(self.data.train_x[idx])
                y = torch.from_numpy(self.data.train_y[idx]).to(self.device)
                self.steps += 1
                yield x, y


def learning_rate(cfg: RunConfig, rnd: int) -> float:
    """``lr`` in round ``rnd`` (setup phases count as round 1): constant, or cosine annealing
    over the rounds, lr * (1 + cos(pi * (r - 1) / R)) / 2 (gPerXAN's code)."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * (max(rnd, 1) - 1) / cfg.rounds))


class Server(Protocol):
    """What server-side hooks may use (implemented by
    :class:`raydg.engine.simulation.Simulation`)."""

    config: RunConfig
    round: int
    global_state: st.State  # ``setup`` may replace it (e.g. CSAC's first fusion)
    client_ids: list[int]
    num_samples: dict[int, int]
    local_keys: set[str]  # the method's local keys for this run's model
    # each client's source domain: for what a method logs, never for how it trains (a real
    # server does not know it)
    domains: dict[int, str]

    def call_clients(self, phase: str, payload: Any = None, *, kind: str,
                     result_kind: str | None = None,
                     clients: list[int] | None = None) -> dict[int, Any]:
        """Run ``client_phase(phase, ctx, payload)`` on clients; ledger both directions.

        ``kind``/``result_kind`` name the information sent and returned; ``"state"`` marks a
        model state dict, entered in the ledger per ``upload_kind`` of its tensors."""
        ...

    def log(self, message: str) -> None:
        """Progress output of the run."""
        ...

    def record(self, table: str, row: dict[str, Any]) -> None:
        """Append a row to a table logged as an artifact (Parquet and CSV) at the end."""
        ...


class Method:
    """FedAvg (McMahan et al.): local SGD on cross-entropy, n_k-weighted parameter averaging."""

    name: ClassVar[str] = "fedavg"
    Options: ClassVar[type] = NoOptions
    paper: ClassVar[str] = "McMahan et al., AISTATS 2017; FedFD-A §3.1"
    augmentation: ClassVar[bool] = False  # composable with any method (``--augment``)
    aggregation: ClassVar[bool] = False  # composable with any method (``--aggregation``)
    # the paper's default for ``client_selection`` (FedFD-A §4.1's best-validation upload)
    client_selection: ClassVar[bool] = False
    # what to try when the training loss stays at chance level, in the method's terms
    collapse_hint: ClassVar[str] = ""
    # acts on the model's BatchNorm layers (keeps them local, mixes or replaces them): a model
    # without any is refused before Ray starts, instead of running a degenerate FedAvg
    needs_batchnorm: ClassVar[bool] = False

    def __init__(self, options: Any = None) -> None:
        self.options = options if options is not None else self.Options()

    # ------------------------------------------------------------------ planning
    @classmethod
    def parse_options(cls, values: dict[str, Any]) -> Any:
        """Build ``Options`` from a dict, with one-line errors for unknown keys or bad types."""
        known = {f.name: f for f in dataclasses.fields(cls.Options)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            valid = ", ".join(f"options.{k}" for k in known) or "none"
            raise RaydgError(f"unknown option(s) {unknown} for method {cls.name}; valid: "
                             f"{valid}{cls._owners(unknown[0])}")
        options, defaults = cls.Options(**values), cls.Options()
        for key in known:
            default, value = getattr(defaults, key), getattr(options, key)
            if isinstance(default, float) and isinstance(value, int) and not isinstance(
                    value, bool):
                setattr(options, key, float(value))
            elif default is not None and not isinstance(value, type(default)) and not (
                    value is None and "None" in str(known[key].type)):  # `float | None`
                raise RaydgError(f"option {key!r} of {cls.name} must be "
                                 f"{type(default).__name__}, got {value!r}")
            numbers = getattr(options, key)
            numbers = numbers if isinstance(numbers, list | tuple) else [numbers]
            if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
                raise RaydgError(f"option {key!r} of {cls.name} must be a finite number, got "
                                 f"{getattr(options, key)!r}")
        cls.check_options(options)
        return options

    @classmethod
    def regime_options(cls, model: str, imagenet: bool) -> dict[str, Any]:
        """Options this method starts from on backbone ``model`` (from ImageNet weights or
        not) where its paper's values, set for the paper's own backbone, do not train: raydg's
        choice, labelled as not the paper's in every table; a dataset's, ``method_options``
        and ``options`` override it."""
        return {}

    @classmethod
    def _owners(cls, option: str) -> str:
        """``; 'mu' is an option of fedprox (--method)``: the methods that have ``option``."""
        from raydg.methods import METHODS

        owners = [name for name, other in METHODS
                  if option in {f.name for f in dataclasses.fields(other.Options)}]
        return f"; {option!r} is an option of {', '.join(owners)} (--method)" if owners else ""

    @classmethod
    def check_options(cls, options: Any) -> None:
        """Raise :class:`RaydgError` for invalid option values (override to check ranges)."""

    @classmethod
    def not_paper(cls, options: Any, paper: Any = None) -> dict[str, Any]:
        """Every option that differs from the paper's value: ``paper``'s (a paper config's
        options) or else the default (the paper's value, or raydg's choice where the paper
        gives none). What a table row shows beside the name, ``fedfd [cafl_reduction=mean]``:
        a setting that is not the paper's is never printed under the plain method name."""
        paper = cls.Options() if paper is None else paper
        return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
                if getattr(options, f.name) != getattr(paper, f.name)}

    @classmethod
    def label(cls, options: Any) -> str:
        """The method as tables and MLflow report it (``ccst-pixel`` for CCST's pixel coder)."""
        return cls.name

    @classmethod
    def setup_steps(cls, options: Any, cfg: RunConfig) -> int:
        """Local steps per client that ``setup`` runs before round 1 (CSAC's acquisition);
        what ``equal_compute`` gives a baseline on top of its rounds."""
        return 0

    # ------------------------------------------------------------------ building (driver)
    def arrange_clients(self, clients: list[ClientData], cfg: RunConfig) -> list[ClientData]:
        """The federation's clients, from the partition's source-domain shards (on the driver,
        before the model is built and any actor starts); e.g. DeepAll pools them into one."""
        return clients

    def build_model(self, spec: ModelSpec) -> nn.Module:
        return build_model(spec)

    def local_keys(self, model: nn.Module) -> set[str]:
        """State-dict keys a client keeps and the server never overwrites (personalised)."""
        return set()

    def upload_kind(self, key: str) -> str:
        """The kind of information a state-dict entry reveals, for the communication ledger."""
        return "bn_statistics" if st.is_bn_statistic(key) else "parameters"

    # ------------------------------------------------------------------ client actor
    def start_round(self, ctx: ClientContext) -> None:
        """Called after the global weights are loaded, before the first local step."""
        ctx.optimizer = ctx.make_optimizer(p for p in ctx.model.parameters() if p.requires_grad)

    def train_step(self, ctx: ClientContext, x: Tensor, y: Tensor) -> float | Tensor:
        """One local step; its loss, as a float or a tensor that is read back when the round
        ends (a read at every step would make the host wait for the GPU)."""
        assert ctx.optimizer is not None
        ctx.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(ctx, x, y)
        loss.backward()
        ctx.optimizer.step()
        return loss.detach()

    def loss(self, ctx: ClientContext, x: Tensor, y: Tensor) -> Tensor:
        """Eq. (1) of FedFD-A: cross-entropy on the client's own data."""
        return F.cross_entropy(ctx.model(x), y)

    def end_round(self, ctx: ClientContext) -> None:
        """Called after the last local step and the client-side model selection."""

    def client_phase(self, phase: str, ctx: ClientContext, payload: Any) -> Any:
        raise NotImplementedError(f"{self.name} has no client phase {phase!r}")

    # ------------------------------------------------------------------ inference (both)
    eval_modes: ClassVar[tuple[str, ...]] = ("global",)

    def predict(self, model: nn.Module, x: Tensor, mode: str) -> Tensor:
        """Logits of the model in eval mode; ``mode`` is one of ``eval_modes``."""
        return model(x)

    # ------------------------------------------------------------------ analysis (evaluator)
    # artifact table -> plot: ("box", group, value) or ("line", x, y, series)
    plots: ClassVar[dict[str, tuple[str, ...]]] = {}

    def analyze(self, model: nn.Module, batches: Iterator[Tensor]) -> dict[str, list[dict]]:
        """Tables about the final global model on the target images (run once, on the
        evaluator); each becomes an artifact ``target_<name>``."""
        return {}

    def summarize(self, tables: dict[str, list[dict]]) -> dict[str, float]:
        """Final metrics drawn from :meth:`analyze`'s tables (logged ``final/<name>``, which a
        report can show, ``raydg report --metric``, where artifacts do not travel)."""
        return {}

    # ------------------------------------------------------------------ server (driver)
    def setup(self, server: Server) -> None:
        """One-off phases before round 1 (e.g. style exchange, local pre-training)."""

    def aggregate(self, server: Server, uploads: list[Upload]) -> st.State:
        """Weighted FedAvg of every uploaded tensor, in client-id order.

        All keys, local ones included, are averaged: the result is the global model that is
        evaluated (its BN statistics are the clients' n_k-weighted average); clients reload only
        the keys that are not local.
        """
        return st.weighted_average([u.state for u in uploads],
                                   self.aggregation_weights(server, uploads))

    def aggregation_weights(self, server: Server, uploads: list[Upload]) -> list[float]:
        """Each upload's weight in ``aggregate``: n_k (the papers' equations) or uniform
        (CCST's code), per ``agg_weights``."""
        uniform = server.config.agg_weights == "uniform"
        return [1.0 if uniform else float(u.num_samples) for u in uploads]

    def validation_weights(self, clients: list[int]) -> list[float] | None:
        """Weights of the clients' source-validation accuracies in a round's ``val_acc`` (the
        model-selection score), asked when the round's evaluation starts; None: the mean."""
        return None

    def on_round_end(self, server: Server) -> dict[str, float]:
        """Extra per-round metrics to log."""
        return {}

    def server_state(self) -> dict[str, Any]:
        """What the method keeps on the driver between rounds (e.g. aggregation weights that
        evolve), for checkpoints: arrays, numbers, strings, lists and dicts only."""
        return {}

    def load_server_state(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`server_state`."""
