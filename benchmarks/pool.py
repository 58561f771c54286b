"""Max-pooling on the CPU: :class:`raydg.models.MaxPool2d` (channels-last forward, PyTorch's
NCHW backward) against ``nn.MaxPool2d``, alone and in a whole training step.

For each pool shape of the digits' ``cnn`` (16 and 32 px) and ``mnist-cnn`` (28 px), batch 32:
the forward + backward time of each pool. For each model: the time of an SGD step (forward,
cross-entropy, backward, raydg's SGD with momentum) with its pools as built and with every pool
put back to ``nn.MaxPool2d``, alternated in one process, one thread; the weights after the
steps must be equal bit for bit (else ``MISMATCH``, exit 1).

Run:  python benchmarks/pool.py [--steps 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from raydg.models import MODELS, MaxPool2d, ModelSpec, pools_as
from raydg.optim import SGD

MODELS_RUN = (("cnn", 3, 16), ("cnn", 3, 32), ("mnist-cnn", 1, 28))
BATCH = 32


def seconds(step: Callable[[], object], n: int) -> float:
    """Mean seconds of ``step`` over ``n`` calls, after 10 to warm up."""
    for _ in range(10):
        step()
    start = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - start) / n


def trainer(name: str, channels: int, size: int, plain: bool
            ) -> tuple[Callable[[], object], nn.Module]:
    """One SGD step of ``name`` on a fixed random batch, and the model it trains."""
    torch.manual_seed(0)
    model = MODELS.get(name)(ModelSpec(name, channels, 10, size))
    if plain:
        pools_as(model, nn.MaxPool2d)
    opt = SGD(model.parameters(), 0.05, 0.5)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, channels, size, size, generator=gen)
    y = torch.randint(0, 10, (BATCH,), generator=gen)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step, model


def pool_step(pool: nn.Module, shape: tuple[int, ...]) -> Callable[[], object]:
    """``pool``'s forward and backward on a ReLU'd random batch of ``shape``."""
    x = torch.relu(torch.randn(shape)).requires_grad_()
    grad = torch.randn_like(F.max_pool2d(x.detach(), 2))
    return lambda: pool(x).backward(grad)


def pool_shapes(name: str, channels: int, size: int) -> list[tuple[int, ...]]:
    """The input shape of each max-pool of ``name`` at ``size`` px."""
    shapes: list[tuple[int, ...]] = []
    model = MODELS.get(name)(ModelSpec(name, channels, 10, size))
    for module in model.modules():
        if isinstance(module, nn.MaxPool2d):
            module.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    with torch.no_grad():
        model(torch.zeros(BATCH, channels, size, size))
    return shapes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("pool forward + backward, batch 32 (microseconds): nn.MaxPool2d, raydg, ratio")
    for shape in dict.fromkeys(s for run in MODELS_RUN for s in pool_shapes(*run)):
        old, new = (seconds(pool_step(pool, shape), 300) for pool in (nn.MaxPool2d(2),
                                                                         MaxPool2d(2)))
        print(f"  {shape}: {old * 1e6:.0f}, {new * 1e6:.0f}, {new / old:.2f}")
    print(f"training step, {args.steps} steps x {args.repeats} (ms): nn.MaxPool2d, raydg, ratio")
    mismatch = False
    for run in MODELS_RUN:
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            weights = {}
            for plain in (True, False):
                step, model = trainer(*run, plain)
                times[plain].append(seconds(step, args.steps))
                weights[plain] = [p.detach() for p in model.parameters()]
            mismatch |= not all(map(torch.equal, weights[True], weights[False]))
        old, new = min(times[True]), min(times[False])
        print(f"  {run[0]} at {run[2]} px: {old * 1e3:.2f}, {new * 1e3:.2f}, {new / old:.2f}")
    if mismatch:
        print("MISMATCH: the weights differ")
    return int(mismatch)


if __name__ == "__main__":
    sys.exit(main())
