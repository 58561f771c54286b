"""DomainBed's augmentation of a batch: raydg's batched transform against one call per image.

For each ``--sizes`` S, a batch of 64 uint8 ``(3, S, S)`` images is augmented by
* ``per image``: torchvision v2's ``RandomResizedCrop(S, (0.7, 1)) -> RandomHorizontalFlip ->
  ColorJitter(0.3, 0.3, 0.3, 0.3) -> RandomGrayscale(0.1)`` called on each image and stacked
  (what raydg did before the batched transform, and what a per-sample pipeline does);
* ``batched``: ``raydg.transforms.make_transform("domainbed", S)`` on the whole batch;
and, beside them, one SGD step of ResNet-18 on the batch (10 classes): the work the
augmentation sits in front of. Median of 10 after 3 warm-ups, synchronised on a GPU, one torch
thread. The two augmentations draw different random parameters, so their outputs differ; each
operation of the batched one is checked against torchvision's in tests/test_transforms.py.

Run:  python benchmarks/augment.py [--device cuda] [--sizes 32 224]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torchvision
from torchvision.transforms import v2

from raydg.transforms import augment_batch, make_transform

BATCH = 64


def timed(f: Callable[[], object], device: torch.device) -> float:
    """Median milliseconds of ``f`` over 10 calls after 3 warm-ups."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        f()
    out = []
    for _ in range(10):
        sync()
        start = time.perf_counter()
        f()
        sync()
        out.append(time.perf_counter() - start)
    return 1e3 * statistics.median(out)


def row(size: int, device: torch.device) -> tuple[float, float, float]:
    """Milliseconds per batch: per-image augmentation, batched, one ResNet-18 step."""
    per_image = v2.Compose([v2.RandomResizedCrop(size, scale=(0.7, 1.0), antialias=True),
                            v2.RandomHorizontalFlip(), v2.ColorJitter(0.3, 0.3, 0.3, 0.3),
                            v2.RandomGrayscale(0.1)])
    batched = make_transform("domainbed", size)
    x = torch.randint(0, 256, (BATCH, 3, size, size), dtype=torch.uint8, device=device)
    model = torchvision.models.resnet18(num_classes=10).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    inputs = torch.randn(BATCH, 3, size, size, device=device)
    labels = torch.randint(0, 10, (BATCH,), device=device)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), labels).backward()
        opt.step()

    return (timed(lambda: torch.stack([per_image(img) for img in x]), device),
            timed(lambda: augment_batch(x, batched), device), timed(step, device))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--sizes", type=int, nargs="+", default=[32, 224])
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    device = torch.device(args.device)
    print(f"batch of {BATCH} on {device}, ms per batch (median of 10)")
    print(f"{'size':>5} {'per image':>10} {'batched':>8} {'per image / batched':>20} "
          f"{'ResNet-18 step':>15} {'batched / step':>15}")
    for size in args.sizes:
        old, new, step = row(size, device)
        print(f"{size:5d} {old:10.1f} {new:8.1f} {old / new:20.2f} {step:15.1f} "
              f"{new / step:15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
