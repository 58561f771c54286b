"""Backbones behind one interface: ``model.features(x)`` -> flat features, ``model.classifier``.

The feature/classifier split is what FedFD-A (F_theta, C_phi), gPerXAN (g_i, h_g) and CSAC need.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn

from raydg.registry import Registry


@dataclass(frozen=True)
class ModelSpec:
    name: str
    in_channels: int
    num_classes: int
    image_size: int


class FeatureClassifier(nn.Module):
    """A feature extractor followed by a linear classifier."""

    def __init__(self, features: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.features = features
        self.classifier = nn.Linear(feature_dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


MODELS: Registry[Callable[[ModelSpec], FeatureClassifier]] = Registry("model")


def _conv_bn(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


@MODELS.register("cnn")
def small_cnn(spec: ModelSpec, width: int = 16) -> FeatureClassifier:
    """Three conv-BN-ReLU blocks, two max-pools, global average pooling (digits)."""
    w = width
    features = nn.Sequential(
        *_conv_bn(spec.in_channels, w), nn.MaxPool2d(2), *_conv_bn(w, 2 * w), nn.MaxPool2d(2),
        *_conv_bn(2 * w, 4 * w), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )
    return FeatureClassifier(features, 4 * w, spec.num_classes)


def _resnet(arch: str) -> Callable[[ModelSpec], FeatureClassifier]:
    def build(spec: ModelSpec) -> FeatureClassifier:
        import torchvision

        net = getattr(torchvision.models, arch)(weights=None)
        if spec.in_channels != 3:
            net.conv1 = nn.Conv2d(spec.in_channels, 64, 7, 2, 3, bias=False)
        dim = net.fc.in_features
        net.fc = nn.Identity()
        return FeatureClassifier(net, dim, spec.num_classes)

    build.__doc__ = f"torchvision {arch}, randomly initialised, its fc replaced by the classifier."
    return build


MODELS.register("resnet18")(_resnet("resnet18"))
MODELS.register("resnet50")(_resnet("resnet50"))


def build_model(spec: ModelSpec) -> FeatureClassifier:
    return MODELS.get(spec.name)(spec)


def bn_keys(model: nn.Module) -> set[str]:
    """State-dict keys of every BatchNorm layer's own tensors (affine and statistics), not of
    modules nested inside one."""
    return {
        f"{name}.{key}"
        for name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
        for key in module.state_dict()
        if "." not in key
    }


def bn_layers(features: nn.Module, blocks: int) -> list[tuple[nn.Module, str]]:
    """(parent, attribute) of the BN layers in the first ``blocks`` blocks (-1: all)."""
    found: list[tuple[nn.Module, str, str]] = []
    for name, module in features.named_modules():
        for child_name, child in module.named_children():
            if isinstance(child, nn.BatchNorm2d):
                found.append((module, child_name, f"{name}.{child_name}".lstrip(".")))
    if blocks < 0:
        return [(m, n) for m, n, _ in found]
    if hasattr(features, "layer1"):  # ResNet: the stem belongs to block 1
        allowed = ("bn1", *(f"layer{i}." for i in range(1, blocks + 1)))
        return [(m, n) for m, n, full in found if full == "bn1" or full.startswith(allowed)]
    return [(m, n) for m, n, _ in found[:blocks]]


def replace_bns(features: nn.Module, make: Callable[[nn.BatchNorm2d], nn.Module],
                blocks: int = -1) -> None:
    """Replace each BN layer of the first ``blocks`` blocks (-1: all) by ``make(bn)``."""
    for parent, attr in bn_layers(features, blocks):
        setattr(parent, attr, make(getattr(parent, attr)))
