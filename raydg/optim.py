"""The clients' SGD: ``torch.optim.SGD``'s update without ``torch.optim``'s first-step import.

Every ``torch.optim.Optimizer`` wraps ``step`` and ``zero_grad`` in ``torch._disable_dynamo``,
which imports ``torch._dynamo`` (with sympy and triton) on its first call: about 80 MB of each
client actor's memory and a second of its start (benchmarks/memory.py). raydg's methods need
only SGD's update, which :class:`SGD` computes as ``torch.optim.SGD`` does on the CPU (its
single-tensor path: the same operations in the same order, bit-identical weights; a test
checks it), so a client process never imports the compiler. Adam stays ``torch.optim.Adam``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


class SGD:
    """SGD with momentum and weight decay (no dampening, no Nesterov), as
    ``torch.optim.SGD(params, lr, momentum, weight_decay)`` steps it:
    d = g + wd * p;  b = d at the first step, else momentum * b + d;  p -= lr * (b if momentum
    else d). ``param_groups`` holds one group, whose ``lr`` may be changed between steps."""

    def __init__(self, params: Iterable[Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        self.param_groups = [{"params": list(params), "lr": lr, "momentum": momentum,
                              "weight_decay": weight_decay}]
        self.buffers: dict[Tensor, Tensor] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            d = p.grad.add(p, alpha=decay) if decay != 0 else p.grad
            if momentum != 0:
                buf = self.buffers.get(p)
                if buf is None:
                    buf = self.buffers[p] = torch.clone(d).detach()
                else:
                    buf.mul_(momentum).add_(d, alpha=1)  # torch's alpha = 1 - dampening
                d = buf
            p.add_(d, alpha=-lr)
