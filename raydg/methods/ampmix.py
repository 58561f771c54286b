"""Amplitude mixing: FedDG/ELCFS's continuous frequency space interpolation (Liu et al., CVPR
2021, §3.2), the "AM" baseline of FedDG-GA (Zhang et al., CVPR 2023).

Before training (ELCFS's distribution bank): every client takes the Fourier transform of its
training images (Eq. 1), keeps each image's amplitude spectrum inside the low-frequency window M
and uploads it; the server gathers the bank and broadcasts it. During local training every image
of a batch is, with probability ``prob`` and draws of its own, given

    A = [(1 - lambda) A_local + lambda A_other] on M,   A = A_local off M      (Eq. 2)
    x' = F^-1(A, P_local)                                                      (Eq. 3)

A_other is one spectrum of another client, drawn as ELCFS's loader does: a client other than
the local one uniformly, then one of its spectra uniformly; lambda ~ U(lambda_low, lambda_high).
Eq. (2) is applied as the authors' code applies it: the local amplitude off M is kept as is.
``ampmix`` trains FedAvg on the mixed images; ``--augment ampmix`` wraps any method's training
inputs the same way, since every hook here defers to ``super()``.

M is the centred square |u|, |v| <= b, b = floor(beta * min(H, W)) of the code (its ``L``;
FDA's beta; not the meta step size beta of ELCFS Eq. 4). Where paper and code differ:

* ``beta`` 0.1: the default ``L`` of ELCFS's mixing functions. Its training script passes L = 0
  (the DC term only, 384 px fundus images), its demo 0.003; FedDG-GA's AM mixes the whole
  spectrum, i.e. beta = 0.5 here.
* lambda ~ U(0, 1): ELCFS §3.2 and FedDG-GA's code; ELCFS's training script replaces the window
  outright (``lambda_low = lambda_high = 1``).
* ``prob`` 0.5: FedDG-GA mixes a whole batch with probability 0.5 (here each image draws); ELCFS
  trains on both the raw and the transformed image.
* The partner: ELCFS's other clients' banks, as here; FedDG-GA's AM mixes with a shuffled copy
  of the client's own batch, so no spectrum leaves a client there.
* Only the window travels (float32): it is all a receiver ever reads. ELCFS saves every image's
  full float64 spectrum; ``bank_size`` 0 (default) banks every training image, as ELCFS extracts
  them (its loader then keeps a random eighth of each client's), N > 0 a random N per client.
* Images are mixed as raw uint8 pixels, before the run's ``train_transform`` and the
  normalisation, then clipped to [0, 255] (as ELCFS) and rounded; FedDG-GA mixes normalised
  tensors after its augmentation.

Memory: C (2b + 1)^2 x 4 bytes per banked image. Every client keeps the whole bank in
``ctx.memory`` (Ray hands it over zero-copy from its object store); client-state checkpoints
include it. At 16 px (b = 1): 108 B per image on digits-style (131 KB for its three source
clients), 36 B on digits-rot (162 KB for five). PACS at 224 px (b = 22): 24.3 KB per image,
133-182 MB for three source domains' 90 % training splits (whole spectra, beta = 0.5: 602 KB
per image, 3.3-4.5 GB: use ``bank_size``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, Server, register

Bank = dict[int, np.ndarray]  # client id -> (n, C, h, w) float32 amplitude windows
BANK = "ampmix_bank"  # key of the broadcast bank in ``ctx.memory``
SPECTRA_BATCH = 64  # images transformed at once when a client computes its spectra


def window(shape: tuple[int, ...], beta: float) -> tuple[slice, slice]:
    """Rows and columns of M in the centred (``fftshift``-ed) spectrum: frequencies |u|, |v| <=
    floor(beta * min(H, W)), the whole spectrum once that reaches H/2 and W/2."""
    h, w = shape[-2:]
    b = math.floor(min(h, w) * beta)
    return (slice(max(h // 2 - b, 0), h // 2 + b + 1), slice(max(w // 2 - b, 0), w // 2 + b + 1))


def low_freq_amplitude(x: Tensor, beta: float) -> Tensor:
    """Eq. (1): the amplitude |F(x)| of images ``(n, C, H, W)`` on M, centred ``(n, C, h, w)``:
    what a client shares."""
    amplitude = torch.fft.fftshift(torch.fft.fft2(x).abs(), dim=(-2, -1))
    rows, cols = window(x.shape, beta)
    return amplitude[..., rows, cols]


def mix_amplitude(x: Tensor, other: Tensor, lam: Tensor, beta: float) -> Tensor:
    """Eq. (2)-(3): images ``x`` with the amplitude on M interpolated towards ``other`` (from
    :func:`low_freq_amplitude`) by ``lam`` (one per image), their own phase kept; unclipped."""
    f = torch.fft.fft2(x)
    amplitude = torch.fft.fftshift(f.abs(), dim=(-2, -1))
    rows, cols = window(x.shape, beta)
    lam = lam.view(-1, 1, 1, 1)
    amplitude[..., rows, cols] = (1 - lam) * amplitude[..., rows, cols] + lam * other
    amplitude = torch.fft.ifftshift(amplitude, dim=(-2, -1))
    return torch.fft.ifft2(torch.polar(amplitude, f.angle())).real


def draw_sources(rng: np.random.Generator, sizes: dict[int, int], own: int,
                 n: int) -> tuple[np.ndarray, np.ndarray]:
    """For ``n`` images: a client other than ``own`` uniformly, then one of its ``sizes[c]``
    spectra uniformly (ELCFS's loader). Returns (clients, indices)."""
    others = np.array([c for c in sorted(sizes) if c != own and sizes[c] > 0])
    clients = rng.choice(others, size=n)
    return clients, rng.integers(0, np.array([sizes[c] for c in clients], dtype=np.int64))


@dataclass
class AmpMixOptions:
    beta: float = 0.1  # M: half-width floor(beta * min(H, W)); 0.5: all (square images)
    lambda_low: float = 0.0  # lambda ~ U(lambda_low, lambda_high) in Eq. (2)
    lambda_high: float = 1.0
    prob: float = 0.5  # probability that a training image is mixed
    bank_size: int = 0  # spectra each client banks: 0 = every training image, N = a random N


class Mixer:
    """A client's training inputs for one round: mix the uint8 batch, then ``inputs`` it."""

    def __init__(self, inputs: Callable[[np.ndarray], Tensor], bank: Bank, own: int,
                 options: AmpMixOptions, rng: np.random.Generator, device: torch.device) -> None:
        self.inputs, self.bank, self.own, self.o = inputs, bank, own, options
        self.sizes = {c: len(v) for c, v in bank.items()}
        self.rng, self.device = rng, device

    def __call__(self, x: np.ndarray) -> Tensor:
        return self.inputs(self.mix(x))

    def mix(self, x: np.ndarray) -> np.ndarray:
        """The batch with a ``prob`` share of its images mixed (Eq. 2-3), clipped, as uint8."""
        chosen = np.flatnonzero(self.rng.random(len(x)) < self.o.prob)
        if len(chosen) == 0:
            return x
        clients, idx = draw_sources(self.rng, self.sizes, self.own, len(chosen))
        lam = self.rng.uniform(self.o.lambda_low, self.o.lambda_high, size=len(chosen))
        other = np.stack([self.bank[c][i] for c, i in zip(clients, idx, strict=True)])
        images = torch.from_numpy(np.asarray(x[chosen], dtype=np.float32)).to(self.device)
        mixed = mix_amplitude(images, torch.from_numpy(other).to(self.device),
                              torch.from_numpy(lam).to(self.device, torch.float32), self.o.beta)
        out = np.array(x, dtype=np.uint8)
        out[chosen] = mixed.clamp(0, 255).round().to(torch.uint8).cpu().numpy()
        return out


@register("am")
class AmpMix(Method):
    """FedAvg on images mixed with other clients' low-frequency amplitudes (ELCFS Eq. 1-3)."""

    name = "ampmix"
    Options = AmpMixOptions
    paper = "Liu et al., CVPR 2021 (FedDG/ELCFS), Eq. (1)-(3); FedDG-GA's AM baseline"
    augmentation = True

    @classmethod
    def check_options(cls, o: Any) -> None:
        super().check_options(o)
        if not 0 <= o.beta <= 0.5 or not 0 <= o.prob <= 1 or o.bank_size < 0:
            raise RaydgError("ampmix: needs 0 <= beta <= 0.5, 0 <= prob <= 1, bank_size >= 0")
        if not 0 <= o.lambda_low <= o.lambda_high <= 1:
            raise RaydgError("ampmix: needs 0 <= lambda_low <= lambda_high <= 1")

    def setup(self, server: Server) -> None:
        """Collect every client's amplitude windows and broadcast the bank."""
        super().setup(server)
        if len(server.client_ids) < 2:
            raise RaydgError("ampmix mixes with other clients' spectra: it needs at least two "
                             f"clients, this federation has {len(server.client_ids)}")
        spectra = server.call_clients("ampmix_spectra", kind="request",
                                      result_kind="amplitude_spectra")
        bank = {c: spectra[c] for c in sorted(spectra)}
        server.call_clients("ampmix_bank", bank, kind="amplitude_bank")

    def client_phase(self, phase: str, ctx: ClientContext, payload: Any) -> Any:
        """``ampmix_spectra`` (the client's upload) and ``ampmix_bank`` (keep the bank)."""
        if phase == "ampmix_spectra":
            return self._spectra(ctx)
        if phase == "ampmix_bank":
            ctx.memory[BANK] = payload
            return None
        return super().client_phase(phase, ctx, payload)

    def _spectra(self, ctx: ClientContext) -> np.ndarray:
        """Eq. (1) on M for every training image, or a random ``bank_size`` of them."""
        x, n = ctx.data.train_x, self.options.bank_size
        if 0 < n < len(x):
            x = x[np.sort(_rng(ctx).choice(len(x), size=n, replace=False))]
        parts = [low_freq_amplitude(torch.tensor(x[i:i + SPECTRA_BATCH], dtype=torch.float64,
                                                 device=ctx.device), self.options.beta
                                    ).float().cpu().numpy()
            for i in range(0, len(x), SPECTRA_BATCH)]
        return np.concatenate(parts)

    def start_round(self, ctx: ClientContext) -> None:
        """Mix every batch the round draws, before the base method's own start."""
        if BANK not in ctx.memory:
            raise RaydgError(f"ampmix: client {ctx.client_id} has no amplitude bank "
                             "(the setup phase did not run)")
        ctx.train_inputs = self.training_inputs(Mixer(
            ctx.train_inputs, ctx.memory[BANK], ctx.client_id, self.options, _rng(ctx),
            ctx.device))
        super().start_round(ctx)

    def training_inputs(self, mixer: Mixer) -> Callable[[np.ndarray], Any]:
        """What a round's batches carry: the mixed images (ELCFS: both views)."""
        return mixer


def _rng(ctx: ClientContext) -> np.random.Generator:
    """A numpy stream seeded from the client's generator of the round (or phase)."""
    return np.random.default_rng(int(torch.randint(2**31, (1,), generator=ctx.generator)))
