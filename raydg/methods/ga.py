"""FedDG-GA (Zhang et al., "Federated Domain Generalization with Generalization Adjustment",
CVPR 2023): aggregation weights that reduce the variance of the clients' generalization gaps.

An aggregation rule: registered as ``ga`` it is FedAvg with GA weights; ``--aggregation ga``
puts the same weights under any method that aggregates with ``aggregation_weights`` (the paper
reports GA on top of FedAvg, FedProx, SCAFFOLD, amplitude mixing and RSC), since every hook here
defers to ``super()``.

* The server keeps one weight a_i per source client, uniform at the start (not by data size).
* Generalization gap of client i in round r: how much worse the new global model does on the
  client's validation split than the client's own model of the round did, by ``metric``:
  ``loss`` (the paper's gap, L_i(global) - L_i(local)) or ``acc`` (the code's default,
  acc_i(local) - acc_i(global)). The local model is the client's last weights of the round
  (taken in ``end_round``; with ``client_selection`` the uploaded copy may be an earlier one);
  the global one carries the client's local keys, as a client loads it.
* Adjustment: a_i += d_r * (G_i - mean G) / max_j |G_j - mean G|, then clipped to [0, 1] and
  renormalised: clients whose data the global model fits worse gain weight. ``centre=False``
  drops the mean (the published code). The step d_r = ``step_size`` / 3 * (1 - (r - 1) / R)
  decays linearly over the R rounds (the code: step 0.2, its constant 1/3).
* The weights computed after round r aggregate round r + 1. With client sampling only the
  round's clients are adjusted (their gaps measured), then all weights are renormalised.
* ``selection=weighted``: a round's ``val_acc`` (model selection) is the clients' validation
  accuracy weighted by the round's aggregation weights (the code's rule); ``mean`` keeps raydg's
  protocol, the plain mean.

Shared beyond parameters: each adjusted client's validation loss and accuracy under the new
global model (ledger kind ``validation_metrics``); the weights stay on the server. Table
``ga_weights`` records every client's weight and gap per round (plotted); the per-round
metrics ``ga/gap_std`` the spread that GA reduces and ``ga/weight/<domain>`` the summed weight
of each source domain's clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, Server, Upload, register

METRICS = ("loss", "acc")
CODE_STEP_SCALE = 1.0 / 3.0  # the published code's constant factor on the step


@dataclass
class GAOptions:
    step_size: float = 0.2  # d: the first round's step before the code's 1/3
    metric: str = "loss"  # loss (the paper's gap) | acc (the code's default)
    centre: bool = True  # subtract the mean gap (the paper) | False (the code)
    selection: str = "mean"  # val_acc: mean (raydg) | weighted by the aggregation weights


def adjust(weights: np.ndarray, gaps: np.ndarray, step: float, centre: bool) -> np.ndarray:
    """One generalization adjustment: weights moved by step * (normalised, optionally
    mean-centred) gap, clipped to [0, 1], renormalised to sum 1."""
    g = gaps - gaps.mean() if centre else gaps
    scale = np.abs(g).max()
    moved = weights + (step * g / scale if scale > 0 else 0.0)
    clipped = np.clip(moved, 0.0, 1.0)
    total = clipped.sum()
    return clipped / total if total > 0 else np.full(len(weights), 1.0 / len(weights))


def step(options: GAOptions, rnd: int, rounds: int) -> float:
    """d_r = step_size / 3 * (1 - (r - 1) / R) for the adjustment after round r."""
    return options.step_size * CODE_STEP_SCALE * (1.0 - (rnd - 1) / rounds)


@register("feddg-ga")
class GA(Method):
    """Generalization-adjusted aggregation weights (FedDG-GA)."""

    name = "ga"
    Options = GAOptions
    paper = "Zhang et al., CVPR 2023"
    aggregation = True
    plots: ClassVar[dict[str, tuple[str, ...]]] = {
        "ga_weights": ("line", "round", "weight", "client")}

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.clients: list[int] = []
        self.weights = np.zeros(0)  # a_i, in ``clients`` order
        self.used = np.zeros(0)  # the weights of the last aggregation
        self.before: dict[int, tuple[float, float]] = {}  # this round's local (loss, acc)

    @classmethod
    def check_options(cls, o: Any) -> None:
        super().check_options(o)
        if o.step_size < 0 or o.metric not in METRICS or o.selection not in ("mean", "weighted"):
            raise RaydgError("ga: step_size must be >= 0, metric loss|acc, "
                             "selection mean|weighted")

    # ------------------------------------------------------------------ server side
    def setup(self, server: Server) -> None:
        super().setup(server)
        if server.config.val_fraction <= 0:
            raise RaydgError("ga measures generalization gaps on the clients' validation "
                             "splits; val_fraction must be > 0")
        self.clients = sorted(server.client_ids)
        self.weights = np.full(len(self.clients), 1.0 / len(self.clients))
        self.used = self.weights.copy()

    def _weight(self, weights: np.ndarray, cids: list[int]) -> list[float]:
        return [float(weights[self.clients.index(c)]) for c in cids]

    def aggregation_weights(self, server: Server, uploads: list[Upload]) -> list[float]:
        """a_i of the uploading clients (``aggregate`` normalises them)."""
        self.before = {u.client_id: (u.metrics["ga/local_loss"], u.metrics["ga/local_acc"])
                       for u in uploads}
        self.used = self.weights.copy()
        return self._weight(self.weights, [u.client_id for u in uploads])

    def on_round_end(self, server: Server) -> dict[str, float]:
        """Measure the round's clients under the new global model and adjust their weights."""
        metrics = super().on_round_end(server)
        if not self.before:
            raise RaydgError(f"ga: {self.name} aggregates without aggregation_weights, so "
                             "it cannot take GA's weights")
        cids = sorted(self.before)
        after = server.call_clients("ga", kind="request", result_kind="validation_metrics",
                                    clients=cids)
        k = METRICS.index(self.options.metric)
        sign = 1.0 if self.options.metric == "loss" else -1.0
        gaps = np.array([sign * (after[c][k] - self.before[c][k]) for c in cids])
        self.before = {}
        idx = [self.clients.index(c) for c in cids]
        weights = self.weights.copy()
        weights[idx] = adjust(self.weights[idx], gaps,
                              step(self.options, server.round, server.config.rounds),
                              self.options.centre) * self.weights[idx].sum()
        self.weights = weights / weights.sum()
        for c, gap in zip(cids, gaps, strict=True):
            server.record("ga_weights", {"client": c, "weight": self._weight(self.weights, [c])[0],
                                         "gap": float(gap)})
        by_domain: dict[str, float] = {}
        for c, w in zip(self.clients, self.weights, strict=True):
            by_domain[server.domains[c]] = by_domain.get(server.domains[c], 0.0) + float(w)
        return {**metrics, "ga/gap_std": float(gaps.std()),
                **{f"ga/weight/{d}": w for d, w in by_domain.items()}}

    def validation_weights(self, clients: list[int]) -> list[float] | None:
        """``selection=weighted``: the weights that aggregated the round being evaluated."""
        if self.options.selection == "mean":
            return super().validation_weights(clients)
        return self._weight(self.used, clients)

    def server_state(self) -> dict[str, Any]:
        return {**super().server_state(), "ga_clients": self.clients,
                "ga_weights": self.weights, "ga_used": self.used}

    def load_server_state(self, state: dict[str, Any]) -> None:
        super().load_server_state(state)
        self.clients = list(state["ga_clients"])
        self.weights, self.used = np.asarray(state["ga_weights"]), np.asarray(state["ga_used"])

    # ------------------------------------------------------------------ client side
    def end_round(self, ctx: ClientContext) -> None:
        """The local model's validation loss and accuracy, before aggregation."""
        super().end_round(ctx)
        loss, acc = ctx.evaluate(ctx.model, ctx.data.val_x, ctx.data.val_y)
        ctx.log("ga/local_loss", loss)
        ctx.log("ga/local_acc", acc)

    def client_phase(self, phase: str, ctx: ClientContext, payload: Any) -> Any:
        """``ga``: the (loss, accuracy) of the new global model on the client's validation."""
        if phase != "ga":
            return super().client_phase(phase, ctx, payload)
        return ctx.evaluate(ctx.model, ctx.data.val_x, ctx.data.val_y)
