"""FedGMA (Tenison et al., "Gradient Masked Averaging for Federated Learning", TMLR 2023,
arXiv 2201.11986): the server scales each coordinate of the averaged client update by how far
the clients agree on its sign.

Algorithm 1 (Gradient Masked FedAvg), one round t with the K clients that uploaded:

* Client update: Delta_k = w_k - w_t, the client's trained weights minus the global model it
  started from.
* Agreement score per coordinate j: A_j = |sum_k sign(Delta_k,j)| / K; every client counts
  once, whatever its sample count, and a coordinate a client left unchanged counts 0.
* Mask (``mask=soft``, the paper's): m_j = 1 where A_j >= tau, else A_j: coordinates the
  clients agree on take the full step, contested ones a step scaled by their agreement.
  ``mask=hard`` is the AND-mask of Parascandolo et al. that GMA starts from: m_j = 1 where
  A_j >= tau, else 0.
* Server step: w_{t+1} = w_t + eta * m (.) Delta, where Delta = sum_k p_k Delta_k is the
  base method's aggregation minus w_t (FedAvg: p_k from ``aggregation_weights``, n_k or
  uniform per ``agg_weights``); eta is the server learning rate ``server_lr``.

Sources: the full text was not available when this was written, so no equation numbers are
cited. The steps above are Algorithm 1 as a reading of the paper summarises it (A_j = |mean
over clients of sign(update_j)|; m = 1 if A_j >= tau else A_j; update = m * mean update) and as
FedTHE's ``pcode/aggregation/gma_fedavg.py`` implements it (soft mask, signs counted once per
client). declearn's ``GradientMaskedAveraging`` instead weights the signs like the average; not
offered here. ``threshold`` (tau) defaults to 0.4, the default of one third-party GMA
aggregator (FedTHE's code uses 0.1, declearn's 1.0, i.e. m = A); with three clients, as one per
PACS source domain, A_j is 1/3 or 1, so any tau <= 1/3 is FedAvg. ``server_lr`` (eta) defaults
to 1: agreed coordinates move as far as under FedAvg. threshold 0 with server_lr 1 is FedAvg.

Which entries are masked: the floating-point entries that are neither BN running statistics
nor local keys. BN running statistics and integer buffers (batch counters) are statistics, not
weights a step moves, so they take the base aggregation (a weighted average, as in FedAvg and
in FedTHE's code, which masks only ``model.parameters()``). Local keys (none for FedGMA alone;
e.g. BN layers under ``--aggregation fedgma`` on FedBN) also take the base aggregation: their
clients never loaded the global values, so w_k - w_t is no update from a common start.

An aggregation rule (``aggregation = True``; the paper offers GMA as a drop-in replacement for
the averaging of existing FL algorithms): ``--aggregation fedgma`` masks the update of any
method, since ``aggregate`` masks whatever the base method aggregates. Stateless across rounds:
nothing to checkpoint.

Shared: nothing beyond parameters (ledger kinds ``parameters``, ``bn_statistics``); the mask is
computed on the server from the uploaded weights. Table ``gma_mask`` records per round and
masked tensor its coordinates (``size``), the fraction with A_j >= tau (``kept``: the full
step) and the mean mask value (``mask_mean``); the per-round metrics ``fedgma/kept`` and
``fedgma/mask_mean`` give the same over all masked coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from raydg import state as st
from raydg.errors import RaydgError
from raydg.methods import Method, Server, Upload, register

MASKS = ("soft", "hard")


@dataclass
class FedGMAOptions:
    threshold: float = 0.4  # tau, in [0, 1]; 0: no masking
    server_lr: float = 1.0  # eta, the server learning rate
    mask: str = "soft"  # soft (the paper: m = A below tau) | hard (the AND-mask: m = 0)


def agreement(updates: list[np.ndarray]) -> np.ndarray:
    """A = |sum_k sign(Delta_k)| / K, coordinate-wise (sign(0) = 0)."""
    return np.abs(sum(np.sign(d) for d in updates)) / len(updates)


def gradient_mask(score: np.ndarray, threshold: float, mask: str) -> np.ndarray:
    """m = 1 where A >= tau, else A (``soft``) or 0 (``hard``)."""
    return np.where(score >= threshold, 1.0, score if mask == "soft" else 0.0)


def masked_keys(state: st.State, local_keys: set[str]) -> list[str]:
    """The entries GMA masks: floating point, not BN running statistics, not local."""
    return [k for k, v in state.items() if np.issubdtype(v.dtype, np.floating)
            and not st.is_bn_statistic(k) and k not in local_keys]


@register()
class FedGMA(Method):
    """FedAvg whose server step is masked by the clients' sign agreement (Algorithm 1)."""

    name = "fedgma"
    Options = FedGMAOptions
    paper = "Tenison et al., TMLR 2023, Algorithm 1"
    aggregation = True
    plots: ClassVar[dict[str, tuple[str, ...]]] = {
        "gma_mask": ("line", "round", "kept", "layer")}

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.metrics: dict[str, float] = {}  # the last aggregation's mask (none: nothing masked)

    @classmethod
    def check_options(cls, o: Any) -> None:
        super().check_options(o)
        if not 0.0 <= o.threshold <= 1.0 or o.server_lr <= 0 or o.mask not in MASKS:
            raise RaydgError("fedgma: threshold must be in [0, 1], server_lr > 0, "
                             "mask soft|hard")

    def aggregate(self, server: Server, uploads: list[Upload]) -> st.State:
        """w + eta * m (.) (base aggregation - w) on the masked keys; the base aggregation
        elsewhere. Records the mask per tensor in table ``gma_mask``."""
        base = super().aggregate(server, uploads)
        o = self.options
        kept = mass = total = 0.0
        for key in masked_keys(base, server.local_keys):
            w = server.global_state[key].astype(np.float64)
            score = agreement([u.state[key].astype(np.float64) - w for u in uploads])
            m = gradient_mask(score, o.threshold, o.mask)
            base[key] = np.asarray(w + o.server_lr * m * (base[key] - w), dtype=base[key].dtype)
            full = score >= o.threshold
            server.record("gma_mask", {"layer": key, "size": int(m.size),
                                       "kept": float(full.mean()), "mask_mean": float(m.mean())})
            kept, mass, total = kept + full.sum(), mass + m.sum(), total + m.size
        self.metrics = {"fedgma/kept": float(kept / total),
                        "fedgma/mask_mean": float(mass / total)} if total else {}
        return base

    def on_round_end(self, server: Server) -> dict[str, float]:
        """The round's mask summary over all masked coordinates."""
        return {**super().on_round_end(server), **self.metrics}
