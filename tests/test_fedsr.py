"""FedSR against independent expectations: its loss (CE + L2R + CMI, the KL in closed form)
and the sampled prediction recomputed in numpy, option checks, and tiny federations on Ray."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from raydg.api import simulation
from raydg.cli import cli
from raydg.datasets import load_dataset
from raydg.engine.client import ClientHost, Evaluator, RuntimeSpec
from raydg.errors import RaydgError
from raydg.methods import METHODS, ClientContext, method_class
from raydg.methods.fedsr import PREDICT_SEED, FedSR, GaussianNet, cmi_term
from raydg.models import ModelSpec
from raydg.partition import Partition, make_clients
from tests.conftest import tiny_config

SPEC = ModelSpec("cnn", 3, 10, 16)
FEATURES, Z_DIM, CLASSES = 5, 3, 4


def _method(**options) -> FedSR:
    return FedSR(FedSR.parse_options(options))


class _Ctx:
    """What ``FedSR.loss`` uses of a client context: the model and ``log``."""

    log = ClientContext.log

    def __init__(self, model: nn.Module) -> None:
        self.model, self.metrics, self.terms = model, {}, set()


def _toy_net(c: float) -> GaussianNet:
    """Identity backbone on 5 features, z_dim 3, 4 classes, non-trivial reference params."""
    torch.manual_seed(0)
    net = GaussianNet(nn.Identity(), FEATURES, Z_DIM, CLASSES)
    with torch.no_grad():
        net.r_mu.normal_()
        net.r_sigma.uniform_(-1.0, 2.0)
        net.c.fill_(c)
    return net


def _np(net: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().double().numpy() for k, v in net.state_dict().items()}


def _softplus(a: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, a)


def _mu_sigma(p: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = x @ p["encoder.weight"].T + p["encoder.bias"]
    return out[:, :Z_DIM], _softplus(out[:, Z_DIM:])


def _expected(p, x, y, eps, l2r, cmi, squared):
    """CE + l2r * mean ||z|| (or ||z||²) + cmi * mean KL(N(c mu, |c| sigma) || N(r_mu[y],
    softplus(r_sigma[y]))), all in float64 numpy."""
    mu, sigma = _mu_sigma(p, x)
    z = mu + sigma * eps
    logits = z @ p["classifier.weight"].T + p["classifier.bias"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    ce = np.mean(np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(y)), y])
    norms = np.sqrt((z ** 2).sum(axis=1))
    l2r_value = np.mean(norms ** 2 if squared else norms)
    c = float(p["c"])
    mq, sq = c * mu, abs(c) * sigma
    mp, sp = p["r_mu"][y], _softplus(p["r_sigma"][y])
    kl = (np.log(sp / sq) + (sq ** 2 + (mq - mp) ** 2) / (2 * sp ** 2) - 0.5).sum(axis=1)
    return ce + l2r * l2r_value + cmi * kl.mean(), l2r_value, kl.mean()


@pytest.mark.parametrize(("c", "squared"), [(1.7, False), (1.7, True), (-0.6, False)])
def test_loss_is_ce_plus_weighted_l2r_and_cmi(c, squared):
    method = _method(l2r=0.3, cmi=0.05, l2r_squared=squared)
    net = _toy_net(c).train()
    ctx = _Ctx(net)
    x = torch.randn(6, FEATURES)
    y = torch.tensor([0, 2, 2, 0, 1, 0])  # class 3 absent
    torch.manual_seed(7)
    loss = method.loss(ctx, x, y)
    torch.manual_seed(7)
    eps = torch.randn(6, Z_DIM).double().numpy()  # the draw of the reparameterisation
    expected, l2r_value, cmi_value = _expected(_np(net), x.double().numpy(), y.numpy(), eps,
                                               0.3, 0.05, squared)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert ctx.metrics["fedsr/l2r"] == [pytest.approx(l2r_value, rel=1e-5)]
    assert ctx.metrics["fedsr/cmi"] == [pytest.approx(cmi_value, rel=1e-5)]
    loss.backward()  # the reference parameters are trained, for the classes in the batch
    for p in (net.r_mu, net.r_sigma):
        assert p.grad[3].abs().sum() == 0 and p.grad[:3].abs().sum(dim=1).min() > 0
    assert net.c.grad != 0


def test_kl_is_zero_where_the_scaled_posterior_is_the_reference():
    net = _toy_net(2.0)
    x = torch.randn(2, FEATURES)
    with torch.no_grad():
        mu, sigma = net.gaussian(x)
        net.r_mu[1] = 2.0 * mu[0]
        net.r_sigma[1] = torch.log(torch.expm1(2.0 * sigma[0]))  # softplus^-1(2 sigma)
    assert cmi_term(net, mu[:1], sigma[:1], torch.tensor([1])).item() == pytest.approx(
        0.0, abs=1e-5)


def test_sampled_prediction_averages_softmax_over_seeded_draws():
    method = _method(samples=5)
    net = _toy_net(1.0).eval()
    xa, xb = torch.randn(7, FEATURES), torch.randn(3, FEATURES)
    rng_before = torch.get_rng_state()
    with torch.no_grad():
        first = method.predict(net, xa, "sampled")
        other = method.predict(net, xb, "sampled")
        again = method.predict(net, xa, "sampled")  # after another batch: the same bits
        mean_logits = method.predict(net, xa, "mean").numpy()
    assert torch.equal(torch.get_rng_state(), rng_before)  # the global stream is untouched
    assert torch.equal(first, again)
    with torch.no_grad():
        assert torch.equal(method.predict(net, xb, "sampled"), other)
    p = _np(net)
    mu, sigma = _mu_sigma(p, xa.double().numpy())
    eps = torch.randn((5, 7, Z_DIM), generator=torch.Generator().manual_seed(PREDICT_SEED))
    probs = np.zeros((7, CLASSES))
    for draw in eps.double().numpy():
        logits = (mu + sigma * draw) @ p["classifier.weight"].T + p["classifier.bias"]
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs += e / e.sum(axis=1, keepdims=True) / 5
    np.testing.assert_allclose(first.exp().numpy(), probs, rtol=1e-5)
    np.testing.assert_allclose(mean_logits, mu @ p["classifier.weight"].T
                               + p["classifier.bias"], rtol=1e-5, atol=1e-6)


def test_model_shapes_local_keys_and_composition_with_ccst():
    net = _method().build_model(SPEC)
    assert net.encoder.weight.shape == (2 * 64, 64)  # z_dim 0: the digits CNN's width
    assert net.classifier.weight.shape == (10, 64)
    small = _method(z_dim=8).build_model(SPEC)
    assert small.r_mu.shape == small.r_sigma.shape == (10, 8)
    with torch.no_grad():
        assert small.c.item() == 1.0 and small.r_mu.abs().sum().item() == 0.0
        assert torch.all(small.r_sigma == 1)
    assert small.eval()(torch.randn(2, 3, 16, 16)).shape == (2, 10)
    assert _method().local_keys(net) == {"r_mu", "r_sigma", "c"}
    assert _method(local_reference=False).local_keys(net) == set()
    cls = method_class("fedsr", "ccst")
    both = cls(cls.parse_options({"k": 2, "l2r": 0.1}))
    assert both.options.l2r == 0.1 and both.eval_modes == ("sampled", "mean")
    assert isinstance(both.build_model(SPEC), GaussianNet)
    with pytest.raises(RaydgError, match="samples >= 1"):
        cls.parse_options({"samples": 0})  # ccst's check defers to fedsr's


def test_defaults():
    o = _method().options
    assert (o.z_dim, o.l2r, o.cmi, o.samples, o.l2r_squared, o.local_reference) == (
        0, 0.01, 0.001, 20, False, True)


@pytest.mark.parametrize("bad", [{"l2r": -0.1}, {"cmi": -1e-3}, {"samples": 0},
                                 {"z_dim": -1}, {"l2r": math.nan}, {"samples": 1.5},
                                 {"beta": 1.0}])
def test_invalid_options_are_refused(bad):
    with pytest.raises(RaydgError):
        FedSR.parse_options(bad)


def test_listed_as_a_method():
    assert METHODS.get("fedsr") is FedSR
    assert "fedsr" in CliRunner().invoke(cli, ["list", "methods"]).output


@pytest.mark.parametrize(("dataset", "target"), [("digits-style", "sketch"),
                                                 ("digits-rot", "M75")])
def test_tiny_federation_logs_regularisers_and_reproduces_elsewhere(dataset, target,
                                                                    warm_actors):
    cfg = tiny_config(dataset=dataset, target=target, method="fedsr", local_steps=3,
                      actors=1, options={"z_dim": 16, "samples": 4})
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    result = simulation(cfg, data, log=lambda _: None).run()
    rows = result.history
    assert [r["round"] for r in rows] == [1, 2]
    for r in rows:
        assert r["fedsr/l2r"] > 0 and r["fedsr/cmi"] > 0
        assert math.isfinite(r["train_loss"])
        assert all(0.0 <= r[f"target_acc/{m}"] <= 1.0 for m in ("sampled", "mean"))
        assert r["target_acc"] == r["target_acc/sampled"]
    assert set(result.selected) == {"sampled", "mean"}
    # the final model evaluated again in this process gives the same bits as the actors'
    # validation and the driver's target evaluation
    method = _method(z_dim=16, samples=4)
    spec = ModelSpec(cfg.model, data.channels, len(data.classes), cfg.image_size)
    clients = make_clients(data, Partition.of(cfg))
    rt = RuntimeSpec(method, cfg, spec, data.mean, data.std)
    validation, _ = ClientHost(rt, clients).validate(result.global_state, with_local=False)
    assert np.mean([validation[c]["val_acc"] for c in sorted(validation)]) == rows[-1][
        "val_acc"]
    test = data.domain(target)
    accuracies, _ = Evaluator(rt, test.x, test.y).evaluate(result.global_state)
    assert accuracies == {m: rows[-1][f"target_acc/{m}"] for m in ("sampled", "mean")}
