"""CCST against independent expectations: moments, bank shapes, Algorithm 1, the VGG coder's
weight files, and ``--augment ccst`` on other methods."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raydg import state
from raydg.api import simulation
from raydg.datasets import load_dataset
from raydg.engine.client import ClientHost, RuntimeSpec
from raydg.errors import RaydgError
from raydg.labels import method_label
from raydg.methods import METHODS, method_class
from raydg.methods.ccst import PixelCoder, StyleTransfer, VGGCoder, _convs, adain, augment
from raydg.models import ModelSpec
from raydg.partition import ClientData, Partition, make_clients
from tests.conftest import tiny_config

PIXEL = StyleTransfer(PixelCoder(), torch.device("cpu"), None)


def test_stylised_image_takes_the_target_channel_moments():
    rng = np.random.default_rng(0)
    image = rng.integers(60, 200, size=(3, 32, 32)).astype(np.uint8)
    style = np.array([[0.3, 0.5, 0.6], [0.05, 0.1, 0.08]])  # means, stds well inside [0, 1]
    out = PIXEL(image, [style])[0].astype(np.float64) / 255.0
    np.testing.assert_allclose(out.mean(axis=(1, 2)), style[0], atol=3e-3)
    np.testing.assert_allclose(out.std(axis=(1, 2)), style[1], atol=3e-3)


def test_pixel_style_is_channel_mean_and_std_over_all_pixels():
    images = np.zeros((2, 3, 2, 2), dtype=np.uint8)
    images[0, 0] = 255  # channel 0: half the pixels 1.0, half 0.0
    images[:, 1] = 51  # channel 1: constant 0.2
    style = PIXEL.style(images)
    assert style.shape == (2, 3)
    np.testing.assert_allclose(style[:, 0], [0.5, 0.5])
    np.testing.assert_allclose(style[:, 1], [0.2, 0.0], atol=1e-12)


class _SmallVGG(nn.Module):
    """A VGG-shaped encoder (1x1 colour conv, reflection-padded 3x3 convs, max-pools), small."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 3, 1), *_convs(3, [8, "M", 16, 16, "M", 32]))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


def test_overall_style_is_accumulated_batch_by_batch():
    torch.manual_seed(0)
    coder = _SmallVGG().eval()
    seen: list[int] = []
    coder.encoder.register_forward_hook(lambda _m, inputs, _o: seen.append(len(inputs[0])))
    images = np.random.default_rng(0).integers(0, 256, (10, 3, 12, 12)).astype(np.uint8)
    style = StyleTransfer(coder, torch.device("cpu"), None).style(images, batch=3)
    assert seen == [3, 3, 3, 1]  # never all of the client's images at once
    with torch.no_grad():  # Eq. (8) over every image at once, in numpy
        f = coder.encode(torch.from_numpy(images / 255.0).float()).double().numpy()
    np.testing.assert_allclose(style[0], f.mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(style[1], f.std(axis=(0, 2, 3)), rtol=1e-5)


def test_the_label_names_the_coder():
    cls = method_class("fedbn", "ccst")
    assert cls.label(cls.parse_options({})) == "fedbn+ccst-pixel"
    assert METHODS.get("ccst").label(METHODS.get("ccst").Options(encoder="vgg")) == "ccst"


def _client(cid: int, n: int = 5) -> ClientData:
    x = np.stack([np.full((3, 4, 4), (10 * i + cid) % 190, dtype=np.uint8) for i in range(n)])
    x[:, :, 0, 0] = 200  # every image has some contrast
    y = np.arange(n, dtype=np.int64)
    return ClientData(cid, "d", x, y, x[:1], y[:1])


def test_algorithm_1_k_distinct_clients_own_client_is_the_original():
    bank = {c: np.array([[[0.1 + 0.2 * c] * 3, [0.05] * 3]]) for c in range(4)}
    data = _client(1)
    out = augment(data, 1, bank, 3, np.random.default_rng(0), PIXEL)
    assert len(out.train_y) == 5 * 3
    np.testing.assert_array_equal(out.train_y, np.repeat(data.train_y, 3))
    for i in range(5):
        group = out.train_x[3 * i:3 * i + 3]
        means = [g.astype(float).mean() / 255 for g in group]
        origin = [np.array_equal(g, data.train_x[i]) for g in group]
        styled = [min(range(4), key=lambda c: abs(m - bank[c][0, 0, 0])) for m in means]
        # each styled copy matches one bank client; own client (1) only as the original
        chosen = [1 if o else s for o, s in zip(origin, styled, strict=True)]
        assert len(set(chosen)) == 3
        assert all(s != 1 for o, s in zip(origin, styled, strict=True) if not o)
    # over many images the own client is drawn with probability K/N = 3/4
    many = augment(_client(1, 400), 1, bank, 3, np.random.default_rng(1), PIXEL)
    originals = sum(np.array_equal(many.train_x[j], _client(1, 400).train_x[j // 3])
                    for j in range(len(many.train_y)))
    assert originals / 400 == pytest.approx(0.75, abs=0.06)


@pytest.mark.parametrize(("style", "per_client"), [("overall", 1), ("single", 4)])
def test_bank_shapes_and_only_style_vectors_travel(style, per_client, warm_actors):
    cfg = tiny_config(method="ccst", rounds=1, local_steps=2,
                      options={"style": style, "k": 2, "single_styles": per_client})
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    sim = simulation(cfg, data, log=lambda _: None)
    result = sim.run()
    setup = [r for r in result.tables["ledger"] if r["round"] == 0]
    style_bytes = per_client * 2 * 3 * 8  # (J or 1) x (mean, std) x 3 channels, float64
    assert {r["kind"] for r in setup} == {"request", "style_vectors", "style_bank"}
    ups = [r for r in setup if r["kind"] == "style_vectors"]
    assert len(ups) == 3 and all(r["bytes"] == style_bytes for r in ups)
    bank = [r for r in setup if r["kind"] == "style_bank"]
    downs = [r for r in bank if r["direction"] == "down"]
    assert len(downs) == 3 and all(r["bytes"] == 3 * style_bytes for r in downs)  # whole bank
    assert all(r["bytes"] == 0 for r in bank if r["direction"] == "up")  # no image leaves


def _augmented_host(name: str, k: int = 2):
    base, _, aug = name.partition("+")
    cfg = tiny_config(method=base, augment=aug or None, local_steps=1, options={"k": k})
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    clients = make_clients(data, Partition.of(cfg))
    cls = method_class(cfg.method, cfg.augment)
    method = cls(cls.parse_options(cfg.options))
    spec = ModelSpec(cfg.model, 3, 10, cfg.image_size)
    host = ClientHost(RuntimeSpec(method, cfg, spec, data.mean, data.std), clients)
    torch.manual_seed(0)
    global_state = state.to_numpy(method.build_model(spec))
    bank = {c.client_id: host.phase("style", c.client_id, None, global_state, 0)[0]
            for c in clients}
    host.phase("augment", 0, bank, global_state, 0)
    return host, clients, global_state


@pytest.mark.parametrize("name", ["ccst", "fedprox+ccst"])
def test_training_uses_the_augmented_d_times_k_samples(name):
    host, clients, global_state = _augmented_host(name)
    upload = host.train(0, global_state, 1)
    assert upload.num_samples == 2 * clients[0].num_train
    assert host.train(1, global_state, 1).num_samples == clients[1].num_train  # not augmented


def test_adain_gives_features_the_style_moments():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(2, 5, 4, 4, generator=g) * 3 + 1
    style = torch.stack([torch.stack([torch.linspace(-1, 1, 5), torch.linspace(0.5, 2, 5)])] * 2)
    out = adain(f, style).numpy()
    np.testing.assert_allclose(out.mean(axis=(2, 3)), style[:, 0].numpy(), atol=1e-5)
    np.testing.assert_allclose(out.std(axis=(2, 3)), style[:, 1].numpy(), rtol=1e-4)


def _weights(tmp_path, coder: VGGCoder):
    enc, dec = tmp_path / "vgg_normalised.pth", tmp_path / "decoder.pth"
    full = dict(coder.encoder.state_dict())
    full["31.weight"] = torch.zeros(1)  # the published file goes on to relu5_4
    torch.save(full, enc)
    torch.save(coder.decoder.state_dict(), dec)
    return str(enc), str(dec)


def test_vgg_coder_loads_user_weights_and_stylises(tmp_path):
    torch.manual_seed(0)
    enc, dec = _weights(tmp_path, VGGCoder())
    cls = METHODS.get("ccst")
    opts = cls.parse_options({"encoder": "vgg", "encoder_weights": enc, "decoder_weights": dec,
                              "vgg_size": 32})
    from raydg.methods.ccst import vgg_coder

    coder = vgg_coder(enc, dec, "cpu")
    saved = torch.load(enc, weights_only=True)
    assert torch.equal(coder.encoder[29].weight, saved["29.weight"])  # relu4_1's conv
    transfer = StyleTransfer(coder, torch.device("cpu"), opts.vgg_size)
    images = np.random.default_rng(0).integers(0, 256, (3, 3, 16, 16), dtype=np.uint8)
    style = transfer.style(images)
    assert style.shape == (2, 512)
    out = transfer(images[0], [style, transfer.style(images[1:2])])
    assert len(out) == 2 and out[0].shape == (3, 16, 16) and out[0].dtype == np.uint8


def test_vgg_weight_files_missing_or_wrong_fail_with_one_clear_error(tmp_path):
    cls = METHODS.get("ccst")
    with pytest.raises(RaydgError, match=r"options\.encoder_weights"):
        cls.parse_options({"encoder": "vgg"})
    _, dec = _weights(tmp_path, VGGCoder())
    with pytest.raises(RaydgError, match="lacks"):
        cls.parse_options({"encoder": "vgg", "encoder_weights": dec, "decoder_weights": dec})
    evil = tmp_path / "evil.pth"
    torch.save({"obj": ClientData}, evil)  # a pickled class, not tensors
    with pytest.raises(RaydgError, match="cannot load"):
        cls.parse_options({"encoder": "vgg", "encoder_weights": str(evil),
                           "decoder_weights": dec})


def test_augment_composes_with_other_methods_and_refuses_non_augmentations():
    cls = method_class("fedbn", "ccst")
    assert cls.name == "fedbn+ccst" and cls.__mro__[1:3] == (METHODS.get("ccst"),
                                                              METHODS.get("fedbn"))
    opts = method_class("fedprox", "ccst").parse_options({"mu": 0.5, "k": 2})
    assert (opts.mu, opts.k, opts.style) == (0.5, 2, "overall")
    with pytest.raises(RaydgError, match="not an augmentation"):
        method_class("fedavg", "fedbn")
    with pytest.raises(RaydgError, match="training method"):
        method_class("ccst", "ccst")


def test_augment_ccst_runs_with_fedbn_on_ray(warm_actors):
    cfg = tiny_config(method="fedbn", augment="ccst", rounds=1, local_steps=2,
                      options={"k": 2})
    assert method_label(cfg) == "fedbn+ccst-pixel"  # the pixel coder is never called ccst
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    sim = simulation(cfg, data, log=lambda _: None)
    result = sim.run()
    assert result.method == "fedbn+ccst-pixel [k=2]"  # its row says K is not the paper's
    kinds = {(r["round"], r["kind"]) for r in result.tables["ledger"]}
    assert {(0, "style_vectors"), (0, "style_bank"), (1, "parameters")} <= kinds
    bn = {k for k in result.global_state if "running_mean" in k}
    assert bn and bn <= sim.local_keys  # FedBN's local statistics are still in place


class _Counts(METHODS.get("fedavg")):
    """A base method with a client phase of its own, to compose CCST with."""

    name = "counts"

    def client_phase(self, phase, ctx, payload):
        return ctx.data.num_train if phase == "count" else super().client_phase(
            phase, ctx, payload)


def test_the_base_methods_own_phases_see_the_augmented_data():
    cfg = tiny_config(method="ccst", local_steps=1, options={"k": 2})
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    clients = make_clients(data, Partition.of(cfg))
    ccst = METHODS.get("ccst")
    composed = type("CountsCCST", (ccst, _Counts), {"name": "counts+ccst"})
    method = composed(ccst.parse_options(cfg.options))
    spec = ModelSpec(cfg.model, 3, 10, cfg.image_size)
    host = ClientHost(RuntimeSpec(method, cfg, spec, data.mean, data.std), clients)
    global_state = state.to_numpy(method.build_model(spec))
    assert host.phase("count", 0, None, global_state, 0)[0] == clients[0].num_train
    bank = {c.client_id: host.phase("style", c.client_id, None, global_state, 0)[0]
            for c in clients}
    host.phase("augment", 0, bank, global_state, 0)
    assert host.phase("count", 0, None, global_state, 0)[0] == 2 * clients[0].num_train
