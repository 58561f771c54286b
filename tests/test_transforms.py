"""Training augmentation: identity, flips, DomainBed's pipeline, reproducibility, wiring."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raydg.errors import RaydgError
from raydg.transforms import augment_batch, make_transform
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
    from raydg.partition import make_clients

    with pytest.raises(RaydgError, match="train_transform"):
        tiny_config(train_transform="jitter")
    firsts = {}
    for name in ("none", "domainbed"):
        cfg = tiny_config(train_transform=name)
        data = load_dataset(cfg.dataset, None, cfg.image_size)
        clients = make_clients(data, cfg.target, None, None, cfg.val_fraction, cfg.seed)[:1]
        host = ClientHost(RuntimeSpec(METHODS.get("fedavg")(), cfg, ModelSpec("cnn", 3, 10, 16),
                                      data.mean, data.std), clients)
        ctx = host._context(0, 1, {k: v.detach().numpy() for k, v in
                                   host.model.state_dict().items()})
        firsts[name] = next(ctx.batches())[0]
    assert firsts["none"].shape == firsts["domainbed"].shape
    assert not torch.allclose(firsts["none"], firsts["domainbed"])
