"""The initial backbone weights of a run, and ``glyphs``, a pretraining that runs offline.

The papers start every federation from ImageNet weights, so BN statistics and features mean
something from round 1. ImageNet cannot be reached here, and the embedded digits federations start
from scratch: a different regime. ``--weights glyphs`` gives them a pretrained start on data
disjoint from every digits domain: letters (not digits) rendered with Pillow's bundled font in
random sizes, positions, rotations, colours, backgrounds and noise, classified into the letters by
the same backbone, centrally, then the classifier is dropped as ImageNet's is. Letters that look
like digits (B D G I O Q S Z) are left out. The weights are made once per backbone, image shape and
normalisation, deterministically (one torch thread, fixed seeds), and cached as a state dict
read back with ``weights_only``.

Disclosure: ``glyphs`` draws both ink polarities (light on dark and dark on light), striped and
noisy backgrounds and rotations of up to 25 degrees: not target images, but the style families
of held-out digits domains (colour-inverted, texture, rotated), a favourable start.
``glyphs-neutral`` renders the same letters in the same sizes and places without them: upright,
the ink always lighter than a plain background.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from raydg.datasets import MultiDomainDataset
from raydg.models import ModelSpec, build_model, file_state, imagenet_weights
from raydg.plan import GLYPHS, IMAGENET, Federation, Plan

LETTERS = "ACEFHJKLMNPRTUVWXY"
NEUTRAL = "glyphs-neutral"
PRETRAININGS = (GLYPHS, NEUTRAL)  # the named starts of ``--weights``
GLYPH_RECIPE = {"per_class": 400, "epochs": 12, "batch": 64, "lr": 0.05, "momentum": 0.9,
                "weight_decay": 5e-4, "seed": 0, "version": 1}


def render_glyphs(per_class: int, channels: int, size: int, rng: np.random.Generator,
                  neutral: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` images of every letter of :data:`LETTERS`: uint8 ``(n, channels, size,
    size)`` and int64 labels, each in its own random size, place, rotation and colours
    (``neutral``: upright, light ink on a plain background)."""
    from PIL import Image, ImageDraw, ImageFont

    big = 4 * size  # drawn large, then reduced with antialiasing
    xs, ys = [], []
    for label, letter in enumerate(LETTERS):
        for _ in range(per_class):
            font = ImageFont.load_default(size=float(rng.uniform(0.45, 0.8) * big))
            canvas = Image.new("L", (big, big), 0)
            centre = (big / 2 + rng.uniform(-0.12, 0.12) * big,
                      big / 2 + rng.uniform(-0.12, 0.12) * big)
            ImageDraw.Draw(canvas).text(centre, letter, fill=255, font=font, anchor="mm")
            if not neutral:
                canvas = canvas.rotate(float(rng.uniform(-25, 25)), resample=Image.BILINEAR)
            mask = np.asarray(canvas.resize((size, size), Image.LANCZOS), np.float32) / 255
            xs.append(_paint(mask, channels, rng, neutral))
            ys.append(label)
    return np.stack(xs), np.asarray(ys, dtype=np.int64)


def _paint(mask: np.ndarray, channels: int, rng: np.random.Generator,
           neutral: bool = False) -> np.ndarray:
    """Ink of one colour on a plain, striped or noisy background of another, at least 0.4
    apart in every channel (``neutral``: lighter ink on a plain background)."""
    ink = rng.uniform(0.5 if neutral else 0, 1, (channels, 1, 1))
    paper = ink + np.where(ink > 0.5, -1, 1) * rng.uniform(0.4, 0.7, (channels, 1, 1))
    paper = np.clip(paper, 0, None) if neutral else paper
    h, w = mask.shape
    kind = 0 if neutral else rng.integers(3)
    if kind == 1:
        yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
        angle, freq = rng.uniform(0, np.pi), rng.uniform(1.5, 4.0)
        stripes = np.sin(2 * np.pi * freq * (np.cos(angle) * xx + np.sin(angle) * yy))
        paper = paper + 0.15 * stripes[None]
    elif kind == 2:
        paper = paper + rng.normal(0, 0.08, (channels, h, w))
    image = mask[None] * ink + (1 - mask[None]) * paper
    return np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)


def _normalise(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    t = torch.from_numpy(x).float().div_(255)
    return (t - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


def pretrain_glyphs(model: str, channels: int, size: int, mean: tuple[float, ...],
                    std: tuple[float, ...], neutral: bool = False
                    ) -> tuple[dict[str, Tensor], float]:
    """Train ``model`` centrally on the glyphs (one torch thread: deterministic); its backbone's
    state dict, without the classifier, and its accuracy on held-out glyphs."""
    r = GLYPH_RECIPE
    rng = np.random.default_rng(r["seed"])
    x, y = render_glyphs(r["per_class"], channels, size, rng, neutral)
    held = rng.permutation(len(y))
    test, train = held[: len(y) // 10], held[len(y) // 10:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(r["seed"])
        net = build_model(ModelSpec(model, channels, len(LETTERS), size))
        opt = torch.optim.SGD(net.parameters(), lr=r["lr"], momentum=r["momentum"],
                              weight_decay=r["weight_decay"])
        order = torch.Generator().manual_seed(r["seed"])
        for _ in range(r["epochs"]):
            perm = train[torch.randperm(len(train), generator=order).numpy()]
            for i in range(0, len(perm) - r["batch"] + 1, r["batch"]):
                idx = perm[i:i + r["batch"]]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(net(_normalise(x[idx], mean, std)),
                                torch.from_numpy(y[idx])).backward()
                opt.step()
        net.eval()
        with torch.no_grad():
            correct = (net(_normalise(x[test], mean, std)).argmax(1).numpy() == y[test]).mean()
    finally:
        torch.set_num_threads(threads)
    return {k: v.clone() for k, v in net.features.state_dict().items()}, float(correct)


def glyph_weights(model: str, channels: int, size: int, mean: tuple[float, ...],
                  std: tuple[float, ...], cache: Path, log: Callable[[str], None] = print,
                  name: str = GLYPHS) -> dict[str, Tensor]:
    """The backbone of pretraining ``name`` (:data:`PRETRAININGS`) from ``cache``, pretrained
    there first if absent."""
    neutral = name == NEUTRAL
    key = json.dumps([model, channels, size, mean, std, GLYPH_RECIPE, LETTERS,
                      torch.__version__, *(["neutral"] if neutral else [])])
    path = cache / "pretrained" / (f"{name}-{model}-{channels}x{size}-"
                                   f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt")
    if not path.is_file():
        state, accuracy = pretrain_glyphs(model, channels, size, mean, std, neutral)
        log(f"pretrained {model} on {name} ({len(LETTERS)} letters, "
            f"{channels}x{size}x{size}): {100 * accuracy:.1f}% on held-out glyphs")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".writing-{os.getpid()}")
        torch.save(state, partial)
        partial.replace(path)  # atomic: a reader sees the whole file or none
        log(f"cached the {name} backbone in {path}")
    return file_state(str(path))


def initial_weights(fed: Federation, channels: int, mean: tuple[float, ...],
                    std: tuple[float, ...], cache: Path,
                    log: Callable[[str], None] = print) -> dict[str, Tensor] | None:
    """The backbone state dict a federation starts from (``fed.init``): None (random
    initialisation), ImageNet's (torchvision's cache), a glyphs pretraining
    (:data:`PRETRAININGS`), or the user's file."""
    cfg, source = fed.config, fed.init
    if source is None:
        return None
    if source == IMAGENET:
        return imagenet_weights(cfg.model)
    if source in PRETRAININGS:
        return glyph_weights(cfg.model, channels, cfg.image_size, mean, std, cache, log, source)
    return file_state(source)


def starting_weights(plan: Plan, data: MultiDomainDataset, cache: Path,
                     log: Callable[[str], None] = print) -> dict[str, dict[str, np.ndarray]]:
    """Every federation's initial backbone, by :attr:`~raydg.plan.Federation.weights_key`,
    loaded (or pretrained) once, here, and checked to fit the model: missing weights stop the
    experiment before Ray starts, and no node has to find a file. As numpy arrays: the
    experiment's process, which passes them on, holds no torch (:mod:`raydg.forked`)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for fed in plan.federations:
        cfg, key = fed.config, fed.weights_key
        if key in out or fed.init is None:
            continue
        state = initial_weights(fed, data.channels, data.mean, data.std, cache, log)
        build_model(ModelSpec(cfg.model, data.channels, len(data.classes), cfg.image_size,
                              state))
        out[key] = {k: v.detach().cpu().numpy() for k, v in state.items()}
    return out
