"""CSAC (Yuan et al., IEEE TKDE 2023): collaborative semantic aggregation and calibration.

1. Local semantic acquisition (§3.3, Eq. 1-2), a setup phase: every client trains its own model
   G^h from the common initial model with label-smoothed cross-entropy (alpha = 0.1) and keeps
   it, frozen, as its local model L^h for the whole run (``ctx.memory``); G^h is uploaded. Its
   length comes from the paper's epochs as the authors' code counts them (reference notes):
   ``acquire_epochs`` (30) x 60 iterations of acquisition against ``calibration_epochs`` (10;
   5 for Rotated MNIST) x 20 iterations of calibration per round, i.e. acquisition =
   ``local_steps`` x 30*60 / (10*20) = 9 x ``local_steps`` (18 x for Rotated MNIST), unless
   ``acquire_steps`` is given.
2. Data-free semantic aggregation (§3.4, Eq. 3-4), on the driver, after acquisition and after
   every round: per state-dict tensor ("layer", as in the authors' code), client h's weight is
   dist(G_l^h, G_l^AVG) normalised over clients (``distance``: l2, l1, cosine; Table 4's
   strategies ``equal`` and ``similarity`` = inverse L2). Sample counts play no part.
3. Cross-layer semantic calibration (§3.5, Eq. 5-11), the round's local training: the fused
   model M and the frozen L^h see the same batch; the outputs of the semantic layers R (ResNet:
   layer2-4; a plain CNN: its last two conv blocks, ``layers``) are projected by one conv
   each to ``proj_channels`` x the last layer's spatial size, M's and L^h's by separate
   projections that belong to M (trained and fused with it; ``freeze_local_projection`` keeps
   L^h's at their initial weights, so that the alignment cannot vanish by shrinking both
   projections). Loss Eq. (11):
   ``lambda * sum_{l,m} alpha_{l,m} MMD(M_l', L_m')  +  CE(M(x), y)``, lambda = 0.6.
   alpha (Eq. 7-9) is computed without gradient, as in the authors' code; the MMD is a
   multi-kernel Gaussian (5 bandwidths 3^k x the pooled batch's mean squared distance,
   k = -3..1), quadratic estimator. The alignment and cross-entropy terms are logged each round
   (``csac/alignment``, ``csac/ce``).

The authors' released default leaves the cross-layer set empty (reference notes); here the
paper's cross-layer term is live. Ablations (Table 5): ``alignment`` cross|same|none,
``attention`` both|position|channel|uniform (the alpha that is kept), ``label_smoothing=0``,
``cross_entropy=false``, ``discrepancy`` mmd|mse.

The per-layer aggregation weights of every client (conv and linear kernels; Fig. 7) are
recorded every aggregation in table ``aggregation_weights``, plotted per layer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydg import state as st
from raydg.config import RunConfig
from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, Server, Upload, register
from raydg.models import ModelSpec

DISTANCES = ("l2", "l1", "cosine", "equal", "similarity")
ACQUIRE_ITERATIONS, CALIBRATE_ITERATIONS = 60, 20  # per epoch, in the authors' code
MMD_SCALES = tuple(3.0 ** k for k in range(-3, 2))


# ---------------------------------------------------------------------- aggregation (Eq. 3-4)
def divergence_weights(tensors: list[np.ndarray], distance: str = "l2") -> np.ndarray:
    """Eq. (3)-(4): one layer's weight per client, proportional to its distance to the mean.

    ``equal`` is the semantic average; ``similarity`` weights by inverse L2 distance (a client
    at distance zero shares all the weight with the others there). If every distance is zero
    the weights are equal.
    """
    g = np.stack([t.astype(np.float64).ravel() for t in tensors])
    avg = g.mean(axis=0)  # Eq. (3)
    diff = g - avg
    h = len(tensors)
    if distance == "equal":
        return np.full(h, 1.0 / h)
    if distance == "l1":
        d = np.abs(diff).sum(axis=1)
    elif distance == "cosine":
        norms = np.linalg.norm(g, axis=1) * np.linalg.norm(avg)
        d = np.where(norms > 0, 1.0 - (g @ avg) / np.where(norms > 0, norms, 1.0), 0.0)
        d = np.maximum(d, 0.0)
    else:
        d = np.linalg.norm(diff, axis=1)
    if distance == "similarity":
        d = (d == 0).astype(np.float64) if np.any(d == 0) else 1.0 / d
    total = d.sum()
    return d / total if total > 0 else np.full(h, 1.0 / h)


def semantic_aggregate(states: list[st.State], distance: str) -> tuple[st.State, dict]:
    """Eq. (4) for every tensor of the states (in client order): the fused state and each
    floating tensor's weights. Integer buffers (BN batch counters) are averaged."""
    fused: st.State = {}
    weights: dict[str, np.ndarray] = {}
    for key, first in states[0].items():
        if np.issubdtype(first.dtype, np.floating):
            weights[key] = divergence_weights([s[key] for s in states], distance)
        w = weights.get(key, [1.0] * len(states))
        fused.update(st.weighted_average(states, w, [key]))
    return fused, weights


# ---------------------------------------------------------------------- calibration (Eq. 5-11)
def semantic_layers(model: nn.Module, count: int) -> list[str]:
    """Module names of the last ``count`` semantic layers: a torchvision backbone's stages
    (ResNet's layer1-4, :data:`raydg.models.TORCHVISION`), or the ReLU outputs of a plain
    CNN's conv blocks (a ReLU after a conv or a BN; not after a linear)."""
    features = model.features
    if hasattr(features, "stages"):
        names = [f"features.{s}" for s in features.stages]
    else:
        children = list(features.named_children())
        pairs = zip(children[1:], children[:-1], strict=True)
        names = [f"features.{n}" for (n, m), (_, before) in pairs
                 if isinstance(m, nn.ReLU) and isinstance(before, nn.Conv2d | nn.BatchNorm2d)]
    if not 1 <= count <= len(names):
        raise RaydgError(f"csac: layers must be between 1 and {len(names)} for this model")
    return names[-count:]


def tapped(model: nn.Module, names: list[str], x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """The model's logits and the outputs of the named modules on ``x``."""
    found: dict[str, Tensor] = {}
    hooks = [model.get_submodule(n).register_forward_hook(
        lambda _m, _i, out, n=n: found.__setitem__(n, out)) for n in names]
    try:
        logits = model(x)
    finally:
        for h in hooks:
            h.remove()
    return logits, [found[n] for n in names]


def projection(channels: int, size: tuple[int, int], out: tuple[int, int],
               out_channels: int) -> nn.Conv2d:
    """Eq. (5): one conv from ``channels x size`` to ``out_channels x out``."""
    if size == out:
        return nn.Conv2d(channels, out_channels, 1)
    if size == (2 * out[0], 2 * out[1]):
        return nn.Conv2d(channels, out_channels, 3, stride=2, padding=1)
    return nn.Conv2d(channels, out_channels, (size[0] - out[0] + 1, size[1] - out[1] + 1))


class Calibration(nn.Module):
    """The projections of M's (``fused``) and of L^h's (``local``) semantic features."""

    def __init__(self, layers: list[str], shapes: list[torch.Size], out_channels: int) -> None:
        super().__init__()
        self.layers = layers
        out = tuple(shapes[-1][-2:])

        def make() -> nn.ModuleList:
            return nn.ModuleList(projection(s[0], tuple(s[-2:]), out, out_channels)
                                 for s in shapes)

        self.fused, self.local = make(), make()


def attention_weights(a: list[Tensor], b: list[Tensor], use: str = "both") -> Tensor:
    """Eq. (7)-(9): alpha[l, m] from M's projected features ``a`` and L^h's ``b``, each
    ``(n, c, g, w)``; rows sum to 1 (softmax over m). ``use`` keeps position, channel, both
    (their mean, Eq. 9) or neither (uniform)."""
    A = torch.stack([t.flatten(2) for t in a])  # (L, n, c, d)
    B = torch.stack([t.flatten(2) for t in b])
    _, n, c, d = A.shape
    if use == "uniform":
        return torch.full((len(a), len(b)), 1.0 / len(b), device=A.device)
    position = (torch.einsum("lncd,mnce->lm", A, B) / (n * d * d)).softmax(1)  # Eq. (7)
    channel = (torch.einsum("lncd,mned->lm", A, B) / (n * c * c)).softmax(1)  # Eq. (8)
    if use == "position":
        return position
    return channel if use == "channel" else 0.5 * (position + channel)  # Eq. (9)


def mmd(x: Tensor, y: Tensor, scales: tuple[float, ...] = MMD_SCALES) -> Tensor:
    """Multi-kernel Gaussian MMD^2 (quadratic estimator) between two equal-sized batches.

    Kernels exp(-||u - v||^2 / (s * mean pairwise squared distance of the pooled batch)), one per
    scale s; the bandwidth is taken without gradient.
    """
    z = torch.cat([x.flatten(1), y.flatten(1)])
    sq = (z * z).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * z @ z.T).clamp_min(0.0)
    m = len(z)
    base = (d2.detach().sum() / (m * m - m)).clamp_min(1e-12)
    k = sum(torch.exp(-d2 / (base * s)) for s in scales)
    n = len(x)
    return k[:n, :n].mean() + k[n:, n:].mean() - 2.0 * k[:n, n:].mean()


def mse(x: Tensor, y: Tensor) -> Tensor:
    return F.mse_loss(x, y)


DISCREPANCIES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {"mmd": mmd, "mse": mse}


def alignment_loss(a: list[Tensor], b: list[Tensor], alignment: str, attention: str,
                   discrepancy: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """Eq. (6): sum_{l,m} alpha_{l,m} D(M_l', L_m'); ``same`` aligns only l = m, weight 1."""
    if alignment == "same":
        return sum(discrepancy(x, y) for x, y in zip(a, b, strict=True))
    with torch.no_grad():
        alpha = attention_weights(a, b, attention)
    return sum(alpha[i, j] * discrepancy(a[i], b[j]) for i in range(len(a))
               for j in range(len(b)))


@dataclass
class CSACOptions:
    lambda_cal: float = 0.6  # lambda of Eq. (11)
    label_smoothing: float = 0.1  # alpha of Eq. (2); 0 = Table 5's "without label smoothing"
    acquire_steps: int | None = None  # acquisition steps; None: from the epochs below
    acquire_epochs: int = 30  # §4.1; 60 iterations each in the authors' code
    calibration_epochs: int = 10  # §4.1 (5 for Rotated MNIST); 20 iterations each there
    freeze_local_projection: bool = False  # keep L^h's projections at their initial weights
    distance: str = "l2"  # Eq. (4): l2 | l1 | cosine | equal | similarity (Table 4)
    layers: int = 0  # |R|, the last semantic layers aligned; 0: 3 (ResNet) or 2 (CNN), §4.1
    proj_channels: int = 32  # channels after projection, Eq. (5)
    alignment: str = "cross"  # cross | same | none (Table 5)
    attention: str = "both"  # both | position | channel | uniform (Table 5)
    discrepancy: str = "mmd"  # mmd | mse (Table 5)
    cross_entropy: bool = True  # L_AR of Eq. (10); false = Table 5's "without cross-entropy"


CHOICES = {"distance": DISTANCES, "alignment": ("cross", "same", "none"),
           "attention": ("both", "position", "channel", "uniform"),
           "discrepancy": tuple(DISCREPANCIES)}


@register()
class CSAC(Method):
    """Local semantic acquisition, then semantic aggregation and calibration alternately."""

    name = "csac"
    Options = CSACOptions
    paper = "Yuan et al., IEEE TKDE 2023, Eq. (1)-(11)"
    plots: ClassVar[dict[str, tuple[str, ...]]] = {
        "aggregation_weights": ("line", "round", "weight", "client", "layer")}

    @classmethod
    def check_options(cls, o: CSACOptions) -> None:
        for key, allowed in CHOICES.items():
            if getattr(o, key) not in allowed:
                raise RaydgError(f"csac: {key} must be one of {'|'.join(allowed)}")
        if o.acquire_steps is not None and (not isinstance(o.acquire_steps, int)
                                            or o.acquire_steps < 1):
            raise RaydgError("csac: acquire_steps must be a positive integer")
        if o.acquire_epochs < 1 or o.calibration_epochs < 1:
            raise RaydgError("csac: acquire_epochs and calibration_epochs must be >= 1")
        if o.lambda_cal < 0 or not 0 <= o.label_smoothing < 1 or o.proj_channels < 1:
            raise RaydgError("csac: need lambda_cal >= 0, 0 <= label_smoothing < 1, "
                             "proj_channels >= 1")
        if not (o.cross_entropy or (o.alignment != "none" and o.lambda_cal > 0)):
            raise RaydgError("csac: without cross-entropy and alignment there is no loss")

    @classmethod
    def setup_steps(cls, options: CSACOptions, cfg: RunConfig) -> int:
        """Local semantic acquisition: ``acquire_steps``, else the authors' iterations per
        epoch (60 acquisition, 20 calibration) scaled to ``local_steps``."""
        if options.acquire_steps is not None:
            return options.acquire_steps
        return round(cfg.local_steps * options.acquire_epochs * ACQUIRE_ITERATIONS
                     / (options.calibration_epochs * CALIBRATE_ITERATIONS))

    def build_model(self, spec: ModelSpec) -> nn.Module:
        """The backbone plus its calibration projections (part of M: trained and fused)."""
        model = super().build_model(spec)
        default = 3 if len(getattr(model.features, "stages", ())) >= 4 else 2
        names = semantic_layers(model, self.options.layers or default)
        model.eval()
        with torch.no_grad():
            _, feats = tapped(model, names, torch.zeros(1, spec.in_channels, spec.image_size,
                                                        spec.image_size))
        model.train()
        model.calibration = Calibration(names, [f.shape[1:] for f in feats],
                                        self.options.proj_channels)
        return model

    # ------------------------------------------------------------------ server side
    def setup(self, server: Server) -> None:
        """Local semantic acquisition on every client, then the first fusion (Eq. 4)."""
        steps = self.setup_steps(self.options, server.config)
        server.log(f"csac: local semantic acquisition, {steps} steps on "
                   f"{len(server.client_ids)} clients")
        trained = server.call_clients("acquire", server.global_state, kind="state",
                                      result_kind="state")
        server.global_state = self._fuse(server, [trained[c] for c in sorted(trained)],
                                         sorted(trained))

    def aggregate(self, server: Server, uploads: list[Upload]) -> st.State:
        """Eq. (4) over the calibrated models."""
        return self._fuse(server, [u.state for u in uploads], [u.client_id for u in uploads])

    def _fuse(self, server: Server, states: list[st.State], clients: list[int]) -> st.State:
        fused, weights = semantic_aggregate(states, self.options.distance)
        for key, w in weights.items():
            if states[0][key].ndim >= 2:  # conv and linear kernels: the layers of Fig. 7
                for cid, wc in zip(clients, w, strict=True):
                    server.record("aggregation_weights", {"client": cid, "layer": key,
                                                          "weight": float(wc)})
        return fused

    # ------------------------------------------------------------------ client side
    def client_phase(self, phase: str, ctx: ClientContext, payload: Any) -> Any:
        """``acquire``: train G^h from ``payload`` (Eq. 2), keep it as L^h, upload it."""
        if phase != "acquire":
            return super().client_phase(phase, ctx, payload)
        o = self.options
        st.load(ctx.model, payload)
        optimizer = ctx.make_optimizer(ctx.model.parameters())
        batches = ctx.batches()
        for _ in range(self.setup_steps(o, ctx.config)):
            x, y = next(batches)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(ctx.model(x), y, label_smoothing=o.label_smoothing).backward()
            optimizer.step()
        trained = st.to_numpy(ctx.model)
        ctx.memory["local_model"] = trained
        return trained

    def start_round(self, ctx: ClientContext) -> None:
        """Load the client's frozen L^h next to its copy of the fused model M."""
        ctx.model.calibration.local.requires_grad_(not self.options.freeze_local_projection)
        super().start_round(ctx)
        local = copy.deepcopy(ctx.model).requires_grad_(False)
        st.load(local, ctx.memory["local_model"])
        ctx.scratch["local_model"] = local.eval()

    def loss(self, ctx: ClientContext, x: Tensor, y: Tensor) -> Tensor:
        """Eq. (11): lambda * L_AL (Eq. 6) + L_AR (Eq. 10)."""
        o, model = self.options, ctx.model
        calib = model.calibration
        logits, fused = tapped(model, calib.layers, x)
        loss = F.cross_entropy(logits, y) if o.cross_entropy else torch.zeros((), device=x.device)
        ctx.log("csac/ce", loss.detach(), term=True)
        if o.alignment == "none" or o.lambda_cal == 0:
            return loss
        with torch.no_grad():
            _, local = tapped(ctx.scratch["local_model"], calib.layers, x)
        a = [p(f) for p, f in zip(calib.fused, fused, strict=True)]  # Eq. (5)
        b = [p(f) for p, f in zip(calib.local, local, strict=True)]
        aligned = alignment_loss(a, b, o.alignment, o.attention, DISCREPANCIES[o.discrepancy])
        ctx.log("csac/alignment", aligned.detach(), term=True)
        return loss + o.lambda_cal * aligned
