"""Training augmentation: identity, flips, DomainBed's pipeline, reproducibility, wiring; each
batched operation against torchvision's per-image function with the same parameters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raydg.errors import RaydgError
from raydg.transforms import (
    CROP_RATIO,
    CROP_SCALE,
    augment_batch,
    color_jitter,
    crop_boxes,
    crop_flip,
    jitter_params,
    make_transform,
)
from tests.conftest import tiny_config


def _batch(n: int = 8, size: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)


def test_none_is_the_identity_and_flip_only_mirrors():
    x = _batch()
    assert make_transform("none", 12) is None
    assert augment_batch(x, None) is x
    torch.manual_seed(1)
    out = augment_batch(x, make_transform("flip", 12))
    flipped = [torch.equal(o, i.flip(-1)) for o, i in zip(out, x, strict=True)]
    kept = [torch.equal(o, i) for o, i in zip(out, x, strict=True)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert any(flipped) and any(kept)  # p = 0.5 over 8 images


@pytest.mark.parametrize("name", ["flip-jitter", "crop-flip", "domainbed"])
def test_cropping_pipelines_keep_the_shape_and_are_seeded(name):
    x = _batch()
    t = make_transform(name, 12)
    torch.manual_seed(3)
    a = augment_batch(x, t)
    torch.manual_seed(3)
    b = augment_batch(x, t)
    assert a.shape == x.shape and a.dtype == torch.uint8
    assert torch.equal(a, b)
    assert not torch.equal(a, x)


def test_domainbed_jitter_changes_colours_and_grayscale_appears():
    x = _batch(n=200, size=8)
    torch.manual_seed(0)
    out = augment_batch(x, make_transform("domainbed", 8)).numpy().astype(int)
    grey = [np.array_equal(o[0], o[1]) and np.array_equal(o[1], o[2]) for o in out]
    assert 5 <= sum(grey) <= 45  # p = 0.1 of 200 (colour input is never grey by chance)


def test_train_transform_is_validated_and_reaches_training_batches():
    from raydg.datasets import load_dataset
    from raydg.engine.client import ClientHost, RuntimeSpec
    from raydg.methods import METHODS
    from raydg.models import ModelSpec
    from raydg.partition import Partition, make_clients

    with pytest.raises(RaydgError, match="train_transform"):
        tiny_config(train_transform="jitter")
    firsts = {}
    for name in ("none", "domainbed"):
        cfg = tiny_config(train_transform=name)
        data = load_dataset(cfg.dataset, None, cfg.image_size)
        clients = make_clients(data, Partition.of(cfg))[:1]
        host = ClientHost(RuntimeSpec(METHODS.get("fedavg")(), cfg, ModelSpec("cnn", 3, 10, 16),
                                      data.mean, data.std), clients)
        ctx = host._context(0, 1, {k: v.detach().numpy() for k, v in
                                   host.model.state_dict().items()})
        firsts[name] = next(ctx.batches())[0]
    assert firsts["none"].shape == firsts["domainbed"].shape
    assert not torch.allclose(firsts["none"], firsts["domainbed"])


def test_crop_boxes_fit_with_the_drawn_area_and_ratio():
    torch.manual_seed(0)
    top, left, h, w = crop_boxes(2000, 30, 40)
    assert bool(((top >= 0) & (left >= 0) & (top + h <= 30) & (left + w <= 40)).all())
    area, ratio = (h * w).double() / 1200, w.double() / h.double()
    # rounding each side to an integer moves area and ratio by at most ~one pixel's share
    assert area.min() >= CROP_SCALE[0] - 0.05 and area.max() <= CROP_SCALE[1] + 1e-9
    assert ratio.min() >= CROP_RATIO[0] - 0.05 and ratio.max() <= CROP_RATIO[1] + 0.05
    # offsets cover the free range at both ends
    assert bool((top == 0).any() and (top + h == 30).any())
    assert bool((left == 0).any() and (left + w == 40).any())


def test_crop_flip_matches_torchvision_resized_crop_per_image():
    from torchvision.transforms.v2 import functional as TF

    torch.manual_seed(1)
    x = torch.rand(16, 3, 24, 24)
    top, left, h, w = crop_boxes(16, 24, 24)
    flip = torch.rand(16) < 0.5
    out = crop_flip(x, top, left, h, w, flip, 24)
    for i in range(16):
        want = TF.resized_crop(x[i], int(top[i]), int(left[i]), int(h[i]), int(w[i]),
                               [24, 24], antialias=True)
        want = want.flip(-1) if flip[i] else want
        assert torch.allclose(out[i], want, atol=1e-5), i


@pytest.mark.parametrize("channels", [3, 1])
def test_color_jitter_matches_torchvision_ops_in_each_images_order(channels):
    from torchvision.transforms.v2 import functional as TF

    ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    torch.manual_seed(2)
    x = torch.randint(0, 6, (24, channels, 10, 10)) / 5  # many ties between channels, greys
    factors, order = jitter_params(24)
    out = color_jitter(x.clone(), factors, order)
    for i in range(24):
        want = x[i]
        for k in order[i].tolist():
            want = ops[k](want, float(factors[i, k]))
        assert torch.allclose(out[i], want, atol=1e-5), i
    assert len({tuple(o) for o in order.tolist()}) > 10  # orders vary between images


def test_a_batch_in_chunks_equals_the_batch_at_once():
    x = _batch(n=20, size=256)
    t = make_transform("domainbed", 256)
    torch.manual_seed(4)
    chunked = t(x)  # on a CPU: 2^20 values, 5 images, at a time
    torch.manual_seed(4)
    whole = t.apply(x, t.draw(20, 256, 256))
    assert torch.equal(chunked, whole)
    assert t(x[:0]).shape == (0, 3, 256, 256)  # an empty batch passes through
