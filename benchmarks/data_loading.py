"""Image throughput: raydg's decode-once image path against torchvision ImageFolder + DataLoader.

A synthetic PACS-layout folder (``PACS/<domain>/<class>/*.jpg``, 4 domains x 7 classes) is
written first: ``--images`` JPEGs of ``--source-size`` pixels, quality 90, with seeded random
content (a random colour grid upsampled, plus noise, so file sizes and decoding cost resemble
photos). Then, in one process, at ``--image-size`` and ``--batch-size``:

* ``raydg first load``: ``load_dataset("pacs", root, size, cache=<fresh folder>)``, i.e. decode,
  resize and write the ``.npy`` cache.
* ``raydg cached load``: the same call again (fingerprint the files, memory-map the arrays).
* ``raydg epoch``: one pass over all images in shuffled batches through ``to_inputs`` (uint8 ->
  normalised float tensor), what a client does every step; the domains are first gathered into
  one in-memory array, as client shards are (not timed). With ``--transform`` also a row with
  the training augmentation (``augment_batch``) before ``to_inputs``.
* ``DataLoader wN``: ``ConcatDataset`` of one ``ImageFolder`` per domain with
  ``Resize((S, S)), ToTensor(), Normalize(ImageNet)``, decoding every epoch, shuffled, the same
  batch size, ``num_workers`` N for each N of ``--workers`` (persistent workers).

Epoch rows report the median over ``--epochs`` passes. The main process uses ``--threads`` torch
threads (default 1: a raydg client actor's default CPU). The machine may be shared: compare the
ratios printed below the table, which come from the same run, rather than absolute numbers.

Run:  python benchmarks/data_loading.py [--images 2000] [--epochs 3] [--image-size 224]
      [--workers 0 2] [--transform domainbed] [--root DIR] [--keep] [--json data_loading.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from raydg.datasets import IMAGENET_MEAN, IMAGENET_STD, load_dataset, to_inputs
from raydg.transforms import TRANSFORMS, Augment, augment_batch, make_transform

DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")


@dataclass
class Row:
    name: str
    seconds: float  # total for a load, median per epoch for an epoch row
    images: int

    @property
    def rate(self) -> float:
        return self.images / self.seconds


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_images(root: Path, n: int, size: int, seed: int) -> None:
    """``n`` JPEGs spread round-robin over ``root/PACS/<domain>/<class>/``."""
    rng = np.random.default_rng(seed)
    for d in DOMAINS:
        for c in CLASSES:
            (root / "PACS" / d / c).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        grid = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        base = np.asarray(Image.fromarray(grid).resize((size, size), Image.BICUBIC))
        noisy = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        d, c = DOMAINS[i % len(DOMAINS)], CLASSES[(i // len(DOMAINS)) % len(CLASSES)]
        Image.fromarray(noisy).save(root / "PACS" / d / c / f"{i:06d}.jpg", quality=90)


def timed_epochs(name: str, epochs: int, images: int,
                 batches: Callable[[int], Iterable[Any]]) -> tuple[Row, list[float]]:
    """Run ``batches(epoch)`` to exhaustion ``epochs`` times; the median epoch as a Row."""
    times = []
    for e in range(epochs):
        t0 = time.perf_counter()
        for _ in batches(e):
            pass
        times.append(time.perf_counter() - t0)
        progress(f"  {name}: epoch {e + 1}/{epochs} {times[-1]:.2f} s")
    return Row(name, statistics.median(times), images), times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--source-size", type=int, default=256, help="side of the JPEGs written")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--transform", choices=TRANSFORMS, default="none",
                   help="also time raydg's epoch with this training augmentation")
    p.add_argument("--threads", type=int, default=1, help="torch threads of this process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--root", metavar="DIR",
                   help="data root to use and keep (images are written if PACS/ is missing)")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    args = p.parse_args(argv)
    if args.images < len(DOMAINS) * len(CLASSES) or args.epochs < 1:
        p.error(f"need --images >= {len(DOMAINS) * len(CLASSES)} and --epochs >= 1")

    from torch.utils.data import ConcatDataset, DataLoader
    from torchvision import datasets, transforms

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="raydg-bench-"))
    root = Path(args.root).expanduser() if args.root else work / "data"
    size, bs = args.image_size, args.batch_size
    try:
        if (root / "PACS").is_dir():
            progress(f"reusing the images under {root / 'PACS'}")
        else:
            progress(f"writing {args.images} JPEGs of {args.source_size}px under {root / 'PACS'}")
            make_images(root, args.images, args.source_size, args.seed)

        rows: list[Row] = []
        progress("raydg first load (decode, resize, write the cache)")
        t0 = time.perf_counter()
        data = load_dataset("pacs", str(root), size, log=progress, cache=work / "cache")
        rows.append(Row("raydg first load", time.perf_counter() - t0, 0))
        t0 = time.perf_counter()
        data = load_dataset("pacs", str(root), size, log=progress, cache=work / "cache")
        rows.append(Row("raydg cached load", time.perf_counter() - t0, 0))
        n = sum(len(d) for d in data.domains)
        for r in rows:
            r.images = n
        x = np.concatenate([d.x for d in data.domains])
        y = np.concatenate([d.y for d in data.domains])

        def raydg_batches(epoch: int, transform: Augment | None = None) -> Iterable[Any]:
            g = torch.Generator().manual_seed(args.seed + epoch)
            perm = torch.randperm(n, generator=g).numpy()
            for i in range(0, n, bs):
                idx = perm[i:i + bs]
                xb = torch.from_numpy(x[idx])
                if transform is not None:
                    xb = augment_batch(xb, transform)
                yield to_inputs(xb, data.mean, data.std), torch.from_numpy(y[idx])

        epochs: dict[str, list[float]] = {}
        progress("raydg epochs")
        row, epochs["raydg epoch"] = timed_epochs("raydg epoch", args.epochs, n, raydg_batches)
        rows.append(row)
        ours = [row]
        if args.transform != "none":
            name = f"raydg epoch +{args.transform}"
            augment = make_transform(args.transform, size)
            row, epochs[name] = timed_epochs(name, args.epochs, n,
                                             lambda e: raydg_batches(e, augment))
            rows.append(row)
            ours.append(row)

        pipeline = transforms.Compose([transforms.Resize((size, size)), transforms.ToTensor(),
                                       transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        folders = ConcatDataset([datasets.ImageFolder(str(root / "PACS" / d), transform=pipeline)
                                 for d in DOMAINS])
        assert len(folders) == n, (len(folders), n)
        theirs = []
        for w in args.workers:
            name = f"DataLoader w{w}"
            progress(name)
            loader = DataLoader(folders, batch_size=bs, shuffle=True, num_workers=w,
                                persistent_workers=w > 0,
                                generator=torch.Generator().manual_seed(args.seed))
            row, epochs[name] = timed_epochs(name, args.epochs, n, lambda e, ld=loader: ld)
            rows.append(row)
            theirs.append(row)
            del loader

        print(f"\n{n} images ({args.source_size}px JPEG q90) -> {size}px, batch {bs}, "
              f"{args.epochs} epoch(s), {args.threads} torch thread(s)")
        print(f"{'':26} {'seconds':>9} {'images/s':>10}")
        for r in rows:
            print(f"{r.name:26} {r.seconds:9.3f} {r.rate:10.1f}")
        print("ratios (images/s over images/s, same run):")
        ratios: dict[str, float] = {}
        for a in ours:
            for b in theirs:
                ratios[f"{a.name} / {b.name}"] = a.rate / b.rate
        ratios["raydg cached load / raydg first load"] = rows[1].rate / rows[0].rate
        for k, v in ratios.items():
            print(f"  {k:44} {v:9.1f} x")

        if args.json:
            out = {"args": vars(args), "images": n,
                   "rows": [{**asdict(r), "images_per_s": r.rate} for r in rows],
                   "epoch_seconds": epochs, "ratios": ratios}
            Path(args.json).write_text(json.dumps(out, indent=2))
    finally:
        if args.keep:
            progress(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
