"""FedFD against numpy evaluations of FedFD-A Eq. (2)-(5): mixed statistics, the client-agnostic
losses and the global statistics. FedFD-A's adapter: test_fedfd_a.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from raydg import state
from raydg.datasets import load_dataset
from raydg.engine.client import ClientHost, RuntimeSpec
from raydg.methods import METHODS
from raydg.methods.fedfd import MixBN, bn_mode, mix_layers, set_reference
from raydg.models import ModelSpec
from raydg.partition import Partition, make_clients
from tests.conftest import tiny_config

EPS = 1e-5


def _mixbn(channels=3, adapter_hidden=None, u=(0.0, 1.0), fixed=0.5, per_channel=False):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(channels, eps=EPS)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return MixBN(bn, u, fixed, adapter_hidden, per_channel)


def _np_mixed(x, w, mu_g, var_g, gamma, beta):
    """Eq. (2)/(6) in numpy: normalise with w*instance + (1-w)*global statistics."""
    mu_i = x.mean(axis=(2, 3))
    sigma_i = np.sqrt(x.var(axis=(2, 3)) + EPS)
    sigma_g = np.sqrt(var_g + EPS)
    mu = w * mu_i + (1 - w) * mu_g
    sigma = w * sigma_i + (1 - w) * sigma_g
    out = (x - mu[:, :, None, None]) / sigma[:, :, None, None]
    return out * gamma[None, :, None, None] + beta[None, :, None, None]


def _params(layer):
    return (layer.running_mean.numpy(), layer.running_var.numpy(),
            layer.weight.detach().numpy(), layer.bias.detach().numpy())


def test_mixed_statistics_match_numpy():
    layer = _mixbn(u=(0.2, 0.9))
    x = torch.randn(4, 3, 5, 5) * 2 + 1
    torch.manual_seed(123)
    with bn_mode(layer, "mix"):
        out = layer(x).detach().numpy()
    torch.manual_seed(123)
    u = torch.empty(1, 3).uniform_(0.2, 0.9).numpy()  # one u per channel, shared by the batch
    assert np.all((u >= 0.2) & (u <= 0.9))
    np.testing.assert_allclose(out, _np_mixed(x.numpy(), u, *_params(layer)), rtol=1e-5,
                               atol=1e-5)
    for mode, w in (("instance", 1.0), ("fixed", 0.5)):
        with bn_mode(layer, mode):
            got = layer(x).detach().numpy()
        np.testing.assert_allclose(got, _np_mixed(x.numpy(), w, *_params(layer)), rtol=1e-5,
                                   atol=1e-5)


def test_mix_uses_the_global_reference_statistics():
    layer = _mixbn()
    mu_g, var_g = np.array([5.0, -2.0, 0.0]), np.array([4.0, 0.25, 1.0])
    set_reference(nn.Sequential(layer), {"0.running_mean": mu_g, "0.running_var": var_g})
    x = torch.randn(2, 3, 4, 4)
    with bn_mode(layer, "fixed"):  # w = 0.5
        got = layer(x).detach().numpy()
    _, _, gamma, beta = _params(layer)
    np.testing.assert_allclose(got, _np_mixed(x.numpy(), 0.5, mu_g, var_g, gamma, beta),
                               rtol=1e-5, atol=1e-5)


def _fedfd(name="fedfd", **options):
    cls = METHODS.get(name)
    return cls(cls.parse_options(options))


def _model(method, channels=3):
    """A model whose mu_G, sigma_G are pinned to its initial statistics, as ``start_round`` pins
    them to the received global ones (training-mode passes then cannot move them)."""
    torch.manual_seed(0)
    model = method.build_model(ModelSpec("cnn", channels, 10, 16))
    set_reference(model, state.to_numpy(model))
    return model


def test_client_agnostic_losses_match_their_equations():
    method = _fedfd()
    model = _model(method).train()
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    torch.manual_seed(7)
    parts = method.client_agnostic_losses(model, x, y)
    # recompute both feature passes with the same random draws, then the losses in numpy
    torch.manual_seed(7)
    with torch.no_grad():
        f = model.features(x)
        with bn_mode(model, "mix"):
            f_d = model.features(x)
        logits_d = model.classifier(f_d).numpy()
    f, f_d, yn = f.numpy(), f_d.numpy(), y.numpy()
    cafl = np.mean(np.sum((f - f_d) ** 2, axis=1))  # Eq. (3)
    z = logits_d - logits_d.max(axis=1, keepdims=True)
    cacl = np.mean(-(z[np.arange(8), yn] - np.log(np.exp(z).sum(axis=1))))  # Eq. (4)
    assert parts["cafl"].item() == pytest.approx(cafl, rel=1e-4)
    assert parts["cacl"].item() == pytest.approx(cacl, rel=1e-5)
    assert parts["cafl"].item() > 0


@pytest.mark.parametrize(("options", "weights"), [
    ({}, (0.9, 0.1, 4.0)),  # FedFD-A Eq. (5)
    ({"objective": "fedig"}, (1.0, 0.1, 4.0)),  # FedIG Eq. (6)
    ({"losses": "cafl"}, (1.0, 0.0, 4.0)),
    ({"losses": "cacl"}, (0.9, 0.1, 0.0)),
])
def test_total_loss_weights(options, weights):
    method = _fedfd(**options)
    model = _model(method).train()
    ctx = SimpleNamespace(model=model, round=1, log=lambda *_, **__: None)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    torch.manual_seed(3)
    total = method.loss(ctx, x, y).item()
    torch.manual_seed(3)
    p = {k: v.item() for k, v in method.client_agnostic_losses(model, x, y).items()}
    assert total == pytest.approx(weights[0] * p["ce"] + weights[1] * p["cacl"]
                                  + weights[2] * p["cafl"], rel=1e-5)


def test_cacl_updates_only_the_classifier():
    method = _fedfd(losses="cacl", lambda1=1.0)  # loss = 0*CE + CACL
    model = _model(method).train()
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    ctx = SimpleNamespace(model=model, round=1, log=lambda *_, **__: None)
    method.loss(ctx, x, y).backward()
    assert all(p.grad is None or not p.grad.any() for p in model.features.parameters())
    assert model.classifier.weight.grad.abs().sum() > 0


def _host(method_name, **options):
    cfg = tiny_config(method=method_name, local_steps=3, options=options)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    clients = make_clients(data, Partition.of(cfg))
    spec = ModelSpec(cfg.model, data.channels, 10, cfg.image_size)
    method = _fedfd(method_name, **options)
    return ClientHost(RuntimeSpec(method, cfg, spec, data.mean, data.std), clients), method, spec


def _first_round(method_name):
    """Client 0's context in round 1, its round started, under a seeded initial model."""
    host, method, spec = _host(method_name)
    torch.manual_seed(0)
    ctx = host._context(0, 1, state.to_numpy(method.build_model(spec)))
    method.start_round(ctx)
    return host, method, ctx


def test_global_statistics_are_the_weighted_aggregate():
    host, method, spec = _host("fedfd")
    torch.manual_seed(0)
    initial = state.to_numpy(method.build_model(spec))
    uploads = [host.train(c, initial, 1) for c in sorted(host.slots)]
    new_global = state.weighted_average([u.state for u in uploads],
                                        [u.num_samples for u in uploads])
    ctx = host._context(0, 2, new_global)
    method.start_round(ctx)
    n = np.array([u.num_samples for u in uploads], dtype=np.float64)
    for name, layer in mix_layers(ctx.model):
        for i, key in enumerate(("running_mean", "running_var")):
            stats = np.stack([u.state[f"{name}.{key}"] for u in uploads])
            expected = (n[:, None] * stats).sum(0) / n.sum()
            np.testing.assert_allclose(layer.reference[i].numpy(), expected, rtol=1e-6)
    # SiloBN base: the client's own running statistics stay local
    assert host.local_keys == {k for k in new_global if "running" in k or "tracked" in k}


def test_mixstyle_statistics_match_numpy():
    """Table 3(b): each sample normalised with lambda*own + (1-lambda)*partner statistics."""
    layer = _mixbn()
    x = torch.randn(6, 3, 4, 4) * 2
    torch.manual_seed(11)
    with bn_mode(layer, "mixstyle"):
        got = layer(x).detach().numpy()
    torch.manual_seed(11)
    perm = torch.randperm(6).numpy()
    lam = torch.distributions.Beta(0.1, 0.1).sample((6, 1)).numpy()
    xn = x.numpy()
    mu_i, sigma_i = xn.mean(axis=(2, 3)), np.sqrt(xn.var(axis=(2, 3)) + EPS)
    mu = lam * mu_i + (1 - lam) * mu_i[perm]
    sigma = lam * sigma_i + (1 - lam) * sigma_i[perm]
    _, _, gamma, beta = _params(layer)
    expected = (xn - mu[:, :, None, None]) / sigma[:, :, None, None]
    expected = expected * gamma[None, :, None, None] + beta[None, :, None, None]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    method = _fedfd(augment="mixstyle")
    model = _model(method).train()
    parts = method.client_agnostic_losses(model, torch.randn(8, 3, 16, 16),
                                          torch.randint(0, 10, (8,)))
    assert parts["cafl"].item() > 0


def test_cafl_mean_reduction_averages_over_the_feature_dimensions():
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    cafl = {}
    for reduction in ("sum", "mean"):
        method = _fedfd(cafl_reduction=reduction)
        model = _model(method).train()
        torch.manual_seed(7)
        cafl[reduction] = method.client_agnostic_losses(model, x, y)["cafl"].item()
    dims = model.features(x).shape[1]
    assert cafl["mean"] == pytest.approx(cafl["sum"] / dims, rel=1e-5)


def test_client_validation_normalises_with_the_rounds_global_statistics():
    host, method, ctx = _first_round("fedfd-a")
    global_state = ctx.global_state
    batches = ctx.batches()
    for _ in range(3):  # batch-mode training moves the model's own running statistics
        method.train_step(ctx, *next(batches))
    x = ctx.inputs(ctx.data.val_x)
    ctx.model.eval()

    def predicted(reference):
        set_reference(ctx.model, reference)
        with torch.no_grad():
            return method.predict(ctx.model, x, "fixed")

    set_reference(ctx.model, global_state)  # as start_round left it: the client's validation
    with torch.no_grad():
        during = method.predict(ctx.model, x, "fixed")
    assert torch.equal(during, predicted(global_state))
    assert not torch.allclose(during, predicted(None))  # not the model's own statistics
    set_reference(ctx.model, global_state)
    method.end_round(ctx)
    with torch.no_grad():
        assert torch.equal(method.predict(ctx.model, x, "fixed"), predicted(None))
    host.train(1, global_state, 1)  # a whole round ends with the reference cleared
    assert all(m.reference is None for _, m in mix_layers(host.model))
