"""The MixStyle baseline against its equation in numpy."""

from __future__ import annotations

import numpy as np
import torch

from raydg.methods import METHODS
from raydg.methods.mixstyle import MixStyle
from raydg.models import ModelSpec


def test_mixstyle_matches_numpy_and_is_identity_at_test_time():
    layer = MixStyle(p=1.0, alpha=0.1).train()
    x = torch.randn(5, 3, 4, 4) * 3 + 1
    torch.manual_seed(4)
    got = layer(x).numpy()
    torch.manual_seed(4)
    torch.rand(())  # the p draw
    lam = torch.distributions.Beta(0.1, 0.1).sample((5, 1, 1, 1)).numpy()
    perm = torch.randperm(5).numpy()
    xn = x.numpy()
    mu = xn.mean(axis=(2, 3), keepdims=True)
    sigma = np.sqrt(xn.var(axis=(2, 3), keepdims=True) + 1e-6)
    expected = (xn - mu) / sigma * (lam * sigma + (1 - lam) * sigma[perm]) \
        + lam * mu + (1 - lam) * mu[perm]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(layer.eval()(x), x)


def test_mixstyle_is_inserted_after_the_early_stages():
    method = METHODS.get("mixstyle")()
    cnn = method.build_model(ModelSpec("cnn", 3, 10, 16))
    assert sum(isinstance(m, MixStyle) for m in cnn.modules()) == 2  # after both max-pools
    resnet = method.build_model(ModelSpec("resnet18", 3, 7, 32))
    assert [isinstance(getattr(resnet.features, f"layer{i}")[-1], MixStyle)
            for i in (1, 2, 3)] == [True, True, True]
    assert not isinstance(resnet.features.layer4[-1], MixStyle)
    x = torch.randn(2, 3, 16, 16)
    assert cnn.eval()(x).shape == (2, 10)


def test_a_one_by_one_map_passes_unchanged_and_the_last_stage_never_gets_mixstyle():
    """A 1x1 map has no spatial statistics (its unbiased variance is NaN): unchanged. AlexNet
    has three stages, so MixStyle follows its first two (a 64 px image is 1x1 after its last)."""
    x = torch.randn(4, 8, 1, 1)
    assert torch.equal(MixStyle(p=1.0, alpha=0.1).train()(x), x)
    alexnet = METHODS.get("mixstyle")().build_model(ModelSpec("alexnet", 3, 7, 64))
    assert [i for i, m in enumerate(alexnet.features.features)
            if isinstance(m, torch.nn.Sequential) and isinstance(m[-1], MixStyle)] == [2, 5]
    out = alexnet.train()(torch.randn(4, 3, 64, 64))
    assert torch.isfinite(out).all()
