"""Write a small image dataset in DomainBed's layout, ROOT/digits_png/<domain>/<class>/N.png,
from raydg's embedded digits-style (four styles of 16 x 16 digits), as a stand-in for your own
folder of images:

    python examples/folder_dataset/make_dataset.py ROOT [--per-class N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from raydg.datasets import load_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--per-class", type=int, default=20, help="images per class and domain")
    args = parser.parse_args()
    data = load_dataset("digits-style", None, None, log=lambda _: None)
    for domain in data.domains:
        for label, name in enumerate(data.classes):
            folder = args.root / "digits_png" / domain.name / name
            folder.mkdir(parents=True, exist_ok=True)
            for i, image in enumerate(domain.x[domain.y == label][:args.per_class]):
                gray = np.asarray(image, dtype=np.uint8)[0]
                Image.fromarray(gray).convert("RGB").save(folder / f"{i}.png")
    print(f"wrote {args.root / 'digits_png'}")


if __name__ == "__main__":
    main()
