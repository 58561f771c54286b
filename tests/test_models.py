"""Backbones: torchvision's by name, ImageNet weights from torch's cache or a user's file,
their config rules, and every method on each."""

from __future__ import annotations

import urllib.error

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

from raydg.config import RunConfig
from raydg.errors import RaydgError
from raydg.methods import METHODS, method_class
from raydg.methods.base import Method
from raydg.models import (
    TORCHVISION,
    MaxPool2d,
    ModelSpec,
    build_model,
    file_state,
    has_batchnorm,
    imagenet_weights,
)
from raydg.planning import init_weights
from raydg.resolve import resolve


def _saved_resnet18(path) -> dict:
    torch.manual_seed(123)
    state = torchvision.models.resnet18(weights=None).state_dict()  # with its 1000-class fc
    torch.save(state, path)
    return state


def _offline(*_args, **_kwargs):
    raise urllib.error.URLError("network is unreachable")


def test_weights_file_initialises_the_backbone(tmp_path):
    state = _saved_resnet18(tmp_path / "r18.pth")
    model = build_model(ModelSpec("resnet18", 3, 7, 32, weights=file_state(tmp_path / "r18.pth")))
    assert torch.equal(model.features.conv1.weight, state["conv1.weight"])
    assert torch.equal(model.features.layer4[1].bn2.running_var, state["layer4.1.bn2.running_var"])
    assert model.classifier.out_features == 7  # the ImageNet head is not used
    fresh = build_model(ModelSpec("resnet18", 3, 7, 32))
    assert not torch.equal(fresh.features.conv1.weight, state["conv1.weight"])


def test_bad_weight_files_are_one_clear_error(tmp_path):
    r18 = _saved_resnet18(tmp_path / "r18.pth")
    with pytest.raises(RaydgError, match="do not fit"):
        build_model(ModelSpec("resnet50", 3, 7, 32, weights=r18))
    with pytest.raises(RaydgError, match="does not exist"):
        file_state(tmp_path / "none.pth")
    torch.save(torch.zeros(3), tmp_path / "tensor.pth")
    with pytest.raises(RaydgError, match="not a state dict"):
        file_state(tmp_path / "tensor.pth")
    torch.save({"cls": RunConfig}, tmp_path / "pickled.pth")  # arbitrary pickle: refused
    with pytest.raises(RaydgError, match="cannot load"):
        file_state(tmp_path / "pickled.pth")
    with pytest.raises(RaydgError, match="3-channel"):
        build_model(ModelSpec("resnet18", 1, 7, 32, weights=r18))


def test_imagenet_weights_come_from_torch_cache_or_fail_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)

    monkeypatch.setattr(torch.hub, "urlopen", _offline)
    with pytest.raises(RaydgError, match=r"--weights FILE or --no-pretrained"):
        imagenet_weights("resnet18")
    state = _saved_resnet18(cache / "resnet18-f37072fd.pth")
    model = build_model(ModelSpec("resnet18", 3, 7, 32, weights=imagenet_weights("resnet18")))
    assert torch.equal(model.features.conv1.weight, state["conv1.weight"])
    with pytest.raises(RaydgError, match="cnn has no ImageNet weights"):
        imagenet_weights("cnn")


def test_pretrained_follows_the_dataset_and_the_model():
    pacs = resolve(RunConfig(dataset="pacs"))
    assert pacs.pretrained and init_weights(pacs) == "imagenet"
    assert init_weights(resolve(RunConfig(dataset="pacs", pretrained=False))) is None
    assert resolve(RunConfig(dataset="pacs", model="cnn")).pretrained is False
    assert init_weights(resolve(RunConfig(dataset="digits-style"))) is None
    own = resolve(RunConfig(dataset="digits-style", model="resnet18", weights="w.pth"))
    assert init_weights(own) == "w.pth"
    glyphs = resolve(RunConfig(dataset="digits-style", weights="glyphs"))  # any backbone
    assert glyphs.model == "cnn" and glyphs.pretrained and init_weights(glyphs) == "glyphs"
    with pytest.raises(RaydgError, match="cnn has no ImageNet weights"):
        resolve(RunConfig(dataset="digits-style", pretrained=True))
    with pytest.raises(RaydgError, match="contradict"):
        resolve(RunConfig(dataset="pacs", pretrained=False, weights="w.pth"))


def test_a_run_without_weights_stops_before_ray_starts(tmp_path, monkeypatch):
    import ray
    from click.testing import CliRunner
    from PIL import Image

    from raydg.cli import cli

    for d in ("art_painting", "cartoon", "photo", "sketch"):
        for c in ("dog", "horse"):
            (tmp_path / "PACS" / d / c).mkdir(parents=True)
            for i in range(6):
                Image.new("RGB", (8, 8), (40 * i, 0, 0)).save(tmp_path / f"PACS/{d}/{c}/{i}.png")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "urlopen", _offline)
    result = CliRunner().invoke(cli, ["run", "pacs", "--data-root", str(tmp_path), "--no-cache",
                                      "--image-size", "16", "--tracking-uri",
                                      f"sqlite:///{tmp_path}/m.db"])
    assert result.exit_code == 2
    assert "raydg: error: ImageNet weights of resnet18" in result.output
    assert not ray.is_initialized()


def test_mnist_cnn_has_crossgrads_lenet_layers():
    """CrossGrad's nets/lenet.py: conv 5x5x32 (same), pool 2, conv 5x5x64 (same), pool 2,
    fc 1024, dropout, fc to the classes; its parameters counted by hand at 28x28."""
    model = build_model(ModelSpec("mnist-cnn", 1, 10, 28))
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (1024, 7 * 7 * 64), (1024,),
                      (10, 1024), (10,)]
    by_hand = (25 * 32 + 32) + (25 * 32 * 64 + 64) + (3136 * 1024 + 1024) + (1024 * 10 + 10)
    assert sum(p.numel() for p in model.parameters()) == by_hand == 3_274_634
    x = torch.randn(3, 1, 28, 28)
    assert model.features(x).shape == (3, 1024) and model(x).shape == (3, 10)
    model.eval()  # dropout is the only stochastic layer
    torch.testing.assert_close(model(x), model(x))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert build_model(ModelSpec("mnist-cnn", 3, 7, 32)).features[7].in_features == 64 * 8 * 8


def test_mnist_cnn_bn_puts_a_batchnorm_after_each_conv_in_place_of_its_bias():
    model = build_model(ModelSpec("mnist-cnn-bn", 1, 10, 28))
    kinds = [type(m).__name__ for m in model.features]
    assert kinds == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Conv2d", "BatchNorm2d",
                     "ReLU", "MaxPool2d", "Flatten", "Linear", "ReLU", "Dropout"]
    plain = 3_274_634
    assert sum(p.numel() for p in model.parameters()) == plain - 32 - 64 + 2 * (32 + 64)
    assert has_batchnorm("mnist-cnn-bn") and not has_batchnorm("mnist-cnn")
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)


POOLS = [(2, None, 0, 1, False), (3, 2, 1, 1, False), (2, 2, 0, 1, True), (3, 2, 0, 1, True),
         (2, 1, 0, 1, False), (3, 3, 1, 2, False)]  # kernel, stride, padding, dilation, ceil


@pytest.mark.parametrize("pool", POOLS)
def test_raydgs_max_pool_is_torchs_bit_for_bit_ties_and_nan_included(pool):
    """Inputs of few values (ties everywhere), with NaN or inf and -0.0: the output, the
    gradient and the no-grad output of MaxPool2d (and its output for a channels-last input)
    equal nn.MaxPool2d's exactly, in NCHW."""
    gen = torch.Generator().manual_seed(0)
    for shape in [(4, 3, 9, 9), (2, 5, 16, 16), (3, 1, 7, 8)]:
        for special in (float("nan"), float("inf")):
            x = torch.randint(-2, 3, shape, generator=gen).float()
            x[x == 2], x[x == -2] = special, -0.0
            ref, ours = nn.MaxPool2d(*pool[:4], ceil_mode=pool[4]), MaxPool2d(*pool[:4],
                                                                             ceil_mode=pool[4])
            a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
            out_a, out_b = ref(a), ours(b)
            grad = torch.randn(out_a.shape, generator=gen)
            out_a.backward(grad)
            out_b.backward(grad)
            with torch.no_grad():
                out_c = ours(x)
                out_d = ours(x.contiguous(memory_format=torch.channels_last)).contiguous()
            for out in (out_b, out_c, out_d):
                assert out.is_contiguous() and torch.equal(out.isnan(), out_a.isnan())
                assert torch.equal(out.nan_to_num(), out_a.nan_to_num())
                assert torch.equal(out.signbit(), out_a.signbit())
            assert b.grad.is_contiguous() and torch.equal(a.grad, b.grad)


def test_every_backbones_max_pools_are_raydgs():
    for name in ("cnn", "mnist-cnn", "resnet18", "alexnet", "densenet121"):
        pools = [m for m in build_model(ModelSpec(name, 3, 7, 32)).modules()
                 if isinstance(m, nn.MaxPool2d)]
        assert pools and all(type(m) is MaxPool2d for m in pools), name


# The torchvision backbones: each built as torchvision builds it, less its ImageNet head.
EXPECTED_BN = {"resnet18": True, "resnet34": True, "resnet50": True, "resnet101": True,
               "alexnet": False, "densenet121": True, "mobilenet_v3_small": True}
CHANGES_THE_NETWORK = [n for n, c in METHODS if c.build_model is not Method.build_model
                       and n != "local"]  # local: copies of the plain backbone, one per client


@pytest.mark.parametrize("arch", sorted(TORCHVISION))
def test_each_backbone_is_torchvisions_without_its_head(arch):
    reference = getattr(torchvision.models, arch)(weights=None)
    head = reference.get_submodule(TORCHVISION[arch].head)
    model = build_model(ModelSpec(arch, 3, 7, 64))
    count = sum(p.numel() for p in model.features.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) - sum(
        p.numel() for p in head.parameters())
    assert model.classifier.in_features == head.in_features
    assert has_batchnorm(arch) is EXPECTED_BN[arch]
    for stage in model.features.stages:  # where MixStyle goes and what CSAC aligns
        model.features.get_submodule(stage)
    assert build_model(ModelSpec(arch, 1, 7, 64)).features(torch.randn(2, 1, 64, 64)).shape == (
        2, head.in_features)  # grey images: a fresh first convolution


@pytest.mark.parametrize("arch", sorted(TORCHVISION))
def test_the_methods_that_change_the_network_take_a_step_on_each_backbone(arch):
    """Each method whose network is not the plain backbone (MixStyle's layers, CSAC's
    projections, gPerXAN's normalisers, FedFD-A's statistics, FedSR's representation) is built
    on ``arch``, takes one forward and backward step and changes its weights; one that acts on
    BatchNorm is refused on a backbone without it. 32 px (AlexNet: 64, its smallest)."""
    size = 64 if arch == "alexnet" else 32
    spec, x = ModelSpec(arch, 3, 7, size), torch.randn(4, 3, size, size)
    y = torch.tensor([0, 1, 2, 3])
    for name in CHANGES_THE_NETWORK:
        cls = method_class(name)
        if cls.needs_batchnorm and not has_batchnorm(arch):
            with pytest.raises(RaydgError, match=f"model {arch} has none"):
                resolve(RunConfig(dataset="digits-style", model=arch, method=name))
            continue
        torch.manual_seed(0)
        model = cls(cls.parse_options({})).build_model(spec)
        before = [p.detach().clone() for p in model.parameters()]
        optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
        assert all(torch.isfinite(p).all() for p in model.parameters()), name
        after = list(model.parameters())
        assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True)), name


def test_a_non_resnet_starts_from_a_torchvision_weights_file(tmp_path):
    torch.manual_seed(5)
    state = torchvision.models.mobilenet_v3_small(weights=None).state_dict()
    torch.save(state, tmp_path / "mnv3.pth")
    model = build_model(ModelSpec("mobilenet_v3_small", 3, 7, 64,
                                  weights=file_state(tmp_path / "mnv3.pth")))
    assert torch.equal(model.features.features[0][0].weight, state["features.0.0.weight"])
    assert torch.equal(model.features.classifier[0].weight, state["classifier.0.weight"])
    assert model.classifier.out_features == 7  # classifier.3, the ImageNet head: not used
    with pytest.raises(RaydgError, match="do not fit"):
        build_model(ModelSpec("densenet121", 3, 7, 64, weights=state))


@pytest.mark.slow
def test_every_training_method_runs_a_round_on_the_smallest_backbone(ray_session, tmp_path):
    """One round of every training method on mobilenet_v3_small (1.5 M parameters), at 64 px:
    at 32 px its last maps are 1x1, where instance normalisation (gPerXAN) has nothing to
    normalise."""
    from raydg.config import Search
    from raydg.experiment import run_experiment

    training = [n for n, c in METHODS if not (c.augmentation or c.aggregation)]
    cfg = RunConfig(dataset="digits-style", model="mobilenet_v3_small", image_size=64,
                    target="sketch", rounds=1, local_steps=2, batch_size=8, val_every=2,
                    tracking_uri=f"sqlite:///{tmp_path}/m.db", storage=str(tmp_path / "r"))
    result = run_experiment(cfg, Search(grid={"method": training}), out=lambda _: None,
                            progress="none")
    assert sorted(r.method.split(" ")[0] for r in result.runs) == sorted(training)
    for r in result.runs:
        assert all(np.isfinite(h["train_loss"]) for h in r.history), r.method
        assert 0 <= r.selected[r.mode] <= 100, r.method
