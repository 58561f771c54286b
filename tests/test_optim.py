"""raydg.optim.SGD against torch.optim.SGD: the same weights, bit for bit, and no compiler."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from raydg.models import ModelSpec, build_model
from raydg.optim import SGD


def _train(make, steps: int = 12) -> dict[str, torch.Tensor]:
    """A BN CNN with its first conv frozen (no grad: skipped), its lr halved after 6 steps."""
    torch.manual_seed(0)
    net = build_model(ModelSpec("cnn", 3, 10, 16))
    frozen = next(net.parameters())
    frozen.requires_grad_(False)
    opt = make([p for p in net.parameters()])
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        if step == steps // 2:
            opt.param_groups[0]["lr"] /= 2
        x, y = torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
        opt.zero_grad(set_to_none=step % 2 == 0)
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return net.state_dict()


@pytest.mark.parametrize("momentum,decay", [(0.5, 0.0), (0.9, 5e-4), (0.0, 1e-3), (0.0, 0.0)])
def test_sgd_steps_as_torch_sgd_bit_for_bit(momentum, decay):
    ours = _train(lambda p: SGD(p, lr=0.05, momentum=momentum, weight_decay=decay))
    theirs = _train(lambda p: torch.optim.SGD(p, lr=0.05, momentum=momentum,
                                              weight_decay=decay))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    start = _train(lambda p: SGD(p, lr=0.05), steps=0)
    moved = [k for k in start if not torch.equal(ours[k], start[k])]
    assert "features.0.weight" not in moved and "classifier.weight" in moved, moved


def test_training_with_it_imports_no_compiler():
    code = ("import sys, torch; from raydg.optim import SGD; w = torch.ones(3, requires_grad=True);"
            " o = SGD([w], lr=0.1, momentum=0.5); (w * w).sum().backward(); o.step(); "
            "o.zero_grad(); print('torch._dynamo' in sys.modules, w.tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(maxsplit=1) == ["False", "[0.800000011920929, 0.800000011920929, "
                                            "0.800000011920929]\n"]
