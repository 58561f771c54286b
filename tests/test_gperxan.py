"""gPerXAN against independent computations of its Eq. (2)-(4) and PerXAN's personalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raydg import state
from raydg.datasets import load_dataset
from raydg.engine.client import ClientHost, RuntimeSpec
from raydg.methods import METHODS
from raydg.methods.gperxan import IBN, XAN
from raydg.models import ModelSpec, bn_layers
from raydg.partition import Partition, make_clients
from tests.conftest import tiny_config

SPEC = ModelSpec("cnn", 3, 10, 16)


def _method(name="gperxan", **options):
    cls = METHODS.get(name)
    return cls(cls.parse_options(options))


def test_xan_is_the_softmax_weighted_sum_of_in_and_bn():
    torch.manual_seed(0)
    layer = XAN(nn.BatchNorm2d(3))
    with torch.no_grad():
        layer.score_in.fill_(0.3)
        layer.score_bn.fill_(-0.4)
        layer.inorm.weight.uniform_(0.5, 1.5)
        layer.bn.bias.uniform_(-1, 1)
    w = layer.weights().detach().numpy()
    assert w.sum() == pytest.approx(1.0)
    assert w[0] == pytest.approx(np.exp(0.3) / (np.exp(0.3) + np.exp(-0.4)))
    x = torch.randn(4, 3, 5, 5) * 2 + 1
    xn = x.numpy()

    def norm(axes):
        mu = xn.mean(axis=axes, keepdims=True)
        return (xn - mu) / np.sqrt(xn.var(axis=axes, keepdims=True) + 1e-5)

    def affine(z, m):
        g, b = m.weight.detach().numpy(), m.bias.detach().numpy()
        return z * g[None, :, None, None] + b[None, :, None, None]

    expected = w[0] * affine(norm((2, 3)), layer.inorm) + w[1] * affine(norm((0, 2, 3)), layer.bn)
    np.testing.assert_allclose(layer.train()(x).detach().numpy(), expected, rtol=1e-4,
                               atol=1e-5)
    fresh = XAN(nn.BatchNorm2d(3)).weights().detach().numpy()
    np.testing.assert_allclose(fresh, [0.5, 0.5])  # both scores start at 1.0


def test_on_one_by_one_maps_the_in_side_is_its_bias_as_the_definition_gives():
    """(x - mean) / sqrt(var + eps) of a single value is 0: g*0 + b; torch refuses to train IN
    there, and a 32 px image is 1x1 after a ResNet's layer4."""
    layer, x = XAN(nn.BatchNorm2d(3)), torch.randn(4, 3, 1, 1, requires_grad=True)
    with torch.no_grad():
        layer.inorm.bias.copy_(torch.tensor([0.5, -1.0, 2.0]))
    bn = layer.bn(x).detach().numpy()
    expected = 0.5 * np.array([0.5, -1.0, 2.0])[None, :, None, None] + 0.5 * bn
    np.testing.assert_allclose(layer.train()(x).detach().numpy(), expected, rtol=1e-6)
    layer(x).sum().backward()
    assert layer.inorm.bias.grad is not None and torch.isfinite(x.grad).all()
    assert IBN(nn.BatchNorm2d(4)).train()(torch.randn(2, 4, 1, 1)).shape == (2, 4, 1, 1)


def _round_two_views(name="gperxan", **options):
    cfg = tiny_config(method=name, local_steps=4)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    clients = make_clients(data, Partition.of(cfg))[:2]
    method = _method(name, **options)
    host = ClientHost(RuntimeSpec(method, cfg, SPEC, data.mean, data.std), clients)
    torch.manual_seed(0)
    initial = state.to_numpy(method.build_model(SPEC))
    uploads = [host.train(c.client_id, initial, 1) for c in clients]
    agg = state.weighted_average([u.state for u in uploads], [u.num_samples for u in uploads])
    views = {}
    for c in clients:
        host._context(c.client_id, 2, agg)
        views[c.client_id] = state.to_numpy(host.model)
    return host, uploads, agg, views


def test_exactly_the_bn_sides_stay_local():
    host, uploads, agg, views = _round_two_views()
    bn_side = {k for k in agg if ".bn." in k or k.endswith("score_bn")}
    assert host.local_keys == bn_side and len(bn_side) == 3 * 6  # 3 XAN layers
    differ = {k for k in agg if not np.array_equal(views[0][k], views[1][k])}
    # every float BN-side tensor differs between the clients, and nothing else does (the
    # batch counters may agree when both uploads come from the same step)
    assert {k for k in bn_side if not k.endswith("num_batches_tracked")} <= differ <= bn_side
    for u in uploads:
        for k in agg:
            expected = u.state[k] if k in bn_side else agg[k]
            np.testing.assert_array_equal(views[u.client_id][k], expected, err_msg=k)


def test_frozen_global_head_gets_no_gradient_and_regulariser_value():
    method = _method(lambda_reg=0.5)
    torch.manual_seed(0)
    model = method.build_model(SPEC).train()
    ctx = type("Ctx", (), {"model": model, "scratch": {}})()
    head = type(model.classifier)(model.classifier.in_features, 10)
    head.load_state_dict(model.classifier.state_dict())
    head.requires_grad_(False)
    ctx.scratch["global_head"] = head
    with torch.no_grad():  # the local head drifts away from the frozen global one
        model.classifier.weight.add_(torch.randn_like(model.classifier.weight))
    x, y = torch.randn(6, 3, 16, 16), torch.randint(0, 10, (6,))
    torch.manual_seed(1)
    loss = method.loss(ctx, x, y)
    loss.backward()
    assert all(p.grad is None for p in head.parameters())
    assert model.classifier.weight.grad is not None
    with torch.no_grad():
        torch.manual_seed(1)
        f = model.features(x)
        local = model.classifier(f).numpy()
        guide = (f.numpy() @ head.weight.numpy().T) + head.bias.numpy()

    def ce(logits):
        z = logits - logits.max(axis=1, keepdims=True)
        return np.mean(np.log(np.exp(z).sum(axis=1)) - z[np.arange(6), y.numpy()])

    assert loss.item() == pytest.approx(ce(local) + 0.5 * ce(guide), rel=1e-5)


def test_start_round_freezes_a_copy_of_the_received_classifier():
    host, _, agg, _ = _round_two_views()
    ctx = host._context(0, 2, agg)
    host.method.start_round(ctx)
    head = ctx.scratch["global_head"]
    assert head is not ctx.model.classifier
    assert all(not p.requires_grad for p in head.parameters())
    np.testing.assert_array_equal(head.weight.numpy(), agg["classifier.weight"])


def test_variants_and_blocks():
    assert not any(isinstance(m, XAN) for m in _method("gfedavg").build_model(SPEC).modules())
    assert _method("gfedavg").options.lambda_reg == 0.5
    assert _method("perxan").options.lambda_reg == 0.0
    ibn = _method(norm="ibn").build_model(SPEC)
    assert sum(isinstance(m, IBN) for m in ibn.modules()) == 3
    assert ibn(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    two = _method(xan_blocks=2).build_model(SPEC)
    assert sum(isinstance(m, XAN) for m in two.modules()) == 2
    resnet = METHODS.get("fedavg")().build_model(ModelSpec("resnet18", 3, 7, 32))
    assert len(bn_layers(resnet.features, 1)) == 1 + 4  # stem bn1 + layer1's 2 blocks x 2 BN
    assert len(bn_layers(resnet.features, 2)) == 1 + 4 + 5  # + layer2 (with downsample BN)
    assert len(bn_layers(resnet.features, -1)) == 20


def test_xan_weights_are_recorded_each_round():
    method = _method()
    torch.manual_seed(0)
    model = method.build_model(SPEC)
    with torch.no_grad():
        model.features[1].score_in.fill_(2.0)
    rows = []
    server = type("S", (), {"global_state": state.to_numpy(model),
                            "record": lambda self, t, r: rows.append((t, r))})()
    method.on_round_end(server)
    assert [r["layer"] for _, r in rows] == ["features.1", "features.5", "features.9"]
    first = rows[0][1]
    assert first["w_in"] == pytest.approx(np.exp(2) / (np.exp(2) + np.exp(1)))
    assert all(r["w_in"] + r["w_bn"] == pytest.approx(1.0) for _, r in rows)


def test_eval_client_takes_that_clients_bn_side(tmp_path):
    from raydg.methods import Upload
    from raydg.plots import plot

    method = _method(eval_client=1)
    torch.manual_seed(0)
    model = method.build_model(SPEC)
    local = method.local_keys(model)
    base = state.to_numpy(model)
    rng = np.random.default_rng(0)
    uploads = [Upload(c, n, {k: (v + rng.normal(size=v.shape)).astype(v.dtype)
                             for k, v in base.items()}) for c, n in ((0, 30), (1, 10))]
    server = type("S", (), {"config": tiny_config(), "global_state": base,
                            "local_keys": local, "client_ids": [0, 1]})()
    merged = method.aggregate(server, uploads)
    for k in base:
        if k in local:
            np.testing.assert_array_equal(merged[k], uploads[1].state[k])
        elif base[k].dtype.kind == "f":
            expected = (30 * uploads[0].state[k] + 10 * uploads[1].state[k]) / 40
            np.testing.assert_allclose(merged[k], expected, rtol=1e-5, atol=1e-6)
    server.client_ids = [0]
    with pytest.raises(Exception, match="eval_client 1"):
        method.setup(server)
    rows = [{"round": r, "layer": layer, "w_in": 0.5 + 0.01 * r} for r in (1, 2, 3)
            for layer in ("a", "b")]
    plot(rows, method.plots["xan_weights"], tmp_path / "w.png")
    assert (tmp_path / "w.png").read_bytes()[:4] == b"\x89PNG"
