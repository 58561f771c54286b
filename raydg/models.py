"""Backbones behind one interface: ``model.features(x)`` -> flat features, ``model.classifier``.

The feature/classifier split is what FedFD-A (F_theta, C_phi), gPerXAN (g_i, h_g) and CSAC need.
A backbone can start from a state dict of its ``features`` (torchvision's format for the ResNets,
whose ``fc`` is ignored): ImageNet weights through torchvision's weights API (its standard cache,
downloaded where there is internet), a file the user gives (loaded with ``weights_only``), or
:mod:`raydg.pretrain`'s ``glyphs``. The experiment's process loads them once; only the initial
global model is built with them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from raydg.errors import RaydgError
from raydg.registry import Registry


@dataclass(frozen=True)
class ModelSpec:
    name: str
    in_channels: int
    num_classes: int
    image_size: int
    weights: dict[str, Tensor] | None = None  # the backbone's initial state; None: random


class FeatureClassifier(nn.Module):
    """A feature extractor followed by a linear classifier."""

    def __init__(self, features: nn.Module, feature_dim: int, num_classes: int) -> None:
        super().__init__()
        self.features = features
        self.classifier = nn.Linear(feature_dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


MODELS: Registry[Callable[[ModelSpec], FeatureClassifier]] = Registry("model")


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` that pools a CPU batch in channels-last memory, where PyTorch's CPU
    kernel is vectorised (its NCHW kernel took 5x as long on a small CNN's first pool: a quarter
    of a training step, ``benchmarks/pool.py``), and hands back NCHW tensors. Its backward is
    PyTorch's NCHW one with the same indices, so outputs and gradients are ``nn.MaxPool2d``'s
    bit for bit, ties and NaN included; elsewhere (a GPU, an input not in NCHW) it is
    ``nn.MaxPool2d``."""

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu" or x.dim() != 4 or not x.is_contiguous() or self.return_indices:
            return super().forward(x)
        args = (self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)
        if not (torch.is_grad_enabled() and x.requires_grad):
            return torch.nn.functional.max_pool2d(_channels_last(x), *args).contiguous()
        return _ChannelsLastPool.apply(x, *args)


def _channels_last(x: Tensor) -> Tensor:
    return x.contiguous(memory_format=torch.channels_last)


class _ChannelsLastPool(torch.autograd.Function):
    """Forward: the channels-last kernel's values and indices (positions within each plane,
    which do not depend on the memory format); backward: PyTorch's NCHW kernel on them."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, *args: Any) -> Tensor:
        out, indices = torch.ops.aten.max_pool2d_with_indices(_channels_last(x), *args)
        ctx.save_for_backward(x, indices.contiguous())
        ctx.args = args
        return out.contiguous()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, indices = ctx.saved_tensors
        grad_x = torch.ops.aten.max_pool2d_with_indices_backward(
            grad.contiguous(), x, *ctx.args, indices)
        return (grad_x,) + (None,) * len(ctx.args)


def pools_as(net: nn.Module, kind: type[nn.MaxPool2d] = MaxPool2d) -> nn.Module:
    """``net`` with each max-pool of another class replaced by one of ``kind`` (a subclass of
    ``nn.MaxPool2d``, or that class itself) with the same arguments."""
    for name, module in list(net.named_modules()):
        if isinstance(module, nn.MaxPool2d) and type(module) is not kind:
            _set_submodule(net, name, kind(module.kernel_size, module.stride, module.padding,
                                           module.dilation, module.return_indices,
                                           module.ceil_mode))
    return net


def _conv_bn(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


@MODELS.register("cnn")
def small_cnn(spec: ModelSpec, width: int = 16) -> FeatureClassifier:
    """Three conv-BN-ReLU blocks, two max-pools, global average pooling (digits)."""
    w = width
    features = nn.Sequential(
        *_conv_bn(spec.in_channels, w), MaxPool2d(2), *_conv_bn(w, 2 * w), MaxPool2d(2),
        *_conv_bn(2 * w, 4 * w), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )
    if spec.weights is not None:
        load_backbone(features, spec.weights)
    return FeatureClassifier(features, 4 * w, spec.num_classes)


@MODELS.register("mnist-cnn")
def mnist_cnn(spec: ModelSpec, batchnorm: bool = False) -> FeatureClassifier:
    """Two conv and two fully-connected layers, no BN: the MNIST CNN of Rotated MNIST papers.

    CSAC §4.1's "standard MNIST CNN architecture with two convolution layers and two
    fully-connected layers" (after MTAE and DGER), with the layer sizes of CrossGrad's LeNet
    variant (Shankar et al., ICLR 2018; vihari/crossgrad ``nets/lenet.py``), whose Rotated
    MNIST row CSAC's Table 3 cites. conv 5x5, 32 (same padding), ReLU, max-pool 2;
    conv 5x5, 64, ReLU, max-pool 2; fc 1024, ReLU, dropout 0.5; fc to the classes. At 28x28:
    3,274,634 parameters. Weights start from PyTorch's default initialisation (the TF code draws
    a truncated normal with std 0.1); no batch normalisation (``batchnorm``: see
    :func:`mnist_cnn_bn`)."""
    side = spec.image_size // 4

    def conv(cin: int, cout: int) -> list[nn.Module]:
        norm = [nn.BatchNorm2d(cout)] if batchnorm else []
        return [nn.Conv2d(cin, cout, 5, padding=2, bias=not batchnorm), *norm, nn.ReLU(),
                MaxPool2d(2)]

    features = nn.Sequential(
        *conv(spec.in_channels, 32), *conv(32, 64), nn.Flatten(),
        nn.Linear(64 * side * side, 1024), nn.ReLU(), nn.Dropout(0.5),
    )
    if spec.weights is not None:
        load_backbone(features, spec.weights)
    return FeatureClassifier(features, 1024, spec.num_classes)


@MODELS.register("mnist-cnn-bn")
def mnist_cnn_bn(spec: ModelSpec) -> FeatureClassifier:
    """mnist-cnn with a BatchNorm after each conv (which then has no bias): not a paper's model.

    For the methods that act on BN layers (FedBN, SiloBN, FedFD, gPerXAN) on Rotated MNIST,
    whose papers never ran it; their rows are labelled ``model=mnist-cnn-bn`` and compared with
    FedAvg on this same model."""
    return mnist_cnn(spec, batchnorm=True)


def imagenet_weights(arch: str) -> dict[str, Tensor]:
    """torchvision's ImageNet weights of ``arch`` from its cache, downloading them if needed."""
    import torchvision

    if not has_pretrained(arch):
        raise RaydgError(f"model {arch} has no ImageNet weights")
    weights = getattr(torchvision.models, IMAGENET_WEIGHTS[arch.lower()]).IMAGENET1K_V1
    try:
        return weights.get_state_dict(progress=False, weights_only=True, map_location="cpu")
    except OSError as err:  # urllib's URLError is an OSError
        cache = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
        raise RaydgError(f"ImageNet weights of {arch} are not in torch's cache ({cache}) and "
                         f"cannot be downloaded ({err}); pass --weights FILE or "
                         "--no-pretrained") from None


def file_state(path: str | Path) -> dict[str, Tensor]:
    """A state dict from a user's file, loaded with ``weights_only``."""
    path = str(path)
    if not Path(path).is_file():
        raise RaydgError(f"weights file {path!r} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # an untrusted file fails in many ways (EOFError, IndexError, ..)
        raise RaydgError(f"cannot load weights file {path}: {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else 'unreadable'}") from None
    if not isinstance(state, dict):
        raise RaydgError(f"weights file {path} holds a {type(state).__name__}, not a state dict")
    return state


def load_backbone(net: nn.Module, state: Mapping[str, Tensor | np.ndarray],
                  ignore: str = "fc.") -> None:
    """Load a backbone state dict (tensors, or numpy arrays as an experiment passes them)
    into ``net``; keys under ``ignore`` (the ImageNet head) are left out. Missing keys or
    mismatched shapes are one clear error."""
    own = {k: v for k, v in net.state_dict().items() if not k.startswith(ignore)}
    missing = sorted(set(own) - set(state))
    bad = sorted(k for k in own if k in state and state[k].shape != own[k].shape)
    if missing or bad:
        raise RaydgError(f"the initial weights do not fit: missing {missing[:3]}, wrong "
                         f"shape {bad[:3]} ({len(missing)} missing, {len(bad)} mismatched)")
    net.load_state_dict({k: _tensor(state[k]) for k in own}, strict=False)


def _tensor(value: Tensor | np.ndarray) -> Tensor:
    """A tensor of ``value``; an array is copied (Ray's object store gives read-only ones)."""
    return value if isinstance(value, Tensor) else torch.from_numpy(np.array(value))


@dataclass(frozen=True)
class Torchvision:
    """A torchvision classifier as a backbone: the path of its ImageNet head (replaced by the
    run's classifier), its weights enum and its stages (the modules whose outputs are its
    successive feature maps: where MixStyle goes, what CSAC aligns)."""

    head: str
    weights: str
    stages: tuple[str, ...]


RESNET_STAGES = ("layer1", "layer2", "layer3", "layer4")
TORCHVISION = {  # the backbones the papers use and those a researcher reaches for
    "resnet18": Torchvision("fc", "ResNet18_Weights", RESNET_STAGES),
    "resnet34": Torchvision("fc", "ResNet34_Weights", RESNET_STAGES),
    "resnet50": Torchvision("fc", "ResNet50_Weights", RESNET_STAGES),
    "resnet101": Torchvision("fc", "ResNet101_Weights", RESNET_STAGES),
    "alexnet": Torchvision("classifier.6", "AlexNet_Weights",  # after each max-pool
                           ("features.2", "features.5", "features.12")),
    "densenet121": Torchvision("classifier", "DenseNet121_Weights",
                               tuple(f"features.denseblock{i}" for i in range(1, 5))),
    "mobilenet_v3_small": Torchvision("classifier.3", "MobileNet_V3_Small_Weights",
                                      ("features.1", "features.3", "features.8",
                                       "features.11")),  # the last block of each resolution
}


def _torchvision(arch: str) -> Callable[[ModelSpec], FeatureClassifier]:
    def build(spec: ModelSpec) -> FeatureClassifier:
        import torchvision

        kind = TORCHVISION[arch]
        net = pools_as(getattr(torchvision.models, arch)(weights=None))
        if spec.weights is not None and spec.in_channels != 3:
            raise RaydgError(f"pretrained {arch} needs 3-channel images, not "
                             f"{spec.in_channels}; pass --no-pretrained")
        if spec.in_channels != 3:
            _replace_first_conv(net, spec.in_channels)
        dim = net.get_submodule(kind.head).in_features
        _set_submodule(net, kind.head, nn.Identity())
        net.stages = list(kind.stages)  # a plain attribute: not in the state dict
        if spec.weights is not None:
            load_backbone(net, spec.weights, ignore=f"{kind.head}.")
        return FeatureClassifier(net, dim, spec.num_classes)

    build.__doc__ = (f"torchvision {arch}, ImageNet weights or random init, its ImageNet head "
                     "replaced by the classifier.")
    return build


def _set_submodule(net: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(net.get_submodule(parent) if parent else net, name, module)


def _replace_first_conv(net: nn.Module, channels: int) -> None:
    """The first convolution of ``net`` for ``channels`` input channels, freshly initialised."""
    path, conv = next((n, m) for n, m in net.named_modules() if isinstance(m, nn.Conv2d))
    _set_submodule(net, path, nn.Conv2d(channels, conv.out_channels, conv.kernel_size,
                                        conv.stride, conv.padding, bias=conv.bias is not None))


IMAGENET_WEIGHTS = {name: kind.weights for name, kind in TORCHVISION.items()}
for _arch in TORCHVISION:
    MODELS.register(_arch)(_torchvision(_arch))


def has_pretrained(name: str) -> bool:
    """Whether the backbone ``name`` can start from pretrained (ImageNet) weights."""
    MODELS.get(name)  # unknown names are an error
    return name.lower() in IMAGENET_WEIGHTS


@functools.cache
def has_batchnorm(name: str) -> bool:
    """Whether backbone ``name`` has BatchNorm layers (built once, small, on the CPU)."""
    return bool(bn_keys(MODELS.get(name)(ModelSpec(name, 3, 2, 32))))


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
