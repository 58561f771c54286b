"""Backbones: ImageNet weights from torch's cache or a user's file, and their config rules."""

from __future__ import annotations

import urllib.error

import pytest
import torch
import torchvision
from torch import nn

from raydg.config import RunConfig
from raydg.errors import RaydgError
from raydg.models import ModelSpec, build_model, file_state, has_batchnorm, imagenet_weights
from raydg.plan import init_weights
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
