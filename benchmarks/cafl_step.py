"""Why FedFD's CAFL (FedFD-A Eq. 3) explodes from scratch, measured on one client.

Round 1 of one client of a federation, from the seeded initial model, in this process (no Ray):

1. ``steps``: its first local steps of FedFD-A as the engine runs them (``--set`` options),
   printing per step the loss terms and, per BN layer in the diversified pass (Eq. 2), the
   smallest instance sigma (sqrt(var + eps); sqrt(eps) = 0.0032), the largest |input| and the
   largest |output|;
2. ``bound``: at its first step, for CAFL summed and averaged over the feature dimensions and
   with its gradient through both passes or the original one only (``cafl_gradient``), the
   smallest learning rate at which one SGD step on lambda2 * CAFL *raises* CAFL: past it, the
   step overshoots and plain SGD on that term diverges.

Run:  python benchmarks/cafl_step.py [--dataset digits-gen] [--target flat] [--client 1]
          [--steps 6] [--set options.cafl_reduction=sum ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import numpy as np
import torch

from raydg import seeding
from raydg import state as st
from raydg.config import RunConfig, apply, parse_sets
from raydg.datasets import load_dataset
from raydg.engine.client import ClientHost, RuntimeSpec
from raydg.methods import method_class
from raydg.methods.fedfd import mix_layers
from raydg.models import ModelSpec
from raydg.partition import Partition, make_clients
from raydg.resolve import resolve

RATES = np.geomspace(1e-3, 10, 41)  # the learning rates tried, 4 per factor of 10


def client_context(cfg: RunConfig, cid: int) -> tuple[Any, Any]:
    """The method and the round-1 context of client ``cid``, from the seeded initial model."""
    data = load_dataset(cfg.dataset, None, cfg.image_size, log=lambda _: None)
    cls = method_class(cfg.method)
    method = cls(cls.parse_options(cfg.options))
    clients = make_clients(data, Partition.of(cfg))
    spec = ModelSpec(cfg.model, data.channels, len(data.classes), cfg.image_size)
    torch.manual_seed(seeding.derive_seed(cfg.seed, seeding.MODEL_INIT))
    initial = st.to_numpy(method.build_model(spec))
    host = ClientHost(RuntimeSpec(method, cfg, spec, data.mean, data.std), clients)
    ctx = host._context(cid, 1, initial)
    method.start_round(ctx)
    return method, ctx


def steps(method: Any, ctx: Any, count: int) -> None:
    """Train ``count`` local steps, printing the loss terms and the diversified pass's layers."""
    seen: dict[str, tuple[float, float, float]] = {}

    def hook(name: str):
        def record(module, inputs, output) -> None:
            if module.mode == "mix":
                x = inputs[0].detach()
                sigma = (x.var(dim=(2, 3), unbiased=False) + module.eps).sqrt()
                seen[name] = (float(sigma.min()), float(x.abs().max()),
                              float(output.detach().abs().max()))
        return record

    for name, layer in mix_layers(ctx.model):
        layer.register_forward_hook(hook(name))
    batches = ctx.batches()
    for step in range(1, count + 1):
        seen.clear()
        loss = float(method.train_step(ctx, *next(batches)))
        terms = {k: float(v[-1]) for k, v in ctx.metrics.items() if k in ctx.terms}
        layers = "; ".join(f"{n}: sigma_i {a:.2g}, |in| {b:.2g}, |out| {c:.2g}"
                           for n, (a, b, c) in seen.items())
        print(f"step {step}: loss {loss:.3g} " + " ".join(f"{k} {v:.3g}"
                                                          for k, v in terms.items()))
        print(f"   {layers}")


def cafl(method: Any, model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)  # the same u of Eq. (2) at every evaluation
    return method.client_agnostic_losses(model, x, y)["cafl"]


def bound(method: Any, ctx: Any) -> None:
    """Per CAFL variant, the smallest learning rate at which one SGD step raises CAFL."""
    x, y = next(ctx.batches())
    params = list(ctx.model.features.parameters())  # what CAFL trains
    start = [p.detach().clone() for p in params]
    for reduction in ("sum", "mean"):
        for gradient in ("both", "original"):
            method.options = dataclasses.replace(method.options, cafl_reduction=reduction,
                                                 cafl_gradient=gradient)
            before = cafl(method, ctx.model, x, y)
            grads = torch.autograd.grad(method.options.lambda2 * before, params,
                                        allow_unused=True)
            found = None
            for lr in RATES:
                with torch.no_grad():
                    for p, p0, g in zip(params, start, grads, strict=True):
                        p.copy_(p0 if g is None else p0 - lr * g)
                    if float(cafl(method, ctx.model, x, y)) > float(before):
                        found = lr
                        break
            with torch.no_grad():
                for p, p0 in zip(params, start, strict=True):
                    p.copy_(p0)
            print(f"CAFL {reduction:4s} gradient {gradient:8s}: one step raises it from lr "
                  + (f"{found:.3g}" if found else f"> {RATES[-1]:g}"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="digits-gen")
    p.add_argument("--target", default="flat")
    p.add_argument("--client", type=int, default=1)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--method", default="fedfd-a")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    cfg = resolve(apply(RunConfig(dataset=args.dataset, method=args.method, target=args.target,
                                  seeds=[0]), parse_sets(args.set)))
    cfg = dataclasses.replace(cfg, seeds=[cfg.seeds[0]])
    print(f"{cfg.dataset}, target {cfg.target}, client {args.client}: {cfg.method}, lr {cfg.lr}, "
          f"options {cfg.options}")
    bound(*client_context(cfg, args.client))
    steps(*client_context(cfg, args.client), args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
