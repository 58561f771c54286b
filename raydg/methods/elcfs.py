"""FedDG/ELCFS (Liu et al., CVPR 2021) without its boundary-oriented loss: CSAC's FedDG* row.

CSAC (§4.1) ran FedDG "according to the public code", with "the boundary component (it is used
for segmentation task) ... discarded". What remains is the amplitude exchange and the episodic
learning in continuous frequency space.

Amplitude exchange (ELCFS Eq. 1-3): before training, the clients share the low-frequency
amplitude spectra of their training images and every client keeps the bank
(:mod:`raydg.methods.ampmix`, whose options ``beta``, ``lambda_low``/``lambda_high`` and
``bank_size`` apply here). Episodic learning (§3.3), every local step, on a batch B of the
client's own images and its frequency-interpolated copy T(B) (each image given a random other
client's amplitude on M with lambda ~ U(lambda_low, lambda_high); ``prob`` 1: every image, as
the code's paired ``trs`` images):

    L_inn   = CE(f_theta(B), y)                                      meta-train
    theta'  = theta - beta_meta * clip(grad_theta L_inn, -c, c)      Eq. (4)
    L_out   = CE(f_theta'(T(B)), y)                                  meta-test, Eq. (5) less
                                                                     the boundary loss
    theta  <- optimizer step on L_inn(theta) + L_out(theta')         Eq. (6)

As the authors' code (``train_ELCFS.py``): beta_meta = ``meta_step`` 1e-3 (its
``meta_step_size``), c = ``clip`` 100 (its ``clip_value``), and the inner gradient is taken
without a graph, so L_out reaches theta at first order (its gradient at theta'). Eq. (6) read
literally differentiates through the inner step: ``second_order=true``. The run's
``optimizer`` takes the step: SGD by default, as every other method of a table; the code's
Adam (lr 1e-3) is ``--set optimizer=adam --lr 0.001``. ``train_loss`` reports L_inn
(comparable with the other methods); ``elcfs/inner`` and ``elcfs/outer`` are logged per
round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from raydg.errors import RaydgError
from raydg.methods import ClientContext, register
from raydg.methods.ampmix import AmpMix, AmpMixOptions, Mixer


@dataclass
class ELCFSOptions(AmpMixOptions):
    prob: float = 1.0  # share of T(B)'s images that are transformed (the code: all)
    meta_step: float = 1e-3  # beta of Eq. (4), the code's meta_step_size
    clip: float = 100.0  # the inner gradient is clipped to [-clip, clip] (the code's clip_value)
    second_order: bool = False  # differentiate L_out through the inner step (Eq. 6 literally)


class Episode:
    """A uint8 batch -> (its model inputs, the inputs of its frequency-interpolated copy)."""

    def __init__(self, mixer: Mixer) -> None:
        self.mixer = mixer

    def __call__(self, x: np.ndarray) -> tuple[Tensor, Tensor]:
        return self.mixer.inputs(x), self.mixer(x)


@register("feddg")
class ELCFS(AmpMix):
    """Amplitude exchange plus episodic meta-train (own images) / meta-test (interpolated)."""

    name = "elcfs"
    Options = ELCFSOptions
    paper = "Liu et al., CVPR 2021 (FedDG/ELCFS), Eq. (1)-(6) less the boundary loss; CSAC's FedDG*"
    augmentation = False

    @classmethod
    def check_options(cls, o: Any) -> None:
        super().check_options(o)
        if o.meta_step < 0 or o.clip <= 0:
            raise RaydgError("elcfs: needs meta_step >= 0 and clip > 0")

    def training_inputs(self, mixer: Mixer) -> Episode:
        return Episode(mixer)

    def train_step(self, ctx: ClientContext, x: tuple[Tensor, Tensor], y: Tensor
                   ) -> float | Tensor:
        """One episode, Eq. (4)-(6)."""
        assert ctx.optimizer is not None
        own, interpolated = x
        model, o = ctx.model, self.options
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        inner = F.cross_entropy(model(own), y)
        grads = torch.autograd.grad(inner, list(params.values()), retain_graph=True,
                                    create_graph=o.second_order)
        fast = {n: p - o.meta_step * g.clamp(-o.clip, o.clip)
                for (n, p), g in zip(params.items(), grads, strict=True)}
        outer = F.cross_entropy(torch.func.functional_call(model, fast, (interpolated,)), y)
        ctx.optimizer.zero_grad(set_to_none=True)
        (inner + outer).backward()
        ctx.optimizer.step()
        ctx.log("elcfs/inner", inner.detach(), term=True)
        ctx.log("elcfs/outer", outer.detach(), term=True)
        return inner.detach()
