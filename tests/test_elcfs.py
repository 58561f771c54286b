"""ELCFS (CSAC's FedDG*) against independent expectations: one episode of Eq. (4)-(6) recomputed
in numpy on a linear softmax classifier (first order by hand, second order by central
differences of the meta-objective), both views of a batch, and a federation on digits-rot."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raydg.api import simulation
from raydg.datasets import load_dataset
from raydg.errors import RaydgError
from raydg.methods import METHODS, ClientContext
from raydg.methods.ampmix import BANK
from raydg.partition import ClientData
from tests.conftest import tiny_config
from tests.test_ampmix import _flat_bank


def softmax_ce(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray):
    """Mean cross-entropy of softmax(x w^T + b) and its gradients by w and b."""
    z = x @ w.T + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(p[np.arange(len(y)), y]))
    d = (p - np.eye(w.shape[0])[y]) / len(y)
    return loss, d.T @ x, d.sum(axis=0)


def meta_objective(w, b, own, mixed, y, beta, clip):
    """L_inn(theta) + L_out(theta - beta clip(grad L_inn)), Eq. (4)-(6)."""
    inner, gw, gb = softmax_ce(w, b, own, y)
    return inner + softmax_ce(w - beta * np.clip(gw, -clip, clip),
                              b - beta * np.clip(gb, -clip, clip), mixed, y)[0]


def _episode(second_order: bool, clip: float, beta: float = 0.5, lr: float = 0.1):
    """One ELCFS train_step on a linear model: (w0, b0, data, w1, b1, returned loss)."""
    rng = np.random.default_rng(0)
    own, mixed = rng.normal(size=(2, 6, 4))
    y = np.array([0, 1, 2, 0, 1, 2])
    model = nn.Linear(4, 3).double()
    w0, b0 = model.weight.detach().numpy().copy(), model.bias.detach().numpy().copy()
    method = METHODS.get("elcfs")(METHODS.get("elcfs").parse_options(
        {"meta_step": beta, "clip": clip, "second_order": second_order}))
    ctx = ClientContext(client_id=0, round=1, data=None, model=model, config=tiny_config(),
                        device=torch.device("cpu"), global_state={}, memory={},
                        generator=torch.Generator(), inputs=None, train_inputs=None,
                        evaluate=None)
    ctx.optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss = method.train_step(ctx, (torch.from_numpy(own), torch.from_numpy(mixed)),
                             torch.from_numpy(y))
    return (w0, b0, (own, mixed, y), model.weight.detach().numpy(),
            model.bias.detach().numpy(), loss, ctx)


@pytest.mark.parametrize("clip", [100.0, 0.05])
def test_a_first_order_episode_equals_the_hand_computation(clip):
    beta, lr = 0.5, 0.1
    w0, b0, (own, mixed, y), w1, b1, loss, ctx = _episode(False, clip, beta, lr)
    inner, gw, gb = softmax_ce(w0, b0, own, y)
    if clip < 1:
        assert np.abs(gw).max() > clip  # the clip is exercised
    fast_w, fast_b = w0 - beta * np.clip(gw, -clip, clip), b0 - beta * np.clip(gb, -clip, clip)
    outer, ow, ob = softmax_ce(fast_w, fast_b, mixed, y)  # the meta-test gradient at theta'
    np.testing.assert_allclose(w1, w0 - lr * (gw + ow), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b1, b0 - lr * (gb + ob), rtol=1e-10, atol=1e-12)
    assert loss == pytest.approx(inner, rel=1e-12)  # train_loss reports L_inn
    assert ctx.metrics["elcfs/outer"] == [pytest.approx(outer, rel=1e-12)]


def test_a_second_order_episode_follows_the_meta_objectives_gradient():
    beta, lr, eps = 0.5, 0.1, 1e-6
    w0, b0, (own, mixed, y), w1, b1, _, _ = _episode(True, 100.0, beta, lr)
    theta = np.concatenate([w0.ravel(), b0])

    def objective(t: np.ndarray) -> float:
        return meta_objective(t[:w0.size].reshape(w0.shape), t[w0.size:], own, mixed, y, beta,
                              100.0)

    numeric = np.array([(objective(theta + eps * e) - objective(theta - eps * e)) / (2 * eps)
                        for e in np.eye(theta.size)])
    np.testing.assert_allclose(np.concatenate([w1.ravel(), b1]), theta - lr * numeric,
                               rtol=1e-6, atol=1e-9)
    first_order = _episode(False, 100.0, beta, lr)[3]
    assert np.abs(first_order - w1).max() > 1e-6  # the second-order term is not nothing


def test_batches_carry_the_own_images_and_their_interpolated_copy():
    x = np.random.default_rng(5).integers(0, 256, (12, 3, 16, 16), dtype=np.uint8)
    data = ClientData(0, "d", x, np.zeros(12, dtype=np.int64), x[:1], np.zeros(1, np.int64))
    method = METHODS.get("feddg")()
    ctx = ClientContext(
        client_id=0, round=1, data=data, model=nn.Linear(2, 2), config=tiny_config(),
        device=torch.device("cpu"), global_state={},
        memory={BANK: _flat_bank({0: 30.0, 1: 120.0, 2: 220.0}, (3, 16, 16), 0.1)},
        generator=torch.Generator().manual_seed(0), inputs=None,
        train_inputs=lambda b: torch.from_numpy(b), evaluate=None)
    method.start_round(ctx)
    own, interpolated = ctx.train_inputs(x)
    assert torch.equal(own, torch.from_numpy(x))
    assert all(not torch.equal(a, b) for a, b in zip(interpolated, own, strict=True))  # prob 1
    for bad in ({"meta_step": -1.0}, {"clip": 0.0}):
        with pytest.raises(RaydgError, match="elcfs"):
            METHODS.get("elcfs").parse_options(bad)


def test_elcfs_federation_on_digits_rot(warm_actors):
    cfg = tiny_config(dataset="digits-rot", target="M75", method="feddg", rounds=2,
                      local_steps=3, actors=1)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    sim = simulation(cfg, data, log=lambda _: None)
    result = sim.run()
    assert result.method == "elcfs" and len(sim.client_ids) == 5
    assert {r["kind"] for r in result.tables["ledger"] if r["round"] == 0} == {
        "request", "amplitude_spectra", "amplitude_bank"}
    last = result.history[-1]
    assert np.isfinite(last["elcfs/outer"]) and last["elcfs/outer"] > 0
    assert last["train_loss"] < np.log(10) + 0.5
