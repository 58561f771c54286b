"""Parameters and per-iteration cost of methods relative to FedAvg (FedFD-A Table 4).

For each method: its model's parameter count, the seconds of one local training iteration
(the method's own ``train_step``: FedFD's two forward passes, FedFD-A's alternating adapter
step) and of one inference forward pass in its primary mode, all on the same backbone, batch and
input size, timed in one process with the median of ``--iters`` repeats after warm-up.

Table 4 used ResNet-18, batch 64, 224x224 on a GPU; the CPU default here is smaller
(``--image-size 64``) so it finishes in a minute or two. Run:

    python benchmarks/method_cost.py [--model resnet18] [--image-size 224] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from raydg import state
from raydg.config import RunConfig
from raydg.methods import METHODS, ClientContext
from raydg.models import ModelSpec
from raydg.resolve import resolve


def seconds(fn, iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, args: argparse.Namespace) -> dict[str, float]:
    method = METHODS.get(name)()
    spec = ModelSpec(args.model, 3, args.classes, args.image_size)
    torch.manual_seed(0)
    model = method.build_model(spec)
    cfg = resolve(RunConfig(dataset="digits-style", method=name, batch_size=args.batch_size))
    ctx = ClientContext(client_id=0, round=1, data=None, model=model, config=cfg,
                        device=torch.device("cpu"), global_state=state.to_numpy(model),
                        memory={}, generator=torch.Generator(), inputs=None, train_inputs=None)
    method.start_round(ctx)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    y = torch.randint(0, args.classes, (args.batch_size,))
    model.train()
    train = seconds(lambda: method.train_step(ctx, x, y), args.iters)
    model.eval()
    with torch.no_grad():
        infer = seconds(lambda: method.predict(model, x, method.eval_modes[0]), args.iters)
    return {"params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "train_s": train, "infer_s": infer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="fedavg,silobn,fedfd,fedfd-a")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--classes", type=int, default=7)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = {m: measure(m, args) for m in args.methods.split(",")}
    ref = rows[args.methods.split(",")[0]]
    print(f"{args.model}, batch {args.batch_size}, {args.image_size}x{args.image_size}, "
          f"{args.threads} thread(s), median of {args.iters}")
    print(f"{'method':10} {'params (M)':>10} {'train ms/it':>12} {'x':>6} {'infer ms/it':>12} "
          f"{'x':>6}")
    for name, r in rows.items():
        print(f"{name:10} {r['params_m']:10.2f} {1e3 * r['train_s']:12.1f} "
              f"{r['train_s'] / ref['train_s']:6.2f} {1e3 * r['infer_s']:12.1f} "
              f"{r['infer_s'] / ref['infer_s']:6.2f}")


if __name__ == "__main__":
    main()
